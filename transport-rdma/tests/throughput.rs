//! 64 MiB one-way transfer over emulated RDMA vs the shm slot-FIFO
//! transport in the same run (two threads, the same FIFO geometry). The
//! receiver copies every piece out, as a reduction would read it. Ignored
//! by default (timing on a shared machine); run with
//! `cargo test -p transport-rdma --profile test --test throughput -- --ignored --nocapture`.

mod common;

use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, Outgoing, Space};
use common::*;
use transport_shm::{create_inbound, Segment, ShmConnection};

const TOTAL: usize = 64 << 20;

fn transfer(mut tx: Box<dyn Connection>, mut rx: Box<dyn Connection>) -> Duration {
    let piece = tx
        .max_piece(MemoryKind::Host)
        .min(rx.max_piece(MemoryKind::Host));
    let n = TOTAL.div_ceil(piece);
    let src = vec![0x5au8; piece];
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60);
    let sender = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < n {
            assert!(Instant::now() < deadline, "sender stuck");
            if tx
                .try_post_send(&header(piece, sent as u64 + 1), Outgoing::copied(&src))
                .unwrap()
            {
                sent += 1;
            } else {
                std::hint::spin_loop();
            }
        }
        while !tx.flush().unwrap() {}
        tx
    });
    let mut dst = vec![0u8; TOTAL + piece];
    let mut got = 0;
    while got < n {
        assert!(Instant::now() < deadline, "receiver stuck");
        let off = got * piece;
        let more = rx
            .try_recv(Space::Host, &mut |_, p| {
                let d = p.host().expect("a host piece");
                dst[off..off + d.len()].copy_from_slice(d);
                Ok(())
            })
            .unwrap();
        if more {
            got += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    let took = start.elapsed();
    drop(sender.join().unwrap());
    assert!(dst[..TOTAL].iter().all(|&b| b == 0x5a));
    took
}

fn shm_pair(slots: usize, slot_bytes: usize) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let id = std::process::id() as u64 ^ 0x7777;
    let (in0, n0) = create_inbound(id, 1, 0, (slots, slot_bytes), true).unwrap();
    let (in1, n1) = create_inbound(id, 0, 1, (slots, slot_bytes), true).unwrap();
    let c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
    let c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
    c0.unlink();
    c1.unlink();
    (Box::new(c0), Box::new(c1))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
#[ignore = "a timing measurement; scripts/test.sh --long"]
fn emulated_rdma_vs_shm_64mib() {
    for (slots, slot_bytes) in [(8, 128 << 10), (8, 512 << 10), (16, 1 << 20)] {
        let mut shm = Vec::new();
        let mut rdma = Vec::new();
        for _ in 0..5 {
            let (a, b) = shm_pair(slots, slot_bytes);
            shm.push(transfer(a, b));
            let (a, b) = pair(slots, slot_bytes, 1);
            rdma.push(transfer(Box::new(a), Box::new(b)));
        }
        let (s, r) = (median(shm), median(rdma));
        let gbs = |d: Duration| TOTAL as f64 / d.as_secs_f64() / 1e9;
        eprintln!(
            "{slots} slots x {slot_bytes} B: shm {:.2} GB/s, emulated rdma {:.2} GB/s, ratio {:.2}",
            gbs(s),
            gbs(r),
            s.as_secs_f64() / r.as_secs_f64()
        );
    }
}
