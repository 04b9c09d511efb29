//! The GPUDirect device link of two connections (threads of one process,
//! emulated verbs, emulated devices), driven directly: both sides decide
//! alike, device pieces arrive byte for byte in the receiver's inbox and
//! are read from there on its stream, inbox credits wrap the FIFO many
//! times, source registrations are made once per allocation and reused,
//! `SNCL_IB_GDR=0` stages the pair.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, DeviceRegion, Outgoing, Payload, Space};
use common::*;
use device::{Backend, Device, DeviceBuffer, DeviceQueue};
use transport_rdma::{IbSettings, RdmaConnection};

fn queue(ordinal: usize) -> DeviceQueue {
    let dev = device::open(Backend::Emu, ordinal).expect("emulated device");
    let stream = dev.create_stream().expect("stream");
    DeviceQueue { dev, stream }
}

/// Calls `ready` on both sides until both have decided.
fn decide(
    a: &mut RdmaConnection,
    qa: &DeviceQueue,
    b: &mut RdmaConnection,
    qb: &DeviceQueue,
) -> (bool, bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut ra, mut rb) = (None, None);
    while ra.is_none() || rb.is_none() {
        assert!(Instant::now() < deadline, "the pair never decided");
        if ra.is_none() {
            ra = a.ready(qa).expect("ready a");
        }
        if rb.is_none() {
            rb = b.ready(qb).expect("ready b");
        }
    }
    (ra.unwrap(), rb.unwrap())
}

fn upload(q: &DeviceQueue, data: &[u8]) -> DeviceBuffer {
    let buf = DeviceBuffer::new(&q.dev, data.len()).expect("alloc");
    // SAFETY: `data` outlives the synchronisation below.
    unsafe {
        q.dev
            .copy_h2d_async(buf.ptr(), data.as_ptr(), data.len(), q.stream)
    }
    .expect("h2d");
    q.dev
        .synchronize(q.stream, Instant::now() + Duration::from_secs(10))
        .expect("sync");
    buf
}

fn download(q: &DeviceQueue, buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.bytes()];
    // SAFETY: `out` outlives the synchronisation below.
    unsafe {
        q.dev
            .copy_d2h_async(out.as_mut_ptr(), buf.ptr(), out.len(), q.stream)
    }
    .expect("d2h");
    q.dev
        .synchronize(q.stream, Instant::now() + Duration::from_secs(10))
        .expect("sync");
    out
}

/// A device piece of `len` bytes at `addr` on `q`'s device.
fn device_piece(q: &DeviceQueue, addr: u64, len: usize) -> Outgoing<'_> {
    Outgoing::device(DeviceRegion {
        queue: q,
        addr,
        len,
    })
}

/// Sends `src` in pieces of `piece` bytes from `a` to `b`, which copies
/// each from its inbox into `dst` on its stream.
fn transfer(
    (a, qa): (&mut RdmaConnection, &DeviceQueue),
    (b, qb): (&mut RdmaConnection, &DeviceQueue),
    src: &DeviceBuffer,
    dst: &DeviceBuffer,
    piece: usize,
) {
    let total = src.bytes();
    let (mut sent, mut got) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(20);
    let dev_b: Arc<dyn Device> = qb.dev.clone();
    while got < total {
        assert!(
            Instant::now() < deadline,
            "stuck at {sent}/{got} of {total}"
        );
        if sent < total {
            let n = piece.min(total - sent);
            if a.try_post_send(
                &header(n, 1),
                device_piece(qa, src.ptr().0 + sent as u64, n),
            )
            .expect("send")
            {
                sent += n;
            }
        }
        let at = got;
        let mut consume = |h: &comm_core::wire::PieceHeader, p: Payload<'_>| {
            let Payload::Device(inbox) = p else {
                panic!("a host piece where a device piece was expected")
            };
            // SAFETY: the inbox slot holds `h.len` bytes until the event
            // after this copy completes; `dst` has room.
            unsafe {
                dev_b.copy_d2d_async(
                    dst.ptr().add(at),
                    device::DevicePtr(inbox.addr),
                    h.len as usize,
                    qb.stream,
                )
            }
            .expect("d2d");
            got += h.len as usize;
            Ok(())
        };
        b.try_recv(Space::Device(qb), &mut consume).expect("recv");
        // As the executor does while it waits: sent pieces move on.
        a.flush().expect("flush");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.flush().expect("flush") {
        assert!(Instant::now() < deadline, "flush never finished");
    }
}

#[test]
fn device_pieces_go_device_to_device_and_registrations_are_reused() {
    let (mut a, mut b) = pair(4, 64 << 10, 1);
    let (qa, qb) = (queue(0), queue(1));
    assert_eq!(decide(&mut a, &qa, &mut b, &qb), (true, true));
    assert_eq!((a.gdr_active(), b.gdr_active()), (Some(true), Some(true)));
    // 1 MiB + 5 in pieces of the largest size: the 4-slot inbox wraps
    // about 16 times.
    let n = (1 << 20) + 5;
    let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
    let src = upload(&qa, &data);
    let dst = DeviceBuffer::new(&qb.dev, n).expect("alloc");
    let before = transport_rdma::gdr_bytes();
    let max = a.max_piece(MemoryKind::Device);
    let rung = a.verbs_counters();
    transfer((&mut a, &qa), (&mut b, &qb), &src, &dst, max);
    let rung = a.verbs_counters().doorbells - rung.doorbells;
    let pieces = n.div_ceil(max) as u64;
    eprintln!("{pieces} device pieces: {rung} doorbells");
    // The payload WRITE and the header that announces it go as one chain
    // (two doorbells a piece before); now and then a signalled zero-length
    // WRITE retires a staging slot's reader (`fifo_room`), one doorbell of
    // its own, depending on when completions are polled.
    assert!(
        rung * 4 <= pieces * 5,
        "{rung} doorbells for {pieces} device pieces (at most 1.25 a piece)"
    );
    assert_eq!(download(&qb, &dst), data, "bytes arrive as sent");
    let after = transport_rdma::gdr_bytes();
    assert!(after.0 - before.0 >= n as u64 && after.1 - before.1 >= n as u64);
    assert_eq!(
        a.gdr_registrations(),
        1,
        "one registration for one allocation"
    );
    // The same buffer again (new contents): no new registration.
    let data2: Vec<u8> = data.iter().map(|x| x ^ 0x5a).collect();
    // SAFETY: as in `upload`.
    unsafe {
        qa.dev
            .copy_h2d_async(src.ptr(), data2.as_ptr(), n, qa.stream)
    }
    .expect("h2d");
    transfer((&mut a, &qa), (&mut b, &qb), &src, &dst, 7000);
    assert_eq!(download(&qb, &dst), data2);
    assert_eq!(a.gdr_registrations(), 1);
    // Another allocation registers anew.
    let src2 = upload(&qa, &data);
    transfer((&mut a, &qa), (&mut b, &qb), &src2, &dst, max);
    assert_eq!(download(&qb, &dst), data);
    assert_eq!(a.gdr_registrations(), 2);
    // Host pieces still travel on the same connection, once the device
    // pieces' slots are credited back: the receiver returns a slot's credit
    // when its progress sees the copy out of it completed, so both sides
    // progress while the sender waits (as the executor's wait does).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !a
        .try_post_send(&header(3, 2), Outgoing::copied(b"abc"))
        .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "no room for a host piece within 5 s"
        );
        a.flush().expect("flush");
        b.flush().expect("the receiver's progress");
        std::thread::yield_now();
    }
    let mut seen = Vec::new();
    while seen.is_empty() {
        assert!(Instant::now() < deadline);
        b.try_recv(Space::Host, &mut |_, p| {
            let d = p.host().expect("a host piece");
            seen = d.to_vec();
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(seen, b"abc");
}

#[test]
fn gdr_off_stages_the_pair() {
    // (One side off against the other's auto, and a verbs library without
    // ibv_reg_dmabuf_mr, run as processes in tests/rdma_gdr.rs.)
    let off = IbSettings {
        gdr: Some(false),
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(4, 64 << 10, off);
    let (qa, qb) = (queue(0), queue(1));
    assert_eq!(decide(&mut a, &qa, &mut b, &qb), (false, false));
    assert_eq!(a.gdr_active(), Some(false));
    assert!(
        a.try_post_send(&header(4, 1), device_piece(&qa, 0, 4))
            .is_err(),
        "no device path: an error"
    );
    assert_eq!(a.gdr_registrations(), 0);
}

#[test]
fn a_late_inbox_credit_to_a_peer_that_left_is_no_error() {
    // 4 slots: the credit for 2 device pieces goes back once the work
    // reading them has completed, after the receive returned.
    let (mut a, mut b) = pair(4, 64 << 10, 1);
    let (qa, qb) = (queue(0), queue(1));
    assert_eq!(decide(&mut a, &qa, &mut b, &qb), (true, true));
    let data: Vec<u8> = (0..2000).map(|i| (i % 251) as u8).collect();
    let src = upload(&qa, &data);
    let dst = DeviceBuffer::new(&qb.dev, data.len()).expect("alloc");
    let dev_b: Arc<dyn Device> = qb.dev.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut sent, mut got) = (0usize, 0usize);
    while got < 2 {
        assert!(Instant::now() < deadline, "stuck at {sent}/{got}");
        if sent < 2
            && a.try_post_send(
                &header(1000, 1),
                device_piece(&qa, src.ptr().0 + sent as u64 * 1000, 1000),
            )
            .expect("send")
        {
            sent += 1;
        }
        let at = got * 1000;
        let mut consume = |h: &comm_core::wire::PieceHeader, p: Payload<'_>| {
            let Payload::Device(inbox) = p else {
                panic!("a host piece where a device piece was expected")
            };
            // SAFETY: the inbox slot holds `h.len` bytes until the event
            // after this copy completes; `dst` has room.
            unsafe {
                dev_b.copy_d2d_async(
                    dst.ptr().add(at),
                    device::DevicePtr(inbox.addr),
                    h.len as usize,
                    qb.stream,
                )
            }
            .expect("d2d");
            Ok(())
        };
        if b.try_recv(Space::Device(&qb), &mut consume).expect("recv") {
            got += 1;
        }
        a.flush().expect("flush");
    }
    while !a.flush().expect("flush") {
        assert!(Instant::now() < deadline, "flush never finished");
    }
    // a finished and leaves before b's reading work released the slots.
    drop(a);
    while !b.peer_left() {
        assert!(Instant::now() < deadline, "the late credit never went");
        b.flush().expect("a late credit is no error");
    }
    assert_eq!(download(&qb, &dst), data, "bytes arrive as sent");
    // Receiving from the departed peer again names it.
    let e = b
        .try_recv(Space::Device(&qb), &mut |_, _| Ok(()))
        .expect_err("the peer is gone");
    assert!(e.to_string().contains("peer rank 0"), "{e}");
}

/// Issue 36 (dma-buf rules): a verbs library that has
/// `ibv_reg_dmabuf_mr` on a kernel or driver that refuses dma-bufs
/// (EOPNOTSUPP) makes that side say no, with the reason, and the pair
/// stages device pieces instead of failing; with `SNCL_IB_GDR=1` the
/// operation fails naming it.
#[test]
fn a_dmabuf_registration_refused_while_the_symbol_exists_stages_the_pair() {
    let (mut a, mut b) = pair(4, 64 << 10, 1);
    a.inject(transport_rdma::verbs::Fault::DmabufRefused)
        .unwrap();
    let (qa, qb) = (queue(0), queue(1));
    assert_eq!(decide(&mut a, &qa, &mut b, &qb), (false, false));
    assert_eq!(a.gdr_active(), Some(false));
    assert_eq!(b.gdr_active(), Some(false));

    let required = IbSettings {
        gdr: Some(true),
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(4, 64 << 10, required);
    a.inject(transport_rdma::verbs::Fault::DmabufRefused)
        .unwrap();
    let (qa, qb) = (queue(0), queue(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        assert!(Instant::now() < deadline, "the pair never decided");
        match a.ready(&qa) {
            Err(e) => break e.to_string(),
            Ok(Some(v)) => panic!("decided {v} with GPUDirect required and refused"),
            Ok(None) => {}
        }
        let _ = b.ready(&qb);
    };
    assert!(e.contains("EOPNOTSUPP"), "{e}");
}

/// A decided GPUDirect pair whose sender posted one device piece of
/// `data` while its stream is held (the piece's producing work completes
/// only at [`HeldPiece::release`]).
struct HeldPiece {
    a: RdmaConnection,
    b: RdmaConnection,
    /// The held stream's queue (kept alive with it).
    _qa: DeviceQueue,
    qb: DeviceQueue,
    _src: DeviceBuffer,
    gate: device::PinnedBuffer,
}

impl HeldPiece {
    fn post(data: &[u8]) -> HeldPiece {
        let (mut a, mut b) = pair(4, 64 << 10, 1);
        let (qa, qb) = (queue(0), queue(1));
        assert_eq!(decide(&mut a, &qa, &mut b, &qb), (true, true));
        let src = upload(&qa, data);
        let gate = device::PinnedBuffer::new(&qa.dev, 64).expect("pinned");
        let word = gate.as_ptr() as *mut u32;
        // SAFETY: 64 pinned bytes owned by `gate`, which lives as long as
        // the queue that reads them (both in this value).
        unsafe {
            word.write_volatile(0);
            qa.dev.stream_wait_u32(qa.stream, word, 1)
        }
        .expect("hold the stream");
        assert!(a
            .try_post_send(
                &header(data.len(), 1),
                device_piece(&qa, src.ptr().0, data.len())
            )
            .expect("send"));
        HeldPiece {
            a,
            b,
            _qa: qa,
            qb,
            _src: src,
            gate,
        }
    }

    /// Lets the held stream go on: the piece's event completes.
    fn release(&self) {
        // SAFETY: the word lives in `gate`; the device reads it with
        // acquire semantics.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.gate.as_ptr() as *mut u32) }
            .store(1, std::sync::atomic::Ordering::Release);
    }
}

/// Issue 36, risk 10: a device piece is posted once the work producing it
/// completes. Its sender's executor posts it while the stream is held and
/// then goes away; the NIC's progress thread posts it when the stream goes
/// on, and the receiver gets it without the sender calling again.
#[test]
fn a_device_piece_ready_while_the_sender_is_away_goes_out_from_the_nic_thread() {
    let data: Vec<u8> = (0..40_000).map(|i| (i * 7 % 253) as u8).collect();
    let mut held = HeldPiece::post(&data);
    let dst = DeviceBuffer::new(&held.qb.dev, data.len()).expect("alloc");
    // The producing work (behind the hold) completes only now, after the
    // sender's last call.
    std::thread::sleep(Duration::from_millis(20));
    held.release();
    let dev_b: Arc<dyn Device> = held.qb.dev.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = false;
    while !got {
        assert!(
            Instant::now() < deadline,
            "the receiver waited 10 s for a device piece ready while its sender was away \
             (the sender's NIC thread drove it {} times)",
            held.a.background_progress()
        );
        got = held
            .b
            .try_recv(Space::Device(&held.qb), &mut |h, p| {
                let Payload::Device(inbox) = p else {
                    panic!("a host piece where a device piece was expected")
                };
                // SAFETY: the inbox slot holds `h.len` bytes until the
                // event after this copy completes; `dst` has room.
                unsafe {
                    dev_b.copy_d2d_async(
                        dst.ptr(),
                        device::DevicePtr(inbox.addr),
                        h.len as usize,
                        held.qb.stream,
                    )
                }
                .expect("d2d");
                Ok(())
            })
            .expect("recv");
        std::thread::yield_now();
    }
    assert_eq!(download(&held.qb, &dst), data);
    assert!(held.a.background_progress() > 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !held.a.flush().expect("flush") {
        assert!(Instant::now() < deadline, "flush never finished");
    }
}

/// A device piece whose producing work never completes (a faulted
/// device) keeps work outstanding; the NIC's thread, seeing nothing move,
/// looks at the connection ever less often (at most every 16 ms), where it
/// polled every tick for as long as the connection lived.
#[test]
fn the_nic_thread_backs_off_from_a_connection_where_nothing_moves() {
    let mut held = HeldPiece::post(&[7u8; 10_000]);
    // The piece's event never completes while the stream is held.
    std::thread::sleep(Duration::from_millis(300));
    let before = held.a.background_progress();
    std::thread::sleep(Duration::from_secs(1));
    let sweeps = held.a.background_progress() - before;
    assert!(
        (1..=100).contains(&sweeps),
        "{sweeps} sweeps in 1 s of a connection where nothing moves (expected 1 to 100)"
    );
    held.release();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !held.a.flush().expect("flush") {
        assert!(Instant::now() < deadline, "flush never finished");
    }
}
