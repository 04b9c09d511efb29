//! Strict mode's DMA (`dma.rs`): a WRITE lands in steps after the post,
//! its immediate and completion come after its last byte, and nothing is
//! ordered across QPs. The permissive emulation places everything at the
//! post, which is what each assertion below tells apart.

use super::*;

const BIG: usize = 1 << 20;

/// Two devices, each with `nqps` QPs connected pairwise and a 1 MiB
/// region (strict: pinning unbounded, defaults otherwise).
pub(super) struct Bed {
    pub(super) a: EmuVerbs,
    pub(super) b: EmuVerbs,
    pub(super) a_cq: u32,
    pub(super) b_cq: u32,
    pub(super) qps: Vec<(u32, u32)>,
    pub(super) a_mr: Mr,
    pub(super) b_mr: Mr,
}

pub(super) fn bed(strict: bool, nqps: usize) -> Bed {
    let open = || {
        if strict {
            let pin = crate::sys::PinRules {
                limit: None,
                cap_ipc_lock: true,
            };
            let s = Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 6));
            EmuVerbs::open_strict(s, None).unwrap()
        } else {
            EmuVerbs::open().unwrap()
        }
    };
    let (mut a, mut b) = (open(), open());
    let (a_cq, b_cq) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let mut qps = Vec::new();
    for _ in 0..nqps {
        let qa = a.create_qp(a_cq, 16, 16).unwrap();
        let qb = b.create_qp(b_cq, 16, 16).unwrap();
        let address = |dev: &EmuVerbs, qpn| QpAddress {
            lid: dev.port().lid,
            gid: dev.port().gid,
            qpn,
            psn: 0,
        };
        let (to_b, to_a) = (address(&b, qb), address(&a, qa));
        for (dev, qpn, remote) in [(&mut a, qa, to_b), (&mut b, qb, to_a)] {
            let path = PathAttrs {
                gid_index: dev.port().gid_index,
                ..PATH
            };
            dev.modify_qp(qpn, QpTransition::Init).unwrap();
            dev.modify_qp(qpn, QpTransition::Rtr { remote, path })
                .unwrap();
            dev.modify_qp(qpn, QpTransition::Rts { psn: 0, path })
                .unwrap();
        }
        b.post_recv(qb, 0).unwrap();
        qps.push((qa, qb));
    }
    let (a_mr, b_mr) = (a.alloc_mr(BIG).unwrap(), b.alloc_mr(BIG).unwrap());
    buf_of(&a_mr).write(0, &[&vec![7u8; BIG]]);
    Bed {
        a,
        b,
        a_cq,
        b_cq,
        qps,
        a_mr,
        b_mr,
    }
}

impl Bed {
    /// WRITEs `len` bytes with immediate `imm` on QP pair `i`, at `off`.
    fn write(&mut self, i: usize, off: u64, len: usize, imm: u32) {
        let wr = SendWr {
            signaled: true,
            wr_id: u64::from(imm),
            local: (self.a_mr.addr + off, len as u32, self.a_mr.lkey),
            remote_addr: self.b_mr.addr + off,
            rkey: self.b_mr.rkey,
            imm: Some(imm),
        };
        self.a.post_send(self.qps[i].0, &wr).unwrap();
    }

    /// Bytes of 7 at the start of `b`'s region from `off`.
    fn landed(&self, off: usize, len: usize) -> usize {
        let buf = buf_of(&self.b_mr);
        let got = buf.read(off, len);
        got.iter().take_while(|&&x| x == 7).count()
    }

    /// One progress call of `a` (its send completions' immediates).
    fn poll_a(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        self.a.poll_cq(self.a_cq, 64, &mut out).unwrap();
        assert!(out.iter().all(|w| w.status == WcStatus::SUCCESS), "{out:?}");
        out.iter().map(|w| w.wr_id).collect()
    }

    /// The immediates `b` has received.
    fn received(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        self.b.poll_cq(self.b_cq, 64, &mut out).unwrap();
        out.iter().filter_map(|w| w.imm).collect()
    }
}

#[test]
fn a_write_lands_in_steps_and_completes_after_its_last_byte() {
    let mut s = bed(true, 1);
    s.write(0, 0, BIG, 1);
    assert_eq!(s.landed(0, BIG), 0, "nothing at the post");
    assert!(s.a.needs_progress());
    assert!(s.poll_a().is_empty());
    assert_eq!(s.landed(0, BIG), dma::CHUNK, "one step per progress call");
    assert!(s.received().is_empty(), "no immediate before the last byte");
    let steps = BIG / dma::CHUNK;
    let mut polls = 1;
    loop {
        polls += 1;
        if !s.poll_a().is_empty() {
            break;
        }
        assert_eq!(s.landed(0, BIG), polls * dma::CHUNK);
        assert!(polls < steps, "done after {steps} steps");
    }
    assert_eq!(polls, steps);
    assert_eq!(s.landed(0, BIG), BIG);
    assert_eq!(s.received(), vec![1]);
    assert!(!s.a.needs_progress());

    // The permissive emulation: all of it at the post.
    let mut p = bed(false, 1);
    p.write(0, 0, BIG, 1);
    assert_eq!(p.landed(0, BIG), BIG);
    assert_eq!(p.received(), vec![1]);
}

#[test]
fn nothing_is_ordered_across_queue_pairs() {
    let mut s = bed(true, 2);
    // A large WRITE on the first QP, then a small one on the second.
    s.write(0, 0, BIG / 2, 1);
    s.write(1, (BIG / 2) as u64, 64, 2);
    let mut done = Vec::new();
    while !done.contains(&2) {
        done.extend(s.poll_a());
    }
    assert!(
        !done.contains(&1),
        "the later, smaller WRITE finished first"
    );
    assert!(
        s.landed(0, BIG / 2) < BIG / 2,
        "the earlier one is still landing"
    );
    assert_eq!(s.received(), vec![2]);
    while !done.contains(&1) {
        done.extend(s.poll_a());
    }
    assert_eq!(s.received(), vec![1]);

    // Permissive: in posting order, at once.
    let mut p = bed(false, 2);
    p.write(0, 0, BIG / 2, 1);
    p.write(1, (BIG / 2) as u64, 64, 2);
    assert_eq!(p.poll_a(), vec![1, 2]);
}

#[test]
fn a_queue_pair_in_error_flushes_its_unfinished_writes() {
    let mut s = bed(true, 1);
    s.write(0, 0, BIG, 1);
    s.write(0, 0, 64, 2);
    s.a.poll_cq(s.a_cq, 64, &mut Vec::new()).unwrap();
    s.a.inject(Fault::Flush { qpn: s.qps[0].0 }).unwrap();
    let mut out = Vec::new();
    s.a.poll_cq(s.a_cq, 64, &mut out).unwrap();
    let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![(1, WcStatus::WR_FLUSH_ERR), (2, WcStatus::WR_FLUSH_ERR)]
    );
    assert!(s.received().is_empty());
    assert!(!s.a.needs_progress());
}

/// Unsignalled WRITEs make no completion; their send-queue slots are
/// freed only by a later completion of the QP, so a queue filled with them
/// refuses more until a signalled one completes (both models).
#[test]
fn unsignalled_writes_hold_their_slots_until_a_completion_covers_them() {
    for strict in [false, true] {
        let mut s = bed(strict, 1);
        for _ in 0..16 {
            s.post(false);
        }
        for _ in 0..3 {
            assert!(
                s.poll_a().is_empty(),
                "no completion for unsignalled writes"
            );
        }
        let e = s.try_post(true).unwrap_err().to_string();
        assert!(e.contains("full"), "{e}");

        let mut s = bed(strict, 1);
        for _ in 0..15 {
            s.post(false);
        }
        s.post(true);
        let mut done = Vec::new();
        while done.is_empty() {
            done = s.poll_a();
        }
        assert_eq!(done, vec![9], "one completion covers all 16");
        for _ in 0..16 {
            s.post(false);
        }
    }
}

impl Bed {
    /// Posts a 64-byte WRITE (wr_id 9) on the first QP pair.
    fn try_post(&mut self, signaled: bool) -> Result<()> {
        let wr = SendWr {
            signaled,
            wr_id: 9,
            local: (self.a_mr.addr, 64, self.a_mr.lkey),
            remote_addr: self.b_mr.addr,
            rkey: self.b_mr.rkey,
            imm: None,
        };
        self.a.post_send(self.qps[0].0, &wr)
    }

    fn post(&mut self, signaled: bool) {
        self.try_post(signaled).unwrap();
    }
}

/// A WRITE of `len` bytes from the user registration `mr` (at its start)
/// on QP pair 0; returns how long until its completion.
fn write_user(s: &mut Bed, mr: &Mr, len: usize) -> std::time::Duration {
    let wr = SendWr {
        signaled: true,
        wr_id: 9,
        local: (mr.addr, len as u32, mr.lkey),
        remote_addr: s.b_mr.addr,
        rkey: s.b_mr.rkey,
        imm: None,
    };
    let t0 = std::time::Instant::now();
    s.a.post_send(s.qps[0].0, &wr).unwrap();
    while s.poll_a().is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "no completion"
        );
    }
    t0.elapsed()
}

#[test]
fn an_on_demand_source_faults_on_first_touch_unless_prefetched() {
    let mut s = bed(true, 1);
    let user = vec![5u8; 256 << 10];
    let (addr, len) = (user.as_ptr() as u64, user.len());
    // SAFETY: `user` outlives every WRITE below (each is polled to its
    // completion) and is deregistered before it is dropped.
    let mr = unsafe { s.a.reg_user_mr(addr, len, true) }.unwrap();
    let took = write_user(&mut s, &mr, len);
    assert_eq!(
        s.a.counters().odp_faults,
        1,
        "one fault for the work request"
    );
    assert!(
        took >= odp::ODP_FAULT,
        "the QP stalled on the fault: {took:?}"
    );
    // Its pages are translated now: a second pass does not fault.
    write_user(&mut s, &mr, len);
    assert_eq!(s.a.counters().odp_faults, 1);
    s.a.dereg_user_mr(&mr).unwrap();

    // A prefetched registration (ibv_advise_mr) does not fault at all.
    // SAFETY: as above.
    let mr = unsafe { s.a.reg_user_mr(addr, len, true) }.unwrap();
    assert!(s.a.prefetch_on_demand(&mr, addr, len).unwrap());
    write_user(&mut s, &mr, len);
    assert_eq!(s.a.counters().odp_faults, 1, "no new fault");
    // Prefetch is for on-demand registrations only (odp.c: EINVAL).
    assert!(s.a.prefetch_on_demand(&mr, addr, len + 4096).is_err());
    s.a.dereg_user_mr(&mr).unwrap();
    // SAFETY: as above.
    let pinned = unsafe { s.a.reg_user_mr(addr, len, false) }.unwrap();
    let e = s.a.prefetch_on_demand(&pinned, addr, len).unwrap_err();
    assert!(e.to_string().contains("EINVAL"), "{e}");
    // A pinned source never faults.
    write_user(&mut s, &pinned, len);
    assert_eq!(s.a.counters().odp_faults, 1);
    s.a.dereg_user_mr(&pinned).unwrap();
}

#[test]
fn a_pinned_source_mapped_again_since_its_registration_fails_the_write() {
    let mut s = bed(true, 1);
    let len = 2 * 4096;
    let mut map = memmap2::MmapMut::map_anon(len).unwrap();
    map.fill(3);
    let addr = map.as_ptr() as u64;
    // SAFETY: `map` stays mapped (at this address) until the end, after
    // the registration is dropped and every WRITE completed.
    let mr = unsafe { s.a.reg_user_mr(addr, len, false) }.unwrap();
    if s.a.mrs[&mr.lkey].pinned_pages.is_none() {
        eprintln!("skipped: page frame numbers are hidden (needs CAP_SYS_ADMIN)");
        return;
    }
    let post = |s: &mut Bed| write_from(s, &mr);
    assert_eq!(
        post(&mut s),
        WcStatus::SUCCESS,
        "the pinned pages are still there"
    );
    // Freed and mapped again at the same address: new pages, which the
    // NIC's pinned registration does not see.
    // SAFETY: replaces this test's own mapping (same address and length)
    // with a fresh anonymous one; nothing else refers to the old pages.
    let again = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(again as u64, addr);
    map.fill(3);
    assert_eq!(post(&mut s), WcStatus::GENERAL_ERR, "stale pages were read");
    s.a.dereg_user_mr(&mr).unwrap();
}

/// Posts one signalled WRITE of the whole of `mr` (a user registration
/// of `a`) into `b`'s region on the first QP and waits for its status.
pub(super) fn write_from(s: &mut Bed, mr: &Mr) -> WcStatus {
    let wr = SendWr {
        signaled: true,
        wr_id: 1,
        local: (mr.addr, mr.len as u32, mr.lkey),
        remote_addr: s.b_mr.addr,
        rkey: s.b_mr.rkey,
        imm: None,
    };
    s.a.post_send(s.qps[0].0, &wr).unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let mut out = Vec::new();
        s.a.poll_cq(s.a_cq, 8, &mut out).unwrap();
        if let Some(w) = out.first() {
            return w.status;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }
}
