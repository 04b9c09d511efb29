//! TLS on TCP through whole jobs (`SNCL_TLS_*`, docs/SECURITY.md): ranks
//! as processes with the files `commbench tls-certs` writes run checked
//! collectives over TCP; a rank with another job's certificate, a rank
//! without TLS and a half-configured rank are refused with errors that say
//! why, and nothing hangs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod ranks;
use ranks::{finish, free_port, job_secret, rank_cmd, COMMBENCH};

/// A fresh directory for one test's job sets.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sncl-cb-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `commbench tls-certs DIR`; the three settings it prints.
fn job_set(dir: &Path) -> Vec<(String, String)> {
    let out = Command::new(COMMBENCH)
        .args(["tls-certs", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("NAME=value");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Runs `world` ranks of a small checked all-reduce over TCP; rank r gets
/// `env_of(r)` besides the launch variables. Every rank's output.
fn job(
    world: usize,
    timeout_ms: &str,
    env_of: &dyn Fn(usize) -> Vec<(String, String)>,
) -> Vec<Output> {
    let root = format!("127.0.0.1:{}", free_port());
    let secret = job_secret();
    let args = [
        "all_reduce",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
        "-c",
        "1",
    ];
    let children: Vec<_> = (0..world)
        .map(|r| {
            let env = env_of(r);
            let mut extra: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            extra.push(("SNCL_TRANSPORT", "tcp"));
            extra.push(("SNCL_TIMEOUT_MS", timeout_ms));
            rank_cmd(&args, (r, world), &root, &secret, &extra)
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn tls_certs_writes_a_private_job_set() {
    let dir = temp_dir("set");
    let set = job_set(&dir);
    let names: Vec<&str> = set.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["SNCL_TLS_CERT", "SNCL_TLS_KEY", "SNCL_TLS_CA"]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(Path::new(&set[1].1)), 0o600);
    for (_, path) in &set {
        assert!(
            std::fs::read_to_string(path)
                .unwrap()
                .contains("-----BEGIN"),
            "{path}"
        );
    }
}

#[test]
fn three_ranks_over_tls_run_checked_collectives() {
    let dir = temp_dir("ok");
    let set = job_set(&dir);
    for (r, o) in job(3, "60000", &|_| set.clone()).iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", stderr(o));
    }
}

#[test]
fn a_rank_with_another_jobs_certificate_is_refused() {
    let (a, b) = (temp_dir("job-a"), temp_dir("job-b"));
    let (set_a, set_b) = (job_set(&a), job_set(&b));
    let out = job(3, "8000", &|r| {
        if r == 2 {
            set_b.clone()
        } else {
            set_a.clone()
        }
    });
    let e = stderr(&out[2]);
    assert!(!out[2].status.success());
    assert!(e.contains("TLS") && e.contains("127.0.0.1"), "rank 2: {e}");
    // The others end at their deadline, with an error (no hang: `job`
    // would have killed them after 60 s, and they would not report).
    for o in &out[..2] {
        assert!(!o.status.success(), "{}", stderr(o));
    }
}

#[test]
fn a_rank_without_tls_is_told_the_store_requires_it() {
    let dir = temp_dir("mixed");
    let set = job_set(&dir);
    let out = job(2, "5000", &|r| {
        if r == 1 {
            Vec::new()
        } else {
            set.clone()
        }
    });
    let e = stderr(&out[1]);
    assert!(
        e.contains("SNCL_TLS_CERT") && e.contains("TLS"),
        "rank 1: {e}"
    );
}

#[test]
fn half_configured_tls_is_an_error_naming_what_is_missing() {
    let dir = temp_dir("half");
    let set = job_set(&dir);
    let out = job(1, "5000", &|_| vec![set[0].clone()]);
    let e = stderr(&out[0]);
    assert!(!out[0].status.success());
    assert!(
        e.contains("SNCL_TLS_KEY") && e.contains("SNCL_TLS_CA"),
        "{e}"
    );
}
