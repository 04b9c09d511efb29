//! Tagged point-to-point and receive from any source (sncl extension),
//! between thread-ranks over shared memory and over TCP: every message is
//! received once with the right source and tag, tags never cross, large
//! multi-piece messages sent both ways before either side receives do not
//! deadlock, and the errors (size mismatch, timeout) say what happened.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use comm_core::config::TransportChoice;
use sncl::{Communicator, Config, Error, ReduceOp};

fn comms(n: usize, transport: TransportChoice, timeout: Duration) -> Vec<Communicator> {
    let cfg = Config {
        timeout,
        transport,
        shm: sncl::ShmSettings {
            slot_bytes: 4096,
            ..Default::default()
        },
        tcp: sncl::TcpSettings {
            piece_bytes: 4096,
            ..Default::default()
        },
        ..Config::default()
    };
    Communicator::init_threads(n, cfg).expect("init")
}

/// Runs `f(comm)` on every rank's thread; returns the results in rank order.
fn on_ranks<R: Send>(cs: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// A small deterministic generator (xorshift), the same on every rank.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Rank 0 receives `per_sender` messages from each of ranks 1..n with
/// random tags, posting its receives from any source in its own random
/// order of tags; every message must arrive once with its source and tag,
/// in send order per (source, tag). A message's size follows from its tag,
/// so the receiver can size its buffer.
fn any_source(transport: TransportChoice, n: usize, per_sender: usize) {
    let cs = comms(n, transport, Duration::from_secs(30));
    const TAGS: u64 = 8;
    let len_of = |tag: i32| 3 + tag as usize * 211; // up to ~6 KiB: several pieces
    let tags: Vec<Vec<i32>> = (0..n)
        .map(|s| {
            let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ (s as u64 + 1));
            (0..per_sender).map(|_| (r.next() % TAGS) as i32).collect()
        })
        .collect();
    let t0 = Instant::now();
    let results = on_ranks(&cs, |c| {
        let me = c.rank();
        if me != 0 {
            for (i, &tag) in tags[me].iter().enumerate() {
                let mut msg = vec![7u32; len_of(tag)];
                msg[0] = me as u32;
                msg[1] = tag as u32;
                msg[2] = i as u32;
                c.send_tagged(&msg, 0, tag).expect("send_tagged");
            }
            c.barrier().expect("barrier after the sends");
            return Vec::new();
        }
        let mut order: Vec<i32> = tags[1..].iter().flatten().copied().collect();
        let mut r = Rng(42);
        for i in (1..order.len()).rev() {
            let j = (r.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut got = Vec::new();
        for &tag in &order {
            let mut buf = vec![0u32; len_of(tag)];
            let src = c.recv_tagged(&mut buf, None, tag).expect("recv_tagged any");
            got.push((src, buf[0] as usize, buf[1] as i32, tag, buf[2] as usize));
        }
        c.barrier().expect("barrier after the receives");
        got
    });
    let got = &results[0];
    assert_eq!(got.len(), (n - 1) * per_sender);
    let mut count: HashMap<(usize, usize), usize> = HashMap::new();
    let mut last: HashMap<(usize, i32), usize> = HashMap::new();
    for &(src, payload_src, payload_tag, tag, idx) in got {
        assert_eq!(src, payload_src, "source_rank disagrees with the payload");
        assert_eq!(
            payload_tag, tag,
            "a message with tag {payload_tag} matched a receive for {tag}"
        );
        assert_eq!(tags[src][idx], tag);
        *count.entry((src, idx)).or_default() += 1;
        // Non-overtaking: per (source, tag), indices increase.
        if let Some(&prev) = last.get(&(src, tag)) {
            assert!(idx > prev, "({src}, tag {tag}): message {idx} after {prev}");
        }
        last.insert((src, tag), idx);
    }
    assert_eq!(count.len(), got.len(), "a message was received twice");
    assert!(count.values().all(|&k| k == 1));
    eprintln!(
        "any source over {transport:?}: {} messages from {} senders in {:?}",
        got.len(),
        n - 1,
        t0.elapsed()
    );
}

#[test]
fn any_source_shm() {
    any_source(TransportChoice::Auto, 4, 334);
}

#[test]
fn any_source_tcp() {
    any_source(TransportChoice::Tcp, 4, 334);
}

/// Tags never match each other: tag 2 is received before tag 1 although it
/// was sent after; then a collective runs normally.
fn tags_do_not_cross(transport: TransportChoice) {
    let cs = comms(2, transport, Duration::from_secs(20));
    on_ranks(&cs, |c| {
        if c.rank() == 0 {
            c.send_tagged(&[1u8; 10_000], 1, 1).unwrap();
            c.send_tagged(&[2u8; 3], 1, 2).unwrap();
            c.send_tagged::<u8>(&[], 1, 3).unwrap();
        } else {
            let mut b = [0u8; 3];
            assert_eq!(c.recv_tagged(&mut b, Some(0), 2).unwrap(), 0);
            assert_eq!(b, [2u8; 3]);
            c.recv_tagged::<u8>(&mut [], None, 3).unwrap();
            let mut a = vec![0u8; 10_000];
            assert_eq!(c.recv_tagged(&mut a, None, 1).unwrap(), 0);
            assert!(a.iter().all(|&x| x == 1));
        }
        let mut v = [c.rank() as f32 + 1.0; 5];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [3.0; 5]);
    });
}

#[test]
fn tags_do_not_cross_shm() {
    tags_do_not_cross(TransportChoice::Auto);
}

#[test]
fn tags_do_not_cross_tcp() {
    tags_do_not_cross(TransportChoice::Tcp);
}

/// Both ranks send 4 MiB to each other before receiving: the sends park
/// each other's pieces while they wait for room.
fn exchange_large(transport: TransportChoice) {
    let cs = comms(2, transport, Duration::from_secs(30));
    on_ranks(&cs, |c| {
        let me = c.rank();
        let out: Vec<u64> = (0..1 << 19).map(|i| i * 2 + me as u64).collect();
        c.send_tagged(&out, 1 - me, 9).unwrap();
        let mut got = vec![0u64; 1 << 19];
        assert_eq!(c.recv_tagged(&mut got, Some(1 - me), 9).unwrap(), 1 - me);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, &x)| x == i as u64 * 2 + (1 - me) as u64));
    });
}

#[test]
fn exchange_large_shm() {
    exchange_large(TransportChoice::Auto);
}

#[test]
fn exchange_large_tcp() {
    exchange_large(TransportChoice::Tcp);
}

#[test]
fn send_to_self_and_errors() {
    let cs = comms(2, TransportChoice::Auto, Duration::from_millis(1500));
    on_ranks(&cs, |c| {
        let me = c.rank();
        // To self: parked at once, received from self or from any source.
        c.send_tagged(&[5i32, 6], me, 4).unwrap();
        let mut b = [0i32; 2];
        assert_eq!(c.recv_tagged(&mut b, None, 4).unwrap(), me);
        assert_eq!(b, [5, 6]);
        match c.recv_tagged(&mut b, Some(me), 4) {
            Err(Error::InvalidArgument { detail, .. }) => {
                assert!(detail.contains("itself"), "{detail}")
            }
            other => panic!("recv from self without a send: {other:?}"),
        }
        // Size mismatch names the peer, the tag and both sizes.
        if me == 0 {
            c.send_tagged(&[1u8; 8], 1, 5).unwrap();
        } else {
            let mut small = [0u8; 4];
            match c.recv_tagged(&mut small, Some(0), 5) {
                Err(Error::InvalidArgument { detail, .. }) => {
                    assert!(
                        detail.contains("peer rank 0") && detail.contains("tag 5"),
                        "{detail}"
                    );
                    assert!(
                        detail.contains("8 bytes") && detail.contains("4 bytes"),
                        "{detail}"
                    );
                }
                other => panic!("size mismatch: {other:?}"),
            }
        }
    });
    // Nobody sends tag 6: the receive times out and says so.
    let t0 = Instant::now();
    let e = cs[1].recv_tagged(&mut [0u8; 1], None, 6).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(
        text.starts_with("Timed out") && text.contains("tag=6"),
        "{text}"
    );
    assert!(text.contains("1500 ms") && text.contains("[0]"), "{text}");
    assert!(
        t0.elapsed() < Duration::from_millis(3000),
        "{:?}",
        t0.elapsed()
    );
}
