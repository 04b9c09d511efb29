//! `TcpSetup::pacing`: the sockets to a listed peer carry the kernel pacing
//! cap (`SO_MAX_PACING_RATE`) on both ends, the others none. (That the
//! cap paces is the kernel's; the test bed measures what it does: docs/perf-notes/NOTEBOOK.md §3.)

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use comm_core::transport::Connection;
use transport_tcp::{TcpConnection, TcpEndpoint, TcpSetup};

const NSOCKS: usize = 2;

fn setup(rank: usize, pacing: BTreeMap<usize, u64>) -> TcpSetup {
    TcpSetup {
        rank,
        comm_id: 0x5ac1,
        secret: [7; 16],
        nsocks: NSOCKS,
        max_piece: 64 << 10,
        deadline: Instant::now() + Duration::from_secs(20),
        pacing,
        tls: None,
    }
}

/// Connects three ranks; rank r paces its sockets to the peers in `paced[r]`.
fn connect(paced: [&[(usize, u64)]; 3]) -> Vec<Vec<TcpConnection>> {
    let eps: Vec<TcpEndpoint> = (0..3)
        .map(|_| TcpEndpoint::bind(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("bind"))
        .collect();
    let addrs: Vec<_> = eps.iter().map(TcpEndpoint::local_addr).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(r, ep)| {
                let peers: Vec<_> = (0..3).filter(|&p| p != r).map(|p| (p, addrs[p])).collect();
                let pacing = paced[r].iter().copied().collect();
                s.spawn(move || ep.establish(&setup(r, pacing), &peers).expect("establish"))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

#[test]
fn listed_peers_are_paced_on_both_ends_and_others_not() {
    // Rank 0 paces to rank 2 only; rank 2 paces to rank 0; rank 1 to nobody.
    let conns = connect([&[(2, 1_484_375)], &[], &[(0, 1_484_375)]]);
    for (r, cs) in conns.iter().enumerate() {
        for c in cs {
            let want = if (r, c.peer()) == (0, 2) || (r, c.peer()) == (2, 0) {
                1_484_375
            } else {
                u64::MAX
            };
            assert_eq!(
                c.max_pacing_rates(),
                vec![want; NSOCKS],
                "rank {r} to peer {}",
                c.peer()
            );
        }
    }
}
