//! Shared by the nvlink tests: their configuration, ranks connected over
//! nvlink, and their cases (run by the device test kit, `device_kit`).
#![allow(dead_code)]

use std::time::Duration;

use comm_core::config::TransportChoice;
use sncl::{Collective, Communicator, Config};

use crate::device_kit::{bind_rank, cases_of, Case, Rank};

/// Tests of one binary that read the process-wide
/// `transport_nvlink::device_bytes` counters hold this, so that another
/// test's bytes do not count as theirs.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`SERIAL`] (a test that failed while holding it does not matter).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The nvlink tests' configuration. Opens an emulated device first: nvlink
/// is offered only in processes that can run device operations (a CUDA
/// driver library, or an open emulated device), as on a GPU machine.
pub fn config() -> Config {
    let _ = device::open(device::Backend::Emu, 0);
    Config {
        timeout: Duration::from_secs(30),
        chunk_bytes: 4096,
        // Inbox slots of 8 × 4 KiB = 32 KiB, 4 of them: the larger counts
        // below take several slots and wrap the inbox.
        // Automatic choice: same-node pairs get nvlink without forcing it
        // (`bind` checks they did).
        shm: sncl::ShmSettings {
            slot_bytes: 4096,
            slots: 4,
            ..Default::default()
        },
        transport: TransportChoice::Auto,
        // These tests are about the nvlink transport's device pieces: the
        // kernel path, which moves small all-reduces past it, stays off
        // (device_collectives covers it).
        device: comm_core::config::DeviceSettings {
            lane_bytes: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn ranks(n: usize) -> Vec<Rank> {
    let comms = Communicator::init_threads(n, config()).expect("init over nvlink");
    comms.into_iter().map(bind).collect()
}

/// Checks that every peer is connected over nvlink and binds the
/// communicator to emulated device `rank`.
pub fn bind(comm: Communicator) -> Rank {
    for (p, kind) in comm.transports().iter().enumerate() {
        if p != comm.rank() {
            assert_eq!(*kind, "nvlink", "rank {} to {p}", comm.rank());
        }
    }
    bind_rank(comm)
}

/// The nvlink tests' cases: all_reduce, reduce_scatter, all_gather and
/// broadcast (see [`cases_of`]).
pub fn cases(counts: &[usize]) -> Vec<Case> {
    cases_of(
        &[
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast,
        ],
        counts,
    )
}
