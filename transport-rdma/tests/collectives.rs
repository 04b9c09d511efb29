//! Collectives run by comm-core's executor over RDMA connections (emulated
//! verbs), ranks as processes: all_reduce (ring, tree, recursive doubling),
//! reduce_scatter, all_gather and broadcast, float32 sum and int64 max,
//! every output element checked; every other case with checksummed pieces.

mod common;

use std::time::Duration;

use comm_core::algo::{build, Algorithm, Params};
use comm_core::topo::Topology;
use comm_core::transport::Connection;
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{DataType, ReduceOp};
use common::*;
use sncl_runtime::exec::{execute, Buffers, OpContext};
use transport_rdma::{establish, Provider};

const CASES: &[(Collective, Algorithm)] = &[
    (Collective::AllReduce, Algorithm::Ring),
    (Collective::AllReduce, Algorithm::Tree),
    (Collective::AllReduce, Algorithm::Rd),
    (Collective::ReduceScatter, Algorithm::Ring),
    (Collective::AllGather, Algorithm::Ring),
    (Collective::Broadcast, Algorithm::Tree),
];
const TYPES: &[(DataType, ReduceOp)] = &[
    (DataType::Float32, ReduceOp::Sum),
    (DataType::Int64, ReduceOp::Max),
];

/// Rank `r`'s input element `i`: small integers, exact in every type.
fn input(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 29) as i64 - 9
}

fn encode(dtype: DataType, vals: &[i64]) -> Vec<u8> {
    match dtype {
        DataType::Float32 => vals
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        _ => vals.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    }
}

fn reduce(op: ReduceOp, vals: impl Iterator<Item = i64>) -> i64 {
    match op {
        ReduceOp::Max => vals.max().unwrap(),
        _ => vals.sum(),
    }
}

/// Runs one case on this rank and checks its output.
fn run_case(
    conns: &mut [Option<Box<dyn Connection>>],
    me: usize,
    n: usize,
    (coll, algo): (Collective, Algorithm),
    (dtype, op): (DataType, ReduceOp),
    count: usize,
    seq: u64,
) -> Result<(), String> {
    let root = 1 % n;
    let p = Params {
        nranks: n,
        rank: me,
        count,
        root,
        chunk: 1000,
    };
    let sched = build(coll, algo, &p, &Topology::single_node(n))
        .ok_or_else(|| format!("no schedule for {coll:?}/{algo:?}"))?;
    let (send_n, recv_n) = match coll {
        Collective::ReduceScatter => (count * n, count),
        Collective::AllGather => (count, count * n),
        _ => (count, count),
    };
    let send_vals: Vec<i64> = (0..send_n).map(|i| input(me, i)).collect();
    let want: Vec<i64> = (0..recv_n)
        .map(|i| match coll {
            Collective::AllReduce => reduce(op, (0..n).map(|r| input(r, i))),
            Collective::ReduceScatter => reduce(op, (0..n).map(|r| input(r, me * count + i))),
            Collective::AllGather => input(i / count, i % count),
            _ => input(root, i),
        })
        .collect();
    let send = encode(dtype, &send_vals);
    let mut recv = vec![0u8; recv_n * dtype.size()];
    let mut scratch = vec![0u8; sched.scratch_elems * dtype.size()];
    // SAFETY: the three vectors outlive `execute` and nothing else touches
    // them meanwhile; they do not overlap.
    let bufs = unsafe {
        Buffers::new(
            send.as_ptr(),
            send.len(),
            recv.as_mut_ptr(),
            recv.len(),
            scratch.as_mut_ptr(),
            scratch.len(),
        )
    };
    let ctx = OpContext {
        rank: me,
        nranks: n,
        comm_id: 0x5eed,
        seq,
        fingerprint: Fingerprint {
            collective: coll,
            dtype,
            op,
            root: if coll.is_rooted() { root as i32 } else { -1 },
            count: count as u64,
            settings: 0,
        },
        dtype,
        op,
        timeout: Duration::from_secs(20),
        spin: Duration::from_micros(50),
        // Every other case checksums its pieces (staged and lent: the
        // sender's copy or read computes the CRC32C, the receiver's use of
        // the piece verifies it).
        checksum: seq.is_multiple_of(2),
    };
    execute(&sched, &ctx, &bufs, conns, None, None)
        .map_err(|e| format!("{coll:?}/{algo:?} {dtype:?}: {e}"))?;
    if recv != encode(dtype, &want) {
        return Err(format!(
            "rank {me}: {coll:?}/{algo:?} {dtype:?} {op:?} count {count}: wrong values"
        ));
    }
    Ok(())
}

fn child() -> bool {
    let Some((_, me, n, addr, secret, arg)) = child_role() else {
        return false;
    };
    // "zero-copy": slots big enough that pieces reach the transport's
    // zero-copy threshold, so lent pieces are written from the buffers.
    let slot_bytes = if arg == "zero-copy" {
        transport_rdma::ZERO_COPY_MIN + comm_core::wire::HEADER_BYTES
    } else {
        16 << 10
    };
    let store = store_of(addr, secret, me);
    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let result = establish(
        &rdma_setup(me, 4, slot_bytes, 2),
        &Provider::Emulated,
        &*store,
        &peers,
    )
    .map_err(|e| e.to_string())
    .and_then(|list| {
        let mut conns: Vec<Option<Box<dyn Connection>>> = (0..n).map(|_| None).collect();
        for c in list {
            let p = c.peer();
            conns[p] = Some(Box::new(c));
        }
        let mut seq = 0;
        for &case in CASES {
            for &types in TYPES {
                for count in [1, 1000, 50_000] {
                    seq += 1;
                    run_case(&mut conns, me, n, case, types, count, seq)?;
                }
            }
        }
        sncl_bootstrap::store_barrier(&*store, "done", n, Duration::from_secs(30))
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("rank {me}: {e}");
            std::process::exit(1)
        }
    }
}

fn run(test: &str, n: usize) {
    run_with(test, n, "")
}

fn run_with(test: &str, n: usize, arg: &str) {
    let (_server, children) = spawn_ranks(test, n, arg);
    for (rank, (ok, out)) in wait_ranks(children, Duration::from_secs(120))
        .into_iter()
        .enumerate()
    {
        assert!(ok, "rank {rank} of {n}:\n{out}");
    }
}

#[test]
fn collectives_2_ranks() {
    if child() {
        return;
    }
    run("collectives_2_ranks", 2);
}

#[test]
fn collectives_3_ranks() {
    if child() {
        return;
    }
    run("collectives_3_ranks", 3);
}

#[test]
fn collectives_4_ranks() {
    if child() {
        return;
    }
    run("collectives_4_ranks", 4);
}

#[test]
fn collectives_3_ranks_zero_copy() {
    if child() {
        return;
    }
    run_with("collectives_3_ranks_zero_copy", 3, "zero-copy");
}
