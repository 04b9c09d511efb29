//! Hardening of shared-memory segments: private modes, plain names only,
//! no links followed, files of other users refused, geometry checked,
//! unguessable names that the stale-segment cleanup still understands.

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use transport_shm::{cleanup_stale, create_inbound, segment_name, Segment, SHM_DIR};

const NOBODY: u32 = 65534;
/// A pid above any `pid_max`: never alive.
const DEAD_PID: u32 = 0x7fff_fffe;

fn shm(name: &str) -> PathBuf {
    Path::new(SHM_DIR).join(name)
}

/// A fresh valid-looking name that no segment uses.
fn fresh_name(tag: &str) -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    format!(
        "sncl-test-{tag}-{:016x}-{}",
        u64::from_ne_bytes(b),
        std::process::id()
    )
}

/// Removes a path when the test ends, whatever happens.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a process running as uid/gid 65534 can open `path` for reading.
fn nobody_can_open(path: &Path) -> bool {
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3< '{}'", path.display()))
        .uid(NOBODY)
        .gid(NOBODY)
        .stderr(Stdio::null())
        .status()
        .expect("spawning sh as uid 65534");
    status.success()
}

#[test]
fn segments_are_private_whatever_the_umask() {
    // SAFETY: umask only swaps the process's file-creation mask; every
    // segment gets an explicit mode, so other tests do not depend on it.
    let old = unsafe { libc::umask(0) };
    let made = create_inbound(7, 0, 1, (2, 4096), false);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let (seg, name) = made.unwrap();
    let _guard = Remove(shm(&name));
    let meta = std::fs::metadata(shm(&name)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
    // SAFETY: geteuid has no preconditions.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    // The same user still opens it.
    let peer = Segment::open(&name).unwrap();
    assert_eq!(peer.slots(), 2);
    assert_eq!(peer.slot_bytes(), 4096);
    seg.unlink();
}

#[test]
fn another_user_cannot_open_a_live_segment() {
    if !is_root() {
        eprintln!(
            "skipping another_user_cannot_open_a_live_segment: switching to uid {NOBODY} needs root"
        );
        return;
    }
    // Control: the child can open a world-readable file, so a failure
    // below comes from the segment's mode.
    let control = shm(&fresh_name("control"));
    let _c = Remove(control.clone());
    std::fs::write(&control, b"x").unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        nobody_can_open(&control),
        "control: uid {NOBODY} could not open a 0644 file"
    );

    let (seg, name) = create_inbound(8, 0, 1, (2, 4096), false).unwrap();
    let _g = Remove(shm(&name));
    assert!(
        !nobody_can_open(&shm(&name)),
        "uid {NOBODY} opened live segment {name}"
    );
    seg.unlink();
}

#[test]
fn open_refuses_paths_and_bad_names() {
    let long = format!("sncl-{}", "a".repeat(200));
    for bad in [
        "../etc/passwd",
        "/etc/passwd",
        "sncl-../x",
        "sncl-a/b",
        "sncl-/../../etc/passwd",
        "",
        "sncl-",
        "sncl-a.b",
        "sncl-a b",
        "sncl-\u{e9}",
        "sncl-a\0b",
        "other-name",
        long.as_str(),
    ] {
        let e = Segment::open(bad)
            .err()
            .unwrap_or_else(|| panic!("opened {bad:?}"));
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}: {e}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{bad:?}: {e}");
        // Create refuses the same names.
        assert!(Segment::create(bad, 2, 4096).is_err(), "created {bad:?}");
    }
}

#[test]
fn open_does_not_follow_links() {
    // A link to a file elsewhere, and a link to a real, valid segment:
    // both refused, because the link itself is what the name names.
    let (seg, target) = create_inbound(9, 0, 1, (2, 4096), false).unwrap();
    let _t = Remove(shm(&target));
    for (tag, to) in [
        ("passwd", PathBuf::from("/etc/passwd")),
        ("segment", shm(&target)),
    ] {
        let name = fresh_name(tag);
        let _l = Remove(shm(&name));
        std::os::unix::fs::symlink(&to, shm(&name)).unwrap();
        let e = Segment::open(&name)
            .err()
            .unwrap_or_else(|| panic!("followed a link to {}", to.display()));
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(e.to_string().contains(&name), "{e}");
        // Creating over the link fails too (O_EXCL does not follow it).
        assert!(Segment::create(&name, 2, 4096).is_err());
    }
    seg.unlink();
}

#[test]
fn open_refuses_files_others_can_read_or_that_are_not_regular() {
    // Group/other access.
    let (seg, name) = create_inbound(10, 0, 1, (2, 4096), false).unwrap();
    let _g = Remove(shm(&name));
    std::fs::set_permissions(shm(&name), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Segment::open(&name).err().expect("opened a 0644 segment");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("0644"), "{e}");
    seg.unlink();

    // A FIFO with a valid-looking name: refused without blocking.
    let fifo = fresh_name("fifo");
    let _f = Remove(shm(&fifo));
    let c = std::ffi::CString::new(shm(&fifo).into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = Segment::open(&fifo).err().expect("opened a FIFO");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn open_refuses_a_file_of_another_user() {
    if !is_root() {
        eprintln!("skipping open_refuses_a_file_of_another_user: chown needs root");
        return;
    }
    let (seg, name) = create_inbound(11, 0, 1, (2, 4096), false).unwrap();
    let _g = Remove(shm(&name));
    std::os::unix::fs::chown(shm(&name), Some(NOBODY), Some(NOBODY)).unwrap();
    let e = Segment::open(&name)
        .err()
        .expect("opened another user's file");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("65534"), "{e}");
    seg.unlink();
}

#[test]
fn create_rejects_absurd_geometry() {
    let big = 1usize << 32;
    for (slots, slot_bytes) in [
        (0, 4096),
        (2, 0),
        (2, 100),
        (2, 4096 + 32),
        (2, big),
        (2, 4 * big),
        (big, 64),
        (usize::MAX, 64),
        (2, usize::MAX / 64 * 64),
        (usize::MAX, usize::MAX / 64 * 64),
    ] {
        let name = fresh_name("geometry");
        let _g = Remove(shm(&name));
        let e = Segment::create(&name, slots, slot_bytes)
            .err()
            .unwrap_or_else(|| panic!("created {slots} slots of {slot_bytes} bytes"));
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(!shm(&name).exists(), "{name} left behind");
    }
}

#[test]
fn names_are_unguessable_and_cleanup_still_reads_the_pid() {
    let a = segment_name(42, 0, 1, 3, DEAD_PID).unwrap();
    let b = segment_name(42, 0, 1, 3, DEAD_PID).unwrap();
    assert_ne!(a, b, "same arguments, same name: no random token");
    assert!(a.ends_with(&format!("-{DEAD_PID}")), "{a}");
    transport_shm::check_name(&a).unwrap();
    let longest = segment_name(u64::MAX, usize::MAX, usize::MAX, u64::MAX, u32::MAX).unwrap();
    transport_shm::check_name(&longest).unwrap();

    // A stale segment (creator gone) is removed; a live one stays.
    let _ga = Remove(shm(&a));
    drop(Segment::create(&a, 2, 4096).unwrap());
    let live = segment_name(42, 0, 1, 3, std::process::id()).unwrap();
    let _gl = Remove(shm(&live));
    let seg = Segment::create(&live, 2, 4096).unwrap();
    assert!(shm(&a).exists());
    cleanup_stale();
    assert!(!shm(&a).exists(), "stale {a} not removed");
    assert!(shm(&live).exists(), "live {live} removed");
    seg.unlink();
}

/// Minor page faults this thread has taken so far.
fn minor_faults() -> i64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid place for getrusage to write.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    u.ru_minflt
}

/// Both ends map every page of a segment at once: filling every slot
/// afterwards takes no page faults (without it, one per page and process:
/// a message size's first pass through the slots ran 3–4× slower).
#[test]
fn segments_are_mapped_in_whole_at_setup() {
    let (slots, slot_bytes) = (8usize, 128usize << 10);
    let name = fresh_name("populate");
    let _g = Remove(shm(&name));
    let receiver = Segment::create(&name, slots, slot_bytes).unwrap();
    let sender = Segment::open(&name).unwrap();
    let data = vec![7u8; slot_bytes - 64];
    let header = comm_core::wire::PieceHeader {
        comm_id: 1,
        seq: 1,
        fingerprint: None,
        len: data.len() as u32,
        checksum: None,
    };
    let before = minor_faults();
    for i in 0..slots as u64 {
        sender.write_slot(i, &header, &data);
    }
    let mut read = 0usize;
    for i in 0..slots as u64 {
        let (h, _) = receiver.read_inline_slot(i).unwrap();
        read += h.len as usize;
    }
    let faults = minor_faults() - before;
    assert_eq!(read, slots * data.len());
    let pages = slots * slot_bytes / 4096;
    assert!(
        faults < pages as i64 / 8,
        "{faults} page faults filling and reading {pages} pages of slots"
    );
    receiver.unlink();
}

/// Every payload length round-trips, with and without a checksum: up to
/// `IN_HEADER_BYTES` in the slot header's spare word (one cache line for
/// stamp, header and payload), longer ones after the header; a slot is
/// published by its stamp only once written, and a stamp from the slot's
/// previous lap does not publish it again.
#[test]
fn payloads_in_the_header_and_after_it_round_trip_and_stamps_publish() {
    let slots = 2usize;
    let name = fresh_name("stamps");
    let _g = Remove(shm(&name));
    let receiver = Segment::create(&name, slots, 128).unwrap();
    let sender = Segment::open(&name).unwrap();
    let mut index = 0u64;
    for checksum in [None, Some(0)] {
        for len in 0..=2 * transport_shm::IN_HEADER_BYTES + 1 {
            let data: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
            let header = comm_core::wire::PieceHeader {
                comm_id: 1,
                seq: index + 1,
                fingerprint: None,
                len: len as u32,
                checksum,
            };
            assert!(
                !receiver.is_published(index),
                "slot {index} before its write"
            );
            sender.write_slot(index, &header, &data);
            assert!(receiver.is_published(index), "slot {index} after its write");
            // The slot's next lap is not published by this lap's stamp.
            assert!(!receiver.is_published(index + slots as u64));
            let (h, got) = receiver.read_inline_slot(index).unwrap();
            assert_eq!((h.seq, got), (index + 1, &data[..]), "{len} bytes");
            if checksum.is_some() {
                assert_eq!(h.checksum, Some(comm_core::wire::piece_checksum(&data)));
            }
            index += 1;
        }
    }
    receiver.unlink();
}
