//! Cross-memory attach (CMA): reading a peer process's memory straight from
//! where it lies with `process_vm_readv(2)`, as Open MPI's vader BTL does.
//! A sender lends a piece of its buffer by posting a descriptor (address and
//! length) in a slot; the receiver reads the bytes with [`read_from`] into a
//! cache-sized bounce buffer. All the raw system calls of the single-copy
//! path live here.
//!
//! Permission: the kernel allows the read when the reader may ptrace the
//! target (same uid and, under Yama's `ptrace_scope` 1, the target named the
//! reader as its tracer). [`allow_attach`] does the latter for any process
//! (`PR_SET_PTRACER_ANY`, as Open MPI does), only where Yama asks for it;
//! scope 2 and 3 turn the single-copy path off. [`probe_word`] is a word a
//! rank publishes at setup so that each peer can prove with one read that
//! the path works before relying on it.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where Yama keeps its ptrace policy.
pub const YAMA_SCOPE_PATH: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// Yama's ptrace scope, or `None` where Yama is not active (no file).
pub fn yama_scope() -> Option<u32> {
    std::fs::read_to_string(YAMA_SCOPE_PATH)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Lets sibling ranks attach to this process for CMA reads where Yama
/// requires it (scope 1: `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`).
/// Returns an error saying why the single-copy path cannot be used: Yama
/// scope 2 or more (attaching needs `CAP_SYS_PTRACE` or is disabled), a
/// failing `prctl`, or a platform without `process_vm_readv`.
pub fn allow_attach() -> Result<(), String> {
    allow_attach_under(yama_scope())
}

/// As [`allow_attach`], for a given Yama scope (`None`: no Yama).
pub fn allow_attach_under(scope: Option<u32>) -> Result<(), String> {
    match scope {
        None | Some(0) => Ok(()),
        Some(1) => set_ptracer_any(),
        Some(s) => Err(format!(
            "Yama ptrace_scope is {s} ({YAMA_SCOPE_PATH}): cross-memory attach between ranks \
             is not permitted"
        )),
    }
}

static PROBE: AtomicU64 = AtomicU64::new(0);

/// The address and the value of this process's probe word: a random non-zero
/// value in static memory, the same for the life of the process. A peer
/// that reads `value` at `address` with [`read_from`] knows that CMA works.
pub fn probe_word() -> io::Result<(u64, u64)> {
    let mut v = PROBE.load(Ordering::Acquire);
    if v == 0 {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(|e| {
            io::Error::other(format!("drawing the CMA probe word: getrandom failed: {e}"))
        })?;
        let fresh = u64::from_ne_bytes(b) | 1;
        v = match PROBE.compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fresh,
            Err(won) => won,
        };
    }
    Ok((PROBE.as_ptr() as u64, v))
}

/// Reads `out.len()` bytes at `address` in process `pid` into `out`.
///
/// Errors keep the kernel's code: `ESRCH` (the process is gone), `EFAULT`
/// (the range is not mapped there, or it went away mid-read), `EPERM`
/// (not permitted to attach). A read that stops short counts as `EFAULT`.
pub fn read_from(pid: u32, address: u64, out: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < out.len() {
        let n = sys::readv(pid, address + done as u64, &mut out[done..])?;
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n;
    }
    Ok(())
}

/// Cross-memory reads against plain copies on this host, measured once per
/// process: `(cma, memcpy)` in bytes per second per reader, as ranks use
/// them: two threads at once, each reading the other's 16 MiB of freshly
/// touched memory (more than most caches hold: lent pieces of large
/// messages come from memory) in 128 KiB pieces into its own bounce
/// buffer, as two ranks of an all-reduce read each other's inputs; each
/// rate the best of two rounds. Where the kernel makes `process_vm_readv`
/// slow per page (some virtual machines: about 1 GB/s against 5 for a
/// copy), lending loses to the slot FIFO, and the setup leaves it off
/// unless forced. A lone reader overstates the case: on a 2-core Intel VM
/// one thread read at 0.5–0.55 of a copy's speed, two at once at 0.4–0.5,
/// two processes reading each other at 0.25–0.33 (docs/perf-notes/NOTEBOOK.md §16).
/// `None` when a read fails.
pub fn read_speed() -> Option<(f64, f64)> {
    static SPEED: std::sync::OnceLock<Option<(f64, f64)>> = std::sync::OnceLock::new();
    *SPEED.get_or_init(|| {
        let sources: [Vec<u8>; 2] =
            [0u8, 1].map(|k| (0..PROBE_BYTES).map(|i| (i * 13) as u8 ^ k).collect());
        let copy = concurrent_rate(&sources, None)?;
        // Reads slower than a quarter of a copy are cut short: their rate
        // is plain after a part, and init should not wait for the rest.
        let budget = 4.0 * PROBE_BYTES as f64 / copy.max(1.0);
        let cma = concurrent_rate(&sources, Some(budget))?;
        Some((cma, copy))
    })
}

/// Bytes each probe thread reads.
const PROBE_BYTES: usize = 16 << 20;
/// The probe's piece: one default slot.
const PROBE_PIECE: usize = 128 << 10;

/// The slowest of two threads' rates (bytes per second, best of two
/// rounds), each reading the other's source in pieces into a bounce buffer
/// at the same time: by copy (`cma_budget` `None`) or by cross-memory read
/// cut short after `cma_budget` seconds. `None` when a read fails.
fn concurrent_rate(sources: &[Vec<u8>; 2], cma_budget: Option<f64>) -> Option<f64> {
    let pid = std::process::id();
    let mut best = [0f64; 2];
    for _ in 0..2 {
        let start = std::sync::Barrier::new(2);
        let rates: Vec<Option<f64>> = std::thread::scope(|s| {
            let start = &start;
            let readers: Vec<_> = (0..2)
                .map(|k| {
                    let src = &sources[1 - k];
                    s.spawn(move || {
                        let mut bounce = vec![0u8; PROBE_PIECE];
                        start.wait();
                        let t = std::time::Instant::now();
                        let mut read = 0;
                        for piece in src.chunks(PROBE_PIECE) {
                            let out = &mut bounce[..piece.len()];
                            match cma_budget {
                                None => kernels::copy(out, piece),
                                Some(_) => read_from(pid, piece.as_ptr() as u64, out).ok()?,
                            }
                            std::hint::black_box(&bounce);
                            read += piece.len();
                            if cma_budget.is_some_and(|b| t.elapsed().as_secs_f64() > b) {
                                break;
                            }
                        }
                        Some(read as f64 / t.elapsed().as_secs_f64().max(1e-9))
                    })
                })
                .collect();
            readers
                .into_iter()
                .map(|r| r.join().ok().flatten())
                .collect()
        });
        for (b, r) in best.iter_mut().zip(rates) {
            *b = b.max(r?);
        }
    }
    Some(best[0].min(best[1]))
}

#[cfg(target_os = "linux")]
fn set_ptracer_any() -> Result<(), String> {
    // SAFETY: prctl with PR_SET_PTRACER takes an integer argument only (the
    // tracer's pid, here "any"); it reads and writes no memory of ours.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PTRACER,
            libc::PR_SET_PTRACER_ANY as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "prctl(PR_SET_PTRACER, ANY) failed under Yama ptrace_scope 1: {}",
            io::Error::last_os_error()
        ))
    }
}

#[cfg(not(target_os = "linux"))]
fn set_ptracer_any() -> Result<(), String> {
    Err("cross-memory attach needs Linux".into())
}

#[cfg(target_os = "linux")]
mod sys {
    use std::io;

    /// One `process_vm_readv` call; returns the bytes read.
    pub(super) fn readv(pid: u32, address: u64, out: &mut [u8]) -> io::Result<usize> {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote = libc::iovec {
            iov_base: address as usize as *mut libc::c_void,
            iov_len: out.len(),
        };
        // SAFETY: `local` describes `out`, memory of ours that is valid for
        // writes of its whole length and exclusively borrowed for the call.
        // `remote` is only an address in the other process: the kernel
        // checks it there and fails with EFAULT, it never touches our memory
        // through it.
        let r = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::io;

    pub(super) fn readv(_pid: u32, _address: u64, _out: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_the_probe() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut out = vec![0u8; src.len()];
        read_from(std::process::id(), src.as_ptr() as u64, &mut out).unwrap();
        assert_eq!(out, src);
        let (a, v) = probe_word().unwrap();
        assert_ne!(v, 0);
        assert_eq!(probe_word().unwrap(), (a, v), "the probe is stable");
        let mut w = [0u8; 8];
        read_from(std::process::id(), a, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), v);
    }

    #[test]
    fn unmapped_address_and_missing_process_are_errors() {
        let mut out = [0u8; 16];
        let e = read_from(std::process::id(), 8, &mut out).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        // pid 0x7ffffffe does not exist.
        let e = read_from(0x7fff_fffe, 4096, &mut out).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }

    #[test]
    fn read_speed_is_measured_once() {
        let (cma, copy) = read_speed().expect("self reads work");
        assert!(cma > 0.0 && copy > 0.0);
        // Not a correctness condition: the rates, for whoever runs the
        // test with --nocapture.
        eprintln!(
            "cross-memory reads {:.2} GB/s, copies {:.2} GB/s per reader",
            cma / 1e9,
            copy / 1e9
        );
        assert_eq!(read_speed(), Some((cma, copy)), "measured once per process");
    }

    #[test]
    fn yama_scopes_two_and_more_refuse() {
        assert!(allow_attach_under(None).is_ok());
        assert!(allow_attach_under(Some(0)).is_ok());
        let e = allow_attach_under(Some(2)).unwrap_err();
        assert!(e.contains("ptrace_scope is 2"), "{e}");
        assert!(allow_attach_under(Some(3)).is_err());
    }
}
