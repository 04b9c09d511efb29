//! The RDMA transport end to end over emulated verbs: pieces of many sizes
//! in both directions between 2–4 ranks as processes, striping over queue
//! pairs, one device context per process shared by all of its connections,
//! credit flow under a full FIFO, and the machine's own verbs
//! availability (skipped with a reason where there is no library/device).

mod common;

use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::wire::HEADER_BYTES;
use common::*;
use transport_rdma::{establish, probe, Availability, IbSettings, Provider};

const SLOT_BYTES: usize = 64 << 10;

fn sizes() -> Vec<usize> {
    let max = SLOT_BYTES - HEADER_BYTES;
    let mut v = vec![0, 1, 7, 40, 4095, 4096, 4097, max, max - 1, 1000];
    for i in 0..150 {
        v.push((i * 7919 + 13) % (max + 1));
    }
    v
}

/// Child body: connect to every other rank, exchange, exit 0 on success.
fn run_child() -> bool {
    let Some((_, rank, nranks, addr, secret, arg)) = child_role() else {
        return false;
    };
    let qps: usize = arg.parse().unwrap_or(1);
    let store = store_of(addr, secret, rank);
    let peers: Vec<usize> = (0..nranks).filter(|&p| p != rank).collect();
    let setup = rdma_setup(rank, 4, SLOT_BYTES, qps);
    let result = establish(&setup, &Provider::Emulated, &*store, &peers)
        .map_err(|e| e.to_string())
        .and_then(|mut conns| {
            // One device context per process, shared by every peer's
            // connection (issue 36, risk 7), not one per peer.
            let open = transport_rdma::emu::contexts_open();
            if open != 1 {
                return Err(format!(
                    "{open} emulated device contexts open for {} connections (expected 1)",
                    conns.len()
                ));
            }
            exchange(
                rank,
                &mut conns,
                &sizes(),
                Instant::now() + Duration::from_secs(30),
            )?;
            // Everyone has everything before anyone closes.
            sncl_bootstrap::store_barrier(&*store, "done", nranks, Duration::from_secs(20))
                .map_err(|e| e.to_string())?;
            // The context closes with the last connection.
            drop(conns);
            match transport_rdma::emu::contexts_open() {
                0 => Ok(()),
                n => Err(format!(
                    "{n} contexts still open after every connection closed"
                )),
            }
        });
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("rank {rank} failed: {e}");
            std::process::exit(1)
        }
    }
}

fn run_ranks(test: &str, nranks: usize, qps: usize) {
    let (_server, children) = spawn_ranks(test, nranks, &qps.to_string());
    for (rank, (ok, out)) in wait_ranks(children, Duration::from_secs(90))
        .into_iter()
        .enumerate()
    {
        assert!(ok, "rank {rank} of {nranks} failed:\n{out}");
    }
}

#[test]
fn pieces_both_directions_2_ranks() {
    if run_child() {
        return;
    }
    run_ranks("pieces_both_directions_2_ranks", 2, 1);
}

#[test]
fn pieces_both_directions_3_ranks_striped() {
    if run_child() {
        return;
    }
    run_ranks("pieces_both_directions_3_ranks_striped", 3, 2);
}

#[test]
fn pieces_both_directions_4_ranks_striped() {
    if run_child() {
        return;
    }
    run_ranks("pieces_both_directions_4_ranks_striped", 4, 3);
}

#[test]
fn a_full_fifo_refuses_until_credits_return() {
    let slots = 4;
    let (mut a, mut b) = pair(slots, 4096, 2);
    assert_eq!(a.kind(), "rdma");
    assert_eq!(a.max_piece(MemoryKind::Host), 4096 - HEADER_BYTES);
    let data = vec![3u8; 100];
    for i in 0..slots {
        assert!(a
            .try_post_send(&header(100, i as u64 + 1), Outgoing::copied(&data))
            .unwrap());
    }
    // The receiver has not consumed anything: no credit, the FIFO is full.
    for _ in 0..50 {
        assert!(!a
            .try_post_send(&header(100, 99), Outgoing::copied(&data))
            .unwrap());
        b.flush().unwrap();
    }
    // Consume half: a credit comes back and exactly that many slots free up.
    for i in 0..slots / 2 {
        assert!(b
            .try_recv(Space::Host, &mut |h, p| {
                let d = p.host().expect("a host piece");
                assert_eq!((h.seq, d), (i as u64 + 1, data.as_slice()));
                Ok(())
            })
            .unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut more = 0;
    while more < slots / 2 {
        assert!(Instant::now() < deadline, "credits never arrived");
        if a.try_post_send(
            &header(100, (slots + more) as u64 + 1),
            Outgoing::copied(&data),
        )
        .unwrap()
        {
            more += 1;
        }
    }
    assert!(!a
        .try_post_send(&header(100, 99), Outgoing::copied(&data))
        .unwrap());
    // Everything arrives in order.
    let mut seqs = Vec::new();
    while b
        .try_recv(Space::Host, &mut |h, p| {
            let _ = p.host().expect("a host piece");
            seqs.push(h.seq);
            Ok(())
        })
        .unwrap()
    {}
    assert_eq!(seqs, (3..=6).collect::<Vec<u64>>());
}

#[test]
fn oversized_piece_is_an_error_not_a_panic() {
    let (mut a, _b) = pair(2, 4096, 1);
    let big = vec![0u8; 4096];
    let e = a
        .try_post_send(&header(big.len(), 1), Outgoing::copied(&big))
        .unwrap_err()
        .to_string();
    assert!(e.contains("peer rank 1") && e.contains("largest"), "{e}");
}

#[test]
fn mismatched_settings_are_refused_naming_the_peer() {
    let store = sncl_bootstrap::MemoryStore::new();
    let s1 = store.for_rank(1);
    let t = std::thread::spawn(move || {
        let mut setup = rdma_setup(1, 4, 4096, 2);
        setup.deadline = Instant::now() + Duration::from_secs(3);
        establish(&setup, &Provider::Emulated, &s1, &[0]).map(|_| ())
    });
    let mut setup = rdma_setup(0, 4, 4096, 1);
    setup.deadline = Instant::now() + Duration::from_secs(3);
    let e = establish(&setup, &Provider::Emulated, &store, &[1])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("peer rank 1") && e.contains("SNCL_IB_QPS_PER_CONN"),
        "{e}"
    );
    let e = t.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("peer rank 0"), "{e}");
}

#[test]
fn this_machine_without_verbs_is_skipped_with_a_reason() {
    match probe(&IbSettings::default()) {
        Availability::Unavailable(reason) => {
            eprintln!("rdma transport skipped here: {reason}");
            assert!(
                reason.contains("libibverbs.so.1")
                    && (reason.contains("install libibverbs1")
                        || reason.contains("no RDMA device"))
                    || reason.contains("no ACTIVE RDMA port"),
                "{reason}"
            );
        }
        Availability::Ready(p) => eprintln!("this machine has an RDMA device: {p}"),
    }
    let off = IbSettings {
        disable: true,
        ..IbSettings::default()
    };
    assert_eq!(
        probe(&off),
        Availability::Unavailable("SNCL_IB_DISABLE=1".into())
    );
    assert_eq!(probe(&settings(1)), Availability::Ready(Provider::Emulated));
}
