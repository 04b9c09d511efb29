//! The staging pipeline on the emulated device, with the stream held back
//! by a value wait (a "gate" the test opens): sends are staged without
//! blocking and handed out only once copied; the receive ring never
//! overwrites a slot whose copy the device has not run yet.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::exec::Memory;
use ::device::{Backend, DeviceBuffer, PinnedBuffer};
use comm_core::schedule::{BufId, Op, Region};
use comm_core::{DataType, ReduceOp};

use super::{DeviceMemory, OpIds, Staging, MAX_SEND_CHUNK};
use crate::device::binding::Binding;

/// The staging size these tests use.
const RING_BYTES: usize = 4 << 20;

fn binding() -> Binding {
    let dev = ::device::open(Backend::Emu, 0).expect("emulated device");
    Binding::new(
        dev,
        0,
        &comm_core::config::DeviceSettings {
            staging_bytes: RING_BYTES,
            ..Default::default()
        },
    )
    .expect("binding")
}

fn staging(b: &Binding) -> Staging {
    Staging::new(&b.dev, RING_BYTES).expect("staging")
}

const IDS: OpIds = OpIds {
    rank: 0,
    op: "test",
    seq: 1,
};

/// A value wait on the binding's stream: nothing enqueued after it runs
/// until [`Gate::open`].
struct Gate {
    flag: PinnedBuffer,
    opened: AtomicBool,
}

impl Gate {
    fn close(b: &Binding) -> Arc<Gate> {
        let flag = PinnedBuffer::new(&b.dev, 64).expect("pinned flag");
        // SAFETY: 64 bytes of pinned memory owned by `flag`, page aligned;
        // the stream waits on its first u32, which stays alive in the gate.
        unsafe {
            flag.as_ptr().write_bytes(0, 64);
            b.dev
                .stream_wait_u32(b.stream, flag.as_ptr() as *const u32, 1)
                .expect("stream wait");
        }
        Arc::new(Gate {
            flag,
            opened: AtomicBool::new(false),
        })
    }

    fn open(&self) {
        self.opened.store(true, Ordering::SeqCst);
        // SAFETY: aligned, alive as long as self; the device only reads it.
        let f = unsafe { AtomicU32::from_ptr(self.flag.as_ptr() as *mut u32) };
        f.store(1, Ordering::Release);
    }

    fn open_later(self: &Arc<Gate>, after: Duration) -> std::thread::JoinHandle<()> {
        let g = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            g.open();
        })
    }
}

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + k * 13 + 1) as u8).collect()
}

fn download(b: &Binding, buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.bytes()];
    // SAFETY: `out` outlives the synchronisation below.
    unsafe {
        b.dev
            .copy_d2h_async(out.as_mut_ptr(), buf.ptr(), out.len(), b.stream)
            .expect("download");
    }
    b.dev
        .synchronize(b.stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
    out
}

/// Receives 3 rings' worth of pieces while the stream is held: the first
/// ring's worth goes in without waiting; the next piece must wait until
/// the device has copied the oldest slot (the gate opened), and every
/// piece lands intact (plain receive, or reduced with a local region).
fn ring_holds_slots_until_copied(reduce: bool) {
    let b = binding();
    let mut staging = staging(&b);
    let piece = 512 << 10;
    let pieces = 3 * RING_BYTES / piece;
    let bytes = pieces * piece;
    let local = DeviceBuffer::new(&b.dev, bytes).expect("local");
    let recv = DeviceBuffer::new(&b.dev, bytes).expect("recv");
    let ones = vec![1u8; bytes];
    // SAFETY: `ones` outlives the synchronisation in `download`.
    unsafe {
        b.dev
            .copy_h2d_async(local.ptr(), ones.as_ptr(), bytes, b.stream)
    }
    .expect("upload");
    let gate = Gate::close(&b);
    let mem = DeviceMemory::new(
        (&b.dev, b.stream),
        &mut staging,
        IDS,
        (local.ptr(), bytes),
        (recv.ptr(), bytes),
        Duration::from_secs(20),
    );
    let (l, d) = (
        Region::new(BufId::Send, 0, bytes),
        Region::new(BufId::Recv, 0, bytes),
    );
    let put = |k: usize| {
        let data = pattern(k, piece);
        let r = if reduce {
            mem.reduce_at(l, d, 1, k * piece, &data, DataType::Uint8, ReduceOp::Sum)
        } else {
            mem.write_at(d, 1, k * piece, &data)
        };
        r.unwrap_or_else(|e| panic!("piece {k}: {e}"));
    };
    // A full ring while the device runs nothing: no wait (a wait could only
    // end in a timeout, the gate being closed).
    let full = RING_BYTES / piece;
    for k in 0..full {
        put(k);
    }
    let opener = gate.open_later(Duration::from_millis(200));
    put(full);
    assert!(
        gate.opened.load(Ordering::SeqCst),
        "piece {full} reused a ring slot before the device had copied it"
    );
    for k in full + 1..pieces {
        put(k);
    }
    mem.finish().expect("finish");
    drop(mem);
    opener.join().expect("opener");
    let got = download(&b, &recv);
    for k in 0..pieces {
        let mut want = pattern(k, piece);
        if reduce {
            want.iter_mut().for_each(|x| *x = x.wrapping_add(1));
        }
        assert!(
            got[k * piece..(k + 1) * piece] == want[..],
            "piece {k} differs (reduce: {reduce})"
        );
    }
    staging.release(&*b.dev);
}

#[test]
fn ring_never_overwrites_a_slot_the_device_may_read() {
    ring_holds_slots_until_copied(false);
}

#[test]
fn ring_never_overwrites_a_slot_a_reduction_may_read() {
    ring_holds_slots_until_copied(true);
}

#[test]
fn sends_are_staged_in_chunks_without_blocking() {
    let b = binding();
    let mut staging = staging(&b);
    let bytes = 3 * MAX_SEND_CHUNK + 12345;
    let send = DeviceBuffer::new(&b.dev, bytes).expect("send");
    let data = pattern(5, bytes);
    // SAFETY: `data` lives until the end of the test, after the last sync.
    unsafe {
        b.dev
            .copy_h2d_async(send.ptr(), data.as_ptr(), bytes, b.stream)
    }
    .expect("upload");
    let gate = Gate::close(&b);
    let mem = DeviceMemory::new(
        (&b.dev, b.stream),
        &mut staging,
        IDS,
        (send.ptr(), bytes),
        (send.ptr(), 0),
        Duration::from_secs(20),
    );
    let r = Region::new(BufId::Send, 0, bytes);
    let ops = [Op::Send { peer: 1, src: r }, Op::Send { peer: 2, src: r }];
    // Returns at once although the device copies nothing yet.
    mem.prepare_sends(&ops, 1).expect("prepare_sends");
    let chunks = mem.staging.borrow().send_chunks.len();
    assert!(chunks >= 4, "{bytes} bytes staged in {chunks} chunk(s)");
    let first = mem
        .with_piece(r, 1, 0, 4096, |p| p.to_vec())
        .expect("query");
    assert!(
        first.is_none(),
        "a piece was handed out before its copy ran"
    );
    let e = mem
        .with_piece(Region::new(BufId::Send, 1, 8), 1, 0, 8, |_| ())
        .expect_err("an unstaged region");
    assert!(e.to_string().contains("not staged"), "{e}");
    let e = mem
        .with_piece(r, 1, bytes - 4, 8, |_| ())
        .expect_err("beyond the region");
    assert!(e.to_string().contains("beyond"), "{e}");
    gate.open();
    // Every piece arrives intact once its chunk is copied.
    let piece = 100_000;
    let mut at = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while at < bytes {
        let n = piece.min(bytes - at);
        match mem.with_piece(r, 1, at, n, |p| p.to_vec()).expect("query") {
            Some(p) => {
                assert!(p == data[at..at + n], "piece at byte {at} differs");
                at += n;
            }
            None => {
                assert!(Instant::now() < deadline, "chunk at byte {at} never ready");
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    mem.finish().expect("finish");
    drop(mem);
    staging.release(&*b.dev);
}

#[test]
fn fit_places_slots_in_a_ring() {
    use super::{fit, Slot};
    use ::device::EventHandle;
    use std::collections::VecDeque;
    let s = |start, end| Slot {
        start,
        end,
        event: EventHandle(0),
    };
    let mut busy = VecDeque::new();
    assert_eq!(fit(&busy, 100, 100), Some(0));
    busy.push_back(s(0, 256));
    assert_eq!(fit(&busy, 100, 1024), Some(256));
    assert_eq!(fit(&busy, 1024, 1024), None);
    busy.push_back(s(256, 1024));
    assert_eq!(fit(&busy, 1, 1024), None, "full");
    busy.pop_front();
    assert_eq!(fit(&busy, 256, 1024), Some(0), "wraps to the start");
    assert_eq!(fit(&busy, 257, 1024), None);
    busy.push_back(s(0, 128));
    assert_eq!(
        fit(&busy, 128, 1024),
        Some(128),
        "wrapped: up to the oldest"
    );
    assert_eq!(fit(&busy, 129, 1024), None);
}

/// The device path the nvlink transport uses: `device_span` names where a
/// region's bytes lie (and refuses a piece beyond its region), and
/// `device_recv` copies or reduces a piece from another device range (a
/// transport inbox) into the destination on the stream.
#[test]
fn device_span_and_device_recv() {
    let b = binding();
    let mut staging = staging(&b);
    let n = 4096;
    let local = DeviceBuffer::new(&b.dev, n).expect("local");
    let recv = DeviceBuffer::new(&b.dev, n).expect("recv");
    let inbox = DeviceBuffer::new(&b.dev, n).expect("inbox");
    let (ones, piece) = (vec![1u8; n], pattern(3, n));
    // SAFETY: the vectors outlive the synchronisation in `download`.
    unsafe {
        b.dev
            .copy_h2d_async(local.ptr(), ones.as_ptr(), n, b.stream)
            .expect("upload");
        b.dev
            .copy_h2d_async(inbox.ptr(), piece.as_ptr(), n, b.stream)
            .expect("upload");
    }
    let mem = DeviceMemory::new(
        (&b.dev, b.stream),
        &mut staging,
        IDS,
        (local.ptr(), n),
        (recv.ptr(), n),
        Duration::from_secs(20),
    );
    assert!(mem.device_queue().is_some());
    let (l, d) = (
        Region::new(BufId::Send, 0, n),
        Region::new(BufId::Recv, 0, n),
    );
    assert_eq!(
        mem.device_span(l, 1, 100, 10).expect("in bounds"),
        Some(local.ptr().add(100).0)
    );
    let e = mem
        .device_span(l, 1, n - 5, 10)
        .expect_err("beyond the region");
    assert!(e.to_string().contains("beyond its region"), "{e}");
    let half = n / 2;
    let src = inbox.ptr().0;
    let sum = DataType::Uint8;
    // First half: plain copy; second half: local + piece.
    assert!(mem
        .device_recv(None, d, 1, 0, src, half, sum, ReduceOp::Sum)
        .expect("copy"));
    assert!(mem
        .device_recv(
            Some(l),
            d,
            1,
            half,
            src + half as u64,
            half,
            sum,
            ReduceOp::Sum
        )
        .expect("reduce"));
    let e = mem
        .device_recv(None, d, 1, n - 1, src, 2, sum, ReduceOp::Sum)
        .expect_err("beyond the region");
    assert!(e.to_string().contains("beyond its region"), "{e}");
    mem.finish().expect("finish");
    drop(mem);
    let got = download(&b, &recv);
    assert_eq!(got[..half], piece[..half]);
    let want: Vec<u8> = piece[half..].iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(got[half..], want[..]);
}
