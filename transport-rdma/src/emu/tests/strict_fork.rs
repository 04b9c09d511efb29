//! Strict mode's fork rule (`fork.rs`): a fork followed by a write in the
//! parent moves a pinned registration's pages unless `fork_init` kept
//! them out of the child.

use super::strict_dma::{bed, write_from};
use super::*;

/// Forks a child that only sleeps (killed by the caller), so that the
/// parent's pages stay shared with it while the parent writes.
fn fork_a_sleeping_child() -> libc::pid_t {
    // SAFETY: the child calls only async-signal-safe functions (sleep,
    // _exit) before it ends, as fork(2) requires of a child of a
    // multithreaded process.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::sleep(30);
            libc::_exit(0)
        }
    }
    pid
}

fn end_child(pid: libc::pid_t) {
    // SAFETY: `pid` is this test's own child; waitpid reaps it.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// One pinned registration of fresh memory, a WRITE from it, a fork, a
/// write by the parent, and a second WRITE: its status (`None`: the rule
/// cannot apply here, page frame numbers are hidden).
fn write_after_fork(s: &mut super::strict_dma::Bed) -> Option<WcStatus> {
    let len = 2 * 4096;
    let mut map = memmap2::MmapMut::map_anon(len).unwrap();
    map.fill(3);
    // SAFETY: `map` stays mapped until after the registration is dropped
    // and every WRITE from it completed.
    let mr = unsafe { s.a.reg_user_mr(map.as_ptr() as u64, len, false) }.unwrap();
    if s.a.mrs[&mr.lkey].pinned_pages.is_none() {
        s.a.dereg_user_mr(&mr).unwrap();
        return None;
    }
    assert_eq!(write_from(s, &mr), WcStatus::SUCCESS, "before the fork");
    let child = fork_a_sleeping_child();
    map.fill(4);
    let status = write_from(s, &mr);
    end_child(child);
    s.a.dereg_user_mr(&mr).unwrap();
    Some(status)
}

#[test]
fn a_write_by_the_parent_after_a_fork_needs_fork_init() {
    if !fork_initialized() {
        let mut s = bed(true, 1);
        // A library that never called ibv_fork_init, on a kernel without
        // copy-on-fork for pinned pages: the parent's write took a copy
        // and the NIC reads the old page.
        match write_after_fork(&mut s) {
            None => {
                eprintln!("skipped: page frame numbers are hidden (needs CAP_SYS_ADMIN)");
                return;
            }
            Some(status) => assert_eq!(status, WcStatus::GENERAL_ERR, "without fork_init"),
        }
    } else {
        eprintln!("fork_init was called earlier in this process: only its half runs");
    }
    fork_init();
    assert!(fork_initialized());
    // A fresh pair: the failed WRITE left the first one's QP in error.
    match write_after_fork(&mut bed(true, 1)) {
        None => eprintln!("skipped: page frame numbers are hidden (needs CAP_SYS_ADMIN)"),
        Some(status) => assert_eq!(status, WcStatus::SUCCESS, "with fork_init"),
    }
}
