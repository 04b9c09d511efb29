//! Sends to and receives from the rank itself (NCCL allows them inside a
//! group): blocking groups, raw non-blocking operations, and the errors for
//! a transfer to self without its partner. (The C ABI's: sncl-capi's
//! `c_abi_send_recv_to_self`.)

use std::time::Duration;

use sncl::{Collective, Communicator, Config, DataType, Error, P2p, RawOp, ReduceOp};

fn comms(n: usize) -> Vec<Communicator> {
    let cfg = Config {
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    Communicator::init_threads(n, cfg).expect("init")
}

fn assert_invalid(r: sncl::Result<()>, op: &str, needle: &str) {
    match r {
        Err(Error::InvalidArgument {
            op: got, detail, ..
        }) => {
            assert_eq!(got, op, "{detail}");
            assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
        }
        other => panic!("want InvalidArgument from {op}, got {other:?}"),
    }
}

#[test]
fn one_rank_group_copies_to_itself() {
    let c = comms(1).pop().unwrap();
    let out: Vec<u32> = (0..1000).collect();
    let mut got = vec![0u32; 1000];
    c.group(|g| {
        g.send(&out, 0);
        g.recv(&mut got, 0);
    })
    .expect("send/recv to self in one group");
    assert_eq!(got, out);

    // Several pairs match in issue order.
    let (a, b) = (vec![1u8; 3], vec![2u8; 5]);
    let (mut x, mut y) = (vec![0u8; 3], vec![0u8; 5]);
    c.group(|g| {
        g.send(&a, 0);
        g.send(&b, 0);
        g.recv(&mut x, 0);
        g.recv(&mut y, 0);
    })
    .unwrap();
    assert_eq!((x, y), (a, b));
    // Empty transfers to self are fine too.
    c.group(|g| {
        g.send(&[] as &[f32], 0);
        g.recv(&mut [] as &mut [f32], 0);
    })
    .unwrap();
}

#[test]
fn transfer_to_self_without_partner_is_rejected() {
    let c = comms(1).pop().unwrap();
    let buf = vec![7i64; 16];
    let mut dst = vec![0i64; 16];
    assert_invalid(c.send(&buf, 0), "send", "receive(s) from itself");
    assert_invalid(c.recv(&mut dst, 0), "recv", "send(s) to this rank");
    let mut short = vec![0i64; 8];
    assert_invalid(
        c.group(|g| {
            g.send(&buf, 0);
            g.recv(&mut short, 0);
        }),
        "send",
        "meets a receive of 8 int64 elements (64 bytes)",
    );
    assert_invalid(c.send(&buf, 1), "send", "out of range");
    // Rejected before running: nothing was copied, the communicator works.
    assert!(short.iter().all(|&v| v == 0));
    let mut v = [3.0f32; 4];
    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [3.0; 4]);
    assert!(c.async_error().is_none());
}

#[test]
fn ring_with_self_pairs_on_three_ranks() {
    let cs = comms(3);
    let n = cs.len();
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let r = c.rank();
                let out = vec![r as u32 * 10; 777];
                let mine = vec![r as u32 + 1; 50];
                let mut from_left = vec![0u32; 777];
                let mut from_me = vec![0u32; 50];
                for _ in 0..3 {
                    c.group(|g| {
                        g.recv(&mut from_me, r);
                        g.send(&out, (r + 1) % n);
                        g.send(&mine, r);
                        g.recv(&mut from_left, (r + n - 1) % n);
                    })
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    assert!(from_left
                        .iter()
                        .all(|&v| v == ((r + n - 1) % n) as u32 * 10));
                    assert_eq!(from_me, mine);
                }
            });
        }
    });
}

#[test]
fn raw_non_blocking_group_with_self() {
    let c = comms(1).pop().unwrap();
    let out = vec![9u8; 4096];
    let mut got = vec![0u8; 4096];
    let mut op = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
    op.p2p = vec![
        P2p {
            peer: 0,
            is_send: true,
            ptr: out.as_ptr() as *mut u8,
            count: out.len(),
            dtype: DataType::Uint8,
        },
        P2p {
            peer: 0,
            is_send: false,
            ptr: got.as_mut_ptr(),
            count: got.len(),
            dtype: DataType::Uint8,
        },
    ];
    // SAFETY: both buffers outlive the wait below.
    let w = unsafe { c.enqueue_raw(op) };
    w.wait().unwrap();
    assert_eq!(got, out);
}

/// A raw group's own dtype and count are not used (each transfer has its
/// own): a group built with a 4-byte dtype and a count moves the same
/// bytes (it used to panic on a schedule region 4 times its buffer).
#[test]
fn raw_group_ignores_its_own_dtype_and_count() {
    let cs = comms(2);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let (r, peer) = (c.rank(), 1 - c.rank());
                let out = vec![r as u16 + 7; 999];
                let mut got = vec![0u16; 999];
                let mut op = RawOp::new(Collective::SendRecv, DataType::Float32, 5);
                op.p2p = vec![
                    P2p {
                        peer,
                        is_send: true,
                        ptr: out.as_ptr() as *mut u8,
                        count: out.len(),
                        dtype: DataType::Float16,
                    },
                    P2p {
                        peer,
                        is_send: false,
                        ptr: got.as_mut_ptr() as *mut u8,
                        count: got.len(),
                        dtype: DataType::Float16,
                    },
                ];
                // SAFETY: both buffers outlive the call.
                unsafe { c.run_raw(&op) }.unwrap_or_else(|e| panic!("rank {r}: {e}"));
                assert!(got.iter().all(|&v| v == peer as u16 + 7), "rank {r}");
            });
        }
    });
}
