//! `TcpEndpoint::establish_some`, the batches of a communicator whose TCP
//! pairs connect at their first use: a higher-ranked peer whose sockets
//! arrive while this rank still connects an earlier batch is accepted and
//! kept for its own batch (where `establish` would refuse it as
//! unexpected), and connects when that batch comes.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use comm_core::transport::Connection;
use transport_tcp::{TcpEndpoint, TcpSetup};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn setup(rank: usize) -> TcpSetup {
    TcpSetup {
        rank,
        comm_id: 0x1a2e,
        secret: *b"0123456789abcdef",
        nsocks: 2,
        max_piece: 4096,
        deadline: Instant::now() + Duration::from_secs(3),
        pacing: Default::default(),
        tls: None,
    }
}

/// Rank 2 reaches its pair with rank 0 while rank 0 still waits for rank
/// 1 in its first batch; `later` says whether rank 0 names rank 2 as a
/// later peer. Returns rank 2's outcome.
fn rank_2_ahead_of_rank_0(later: BTreeSet<usize>) -> Result<usize, String> {
    let eps: Vec<TcpEndpoint> = (0..3)
        .map(|_| TcpEndpoint::bind(LOCALHOST).unwrap())
        .collect();
    let addr: Vec<SocketAddr> = eps.iter().map(TcpEndpoint::local_addr).collect();
    thread::scope(|s| {
        let (ep0, ep1, ep2) = (&eps[0], &eps[1], &eps[2]);
        let a0 = addr[0];
        let two = s.spawn(move || {
            ep2.establish(&setup(2), &[(0, a0)])
                .map(|c| c[0].peer())
                .map_err(|e| e.to_string())
        });
        thread::sleep(Duration::from_millis(300));
        let zero = s.spawn(move || {
            let first = ep0.establish_some(&setup(0), &[(1, addr[1])], &later);
            let second = first
                .is_ok()
                .then(|| ep0.establish_some(&setup(0), &[(2, addr[2])], &BTreeSet::new()));
            (
                first.map(|c| c[0].peer()),
                second.map(|r| r.map(|c| c[0].peer())),
            )
        });
        // Rank 1 comes late, so rank 2's hellos arrive during rank 0's
        // first batch.
        thread::sleep(Duration::from_millis(300));
        let one = ep1.establish(&setup(1), &[(0, a0)]).map(|c| c[0].peer());
        assert_eq!(one.unwrap(), 0);
        let (first, second) = zero.join().unwrap();
        assert_eq!(first.unwrap(), 1);
        let two = two.join().unwrap();
        if let Some(second) = second {
            if two.is_ok() {
                assert_eq!(second.unwrap(), 2);
            }
        }
        two
    })
}

#[test]
fn a_peer_ahead_of_its_batch_is_kept_for_it() {
    assert_eq!(rank_2_ahead_of_rank_0(BTreeSet::from([2])), Ok(0));
}

#[test]
fn without_later_peers_it_is_refused_as_unexpected() {
    let e = rank_2_ahead_of_rank_0(BTreeSet::new()).expect_err("refused");
    assert!(e.contains("refused it") || e.contains("closed"), "{e}");
}
