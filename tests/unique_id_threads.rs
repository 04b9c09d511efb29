//! A unique id's store leaves no thread behind: once its communicator is
//! gone, or when no rank 0 takes it in time. One test per binary, so the
//! thread count is this test's alone. (Every store of the process runs on
//! one event loop thread, started by the first: the count starts after
//! it.)

use std::time::{Duration, Instant};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn settle(expected: usize) -> usize {
    let t0 = Instant::now();
    while threads() > expected && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    threads()
}

#[test]
fn unique_id_store_threads_end_with_the_communicator() {
    let first = sncl::Communicator::unique_id("127.0.0.1:0".parse().unwrap()).unwrap();
    drop(sncl::Communicator::init_rank(&first, 0, 1).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    let before = threads();
    for _ in 0..3 {
        let id = sncl::Communicator::unique_id("127.0.0.1:0".parse().unwrap()).unwrap();
        let comm = sncl::Communicator::init_rank(&id, 0, 1).unwrap();
        let mut x = [1.0f32; 4];
        comm.all_reduce_in_place(&mut x, sncl::ReduceOp::Sum)
            .unwrap();
        drop(comm);
    }
    let after = settle(before);
    assert_eq!(after, before, "threads left behind by built communicators");
}
