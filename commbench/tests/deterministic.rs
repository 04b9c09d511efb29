//! Deterministic mode across processes: with `SNCL_DETERMINISTIC=1`
//! commbench fills float inputs with values whose sums round differently
//! in almost any other order and checks every result bit for bit against
//! the canonical order (its exit status is 1 on any differing element).
//! Process ranks over shared memory and TCP, host and emulated device
//! memory (the device rows are checked against the same operation on host
//! memory), 3 and 5 ranks, every reducing collective and algorithm.

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_commbench");

/// Runs commbench in deterministic mode; panics naming the run unless it
/// exits 0 with every row's wrong count 0.
fn run(args: &[&str], env: &[(&str, &str)]) {
    let o = Command::new(BIN)
        .args(args)
        .args(["-n", "2", "-w", "1"])
        .env("SNCL_DETERMINISTIC", "1")
        .env("SNCL_TIMEOUT_MS", "60000")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("running commbench");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "commbench {args:?} {env:?} failed ({:?}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    assert!(!rows.is_empty(), "commbench {args:?}: no rows\n{out}");
}

#[test]
fn every_collective_and_algorithm_over_shared_memory_and_tcp() {
    for np in ["3", "5"] {
        for transport in ["shm", "tcp"] {
            let env = [("SNCL_TRANSPORT", transport)];
            for (coll, algos) in [
                ("all_reduce", "ring,flat-ring,tree,rd"),
                ("reduce_scatter", "ring,flat-ring"),
                ("reduce", "tree,ring"),
            ] {
                run(
                    &[
                        coll, "--np", np, "-b", "4", "-e", "1M", "-f", "16", "-d", "float",
                        "--algo", algos,
                    ],
                    &env,
                );
            }
            run(
                &[
                    "all_reduce",
                    "--np",
                    np,
                    "-b",
                    "2",
                    "-e",
                    "256K",
                    "-f",
                    "8",
                    "-d",
                    "bfloat16",
                    "-o",
                    "all",
                ],
                &env,
            );
        }
    }
}

#[test]
fn emulated_device_memory_gives_the_host_bits() {
    for (coll, dtype) in [
        ("all_reduce", "float"),
        ("reduce_scatter", "half"),
        ("reduce", "bfloat16"),
    ] {
        run(
            &[
                coll, "--np", "3", "-b", "8", "-e", "512K", "-f", "8", "-d", dtype, "--device",
                "emu",
            ],
            &[],
        );
    }
}
