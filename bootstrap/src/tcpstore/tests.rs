use super::protocol::*;
use super::*;
use crate::store_barrier;
use crate::Store;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
const SECRET: [u8; 16] = *b"0123456789abcdef";

fn loopback0() -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
}

fn deadline() -> Instant {
    Instant::now() + T
}

#[test]
fn four_clients_barrier() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let world = 4;
    let handles: Vec<_> = (0..world)
        .map(|r| {
            thread::spawn(move || {
                let s = TcpStore::connect(addr, SECRET, r, deadline()).unwrap();
                assert_eq!(s.local_ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
                s.set(&format!("addr/{r}"), format!("10.0.0.{r}:1234").as_bytes())
                    .unwrap();
                // Barrier: count arrivals, the last one releases everyone.
                let n = s.add("arrived", 1).unwrap();
                if n == world as i64 {
                    s.set("go", b"").unwrap();
                }
                s.wait(&["go"], T).unwrap();
                for p in 0..world {
                    let v = s.try_get(&format!("addr/{p}")).unwrap().unwrap();
                    assert_eq!(v, format!("10.0.0.{p}:1234").as_bytes());
                }
                assert_eq!(s.get("arrived", T).unwrap(), b"4");
                store_barrier(&s, "b1", world, T).unwrap();
                let ps = crate::PrefixStore::new("c", &s);
                ps.set("x", &[0u8; 100_000]).unwrap();
                assert_eq!(ps.get("x", T).unwrap().len(), 100_000);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        server.local_store().try_get("arrived").unwrap().unwrap(),
        b"4"
    );
}

#[test]
fn get_blocks_until_set_and_times_out_naming_key() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let a = TcpStore::connect(addr, SECRET, 1, deadline()).unwrap();
    let setter = thread::spawn(move || {
        let b = TcpStore::connect(addr, SECRET, 2, deadline()).unwrap();
        thread::sleep(Duration::from_millis(50));
        b.set("late", b"v").unwrap();
    });
    assert_eq!(a.get("late", T).unwrap(), b"v");
    setter.join().unwrap();
    assert_eq!(a.try_get("nope").unwrap(), None);
    let err = a
        .get("missing/key", Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 1") && err.contains("'missing/key'"),
        "{err}"
    );
    let err = a
        .wait(&["late", "other"], Duration::from_millis(50))
        .unwrap_err()
        .to_string();
    assert!(err.contains("'other'") && !err.contains("'late'"), "{err}");
    a.set("str", b"abc").unwrap();
    let err = a.add("str", 1).unwrap_err().to_string();
    assert!(err.contains("'str'"), "{err}");
    // The connection is still usable after refused requests.
    assert_eq!(a.add("n", 5).unwrap(), 5);
}

#[test]
fn wrong_secret_refused_and_server_keeps_serving() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let t0 = Instant::now();
    let err = TcpStore::connect(addr, *b"fedcba9876543210", 3, deadline())
        .unwrap_err()
        .to_string();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "wrong secret must fail fast"
    );
    assert!(err.contains("rank 3") && err.contains("secret"), "{err}");
    assert!(err.contains(&addr.to_string()), "{err}");
    // Garbage from a non-sncl client is refused too.
    {
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(&[b'x'; 64]).unwrap();
        let mut buf = Vec::new();
        let _ = junk.read_to_end(&mut buf);
    }
    let good = TcpStore::connect(addr, SECRET, 0, deadline()).unwrap();
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k", T).unwrap(), b"v");
}

#[test]
fn unreachable_root_fails_within_deadline() {
    // Grab a free port and close it again, so nothing listens there.
    let port = TcpListener::bind(loopback0())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let t0 = Instant::now();
    let err = TcpStore::connect(addr, SECRET, 3, Instant::now() + Duration::from_millis(300))
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(err.contains("rank 3"), "{err}");
    assert!(
        err.contains(&format!(
            "cannot reach the sncl root at {addr} within 300 ms"
        )),
        "{err}"
    );
    assert!(err.contains("connection refused"), "{err}");
    assert!(err.contains("SNCL_ROOT"), "{err}");
}

#[test]
fn connect_retries_until_root_starts() {
    let port = TcpListener::bind(loopback0())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let client = thread::spawn(move || TcpStore::connect(addr, SECRET, 1, deadline()));
    thread::sleep(Duration::from_millis(200));
    let _server = TcpStoreServer::start(addr, SECRET).unwrap();
    let s = client.join().unwrap().unwrap();
    assert_eq!(s.add("x", 2).unwrap(), 2);
}

#[test]
fn dead_server_is_an_error_not_a_hang() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let s = TcpStore::connect(addr, SECRET, 2, deadline()).unwrap();
    let waiter = {
        let s2 = TcpStore::connect(addr, SECRET, 5, deadline()).unwrap();
        thread::spawn(move || s2.get("never", Duration::from_secs(3600)))
    };
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    drop(server);
    assert!(t0.elapsed() < Duration::from_secs(2), "drop must not hang");
    let err = waiter.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("rank 5") && err.contains("'never'"), "{err}");
    let err = s.set("k", b"v").unwrap_err().to_string();
    assert!(
        err.contains("rank 2") && err.contains(&addr.to_string()),
        "{err}"
    );
    let err = s.try_get("k").unwrap_err().to_string();
    assert!(err.contains("lost earlier"), "{err}");
}

#[test]
fn silent_root_is_reported_unresponsive() {
    // A listener that accepts but never greets (like torchrun's store).
    let l = TcpListener::bind(loopback0()).unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        thread::sleep(Duration::from_secs(5));
        drop(s);
    });
    let err = TcpStore::connect(addr, SECRET, 1, Instant::now() + Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unresponsive") && err.contains("no greeting"),
        "{err}"
    );
    h.join().unwrap();
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Authenticates by hand and returns the raw stream (for abusive frames).
fn raw_authenticated(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut hello = [0u8; GREETING_BYTES];
    s.read_exact(&mut hello).unwrap();
    let cnonce = [7u8; NONCE];
    let mut proof = Vec::new();
    proof.extend_from_slice(MAGIC);
    proof.extend_from_slice(&9u64.to_le_bytes());
    proof.extend_from_slice(&cnonce);
    proof.extend_from_slice(&client_mac(&SECRET, &hello[8..], &cnonce, 9));
    s.write_all(&proof).unwrap();
    let mut verdict = [0u8; 1 + MAC];
    s.read_exact(&mut verdict).unwrap();
    assert_eq!(verdict[0], AUTH_OK);
    s
}

#[test]
fn huge_announced_frames_do_not_grow_the_server() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let before = rss_bytes();
    for _ in 0..4 {
        let mut s = raw_authenticated(addr);
        s.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        let _ = s.write_all(&[OP_SET; 4096]);
        s.set_read_timeout(Some(T)).unwrap();
        let mut buf = Vec::new();
        // The server closes the connection instead of reading 1 GiB.
        let _ = s.read_to_end(&mut buf);
    }
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "RSS grew by {grown} bytes");
    let good = TcpStore::connect(addr, SECRET, 0, deadline()).unwrap();
    good.set("k", b"v").unwrap();
}

#[test]
fn idle_and_trickling_strangers_do_not_delay_a_rank() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tricklers: Vec<_> = (0..50)
        .map(|_| {
            let stop = stop.clone();
            let mut s = TcpStream::connect(addr).unwrap();
            thread::spawn(move || {
                let t0 = Instant::now();
                let mut sent = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 64 {
                    if s.write_all(&MAGIC[sent % 8..sent % 8 + 1]).is_err() {
                        break;
                    }
                    sent += 1;
                    thread::sleep(Duration::from_millis(200));
                }
                // The server drops it once the whole handshake is overdue.
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut buf = [0u8; 64];
                let mut closed = false;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        closed = true;
                        break;
                    }
                }
                (closed, t0.elapsed())
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let good = TcpStore::connect(addr, SECRET, 1, deadline()).unwrap();
    good.set("k", b"v").unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "join took {took:?}");
    for h in tricklers {
        let (closed, after) = h.join().unwrap();
        assert!(closed, "a trickling stranger was never dropped");
        assert!(
            after < HANDSHAKE_TIMEOUT + Duration::from_secs(3),
            "dropped only after {after:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(idle);
}

#[test]
fn a_flood_beyond_the_pending_bound_drops_the_oldest_not_the_rank() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let flood: Vec<TcpStream> = (0..MAX_PENDING_HANDSHAKES + 50)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let good = TcpStore::connect(addr, SECRET, 1, deadline()).unwrap();
    assert_eq!(good.add("n", 1).unwrap(), 1);
    // The first strangers were dropped to make room.
    let mut first = &flood[0];
    first.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 64];
    let mut total = 0;
    loop {
        match first.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => panic!("expected the oldest stranger to be closed: {e}"),
        }
    }
    assert_eq!(total, GREETING_BYTES);
}

#[test]
fn unclaimed_server_stops_by_itself_and_claimed_one_stays() {
    let s =
        TcpStoreServer::start_unclaimed(loopback0(), SECRET, Duration::from_millis(200)).unwrap();
    let addr = s.local_addr();
    let t0 = Instant::now();
    while s.is_serving() && t0.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!s.is_serving());
    assert!(!s.claim());
    assert!(
        TcpStream::connect(addr).is_err(),
        "the port must be free again"
    );
    drop(s);
    let kept =
        TcpStoreServer::start_unclaimed(loopback0(), SECRET, Duration::from_millis(200)).unwrap();
    assert!(kept.claim());
    thread::sleep(Duration::from_millis(400));
    assert!(kept.is_serving());
    let c = TcpStore::connect(kept.local_addr(), SECRET, 0, deadline()).unwrap();
    c.set("k", b"v").unwrap();
}

#[test]
fn ipv6_root_works_where_the_host_has_ipv6() {
    let bind: SocketAddr = "[::1]:0".parse().unwrap();
    let server = match TcpStoreServer::start(bind, SECRET) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipping: this host cannot listen on [::1] ({e})");
            return;
        }
    };
    let addr = server.local_addr();
    let c = TcpStore::connect(addr, SECRET, 0, deadline()).unwrap();
    c.set("k", b"v6").unwrap();
    assert_eq!(c.get("k", T).unwrap(), b"v6");
    assert!(c.local_ip().is_ipv6());
}

fn process_threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A WAIT request for `keys` on a raw authenticated stream.
fn send_wait(s: &mut TcpStream, keys: &[&str], timeout: Duration) {
    let mut req = vec![OP_WAIT];
    req.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
    req.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        put_str(&mut req, k);
    }
    write_frame(s, &req).unwrap();
}

#[test]
fn a_thousand_waiting_ranks_cost_no_thread_each() {
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let before = process_threads();
    let ranks = 1000;
    let mut waiting: Vec<TcpStream> = (0..ranks).map(|_| raw_authenticated(addr)).collect();
    for s in &mut waiting {
        send_wait(s, &["go"], T);
    }
    // Every request is read (and parked on the store) before the count.
    thread::sleep(Duration::from_millis(300));
    let during = process_threads();
    // The other tests of this binary run beside this one and start their
    // own threads: allow them, not one thread per connection.
    assert!(
        during < before + ranks / 4,
        "{ranks} authenticated connections waiting on the store took the process from \
         {before} to {during} threads"
    );
    server.local_store().set("go", b"").unwrap();
    for s in &mut waiting {
        s.set_read_timeout(Some(T)).unwrap();
        assert_eq!(read_frame(s).unwrap().unwrap(), [ST_OK]);
    }
}

#[test]
fn a_reply_being_written_when_the_server_is_dropped_still_arrives() {
    // Rank 0 sets the last key and leaves at once (a communicator
    // destroyed right after its creation): the ranks that waited for that
    // key must still get their answer, not a closed connection.
    for _ in 0..20 {
        let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
        let mut waiters: Vec<TcpStream> = (0..8)
            .map(|_| raw_authenticated(server.local_addr()))
            .collect();
        for s in &mut waiters {
            send_wait(s, &["done"], T);
        }
        thread::sleep(Duration::from_millis(20));
        server.local_store().set("done", b"1").unwrap();
        drop(server);
        for s in &mut waiters {
            s.set_read_timeout(Some(T)).unwrap();
            assert_eq!(read_frame(s).unwrap().unwrap(), [ST_OK]);
        }
    }
}

/// TLS under the store (feature `certs` makes the certificates).
#[cfg(feature = "certs")]
mod tls;
