//! Strict mode's device profile at the emulated device's calls
//! (`profile.rs`, `checks.rs`).

use super::*;

/// A strict device without on-demand paging refuses ODP registrations
/// (EOPNOTSUPP), answers the probe no, and the transport's zero-copy
/// choice follows (staging by default, pinned when asked for); a CX-7's
/// limits bound queues. The permissive device takes all of it.
#[test]
fn a_device_without_odp_and_the_queue_limits() {
    use crate::regcache::ZeroCopy;
    let pin = crate::sys::PinRules {
        limit: None,
        cap_ipc_lock: true,
    };
    let strict = Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 4));
    let no_odp = Strict {
        profile: DeviceProfile {
            on_demand: false,
            ..DeviceProfile::CONNECTX7
        },
        ..strict.clone()
    };
    let mut dev = EmuVerbs::open_strict(no_odp, None).unwrap();
    assert!(!dev.supports_on_demand());
    let page = vec![0u8; 4096];
    // SAFETY: `page` outlives the registration (nothing is posted).
    let e = unsafe { dev.reg_user_mr(page.as_ptr() as u64, 4096, true) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("EOPNOTSUPP"), "{e}");
    assert_eq!(ZeroCopy::choose(None, &mut dev), ZeroCopy::Off);
    assert_eq!(ZeroCopy::choose(Some(true), &mut dev), ZeroCopy::Pinned);

    let mut cx7 = EmuVerbs::open_strict(strict, None).unwrap();
    assert!(cx7.supports_on_demand());
    assert_eq!(ZeroCopy::choose(None, &mut cx7), ZeroCopy::OnDemand);
    let cq = cx7.create_cq(64).unwrap();
    let e = cx7.create_qp(cq, 40_000, 16).unwrap_err().to_string();
    assert!(e.contains("max_qp_wr 32768"), "{e}");
    assert!(cx7.create_cq(5 << 20).is_err());

    let mut permissive = EmuVerbs::open().unwrap();
    let cq = permissive.create_cq(64).unwrap();
    permissive.create_qp(cq, 40_000, 16).unwrap();
}

/// Issue 36, risk 9: the strict device reports a NUMA node and the FIFO
/// and staging it registers are placed there (a preferred-node policy on
/// their pages); the permissive device reports none and leaves the
/// default policy.
#[test]
fn registered_memory_is_placed_on_the_nics_numa_node() {
    let pin = crate::sys::PinRules {
        limit: None,
        cap_ipc_lock: true,
    };
    let strict = Strict::new(pin, std::net::Ipv4Addr::new(198, 18, 0, 4));
    let Some(node) = strict.numa_node else {
        eprintln!("skipped: this kernel reports no NUMA node");
        return;
    };
    let mut dev = EmuVerbs::open_strict(strict, None).unwrap();
    assert_eq!(dev.port().numa_node, Some(node));
    let mr = dev.alloc_mr(1 << 20).unwrap();
    let placed = crate::numa::preferred_node(mr.addr);
    if placed.is_none() && crate::numa::preferred_node(mr.addr + 4096).is_none() {
        // A kernel that refuses mbind (seccomp in some containers) leaves
        // the policy alone; the transport logs it and goes on.
        let probe = memmap2::MmapMut::map_anon(4096).unwrap();
        if crate::numa::prefer_node(probe.as_ptr() as u64, 4096, node).is_err() {
            eprintln!("skipped: mbind is refused here");
            return;
        }
    }
    assert_eq!(placed, Some(node), "the staging's first page");
    assert_eq!(crate::numa::preferred_node(mr.addr + (1 << 19)), Some(node));

    let mut loose = EmuVerbs::open().unwrap();
    assert_eq!(loose.port().numa_node, None);
    let mr = loose.alloc_mr(1 << 20).unwrap();
    assert_eq!(crate::numa::preferred_node(mr.addr), None);
}
