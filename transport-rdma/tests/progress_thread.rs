//! Issue 36, risk 10: a progress thread per NIC. On the strict emulated
//! provider a posted WRITE moves only while its device is progressed, as
//! the host side of a real NIC's protocol does (completions, credits). A
//! sender whose executor posts a piece and then goes away (to reduce, to
//! another step) must not leave the peer waiting: the NIC's thread drives
//! the connection meanwhile. Once nothing is outstanding the thread parks,
//! and it ends with the context's last connection.

mod common;

use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use common::*;

/// A piece of 16 strict DMA steps (64 KiB each).
const LEN: usize = 1 << 20;

/// Threads of this process named for an RDMA progress thread.
fn progress_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("sncl-rdma-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn the_nic_thread_moves_a_write_while_the_sender_is_away_then_parks_and_ends() {
    let strict = transport_rdma::IbSettings {
        emulate_strict: true,
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(4, LEN + comm_core::wire::HEADER_BYTES, strict);
    let data = payload(0, 1, 0, LEN);
    assert!(a
        .try_post_send(&header(LEN, 1), Outgoing::copied(&data))
        .unwrap());
    // The sender's executor does not call its connection again until the
    // receiver has the piece: only the NIC's thread moves the DMA.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = false;
    while !got {
        assert!(
            Instant::now() < deadline,
            "the receiver waited 10 s for a piece whose sender is busy elsewhere \
             (the sender's NIC thread drove it {} times)",
            a.background_progress()
        );
        got = b
            .try_recv(Space::Host, &mut |h, p| {
                assert_eq!(h.seq, 1);
                assert!(p.host().expect("a host piece") == data.as_slice());
                Ok(())
            })
            .unwrap();
        std::thread::yield_now();
    }
    assert!(a.background_progress() > 0);
    // The sender's completion arrives without it: nothing is outstanding
    // then, and the thread stops driving (parked, no polling).
    let deadline = Instant::now() + Duration::from_secs(10);
    let settled = loop {
        let before = a.background_progress();
        std::thread::sleep(Duration::from_millis(50));
        if a.background_progress() == before {
            break before;
        }
        assert!(Instant::now() < deadline, "the NIC thread never settled");
    };
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        a.background_progress(),
        settled,
        "the thread polled a connection with nothing outstanding"
    );
    assert!(a.flush().unwrap(), "the sender's write completed by itself");
    // Two nodes as threads: a context, so a progress thread, each.
    assert_eq!(progress_threads(), 2);
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(5);
    while progress_threads() > 0 {
        assert!(
            Instant::now() < deadline,
            "progress threads outlived their connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
