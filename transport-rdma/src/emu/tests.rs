//! The emulated provider's semantics, two devices in one process.

use super::*;
use crate::verbs::PathAttrs;

const PATH: PathAttrs = PathAttrs {
    mtu: 4096,
    gid_index: 0,
    sl: 0,
    traffic_class: 0,
    timeout: 20,
    retry_cnt: 7,
};

struct Side {
    dev: EmuVerbs,
    cq: u32,
    qp: u32,
    mr: Mr,
}

fn side(cq_depth: usize) -> Side {
    let mut dev = EmuVerbs::open().unwrap();
    let cq = dev.create_cq(cq_depth).unwrap();
    let qp = dev.create_qp(cq, 16, 16).unwrap();
    let mr = dev.alloc_mr(8192).unwrap();
    Side { dev, cq, qp, mr }
}

fn addr(s: &Side) -> QpAddress {
    QpAddress {
        lid: s.dev.port().lid,
        gid: s.dev.port().gid,
        qpn: s.qp,
        psn: 0,
    }
}

fn connect(a: &mut Side, b: &mut Side) {
    let (xa, xb) = (addr(a), addr(b));
    for (x, y) in [(xb, &mut *a), (xa, &mut *b)] {
        y.dev.modify_qp(y.qp, QpTransition::Init).unwrap();
        y.dev
            .modify_qp(
                y.qp,
                QpTransition::Rtr {
                    remote: x,
                    path: PATH,
                },
            )
            .unwrap();
        y.dev
            .modify_qp(y.qp, QpTransition::Rts { psn: 0, path: PATH })
            .unwrap();
    }
}

fn pair() -> (Side, Side) {
    let (mut a, mut b) = (side(64), side(64));
    connect(&mut a, &mut b);
    (a, b)
}

fn write(a: &mut Side, b: &Side, off: u64, len: u32, imm: Option<u32>) {
    let wr = SendWr {
        signaled: true,
        wr_id: off,
        local: (a.mr.addr, len, a.mr.lkey),
        remote_addr: b.mr.addr + off,
        rkey: b.mr.rkey,
        imm,
    };
    a.dev.post_send(a.qp, &wr).unwrap();
}

fn poll(s: &mut Side) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    s.dev.poll_cq(s.cq, 64, &mut out).unwrap();
    out
}

fn fill(s: &mut Side, byte: u8) {
    let mut buf = buf_of(&s.mr);
    buf.write(0, &[&vec![byte; s.mr.len]]);
}

fn buf_of(mr: &Mr) -> crate::mem::Buf {
    // SAFETY: the region is alive for the whole test (its device is).
    unsafe { crate::mem::Buf::new(mr) }
}

#[test]
fn posting_in_the_wrong_state_fails() {
    let mut a = side(8);
    let b = side(8);
    let wr = SendWr {
        signaled: true,
        wr_id: 1,
        local: (a.mr.addr, 8, a.mr.lkey),
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey,
        imm: None,
    };
    let e = a.dev.post_send(a.qp, &wr).unwrap_err().to_string();
    assert!(e.contains("RESET") && e.contains("RTS"), "{e}");
    assert!(a.dev.post_recv(a.qp, 0).is_err());
    let e = a
        .dev
        .modify_qp(a.qp, QpTransition::Rts { psn: 0, path: PATH })
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs RTR"), "{e}");
    a.dev.modify_qp(a.qp, QpTransition::Init).unwrap();
    a.dev.post_recv(a.qp, 0).unwrap();
    let e = a.dev.post_send(a.qp, &wr).unwrap_err().to_string();
    assert!(e.contains("INIT"), "{e}");
}

#[test]
fn writes_land_and_immediates_complete_in_order() {
    let (mut a, mut b) = pair();
    fill(&mut a, 7);
    // One write before any receive is posted: held, as an RNR retry would.
    write(&mut a, &b, 0, 100, Some(1));
    for i in 0..3 {
        b.dev.post_recv(b.qp, i).unwrap();
    }
    write(&mut a, &b, 100, 0, None);
    write(&mut a, &b, 200, 300, Some(2));
    let sent = poll(&mut a);
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|w| w.status == WcStatus::SUCCESS));
    let got = poll(&mut b);
    let imms: Vec<_> = got.iter().map(|w| (w.wr_id, w.imm, w.byte_len)).collect();
    assert_eq!(imms, vec![(0, Some(1), 100), (1, Some(2), 300)]);
    let buf = buf_of(&b.mr);
    assert!(buf.read(0, 100).iter().all(|&x| x == 7));
    assert!(buf.read(100, 100).iter().all(|&x| x == 0));
    assert!(buf.read(200, 300).iter().all(|&x| x == 7));
}

#[test]
fn out_of_bounds_and_bad_keys_are_access_errors() {
    let (mut a, b) = pair();
    write(&mut a, &b, b.mr.len as u64 - 10, 11, None);
    let w = poll(&mut a);
    assert_eq!(w[0].status, WcStatus::REM_ACCESS_ERR);
    assert!(w[0].status.to_string().contains("remote access error"));
    assert_eq!(a.dev.qp_state(a.qp).unwrap(), QpState::Error);
    // Later work requests are flushed.
    write(&mut a, &b, 0, 8, None);
    assert_eq!(poll(&mut a)[0].status, WcStatus::WR_FLUSH_ERR);

    let (mut a, b) = pair();
    let wr = SendWr {
        signaled: true,
        wr_id: 9,
        local: (a.mr.addr, 8, a.mr.lkey),
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey ^ 0x10,
        imm: None,
    };
    a.dev.post_send(a.qp, &wr).unwrap();
    assert_eq!(poll(&mut a)[0].status, WcStatus::REM_ACCESS_ERR);

    let (mut a, b) = pair();
    let wr = SendWr {
        signaled: true,
        local: (a.mr.addr, 8, a.mr.lkey ^ 0x10),
        rkey: b.mr.rkey,
        ..wr
    };
    a.dev.post_send(a.qp, &wr).unwrap();
    assert_eq!(poll(&mut a)[0].status, WcStatus::LOC_PROT_ERR);

    let (mut a, mut b) = pair();
    let mr = b.mr;
    b.dev.dereg_mr(&mr).unwrap();
    write(&mut a, &b, 0, 8, None);
    assert_eq!(poll(&mut a)[0].status, WcStatus::REM_ACCESS_ERR);
}

#[test]
fn cq_overflow_fails_the_queue() {
    let (mut a, mut b) = (side(64), side(2));
    connect(&mut a, &mut b);
    for i in 0..3 {
        b.dev.post_recv(b.qp, i).unwrap();
        write(&mut a, &b, 0, 8, Some(i as u32));
    }
    let mut out = Vec::new();
    let e = b.dev.poll_cq(b.cq, 8, &mut out).unwrap_err().to_string();
    assert!(e.contains("overflowed"), "{e}");
    assert_eq!(
        b.dev.poll_async_event(),
        Some(AsyncEvent::CqErr { cq: b.cq })
    );
}

#[test]
fn a_qp_in_error_fails_writes_to_it_and_flushes() {
    let (mut a, mut b) = pair();
    b.dev.post_recv(b.qp, 5).unwrap();
    b.dev.inject(Fault::QpFatal { qpn: b.qp }).unwrap();
    assert_eq!(
        b.dev.poll_async_event(),
        Some(AsyncEvent::QpFatal { qpn: b.qp })
    );
    assert_eq!(poll(&mut b)[0].status, WcStatus::WR_FLUSH_ERR);
    // b's QP does not answer, whether or not b polls: a's retries run out.
    write(&mut a, &b, 0, 8, Some(1));
    let w = poll(&mut a);
    assert_eq!(w[0].status, WcStatus::RETRY_EXC_ERR);
    assert_eq!(a.dev.qp_state(a.qp).unwrap(), QpState::Error);
}

#[test]
fn a_peer_that_is_gone_exhausts_retries() {
    for len in [8, 0] {
        let (mut a, b) = pair();
        let Side { dev, cq, qp, mr } = b;
        drop(dev); // b's process is "gone"
        let target = Side {
            dev: EmuVerbs::open().unwrap(),
            cq,
            qp,
            mr,
        };
        write(&mut a, &target, 0, len, None);
        let w = poll(&mut a);
        assert_eq!(w[0].status, WcStatus::RETRY_EXC_ERR, "{len} bytes");
        assert!(w[0].status.to_string().contains("retry counter exceeded"));
    }
}

#[test]
fn port_down_raises_an_event_and_flushes_everything() {
    let (mut a, _b) = pair();
    a.dev.post_recv(a.qp, 1).unwrap();
    a.dev.inject(Fault::PortDown).unwrap();
    assert_eq!(
        a.dev.poll_async_event(),
        Some(AsyncEvent::PortErr { port: 1 })
    );
    assert_eq!(poll(&mut a)[0].status, WcStatus::WR_FLUSH_ERR);
}

/// A file in /dev/shm standing in for an emulated device allocation.
fn device_file(len: usize) -> (std::fs::File, std::path::PathBuf) {
    let token = transport_shm::private_file::random_token().unwrap();
    let name = format!("sncl-emu-t{token:x}-{}", std::process::id());
    transport_shm::private_file::create(&name, len).unwrap()
}

#[test]
fn dmabuf_registrations_take_writes_and_feed_them_with_key_and_bounds_checks() {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;
    let (mut a, mut b) = pair();
    assert!(a.dev.supports_dmabuf());
    // The receiver's "device memory": 64 KiB, registered from byte 4096 at
    // a device-like iova.
    let (file, path) = device_file(64 << 10);
    let iova = 0x4000_0000_0000_0000u64;
    let inbox = b
        .dev
        .reg_dmabuf_mr(file.as_fd(), 4096, 32 << 10, iova)
        .unwrap();
    assert_eq!((inbox.addr, inbox.len), (iova, 32 << 10));
    // The sender's host buffer → the peer's device memory.
    let data: Vec<u8> = (0..100u8).collect();
    // SAFETY: the Side's own registered region.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), a.mr.addr as *mut u8, 100) };
    let wr = |raddr: u64, rkey: u32| SendWr {
        signaled: true,
        wr_id: raddr,
        local: (a.mr.addr, 100, a.mr.lkey),
        remote_addr: raddr,
        rkey,
        imm: Some(7),
    };
    a.dev.post_send(a.qp, &wr(iova + 200, inbox.rkey)).unwrap();
    assert_eq!(poll(&mut a)[0].status, WcStatus::SUCCESS);
    let mut got = vec![0u8; 100];
    file.read_exact_at(&mut got, 4096 + 200).unwrap();
    assert_eq!(got, data, "the WRITE landed in the dma-buf");
    b.dev.post_recv(b.qp, 1).unwrap();
    assert_eq!(poll(&mut b)[0].imm, Some(7));

    // A dma-buf registration as the source of a WRITE (device → peer).
    let (sfile, spath) = device_file(8192);
    sfile.write_all_at(&[9u8; 50], 100).unwrap();
    let src = a.dev.reg_dmabuf_mr(sfile.as_fd(), 0, 8192, 0x7000).unwrap();
    let from_dev = SendWr {
        signaled: true,
        wr_id: 1,
        local: (0x7000 + 100, 50, src.lkey),
        remote_addr: iova,
        rkey: inbox.rkey,
        imm: None,
    };
    a.dev.post_send(a.qp, &from_dev).unwrap();
    assert_eq!(poll(&mut a)[0].status, WcStatus::SUCCESS);
    file.read_exact_at(&mut got[..50], 4096).unwrap();
    assert_eq!(got[..50], [9u8; 50]);
    // A source range past the registration: local protection error.
    let bad_src = SendWr {
        signaled: true,
        local: (0x7000 + 8190, 50, src.lkey),
        ..from_dev
    };
    a.dev.post_send(a.qp, &bad_src).unwrap();
    assert_eq!(poll(&mut a)[0].status, WcStatus::LOC_PROT_ERR);

    // Past the end of the registration: remote access error (a fresh
    // pair: the failed QP is in ERROR).
    let (mut c, mut d) = pair();
    let inbox2 = d.dev.reg_dmabuf_mr(file.as_fd(), 0, 4096, iova).unwrap();
    let over = SendWr {
        signaled: true,
        wr_id: 2,
        local: (c.mr.addr, 100, c.mr.lkey),
        remote_addr: iova + 4000,
        rkey: inbox2.rkey,
        imm: None,
    };
    c.dev.post_send(c.qp, &over).unwrap();
    assert_eq!(poll(&mut c)[0].status, WcStatus::REM_ACCESS_ERR);
    // Deregistered: the key no longer lets anything in.
    let (mut e, mut f) = pair();
    let inbox3 = f.dev.reg_dmabuf_mr(file.as_fd(), 0, 4096, iova).unwrap();
    f.dev.dereg_user_mr(&inbox3).unwrap();
    let late = SendWr {
        signaled: true,
        remote_addr: iova,
        rkey: inbox3.rkey,
        local: (e.mr.addr, 10, e.mr.lkey),
        ..over
    };
    e.dev.post_send(e.qp, &late).unwrap();
    assert_eq!(poll(&mut e)[0].status, WcStatus::REM_ACCESS_ERR);
    // Out of the dma-buf's bounds, or not a /dev/shm file: refused.
    assert!(f
        .dev
        .reg_dmabuf_mr(file.as_fd(), 60 << 10, 8192, iova)
        .is_err());
    let tmp = std::fs::File::open("/proc/self/status").unwrap();
    assert!(f.dev.reg_dmabuf_mr(tmp.as_fd(), 0, 10, iova).is_err());
    let _ = (std::fs::remove_file(path), std::fs::remove_file(spath));
}

/// Strict mode pins registrations by the kernel's rule (issue 36, risk 2):
/// per process, in pages, refused with ENOMEM past `RLIMIT_MEMLOCK`
/// without `CAP_IPC_LOCK`; deregistering and closing unpin; with the
/// capability nothing is refused; the permissive emulation counts nothing.
#[test]
fn strict_mode_pins_by_the_kernels_rule() {
    // A process's count of its own: other tests' strict devices pin too.
    let counter: &'static std::sync::atomic::AtomicU64 =
        Box::leak(Box::new(std::sync::atomic::AtomicU64::new(0)));
    let pinned = || counter.load(std::sync::atomic::Ordering::Relaxed);
    let strict = |pin| Strict {
        pinned: counter,
        ..Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 1))
    };
    let rules = crate::sys::PinRules {
        limit: Some(64 << 10),
        cap_ipc_lock: false,
    };
    let mut a = EmuVerbs::open_strict(strict(rules), None).unwrap();
    let mut b = EmuVerbs::open_strict(strict(rules), None).unwrap();
    let first = a.alloc_mr(40 << 10).unwrap();
    assert_eq!(pinned(), 40 << 10);
    // The count is the process's: b's registration adds to a's.
    let e = b.alloc_mr(30 << 10).unwrap_err().to_string();
    assert!(e.contains("ENOMEM") && e.contains("RLIMIT_MEMLOCK"), "{e}");
    assert_eq!(pinned(), 40 << 10, "a refused registration pins nothing");
    // Up to the limit exactly (whole pages: 100 bytes pin one page).
    let _to_the_limit = b.alloc_mr(20 << 10).unwrap();
    let _one_page = b.alloc_mr(100).unwrap();
    assert!(b.alloc_mr(1).is_err(), "one page past the limit");
    a.dereg_mr(&first).unwrap();
    assert_eq!(pinned(), 24 << 10, "deregistering unpins");
    drop(b);
    assert_eq!(pinned(), 0, "closing the device unpins");
    let root = crate::sys::PinRules {
        limit: Some(4096),
        cap_ipc_lock: true,
    };
    let mut c = EmuVerbs::open_strict(strict(root), None).unwrap();
    c.alloc_mr(1 << 20)
        .expect("CAP_IPC_LOCK: the limit does not bind");
    assert_eq!(pinned(), 1 << 20, "counted all the same");
    drop(c);
    assert_eq!(pinned(), 0, "closing the device unpins");
    // The permissive emulation refuses nothing. (The process-wide count,
    // `pinned_bytes`, is not checked here: other tests' strict devices
    // charge it concurrently.)
    let mut d = EmuVerbs::open().unwrap();
    d.alloc_mr(1 << 20).unwrap();
}

/// A strict side (unbounded pinning) sending from GID index `gid_index`
/// (`None`: the one the port chooses).
fn strict_side(gid_index: Option<u8>) -> Side {
    let pin = crate::sys::PinRules {
        limit: None,
        cap_ipc_lock: true,
    };
    let mut dev = EmuVerbs::open_strict(
        Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 7)),
        gid_index,
    )
    .unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(cq, 16, 16).unwrap();
    let mr = dev.alloc_mr(8192).unwrap();
    Side { dev, cq, qp, mr }
}

/// Connects as the transport does: each side's path names its port's GID
/// index.
fn connect_by_port_index(a: &mut Side, b: &mut Side) -> Result<()> {
    let (xa, xb) = (addr(a), addr(b));
    for (x, y) in [(xb, &mut *a), (xa, &mut *b)] {
        let path = PathAttrs {
            gid_index: y.dev.port().gid_index,
            // Retries run out after 4.096 us x 2^10 x 8 = 34 ms (strict).
            timeout: 10,
            ..PATH
        };
        y.dev.modify_qp(y.qp, QpTransition::Init)?;
        y.dev
            .modify_qp(y.qp, QpTransition::Rtr { remote: x, path })?;
        y.dev.modify_qp(y.qp, QpTransition::Rts { psn: 0, path })?;
    }
    Ok(())
}

/// Strict mode's fabric (issue 36, risk 1): the port is RoCE with an
/// mlx5-like GID table; from index 0 (RoCE v1, link-local) a QP reaches RTS
/// but its WRITE never crosses the routed fabric and ends in retry
/// exceeded; from the routable RoCE v2 entry the port chooses by default
/// (index 3) it arrives; an index outside the table fails at RTR.
#[test]
fn strict_ports_deliver_only_from_routable_roce_v2_gids() {
    let (mut a, mut b) = (strict_side(None), strict_side(None));
    assert_eq!(a.dev.port().link_layer, LinkLayer::Ethernet);
    assert_eq!(a.dev.port().gid_index, 3, "the RoCE v2 IPv4 entry");
    connect_by_port_index(&mut a, &mut b).unwrap();
    write(&mut a, &b, 0, 64, None);
    assert_eq!(poll(&mut a)[0].status, WcStatus::SUCCESS);

    for unroutable in [0, 1, 2] {
        let (mut a, mut b) = (strict_side(Some(unroutable)), strict_side(Some(unroutable)));
        connect_by_port_index(&mut a, &mut b).unwrap();
        assert_eq!(a.dev.qp_state(a.qp).unwrap(), QpState::Rts);
        write(&mut a, &b, 0, 64, None);
        let wc = poll_within(&mut a, std::time::Duration::from_secs(5));
        assert_eq!(wc[0].status, WcStatus::RETRY_EXC_ERR, "index {unroutable}");
        assert_eq!(a.dev.qp_state(a.qp).unwrap(), QpState::Error);
    }

    let (mut a, mut b) = (strict_side(Some(9)), strict_side(Some(9)));
    let e = connect_by_port_index(&mut a, &mut b)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sgid_index 9") && e.contains("EINVAL"), "{e}");
}

/// Strict mode's source rule (ibv_post_send(3)): a WRITE's source changed
/// between posting and retrieving its completion fails the work request;
/// one left alone completes; the permissive emulation does not look.
#[test]
fn strict_mode_fails_a_write_whose_source_changed_before_its_completion() {
    for strict in [true, false] {
        let (mut a, mut b) = if strict {
            (strict_side(None), strict_side(None))
        } else {
            (side(64), side(64))
        };
        if strict {
            connect_by_port_index(&mut a, &mut b).unwrap();
        } else {
            connect(&mut a, &mut b);
        }
        fill(&mut a, 7);
        write(&mut a, &b, 0, 4096, None);
        assert_eq!(poll(&mut a)[0].status, WcStatus::SUCCESS);
        write(&mut a, &b, 0, 4096, None);
        // The sender reuses its buffer before it has seen the completion.
        buf_of(&a.mr).write(100, &[&[9u8; 8]]);
        let status = poll(&mut a)[0].status;
        if strict {
            assert_eq!(status, WcStatus::GENERAL_ERR, "strict");
        } else {
            assert_eq!(status, WcStatus::SUCCESS, "permissive");
        }
    }
}

/// Polls until a completion arrives or `limit` passes.
fn poll_within(s: &mut Side, limit: std::time::Duration) -> Vec<WorkCompletion> {
    let end = std::time::Instant::now() + limit;
    loop {
        let got = poll(s);
        if !got.is_empty() || std::time::Instant::now() > end {
            return got;
        }
        std::thread::yield_now();
    }
}

/// Strict mode's hardware timing: a WRITE to a peer that is gone ends in
/// retry exceeded only when 4.096 us x 2^timeout x (retry_cnt + 1) have
/// passed (34 ms here), and a WRITE posted behind it is flushed after it;
/// the permissive emulation fails at once.
#[test]
fn strict_mode_reports_an_unanswered_write_when_the_retries_run_out() {
    let (mut a, mut b) = (strict_side(None), strict_side(None));
    connect_by_port_index(&mut a, &mut b).unwrap();
    let b_mr = b.mr;
    drop(b); // the peer's device is gone
    let dead = Side {
        mr: b_mr,
        ..strict_side(None)
    };
    let start = std::time::Instant::now();
    write(&mut a, &dead, 0, 64, None);
    write(&mut a, &dead, 64, 64, None);
    assert!(
        a.dev.needs_progress(),
        "late completions keep the device busy"
    );
    assert!(
        poll(&mut a).is_empty(),
        "nothing before the retries run out"
    );
    let first = poll_within(&mut a, std::time::Duration::from_secs(5));
    let waited = start.elapsed();
    assert_eq!(first[0].status, WcStatus::RETRY_EXC_ERR);
    let want = retries_run_out_after(10, 7).unwrap();
    assert!(waited >= want, "{waited:?} < {want:?}");
    let mut rest = first[1..].to_vec();
    if rest.is_empty() {
        rest = poll_within(&mut a, std::time::Duration::from_secs(1));
    }
    assert_eq!(rest[0].status, WcStatus::WR_FLUSH_ERR, "the one behind it");

    // The permissive emulation: at once.
    let (mut a, b) = pair();
    let b_mr = b.mr;
    drop(b);
    let dead = Side {
        mr: b_mr,
        ..side(8)
    };
    write(&mut a, &dead, 0, 64, None);
    assert_eq!(poll(&mut a)[0].status, WcStatus::RETRY_EXC_ERR);
}

mod strict_device;
mod strict_dma;
mod strict_fork;
mod strict_qp;
