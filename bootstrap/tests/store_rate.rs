//! The store server's request rate and one client's round trip on
//! loopback: what the simulator's bootstrap model (`sim::bootstrap`,
//! `commbench sim init`) is calibrated with. A communicator's rendezvous
//! sends every rank's `N` reads of a record to this one server.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use sncl_bootstrap::{Store, TcpStore, TcpStoreServer};

const RECORD: usize = 256;

#[test]
fn requests_per_second_and_round_trip_on_loopback() {
    let secret = [7u8; 16];
    let server = TcpStoreServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), secret)
        .expect("a store server");
    let addr = server.local_addr();
    let deadline = Instant::now() + Duration::from_secs(10);
    let keys = 64;
    let first = TcpStore::connect(addr, secret, 0, deadline).expect("a client");
    for k in 0..keys {
        first.set(&format!("info/{k}"), &[k as u8; RECORD]).unwrap();
    }
    // One client, requests one after another: the round trip.
    let gets = 2000;
    let t = Instant::now();
    for i in 0..gets {
        let v = first
            .get(&format!("info/{}", i % keys), Duration::from_secs(5))
            .unwrap();
        assert_eq!(v.len(), RECORD);
    }
    let rtt_us = t.elapsed().as_secs_f64() * 1e6 / gets as f64;
    // A new client: TCP connection and the store's handshake.
    let connects = 50;
    let t = Instant::now();
    for c in 0..connects {
        drop(TcpStore::connect(addr, secret, c + 100, deadline).expect("a client"));
    }
    let connect_us = t.elapsed().as_secs_f64() * 1e6 / connects as f64;
    // Several clients at once, as ranks in their rendezvous: the server's
    // rate (on this 2-core machine the clients share its cores).
    let clients = 16;
    let per_client = 1000;
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            s.spawn(move || {
                let store = TcpStore::connect(addr, secret, c + 1, deadline).expect("a client");
                for i in 0..per_client {
                    let v = store
                        .get(&format!("info/{}", (i + c) % keys), Duration::from_secs(5))
                        .unwrap();
                    assert_eq!(v.len(), RECORD);
                }
            });
        }
    });
    let rate = (clients * per_client) as f64 / t.elapsed().as_secs_f64();
    eprintln!(
        "store on loopback, {RECORD}-byte records: one client's round trip {rtt_us:.1} us, \
         a new client's connection and handshake {connect_us:.0} us; {clients} clients: \
         {rate:.0} gets/s"
    );
    assert!(
        rate > 1000.0 && rtt_us < 10_000.0,
        "{rate} gets/s, {rtt_us} us"
    );
}
