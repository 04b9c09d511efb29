//! Stream memory operations: `cuStreamWaitValue32/64` and
//! `cuStreamWriteValue32/64`.
//!
//! Rules (Driver API, "Stream Memory Operations", and `CUstreamWaitValue_flags`
//! in cuda.h):
//! * `CU_STREAM_WAIT_VALUE_GEQ`: "Wait until (int32_t)(*addr - value) >= 0
//!   (or int64_t for 64 bit values). Note this is a cyclic comparison which
//!   ignores wraparound." — so a wait released with `u32::MAX` for a value
//!   above 2^31 away is *not* released;
//! * `EQ`: `*addr == value`; `AND`: `(*addr & value) != 0`; `NOR`:
//!   `~(*addr | value) != 0`; `CU_STREAM_WAIT_VALUE_FLUSH` may be or-ed in
//!   (ordering only; the model's memory is coherent);
//! * the address must be device memory or mapped page-locked host memory
//!   the driver knows, aligned to the value's size, else
//!   `CUDA_ERROR_INVALID_VALUE`;
//! * a write is ordered after the stream's earlier work (with a memory
//!   barrier unless `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::memory;
use crate::stream::{Op, PassesNow, State, Stream};
use crate::{CUresult, Res};

/// The comparison of a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Cyclic greater-or-equal.
    Geq,
    /// Equal.
    Eq,
    /// Some bit in common.
    And,
    /// Not all bits covered.
    Nor,
}

/// The flags' comparison (the flush bit, 1 << 30, is accepted and ignored).
pub fn test_of(flags: u32) -> Res<Test> {
    const FLUSH: u32 = 1 << 30;
    match flags & !FLUSH {
        0 => Ok(Test::Geq),
        1 => Ok(Test::Eq),
        2 => Ok(Test::And),
        3 => Ok(Test::Nor),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Whether `cur` passes `test` against `value`, at 32 bits.
pub fn passes32(test: Test, cur: u32, value: u32) -> bool {
    match test {
        Test::Geq => (cur.wrapping_sub(value) as i32) >= 0,
        Test::Eq => cur == value,
        Test::And => cur & value != 0,
        Test::Nor => !(cur | value) != 0,
    }
}

/// Whether `cur` passes `test` against `value`, at 64 bits.
pub fn passes64(test: Test, cur: u64, value: u64) -> bool {
    match test {
        Test::Geq => (cur.wrapping_sub(value) as i64) >= 0,
        Test::Eq => cur == value,
        Test::And => cur & value != 0,
        Test::Nor => !(cur | value) != 0,
    }
}

/// Checks a memory operation's address: known device or mapped host
/// memory, aligned; whether it is host memory.
fn check_addr(addr: u64, width: u64) -> Res<bool> {
    if addr == 0 || !addr.is_multiple_of(width) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let r = memory::find(addr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if addr + width > r.base + r.size {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    match r.kind {
        memory::Kind::Device { .. } | memory::Kind::Ipc { .. } => Ok(false),
        memory::Kind::Host { mapped: true } | memory::Kind::Registered { mapped: true } => Ok(true),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn read(addr: u64, wide: bool) -> u64 {
    if wide {
        // SAFETY: `addr` was checked to be a live, aligned 8-byte word of
        // memory the model maps; other threads and processes write it
        // atomically or not at all.
        unsafe { (*(addr as *const AtomicU64)).load(Ordering::Acquire) }
    } else {
        // SAFETY: as above, a 4-byte word.
        u64::from(unsafe { (*(addr as *const AtomicU32)).load(Ordering::Acquire) })
    }
}

/// Issues a wait of `width` bytes (4 or 8) on `s`.
pub fn wait(s: &Arc<Stream>, addr: u64, value: u64, flags: u32, wide: bool) -> Res<()> {
    let test = test_of(flags)?;
    let host = check_addr(addr, if wide { 8 } else { 4 })?;
    let what = if wide {
        "cuStreamWaitValue64"
    } else {
        "cuStreamWaitValue32"
    };
    crate::report::event("stream_waits");
    s.issue(Op::new(what, move |st: &Stream| {
        park(st, addr, value, test, wide, host);
        Ok(())
    }))
    .map(|_| ())
}

/// Runs a wait on the stream's worker until the word passes.
pub fn park(st: &Stream, addr: u64, value: u64, test: Test, wide: bool, host: bool) {
    let ok = move |cur: u64| {
        if wide {
            passes64(test, cur, value)
        } else {
            passes32(test, cur as u32, value as u32)
        }
    };
    let mut cur = read(addr, wide);
    if ok(cur) {
        return;
    }
    let since = Instant::now();
    let label = format!("{test:?} {value}").to_uppercase();
    let passes_now = PassesNow(Arc::new(move || ok(read(addr, wide))));
    st.set_state(State::WaitingValue {
        addr,
        test: label.clone(),
        seen: cur,
        host,
        since,
        passes_now: passes_now.clone(),
    });
    let mut spins = 0u32;
    loop {
        let now = read(addr, wide);
        if now != cur {
            cur = now;
            crate::activity::progress();
            st.set_state(State::WaitingValue {
                addr,
                test: label.clone(),
                seen: cur,
                host,
                since,
                passes_now: passes_now.clone(),
            });
        }
        if ok(cur) {
            return;
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else if spins < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// Issues a write of `value` (4 or 8 bytes) on `s`.
pub fn write(s: &Arc<Stream>, addr: u64, value: u64, flags: u32, wide: bool) -> Res<()> {
    const NO_BARRIER: u32 = 1;
    if flags & !NO_BARRIER != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    check_addr(addr, if wide { 8 } else { 4 })?;
    let what = if wide {
        "cuStreamWriteValue64"
    } else {
        "cuStreamWriteValue32"
    };
    s.issue(Op::new(what, move |_st: &Stream| {
        if wide {
            // SAFETY: checked above: a live aligned word the model maps.
            unsafe { (*(addr as *const AtomicU64)).store(value, Ordering::Release) };
        } else {
            // SAFETY: as above, 4 bytes.
            unsafe { (*(addr as *const AtomicU32)).store(value as u32, Ordering::Release) };
        }
        Ok(())
    }))
    .map(|_| ())
}
