//! Process limits that RDMA registration depends on.

/// Where the machine's sysfs is mounted.
pub const SYSFS_ROOT: &str = "/sys";

/// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited or unknown).
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into a valid place.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The kernel's rule for memory an RDMA registration pins: the pages count
/// against the process's `RLIMIT_MEMLOCK` unless it has `CAP_IPC_LOCK`
/// (`ib_umem_get` in the kernel's drivers/infiniband/core/umem.c:
/// `new_pinned > lock_limit && !capable(CAP_IPC_LOCK)` fails with ENOMEM;
/// setrlimit(2) on RLIMIT_MEMLOCK says the same of mlock). Root has
/// `CAP_IPC_LOCK` unless a container or `setpriv` dropped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinRules {
    /// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited).
    pub limit: Option<u64>,
    /// Whether `CAP_IPC_LOCK` is in the process's effective set.
    pub cap_ipc_lock: bool,
}

/// The page the kernel counts pinned memory in.
pub const PIN_PAGE: u64 = 4096;

/// `CAP_IPC_LOCK`'s bit in the capability sets (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

impl PinRules {
    /// This process's limit and capability.
    pub fn of_process() -> PinRules {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        PinRules {
            limit: memlock_limit(),
            cap_ipc_lock: cap_ipc_lock_in_status(&status),
        }
    }

    /// The bytes this process may pin in all (`None`: no bound).
    pub fn budget(&self) -> Option<u64> {
        if self.cap_ipc_lock {
            None
        } else {
            self.limit
        }
    }

    /// Whether the process may have `total` bytes pinned (counted in whole
    /// pages, as the kernel counts them).
    pub fn allows(&self, total: u64) -> bool {
        match self.budget() {
            None => true,
            Some(limit) => total.div_ceil(PIN_PAGE) <= limit / PIN_PAGE,
        }
    }
}

/// Whether the effective set (`CapEff:` of /proc/PID/status, hex) holds
/// `CAP_IPC_LOCK`.
fn cap_ipc_lock_in_status(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << CAP_IPC_LOCK) != 0)
}

/// Checks, by the kernel's rule (`rules`, read once per device context:
/// a registration must not read /proc), that `bytes` may be pinned in all;
/// the error says how to fix it.
pub fn check_pin(rules: &PinRules, bytes: usize) -> Result<(), String> {
    match rules.budget() {
        Some(limit) if !rules.allows(bytes as u64) => Err(memlock_advice(limit, bytes as u64)),
        _ => Ok(()),
    }
}

/// The message for a too-low `RLIMIT_MEMLOCK`.
pub fn memlock_advice(limit: u64, need: u64) -> String {
    format!(
        "RLIMIT_MEMLOCK is {} KiB but RDMA registration needs at least {} KiB: raise it \
         (`ulimit -l unlimited` in the launching shell, `* - memlock unlimited` in \
         /etc/security/limits.conf, `LimitMEMLOCK=infinity` for a systemd service, or \
         `--ulimit memlock=-1` for a container; or run with CAP_IPC_LOCK, which the limit does not \
         bind), or set SNCL_IB_DISABLE=1 to use TCP",
        limit / 1024,
        need.div_ceil(1024)
    )
}

fn ofd_lock(kind: libc::c_short) -> libc::flock {
    libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// Takes an exclusive open-file-description lock on the whole file: it lasts
/// until the process exits (even as a zombie), so peers can tell a live
/// owner from a dead one with [`lock_held`].
pub fn hold_lock(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut l = ofd_lock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on an open descriptor with a valid `flock`.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether another open file description holds a lock on `file` (its owner
/// is alive).
pub fn lock_held(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    let mut l = ofd_lock(libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on an open descriptor with a valid `flock` to fill in.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut l) };
    rc == 0 && l.l_type != libc::F_UNLCK as libc::c_short
}

/// Whether the kernel module that lets `ibv_reg_mr` take device memory is
/// loaded: `nvidia_peermem` (the GPU driver's, 470 and newer) or the
/// older `nv_peer_mem` (NCCL looks for the same two).
pub fn peermem_loaded() -> bool {
    ["/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"]
        .iter()
        .any(|m| std::path::Path::new(m).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_pin_applies_the_rules_it_is_given() {
        let limited = PinRules {
            limit: Some(8 << 20),
            cap_ipc_lock: false,
        };
        assert!(check_pin(&limited, 8 << 20).is_ok());
        let e = check_pin(&limited, (8 << 20) + 1).unwrap_err();
        assert!(e.contains("RLIMIT_MEMLOCK is 8192 KiB"), "{e}");
        let capable = PinRules {
            cap_ipc_lock: true,
            ..limited
        };
        assert!(check_pin(&capable, 1 << 40).is_ok());
    }

    #[test]
    fn a_low_memlock_limit_is_reported_with_the_fix() {
        let msg = memlock_advice(64 << 10, 32 << 20);
        assert!(msg.contains("64 KiB") && msg.contains("32768 KiB"), "{msg}");
        assert!(msg.contains("ulimit -l unlimited") && msg.contains("SNCL_IB_DISABLE"));
        assert!(msg.contains("CAP_IPC_LOCK"), "{msg}");
    }

    /// The kernel's rule (issue 36, risk 2): the limit binds only without
    /// CAP_IPC_LOCK, in whole pages. The old pre-check refused root at the
    /// common 8 MiB limit.
    #[test]
    fn the_limit_binds_only_without_cap_ipc_lock_in_whole_pages() {
        let capped = PinRules {
            limit: Some(64 << 10),
            cap_ipc_lock: false,
        };
        assert!(capped.allows(64 << 10));
        assert!(!capped.allows((64 << 10) + 1));
        assert_eq!(capped.budget(), Some(64 << 10));
        let root = PinRules {
            limit: Some(8 << 20),
            cap_ipc_lock: true,
        };
        assert!(root.allows(1 << 40), "CAP_IPC_LOCK: no limit");
        assert_eq!(root.budget(), None);
        let unlimited = PinRules {
            limit: None,
            cap_ipc_lock: false,
        };
        assert!(unlimited.allows(u64::MAX));
        // 10,000 bytes of limit are two whole pages.
        let odd = PinRules {
            limit: Some(10_000),
            cap_ipc_lock: false,
        };
        assert!(odd.allows(8192) && !odd.allows(8193));
    }

    #[test]
    fn cap_ipc_lock_is_read_from_the_effective_set() {
        let status = |eff: &str| format!("Name:\tx\nCapInh:\t0000000000004000\nCapEff:\t{eff}\n");
        assert!(cap_ipc_lock_in_status(&status("000001ffffffffff")));
        assert!(cap_ipc_lock_in_status(&status("0000000000004000")));
        assert!(!cap_ipc_lock_in_status(&status("0000000000000000")));
        assert!(!cap_ipc_lock_in_status(&status("000001ffffffbfff")));
        assert!(!cap_ipc_lock_in_status("no such line"));
        // This process: root in CI keeps it unless dropped.
        eprintln!("this process: {:?}", PinRules::of_process());
    }

    #[test]
    fn a_lock_shows_its_owner_alive() {
        let dir = std::env::temp_dir().join(format!("sncl-rdma-lock-{}", std::process::id()));
        let owner = std::fs::File::create(&dir).unwrap();
        let peer = std::fs::File::open(&dir).unwrap();
        assert!(!lock_held(&peer));
        hold_lock(&owner).unwrap();
        assert!(lock_held(&peer));
        drop(owner);
        assert!(
            !lock_held(&peer),
            "the lock goes with its owner's descriptor"
        );
        std::fs::remove_file(&dir).unwrap();
    }
}
