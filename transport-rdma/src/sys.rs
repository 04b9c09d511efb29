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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_memlock_limit_is_reported_with_the_fix() {
        let msg = memlock_advice(64 << 10, 32 << 20);
        assert!(msg.contains("64 KiB") && msg.contains("32768 KiB"), "{msg}");
        assert!(msg.contains("ulimit -l unlimited") && msg.contains("SNCL_IB_DISABLE"));
        match memlock_limit() {
            Some(limit) => {
                let e = check_memlock(limit as usize + 1).unwrap_err();
                assert!(e.contains("RLIMIT_MEMLOCK"), "{e}");
                assert!(check_memlock(limit as usize).is_ok());
            }
            None => eprintln!("RLIMIT_MEMLOCK is unlimited here: only the message was checked"),
        }
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
