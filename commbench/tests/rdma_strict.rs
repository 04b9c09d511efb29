//! RDMA on the strict emulated provider (`SNCL_IB_EMULATE=strict`) across
//! two test-bed nodes (issue 36).
//!
//! Pinned memory (risk 2), under the kernel's rule: a rank whose
//! `RLIMIT_MEMLOCK` is too small for its FIFOs and that lacks `CAP_IPC_LOCK` falls back to TCP with a warning naming the
//! limit (the strict model would refuse its registrations at connect: the
//! job failed before the check moved ahead of the transport's offer); the
//! same limit with the capability (root's) binds nothing and RDMA runs;
//! `SNCL_TRANSPORT=rdma` turns the fallback into an error with the reason.
//!
//! GIDs (risk 1): the strict port is RoCE on a routed fabric; by default the
//! port's RoCE v2 IPv4 entry is chosen and the job runs over RDMA; with the
//! old fixed index 0 (RoCE v1, link-local) every WRITE ends in retry
//! exceeded and the job fails, naming the peer.
//!
//! Needs root (namespaces, dropping a capability); skips with the reason
//! otherwise.

mod bed;

use bed::{repo_root, skip_reason};
use std::process::{Command, Output};

/// A 2-node all-reduce on the bed, each rank under `prlimit --memlock`
/// 64 KiB, without `CAP_IPC_LOCK` where `drop_cap`.
fn run(drop_cap: bool, forced_rdma: bool) -> Output {
    let mut cmd = bed_command();
    if drop_cap {
        cmd.args([
            "setpriv",
            "--inh-caps",
            "-ipc_lock",
            "--bounding-set",
            "-ipc_lock",
        ]);
    }
    cmd.args(["prlimit", "--memlock=65536:65536"]);
    all_reduce(&mut cmd);
    if forced_rdma {
        cmd.env("SNCL_TRANSPORT", "rdma");
    } else {
        cmd.env_remove("SNCL_TRANSPORT");
    }
    cmd.output().expect("running scripts/testbed.sh")
}

/// The bed's command line up to the ranks' command.
fn bed_command() -> Command {
    let mut cmd = Command::new(repo_root().join("scripts/testbed.sh"));
    cmd.args(["--nodes", "2", "--no-limit", "--timeout", "60", "-q", "--"]);
    cmd
}

/// The ranks' command: commbench on the strict model.
fn all_reduce(cmd: &mut Command) {
    cmd.arg(env!("CARGO_BIN_EXE_commbench"))
        .args("all_reduce -b 1M -e 1M -n 2 -w 1 -c 1".split(' '))
        .env("SNCL_IB_EMULATE", "strict")
        .env("SNCL_TIMEOUT_MS", "30000")
        .env_remove("SNCL_IB_DISABLE")
        .env_remove("SNCL_IB_GID_INDEX");
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_memlock_limit_without_cap_ipc_lock_falls_back_to_tcp_and_binds_nothing_with_it() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the RDMA memlock test: {why}");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err()
        || Command::new("prlimit").arg("--version").output().is_err()
    {
        eprintln!("skipping the RDMA memlock test: setpriv / prlimit (util-linux) missing");
        return;
    }
    let o = run(true, false);
    let t = text(&o);
    assert!(o.status.success(), "fallback run failed:\n{t}");
    assert!(t.contains("Out of bounds values : 0 OK"), "{t}");
    assert!(t.contains("# transports of rank 0: 1:tcp"), "{t}");
    assert!(
        t.contains("rdma transport not used, TCP instead") && t.contains("RLIMIT_MEMLOCK"),
        "no warning naming the limit:\n{t}"
    );

    let o = run(false, false);
    let t = text(&o);
    assert!(o.status.success(), "run with CAP_IPC_LOCK failed:\n{t}");
    assert!(t.contains("# transports of rank 0: 1:rdma"), "{t}");

    let o = run(true, true);
    let t = text(&o);
    assert!(
        !o.status.success(),
        "SNCL_TRANSPORT=rdma ran without RDMA:\n{t}"
    );
    assert!(
        t.contains("RLIMIT_MEMLOCK"),
        "the refusal names no reason:\n{t}"
    );
}

#[test]
fn roce_connections_use_the_routable_v2_gid_and_index_0_does_not_cross_the_fabric() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the RDMA GID test: {why}");
        return;
    }
    let mut cmd = bed_command();
    all_reduce(&mut cmd);
    let o = cmd.output().expect("running scripts/testbed.sh");
    let t = text(&o);
    assert!(o.status.success(), "default GID failed:\n{t}");
    assert!(t.contains("# transports of rank 0: 1:rdma"), "{t}");

    let mut cmd = bed_command();
    all_reduce(&mut cmd);
    // The strict NIC retries an unanswered WRITE for 4.096 us x 2^timeout x
    // 8: 0.5 s at 14 (34 s at the default 20).
    let o = cmd
        .env("SNCL_IB_TIMEOUT", "14")
        .env("SNCL_IB_GID_INDEX", "0")
        .output()
        .expect("running scripts/testbed.sh");
    let t = text(&o);
    assert!(
        !o.status.success(),
        "RoCE v1 link-local crossed a routed fabric:\n{t}"
    );
    assert!(
        t.contains("retry counter exceeded") && t.contains("rank 1"),
        "{t}"
    );
}
