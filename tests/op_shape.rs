//! The typed API checks every plain collective's buffers against one
//! `OpShape`: errors name the rank, the operation and what was expected,
//! before anything is sent; buffers a rank does not use are not checked.
//! A refused operation takes no sequence number. Point-to-point counts
//! are in elements of a type, like every other count.

use sncl::{Collective, Communicator, Config, DataType, Error, P2p, RawOp, ReduceOp};

fn comms(n: usize) -> Vec<Communicator> {
    Communicator::init_threads(n, Config::default()).expect("init")
}

fn invalid(r: sncl::Result<()>) -> String {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => e.to_string(),
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[test]
fn wrong_extents_are_refused_with_rank_op_and_expectation() {
    let cs = comms(2);
    let c = &cs[1];
    let e = invalid(c.all_gather(&[1f32; 3], &mut [0f32; 5]));
    assert_eq!(
        e,
        "rank 1: invalid argument to all_gather: recv has 5 elements, expected 6"
    );
    let e = invalid(c.reduce_scatter(&[1f32; 5], &mut [0f32; 3], ReduceOp::Sum));
    assert!(
        e.ends_with("reduce_scatter: send has 5 elements, expected 6"),
        "{e}"
    );
    let e = invalid(c.gather(&[1f32; 2], &mut [0f32; 2], 2));
    assert!(
        e.ends_with("gather: root 2 is out of range for 2 ranks"),
        "{e}"
    );
    let e = invalid(c.scatter(&[1f32; 3], &mut [0f32; 2], 1));
    assert!(
        e.ends_with("scatter: send has 3 elements, expected 4"),
        "{e}"
    );
    let e = invalid(c.all_gather_in_place(&mut [0f32; 5]));
    assert!(e.contains("not divisible by the 2 ranks"), "{e}");
}

#[test]
fn buffers_a_rank_does_not_use_are_not_checked() {
    let cs = comms(2);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let r = c.rank();
                // Gather to rank 0: rank 1's recv is unused (any length).
                let mut recv = vec![0f32; if r == 0 { 4 } else { 1 }];
                c.gather(&[r as f32; 2], &mut recv, 0).unwrap();
                if r == 0 {
                    assert_eq!(recv, [0.0, 0.0, 1.0, 1.0]);
                }
                // Broadcast from rank 1: rank 0's send is unused.
                let send = vec![7f32; if r == 1 { 3 } else { 0 }];
                let mut out = [0f32; 3];
                c.broadcast_from(&send, &mut out, 1).unwrap();
                assert_eq!(out, [7.0; 3]);
                // In-place reduce-scatter: this rank's block holds the sum.
                let mut buf = [1f32, 2.0, 3.0, 4.0];
                c.reduce_scatter_in_place(&mut buf, ReduceOp::Sum).unwrap();
                assert_eq!(buf[r * 2..r * 2 + 2], [[2.0, 4.0], [6.0, 8.0]][r]);
            });
        }
    });
}

/// Every rank makes calls that are refused (bad root, bad extents, a
/// reduction the type does not have, a point-to-point count too large, a
/// raw op with too few variable counts); none takes a sequence number, so
/// the collectives after them still match on every rank.
#[test]
fn refused_operations_on_every_rank_leave_the_numbering_alone() {
    let cs = comms(3);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let r = c.rank();
                let refused = |what: &str, res: sncl::Result<()>| {
                    let e = invalid(res);
                    assert!(e.starts_with(&format!("rank {r}: ")), "{what}: {e}");
                    e
                };
                for round in 0..2 {
                    let e = refused("root", c.broadcast(&mut [0f32; 4], 3));
                    assert!(e.ends_with("root 3 is out of range for 3 ranks"), "{e}");
                    let e = refused("extent", c.all_gather(&[1u32; 2], &mut [0u32; 5]));
                    assert!(e.ends_with("recv has 5 elements, expected 6"), "{e}");
                    refused(
                        "bitwise on floats",
                        c.all_reduce_in_place(&mut [1f32; 2], ReduceOp::BitAnd),
                    );
                    let mut op = RawOp::new(Collective::AllGatherV, DataType::Float32, 0);
                    op.v = Some(Box::new(sncl::VCounts {
                        recv_counts: vec![1; 2],
                        recv_displs: vec![0, 1],
                        ..Default::default()
                    }));
                    // SAFETY: refused before any buffer is used.
                    let e = refused("v counts", unsafe { c.run_raw(&op) });
                    assert!(
                        e.contains("receive counts have 2 entries, expected one per rank (3)"),
                        "{e}"
                    );
                    let mut p2p = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
                    p2p.p2p = vec![P2p {
                        peer: (r + 1) % 3,
                        is_send: true,
                        ptr: std::ptr::NonNull::<f64>::dangling().as_ptr() as *mut u8,
                        count: usize::MAX / 4,
                        dtype: DataType::Float64,
                    }];
                    // SAFETY: refused before any buffer is used.
                    let e = refused("p2p size", unsafe { c.run_raw(&p2p) });
                    assert!(e.contains("send") && e.contains("too large"), "{e}");
                    // Rank-dependent refusals: only some ranks make them.
                    if r == round {
                        refused(
                            "extra",
                            c.reduce(&[1i32; 2], &mut [0i32; 1], ReduceOp::Sum, r),
                        );
                    }
                    let mut v = [r as u64 + 1; 5];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v, [6; 5]);
                    let mut b = [if r == 2 { 9i8 } else { 0 }; 3];
                    c.broadcast(&mut b, 2).unwrap();
                    assert_eq!(b, [9; 3]);
                }
                assert!(c.async_error().is_none());
            });
        }
    });
}

/// A point-to-point transfer counts elements of its own type: a send of
/// 4 float32 meets a receive of 16 bytes, raw ops state counts in
/// elements, and a send and its receive must agree in bytes.
#[test]
fn point_to_point_counts_are_elements() {
    let cs = comms(2);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let r = c.rank();
                let out = [1.5f32, -2.0, 3.25, 4.0];
                let mut bytes = [0u8; 16];
                c.group(|g| {
                    if r == 0 {
                        g.send(&out, 1);
                    } else {
                        g.recv(&mut bytes, 0);
                    }
                })
                .unwrap();
                if r == 1 {
                    assert_eq!(&bytes, sncl::as_bytes(&out[..]));
                }
                // Raw: 3 int64 elements to the next rank, from the previous.
                let send = [r as i64 * 100 + 1, r as i64 * 100 + 2, r as i64 * 100 + 3];
                let mut recv = [0i64; 3];
                let mut op = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
                let p = |peer, is_send, ptr: *mut i64| P2p {
                    peer,
                    is_send,
                    ptr: ptr as *mut u8,
                    count: 3,
                    dtype: DataType::Int64,
                };
                op.p2p = vec![
                    p(1 - r, true, send.as_ptr() as *mut i64),
                    p(1 - r, false, recv.as_mut_ptr()),
                ];
                // SAFETY: both arrays outlive the call.
                unsafe { c.run_raw(&op) }.unwrap();
                let o = (1 - r) as i64 * 100;
                assert_eq!(recv, [o + 1, o + 2, o + 3]);
            });
        }
    });
    let c = &cs[0];
    let (four, mut small) = ([1u32; 4], [0u8; 4]);
    let e = invalid(c.group(|g| {
        g.send(&four, 0);
        g.recv(&mut small, 0);
    }));
    assert!(
        e.contains("a send of 4 uint32 elements (16 bytes)")
            && e.contains("a receive of 4 uint8 elements (4 bytes)"),
        "{e}"
    );
}
