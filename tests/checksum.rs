//! `SNCL_CHECKSUM=1` (`Config::checksum`): collectives over shm and tcp with
//! every piece checksummed give the same results; ranks that disagree on
//! the setting plan with rank 0's (shared settings are adopted). (Detection of a corrupt piece is tested
//! in comm-core's executor, where a piece can be corrupted on purpose.)

use std::sync::Arc;
use std::time::Duration;

use comm_core::config::TransportChoice;
use sncl::{Communicator, Config, MemoryStore, ReduceOp, Store};

fn init(
    n: usize,
    id: u64,
    transport: TransportChoice,
    checksum: impl Fn(usize) -> bool,
) -> Vec<sncl::Result<Communicator>> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                checksum: checksum(r),
                transport,
                shm: sncl::ShmSettings {
                    slot_bytes: 4096,
                    ..Default::default()
                },
                tcp: sncl::TcpSettings {
                    piece_bytes: 4096,
                    ..Default::default()
                },
                timeout: Duration::from_secs(30),
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn checksummed_collectives_are_exact_over_shm_and_tcp() {
    for (k, transport) in [TransportChoice::Auto, TransportChoice::Tcp]
        .into_iter()
        .enumerate()
    {
        let comms: Vec<Communicator> = init(3, 0xc5c0 + k as u64, transport, |_| true)
            .into_iter()
            .map(|c| c.expect("init"))
            .collect();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let r = c.rank();
                    for count in [1usize, 1000, 100_003] {
                        let send: Vec<f32> =
                            (0..count).map(|i| ((i * 3 + r) % 17) as f32).collect();
                        let mut got = vec![0f32; count];
                        c.all_reduce(&send, &mut got, ReduceOp::Sum).unwrap();
                        for (i, g) in got.iter().enumerate() {
                            let want: f32 = (0..3).map(|q| ((i * 3 + q) % 17) as f32).sum();
                            assert_eq!(*g, want, "{transport} rank {r} count {count} element {i}");
                        }
                    }
                });
            }
        });
    }
}

/// Shared settings are rank 0's: a rank that set otherwise adopts it (else
/// rank 0 would refuse rank 1's unchecksummed pieces, and rank 1 would not
/// verify rank 0's).
#[test]
fn ranks_adopt_rank_0s_checksum_setting() {
    for root_checks in [true, false] {
        let comms: Vec<Communicator> = init(
            2,
            0xc5d0 + u64::from(root_checks),
            TransportChoice::Auto,
            |r| (r == 0) == root_checks,
        )
        .into_iter()
        .map(|c| c.expect("init"))
        .collect();
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let send = vec![1.5f32; 10_000];
                    let mut got = vec![0f32; 10_000];
                    c.all_reduce(&send, &mut got, ReduceOp::Sum).unwrap();
                    assert!(got.iter().all(|&x| x == 3.0), "rank {}", c.rank());
                });
            }
        });
    }
}

/// Tagged point-to-point pieces carry and verify checksums too.
#[test]
fn checksummed_tagged_messages_arrive_intact() {
    for (k, transport) in [TransportChoice::Auto, TransportChoice::Tcp]
        .into_iter()
        .enumerate()
    {
        let comms: Vec<Communicator> = init(2, 0xc5e0 + k as u64, transport, |_| true)
            .into_iter()
            .map(|c| c.expect("init"))
            .collect();
        std::thread::scope(|s| {
            let (a, b) = (&comms[0], &comms[1]);
            s.spawn(move || {
                let msg: Vec<u32> = (0..50_000).collect();
                a.send_tagged(&msg, 1, 7).expect("send_tagged");
            });
            s.spawn(move || {
                let mut got = vec![0u32; 50_000];
                b.recv_tagged(&mut got, Some(0), 7).expect("recv_tagged");
                assert!(
                    got.iter().enumerate().all(|(i, &x)| x == i as u32),
                    "{transport}"
                );
            });
        });
    }
}
