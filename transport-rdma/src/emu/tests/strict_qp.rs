//! Strict mode's queue-pair rules between two devices (`qp_rules.rs`):
//! PSNs, the QP acknowledgements go to, and the path MTU against both
//! ports' active MTUs. Each case also runs on the permissive emulation,
//! which lands every one of them: the rule, not the setup, fails them.

use super::*;

/// How one direction, `a` → `b`, is connected.
#[derive(Clone, Copy)]
struct Wiring {
    /// `a`'s send PSN (its RTS).
    a_sends: u32,
    /// The PSN `b` expects (its RTR's `rq_psn`).
    b_expects: u32,
    /// Whether `b`'s RTR names `a`'s QP as the one it answers.
    b_answers_a: bool,
    /// `a`'s path MTU.
    a_path_mtu: u32,
}

const MATCHED: Wiring = Wiring {
    a_sends: 5,
    b_expects: 5,
    b_answers_a: true,
    a_path_mtu: 4096,
};

/// A side whose port's active MTU is `mtu` (strict), or a permissive one.
fn side_of(strict: bool, mtu: u32) -> Side {
    if !strict {
        return side(64);
    }
    let pin = crate::sys::PinRules {
        limit: None,
        cap_ipc_lock: true,
    };
    let s = Strict {
        mtu,
        ..Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 8))
    };
    let mut dev = EmuVerbs::open_strict(s, None).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = dev.create_qp(cq, 16, 16).unwrap();
    let mr = dev.alloc_mr(8192).unwrap();
    Side { dev, cq, qp, mr }
}

fn wire(a: &mut Side, b: &mut Side, w: Wiring) {
    let path = |y: &Side, mtu| PathAttrs {
        gid_index: y.dev.port().gid_index,
        mtu,
        // Retries run out after 4.096 us x 2^10 x 8 = 34 ms (strict).
        timeout: 10,
        ..PATH
    };
    let (pa, pb) = (path(a, w.a_path_mtu), path(b, 4096));
    let to_b = QpAddress { psn: 9, ..addr(b) };
    let to_a = QpAddress {
        psn: w.b_expects,
        qpn: if w.b_answers_a { a.qp } else { a.qp + 1 },
        ..addr(a)
    };
    for (y, remote, path, psn) in [(&mut *a, to_b, pa, w.a_sends), (&mut *b, to_a, pb, 9)] {
        y.dev.modify_qp(y.qp, QpTransition::Init).unwrap();
        y.dev
            .modify_qp(y.qp, QpTransition::Rtr { remote, path })
            .unwrap();
        y.dev
            .modify_qp(y.qp, QpTransition::Rts { psn, path })
            .unwrap();
    }
}

/// Writes 4 KiB of 7s with an immediate from `a` to a posted receive of
/// `b`; returns `a`'s completion status (within 5 s), whether the bytes
/// landed and whether `b` received the immediate.
fn send(a: &mut Side, b: &mut Side) -> (WcStatus, bool, bool) {
    fill(a, 7);
    b.dev.post_recv(b.qp, 1).unwrap();
    write(a, b, 0, 4096, Some(42));
    let status = poll_within(a, std::time::Duration::from_secs(5))[0].status;
    let landed = buf_of(&b.mr).read(0, 4096).iter().all(|&x| x == 7);
    let got = poll(b).iter().any(|w| w.imm == Some(42));
    (status, landed, got)
}

fn run(strict: bool, a_mtu: u32, b_mtu: u32, w: Wiring) -> (WcStatus, bool, bool) {
    let (mut a, mut b) = (side_of(strict, a_mtu), side_of(strict, b_mtu));
    wire(&mut a, &mut b, w);
    send(&mut a, &mut b)
}

#[test]
fn strict_connections_need_matching_psns_acks_and_mtus() {
    let ok = (WcStatus::SUCCESS, true, true);
    for strict in [false, true] {
        assert_eq!(run(strict, 4096, 4096, MATCHED), ok, "strict {strict}");
    }
    let cases = [
        // Ahead of what the responder expects: NAKed, nothing lands.
        (
            4096,
            Wiring {
                a_sends: 6,
                ..MATCHED
            },
            (WcStatus::RETRY_EXC_ERR, false, false),
        ),
        // Behind it: duplicates, acknowledged and dropped.
        (
            4096,
            Wiring {
                a_sends: 4,
                ..MATCHED
            },
            (WcStatus::SUCCESS, false, false),
        ),
        // The responder acknowledges another QP: the data lands, the
        // requester's retries run out.
        (
            4096,
            Wiring {
                b_answers_a: false,
                ..MATCHED
            },
            (WcStatus::RETRY_EXC_ERR, true, true),
        ),
        // A 4096-byte path MTU towards a 1024-byte port: the packets
        // never arrive.
        (1024, MATCHED, (WcStatus::RETRY_EXC_ERR, false, false)),
        // The smaller of the two, as the transport's setup chooses.
        (
            1024,
            Wiring {
                a_path_mtu: 1024,
                ..MATCHED
            },
            ok,
        ),
    ];
    for (b_mtu, w, strict_outcome) in cases {
        assert_eq!(run(true, 4096, b_mtu, w), strict_outcome, "strict");
        assert_eq!(run(false, 4096, b_mtu, w), ok, "permissive lands it");
    }
}

/// `IBV_EVENT_COMM_EST` (ibv_get_async_event(3)): the first packet a QP
/// still in RTR receives raises it, once; it is informational (the
/// transport does not fail a connection on it).
#[test]
fn a_first_packet_on_a_qp_in_rtr_raises_comm_est_once() {
    let (mut a, mut b) = (side_of(true, 4096), side_of(true, 4096));
    let path = |y: &Side| PathAttrs {
        gid_index: y.dev.port().gid_index,
        mtu: 4096,
        timeout: 10,
        ..PATH
    };
    let (pa, pb) = (path(&a), path(&b));
    let to_b = QpAddress { psn: 9, ..addr(&b) };
    let to_a = QpAddress { psn: 5, ..addr(&a) };
    a.dev.modify_qp(a.qp, QpTransition::Init).unwrap();
    a.dev
        .modify_qp(
            a.qp,
            QpTransition::Rtr {
                remote: to_b,
                path: pa,
            },
        )
        .unwrap();
    a.dev
        .modify_qp(a.qp, QpTransition::Rts { psn: 5, path: pa })
        .unwrap();
    // `b` only receives: it stays in RTR.
    b.dev.modify_qp(b.qp, QpTransition::Init).unwrap();
    b.dev
        .modify_qp(
            b.qp,
            QpTransition::Rtr {
                remote: to_a,
                path: pb,
            },
        )
        .unwrap();
    assert_eq!(b.dev.poll_async_event(), None);
    for _ in 0..2 {
        b.dev.post_recv(b.qp, 1).unwrap();
        write(&mut a, &b, 0, 4096, Some(42));
        let done = poll_within(&mut a, std::time::Duration::from_secs(5));
        assert_eq!(done[0].status, WcStatus::SUCCESS);
    }
    assert_eq!(poll(&mut b).len(), 2);
    let ev = b.dev.poll_async_event();
    assert_eq!(ev, Some(AsyncEvent::CommEst { qpn: b.qp }));
    assert!(!ev.unwrap().is_fatal());
    assert_eq!(b.dev.poll_async_event(), None, "raised once");
}
