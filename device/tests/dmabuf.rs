//! dma-buf export of device memory (GPUDirect RDMA): the export covers
//! the allocation, the file descriptor holds the device bytes (checked on
//! `emu`, where it is the allocation's shared-memory file), allocation ids
//! tell allocations apart, and bad ranges are errors. `SNCL_TEST_DEVICE`
//! picks the backend as for the suite (`emu` by default; on `cuda` the
//! tests skip, saying why, where there is no device or no dma-buf
//! support).

mod common;

use std::os::unix::fs::FileExt;

use common::{deadline, Ctx};
use device::Backend;

#[test]
fn an_export_covers_its_allocation_and_holds_its_bytes() {
    let Some(ctx) = Ctx::new() else { return };
    let dev = &ctx.dev;
    if !dev.dmabuf_supported().expect("dmabuf_supported") {
        eprintln!(
            "skipped: {} device 0 does not export dma-bufs",
            dev.backend().name()
        );
        return;
    }
    let bytes = 3 << 20;
    let p = dev.alloc(bytes).expect("alloc");
    let data: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: `data` outlives the synchronisation; the range is `p`'s.
    unsafe { dev.copy_h2d_async(p, data.as_ptr(), bytes, ctx.stream) }.expect("upload");
    dev.synchronize(ctx.stream, deadline()).expect("sync");

    let inner = p.add(4096 + 5);
    let d = dev.dmabuf_export(inner, 1000).expect("export");
    assert!(d.base <= p, "the export starts at or before the allocation");
    assert!(
        d.base.0 + d.len as u64 >= p.0 + bytes as u64,
        "and covers it"
    );
    let id = dev.allocation_id(inner).expect("id");
    assert_eq!(d.id, id);
    assert_eq!(
        dev.allocation_id(p).expect("id"),
        id,
        "one allocation, one id"
    );
    let q = dev.alloc(4096).expect("alloc");
    assert_ne!(dev.allocation_id(q).expect("id"), id, "another allocation");

    if dev.backend() == Backend::Emu {
        // The emulated dma-buf is the allocation's file: its bytes are the
        // device bytes.
        let file = std::fs::File::from(d.fd);
        let mut got = vec![0u8; 1000];
        let at = d.offset + (inner.0 - d.base.0);
        file.read_exact_at(&mut got, at).expect("read the dma-buf");
        assert_eq!(got, data[4096 + 5..4096 + 5 + 1000]);
    }

    // A range past the allocation's end is an error, not a panic.
    let past = dev.dmabuf_export(p.add(bytes - 10), 11);
    assert!(past.is_err(), "a range past the end was exported");
    // SAFETY: no work uses them any more.
    unsafe {
        dev.free(p).expect("free");
        dev.free(q).expect("free");
    }
    if dev.backend() == Backend::Emu {
        let e = dev
            .allocation_id(p)
            .expect_err("a freed allocation has no id");
        assert!(e.to_string().contains("allocation_id"), "{e}");
        assert!(dev.dmabuf_export(p, 1).is_err());
    }
}
