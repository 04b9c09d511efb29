//! Process limits that RDMA registration depends on.

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

/// Checks that `bytes` more may be pinned; the error says how to fix it.
pub fn check_memlock(bytes: usize) -> Result<(), String> {
    match memlock_limit() {
        Some(limit) if (bytes as u64) > limit => Err(memlock_advice(limit, bytes as u64)),
        _ => Ok(()),
    }
}

/// The message for a too-low `RLIMIT_MEMLOCK`.
pub fn memlock_advice(limit: u64, need: u64) -> String {
    format!(
        "RLIMIT_MEMLOCK is {} KiB but RDMA registration needs at least {} KiB: raise it \
         (`ulimit -l unlimited` in the launching shell, `* - memlock unlimited` in \
         /etc/security/limits.conf, `LimitMEMLOCK=infinity` for a systemd service, or \
         `--ulimit memlock=-1` for a container), or set SNCL_IB_DISABLE=1 to use TCP",
        limit / 1024,
        need.div_ceil(1024)
    )
}
