//! Anonymous segments (memfd, opened through `/proc/<pid>/fd`): never named
//! in `/dev/shm`, so a job whose processes are all killed during setup
//! leaves nothing there; opened only by the reference of a live creator,
//! only as the memfd of that reference's token, only by the same user.

use std::io::{BufRead, BufReader, ErrorKind};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use transport_shm::{create_inbound, Segment, ANONYMOUS_PREFIX, SHM_DIR};

/// The sncl entries of `/dev/shm` that end in `pid`.
fn named_by(pid: u32) -> Vec<String> {
    std::fs::read_dir(SHM_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sncl-") && n.ends_with(&format!("-{pid}")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_anonymous_segment_is_private_and_has_no_name() {
    // SAFETY: umask only swaps the process's file-creation mask; every
    // segment gets an explicit mode.
    let old = unsafe { libc::umask(0) };
    let made = create_inbound(1, 0, 1, (2, 4096), true);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let (seg, name) = made.unwrap();
    assert!(name.starts_with(ANONYMOUS_PREFIX), "{name}");
    assert!(named_by(std::process::id()).is_empty());
    let peer = Segment::open(&name).unwrap();
    assert_eq!((peer.slots(), peer.slot_bytes()), (2, 4096));
    // Mode and owner as for named segments.
    let fd: Vec<&str> = name[ANONYMOUS_PREFIX.len()..].split('-').collect();
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd[1])).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    // Withdrawn: nobody opens it any more (the mappings stay).
    seg.unlink();
    let e = Segment::open(&name)
        .err()
        .expect("opened a withdrawn segment");
    assert!(e.to_string().contains("cannot open"), "{e}");
    assert_eq!(peer.slots(), 2);
}

#[test]
fn a_reference_opens_only_the_memfd_of_its_token() {
    let (seg, name) = create_inbound(2, 0, 1, (2, 4096), true).unwrap();
    let parts: Vec<&str> = name[ANONYMOUS_PREFIX.len()..].split('-').collect();
    let (pid, fd) = (parts[0], parts[1]);
    // Another token for the same descriptor.
    let forged = format!("{ANONYMOUS_PREFIX}{pid}-{fd}-{}", "0".repeat(32));
    let e = Segment::open(&forged)
        .err()
        .expect("opened a forged reference");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    // Another file of this user behind a descriptor: refused.
    let other = std::fs::File::open("/proc/self/status").unwrap();
    let at_file = format!(
        "{ANONYMOUS_PREFIX}{pid}-{}-{}",
        other.as_raw_fd(),
        &parts[2]
    );
    let e = Segment::open(&at_file).err().expect("opened a non-memfd");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    // Malformed references.
    for bad in [
        format!("{ANONYMOUS_PREFIX}{pid}-{fd}"),
        format!("{ANONYMOUS_PREFIX}{pid}-{fd}-abc"),
        format!("{ANONYMOUS_PREFIX}x-{fd}-{}", parts[2]),
        format!("{ANONYMOUS_PREFIX}{pid}-{fd}-{}-9", parts[2]),
    ] {
        let e = Segment::open(&bad)
            .err()
            .expect("opened a malformed reference");
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}: {e}");
    }
    seg.unlink();
}

#[test]
fn another_user_cannot_open_an_anonymous_segment() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipping another_user_cannot_open_an_anonymous_segment: switching to uid 65534 needs root"
        );
        return;
    }
    let (seg, name) = create_inbound(3, 0, 1, (2, 4096), true).unwrap();
    let parts: Vec<&str> = name[ANONYMOUS_PREFIX.len()..].split('-').collect();
    let path = format!("/proc/{}/fd/{}", parts[0], parts[1]);
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3<> '{path}'"))
        .uid(65534)
        .gid(65534)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "uid 65534 opened {path}");
    seg.unlink();
}

/// Child side of the kill test: creates anonymous segments, prints their
/// references, then waits to be killed.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_holds_anonymous_segments() {
    if std::env::var_os("SNCL_TEST_ANON_CHILD").is_none() {
        return;
    }
    let segs: Vec<_> = (0..4)
        .map(|i| create_inbound(4, i, 9, (4, 4096), true).unwrap())
        .collect();
    for (_, name) in &segs {
        println!("REF {name}");
    }
    println!("READY");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn segments_of_a_killed_process_leave_nothing_in_dev_shm() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_holds_anonymous_segments",
            "--nocapture",
        ])
        .env("SNCL_TEST_ANON_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut refs = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(r) = line.strip_prefix("REF ") {
            refs.push(r.to_owned());
        }
        if line == "READY" {
            break;
        }
    }
    assert_eq!(refs.len(), 4, "the child did not report its segments");
    assert!(named_by(pid).is_empty(), "{:?}", named_by(pid));
    // A peer maps one while the creator lives.
    let mapped = Segment::open(&refs[0]).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // Gone with its creator: no name left anywhere, no reference opens.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) && Segment::open(&refs[1]).is_ok() {
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in &refs {
        assert!(
            Segment::open(r).is_err(),
            "{r} still opens after its creator died"
        );
    }
    assert!(named_by(pid).is_empty(), "{:?}", named_by(pid));
    // The mapping a peer holds stays valid.
    assert_eq!(mapped.slots(), 4);
}
