//! `Communicator::mem_stats` (NCCL's `ncclCommMemStats`): what a rank
//! holds, by purpose and residence — shared-memory FIFOs it created for
//! each peer (exactly their segment size), TCP frame buffers, windows,
//! the flight recorder, a device binding's staging — and nothing of peers
//! on a single-rank communicator.

mod rank_kit;

use std::time::Duration;

use comm_core::config::TransportChoice;
use device::Backend;
use rank_kit::timed_on_ranks;
use sncl::{Communicator, Config, MemStats, Purpose, ReduceOp, Residence};

const SLOTS: usize = 4;
const SLOT_BYTES: usize = 8192;

fn config(transport: TransportChoice) -> Config {
    let mut c = Config {
        timeout: Duration::from_secs(20),
        transport,
        ..Config::default()
    };
    c.shm.slots = SLOTS;
    c.shm.slot_bytes = SLOT_BYTES;
    c
}

/// `f` on every rank (one thread each), the results in rank order.
fn on_each<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    timed_on_ranks(comms, |_, c| f(c))
        .into_iter()
        .map(|(r, _)| r)
        .collect()
}

#[test]
fn shared_memory_fifos_are_counted_per_peer_by_their_creator() {
    let comms = Communicator::init_threads(3, config(TransportChoice::Auto)).expect("init");
    let stats: Vec<MemStats> = on_each(&comms, |c| {
        let mut v = vec![1f32; 100_000];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        c.mem_stats()
    });
    for m in &stats {
        eprintln!("{m}");
        assert_eq!(m.connected_peers, 2, "{m}");
        // Header, lanes and acknowledgement (6 lines of 128 bytes), then
        // the slots with their 64-byte headers; one segment per peer.
        let segment = 6 * 128 + SLOTS * (64 + SLOT_BYTES);
        assert!(
            m.rows
                .contains(&(Purpose::Fifo, Residence::Shared, 2 * segment as u64)),
            "{m}"
        );
        assert_eq!(m.total(Residence::Device), 0, "{m}");
        assert!(m.of(Purpose::FlightRecorder) > 0, "{m}");
    }
}

#[test]
fn a_single_rank_holds_no_peer_buffers() {
    let comms = Communicator::init_threads(1, config(TransportChoice::Auto)).expect("init");
    let c = &comms[0];
    let mut v = [1f64; 16];
    c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
    let m = c.mem_stats();
    assert_eq!(m.connected_peers, 0, "{m}");
    assert_eq!(m.of(Purpose::Fifo) + m.of(Purpose::Staging), 0, "{m}");
}

#[test]
fn tcp_buffers_windows_and_a_device_binding_are_counted() {
    let comms = Communicator::init_threads(2, config(TransportChoice::Tcp)).expect("init");
    for m in on_each(&comms, |c| c.mem_stats()) {
        assert!(
            m.rows
                .iter()
                .any(|r| r.0 == Purpose::Fifo && r.1 == Residence::Host),
            "{m}"
        );
        assert_eq!(m.total(Residence::Shared), 0, "{m}");
    }
    let comms = Communicator::init_threads(2, config(TransportChoice::Auto)).expect("init");
    let after = on_each(&comms, |c| {
        let before = c.mem_stats().of(Purpose::Windows);
        let w = c.alloc_window::<f32>(1 << 18).expect("window");
        let with = c.mem_stats().of(Purpose::Windows);
        drop(w);
        let dev = device::open(Backend::Emu, c.rank()).expect("emulated device");
        c.bind_device(dev).expect("bind");
        (before, with, c.mem_stats())
    });
    for (before, with, m) in after {
        assert_eq!(before, 0);
        // The window's 1 MiB and the control record.
        assert!(with > 1 << 20, "{with}");
        assert!(m.of(Purpose::DeviceStaging) > 0, "{m}");
        assert!(m.total(Residence::Device) > 0, "{m}");
    }
}
