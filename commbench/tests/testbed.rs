//! The two-tier test bed (network namespaces as nodes behind a rate-limited
//! switch, `scripts/testbed.sh`): 4 nodes x 2 ranks placed round-robin, every
//! hierarchical collective correct (commbench -c 1), and the bytes each rank
//! sent across nodes equal to the algorithm's exact count.
//! Needs root and `ip netns`; skips with the reason otherwise.

mod bed;

use bed::{repo_root, skip_reason};

use std::process::Command;

const NODES: u64 = 4;
const LOCAL: u64 = 2;
const ITERS: u64 = 2;

fn run_bed(op: &str, bytes: u64, extra: &[&str]) -> Vec<serde_json::Value> {
    let root = repo_root();
    let stats = std::env::temp_dir().join(format!("sncl-testbed-{op}-{}.json", std::process::id()));
    let size = bytes.to_string();
    let iters = ITERS.to_string();
    let mut cmd = Command::new(root.join("scripts/testbed.sh"));
    cmd.args([
        "--nodes",
        "4",
        "--ranks-per-node",
        "2",
        "--rate",
        "1gbit",
        "--placement",
        "round-robin",
        "--timeout",
        "120",
        "-q",
        "--",
    ])
    .arg(env!("CARGO_BIN_EXE_commbench"))
    .args([
        op, "-b", &size, "-e", &size, "-n", &iters, "-w", "1", "-c", "1", "--algo", "hier",
    ])
    .args(extra)
    .arg("--stats-json")
    .arg(&stats)
    .env("SNCL_TIMEOUT_MS", "60000");
    let out = cmd.output().expect("running scripts/testbed.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{op} on the test bed failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Out of bounds values : 0 OK"), "{op}: {text}");
    let json = std::fs::read_to_string(&stats).expect("stats json written by rank 0");
    let _ = std::fs::remove_file(&stats);
    serde_json::from_str::<Vec<serde_json::Value>>(&json).expect("stats json")
}

fn inter_sent(stats: &[serde_json::Value]) -> Vec<u64> {
    stats
        .iter()
        .map(|s| s["inter_sent"].as_u64().unwrap())
        .collect()
}

#[test]
fn hierarchical_collectives_on_four_nodes() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the test-bed test: {why}");
        return;
    }
    // Timed iterations run out of place and in place: 2 x ITERS ops each.
    let ops = 2 * ITERS;
    let bytes: u64 = 4 << 20;

    // all_reduce: each rank owns one of L shards and runs a ring all-reduce
    // of it over the N nodes: 2 (N-1)/N x bytes / L.
    let s = run_bed("all_reduce", bytes, &[]);
    let want = 2 * (NODES - 1) * (bytes / LOCAL) / NODES;
    assert_eq!(inter_sent(&s), vec![want * ops; 8], "all_reduce");
    let share: f64 = s
        .iter()
        .map(|x| x["cross_tier_share"].as_f64().unwrap())
        .sum::<f64>()
        / 8.0;
    let intra_want = 2 * (LOCAL - 1) * bytes / LOCAL; // intra RS + AG per rank
    let theory = want as f64 / (want + intra_want) as f64;
    assert!(
        (share - theory).abs() < 1e-9,
        "cross-tier share {share} vs {theory}"
    );

    // all_gather (size = total): every rank forwards the N-1 other nodes'
    // blocks of its local index once.
    let block = bytes / 8;
    let s = run_bed("all_gather", bytes, &[]);
    assert_eq!(
        inter_sent(&s),
        vec![(NODES - 1) * block * ops; 8],
        "all_gather"
    );

    // reduce_scatter (size = total): the cross-node ring sends N-1 blocks.
    let s = run_bed("reduce_scatter", bytes, &[]);
    assert_eq!(
        inter_sent(&s),
        vec![(NODES - 1) * block * ops; 8],
        "reduce_scatter"
    );

    // broadcast from rank 0: binomial tree over the node leaders [0, 1, 2, 3]
    // (round-robin: rank k leads node k): 0 sends twice, 2 once.
    let s = run_bed("broadcast", bytes, &["-r", "0"]);
    let mut want = vec![0u64; 8];
    want[0] = 2 * bytes * ops;
    want[2] = bytes * ops;
    assert_eq!(inter_sent(&s), want, "broadcast");

    // reduce to rank 0: leaders 1, 2 and 3 each send once.
    let s = run_bed("reduce", bytes, &["-r", "0"]);
    let mut want = vec![0u64; 8];
    want[1] = bytes * ops;
    want[2] = bytes * ops;
    want[3] = bytes * ops;
    assert_eq!(inter_sent(&s), want, "reduce");
}

/// Without a topology file the compressed all-reduce measures the node
/// links itself and paces its exchange (issue 35 item 5): rank 0 logs the
/// goodput it measured, which must be the bed's configured rate less
/// headers.
#[test]
fn compressed_exchange_measures_the_links_it_paces() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the test-bed test: {why}");
        return;
    }
    let root = repo_root();
    let out = Command::new(root.join("scripts/testbed.sh"))
        .args("--nodes 2 --ranks-per-node 2 --rate 100mbit --timeout 120 -q --".split(' '))
        .arg(env!("CARGO_BIN_EXE_commbench"))
        .args("all_reduce -b 1M -e 1M -n 2 -w 1 -c 1 --compress int8".split(' '))
        .env("SNCL_TIMEOUT_MS", "60000")
        .env("SNCL_DEBUG", "INFO")
        .env("SNCL_DEBUG_SUBSYS", "TUNING")
        .env_remove("SNCL_TOPO_FILE")
        .env_remove("SNCL_INTER_BW")
        .env_remove("SNCL_COMPRESS_PACING")
        .output()
        .expect("running scripts/testbed.sh");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("Out of bounds values : 0 OK"),
        "compressed all-reduce on the bed failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let logged = format!("{stdout}{stderr}");
    let line = logged
        .lines()
        .find(|l| l.contains("node links measured"))
        .unwrap_or_else(|| panic!("no measurement logged:\n{logged}"));
    let mb_per_s: f64 = line
        .split("link_mb_per_s=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no link_mb_per_s in {line}"));
    // 100 Mbit/s is 12.5 MB/s on the wire; TCP payload is ~95 % of it (the
    // lower bound leaves room for a loaded CI machine).
    assert!(
        (7.0..=13.5).contains(&mb_per_s),
        "measured {mb_per_s} MB/s on a 12.5 MB/s link: {line}"
    );
}
