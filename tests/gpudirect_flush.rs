//! The device's answers the GPUDirect RDMA receive path relies on
//! (transport-rdma's flush before a received piece is consumed, issue 36
//! risk 3): whether NIC writes must be flushed before the device's own work
//! sees them, and the flush itself. On the emulated device (which reports
//! no ordering and counts flushes) and, with `SNCL_TEST_DEVICE=cuda`, on
//! the CUDA backend (the strict driver model runs it:
//! cuda-model/tests/device_path.rs), where they are
//! `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`, `..._FLUSH_WRITES_OPTIONS`
//! and `cuFlushGPUDirectRDMAWrites`.

use sncl::device::{self, Backend};

#[test]
fn the_device_says_whether_gpudirect_writes_need_a_flush_and_takes_one() {
    let backend = match std::env::var("SNCL_TEST_DEVICE").as_deref() {
        Ok("cuda") => Backend::Cuda,
        _ => Backend::Emu,
    };
    let dev = match device::open(backend, 0) {
        Ok(d) => d,
        Err(e) if backend == Backend::Cuda => {
            eprintln!("skipped: no CUDA device 0 opens here: {e}");
            return;
        }
        Err(e) => panic!("the emulated device: {e}"),
    };
    let needed = dev.gpudirect_flush_needed().expect("the write ordering");
    // Both the emulated device and the model report no ordering (as x86
    // Hopper systems do), so the receive path must flush.
    assert!(needed, "{}: no flush needed?", backend.name());
    let before = ::device::emu::gpudirect_flushes();
    dev.flush_gpudirect_writes()
        .unwrap_or_else(|e| panic!("{}: the flush: {e}", backend.name()));
    if backend == Backend::Emu {
        assert_eq!(::device::emu::gpudirect_flushes(), before + 1);
    }
    eprintln!("{}: GPUDirect flush needed and taken", backend.name());
}
