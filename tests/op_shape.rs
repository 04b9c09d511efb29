//! The typed API checks every plain collective's buffers against one
//! `OpShape`: errors name the rank, the operation and what was expected,
//! before anything is sent; buffers a rank does not use are not checked.

use sncl::{Communicator, Config, Error, ReduceOp};

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
