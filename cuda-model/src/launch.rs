//! Kernel launches: sncl's kernels compiled for the host (the
//! `SNCL_HOST_EMU` shim, kernels/cuda/), run on the stream's worker with
//! the launch's grid and block.
//!
//! Rules:
//! * parameters are copied at launch (`cuLaunchKernel`: "kernelParams ...
//!   the values are copied"), so the caller may reuse them at once;
//! * blocks run concurrently as far as they are resident together: a
//!   device holds `CUDA_MODEL_SMS` × (2048 / threads per block, at most
//!   32) blocks; a block beyond that waits until one ends (CUDA C++
//!   Programming Guide, "Thread Hierarchy": blocks "are required to
//!   execute independently"; only a cooperative launch guarantees
//!   co-residency) — blocks that wait on each other beyond that limit
//!   stall, and the detector says so;
//! * without MPS (`CUDA_MODEL_MPS=0`, the default), "a kernel from one
//!   CUDA context cannot execute concurrently with a kernel from another
//!   CUDA context" (Multi-Process Service guide): a kernel of another
//!   process waits until this process's kernels on the device have ended;
//! * a cooperative launch whose grid exceeds what can be resident is
//!   `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.

use std::ffi::{c_char, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::handles::lock;
use crate::host_kernels::{
    sncl_host_codec, sncl_host_direct_block, sncl_host_divide, sncl_host_reduce_copy, Family,
};
use crate::memory;
use crate::module::{Function, FUNCTIONS, MODULES};
use crate::stream::{Op, State, Stream};
use crate::{config, context, report, CUresult, Res};

/// A launch, with its parameters copied.
#[derive(Clone)]
pub struct Launch {
    function: Arc<Function>,
    grid: u32,
    block: u32,
    params: Vec<Vec<u8>>,
}

/// Resident blocks of one device, shared by every launch on it.
struct Residency {
    free: Mutex<u64>,
    cv: Condvar,
}

fn residency(device: usize) -> &'static Residency {
    static R: OnceLock<Vec<Residency>> = OnceLock::new();
    &R.get_or_init(|| {
        (0..config::get().devices)
            .map(|_| Residency {
                free: Mutex::new(u64::from(config::get().sms) * 2048),
                cv: Condvar::new(),
            })
            .collect()
    })[device]
}

/// The blocks of `block` threads one device holds at once.
pub fn resident_blocks(block: u32) -> u64 {
    let per_sm = (2048 / u64::from(block.max(1))).clamp(1, 32);
    u64::from(config::get().sms) * per_sm
}

/// Holds one block's share of the device (in threads, at least 64 so a
/// device holds at most 32 blocks an SM) until dropped.
struct Seat(usize, u64);

fn seat(st: &Stream, block: u32) -> Seat {
    let need = u64::from(block.max(64));
    let r = residency(st.device);
    let mut free = lock(&r.free);
    if *free < need {
        st.set_state(State::WaitingDevice(
            "a block waits for resident space (CUDA_MODEL_SMS)".into(),
        ));
    }
    while *free < need {
        free = r.cv.wait(free).unwrap_or_else(|p| p.into_inner());
    }
    *free -= need;
    Seat(st.device, need)
}

impl Drop for Seat {
    fn drop(&mut self) {
        let r = residency(self.0);
        *lock(&r.free) += self.1;
        r.cv.notify_all();
    }
}

/// This process's hold on a device's time slice (no MPS): kernels of one
/// process share it; another process's kernels wait for it. Held as an
/// abstract Unix socket name (released by the kernel when the process
/// dies; nothing in the file system).
struct Slice {
    active: u32,
    socket: Option<OwnedFd>,
}

fn slices() -> &'static Vec<Mutex<Slice>> {
    static S: OnceLock<Vec<Mutex<Slice>>> = OnceLock::new();
    S.get_or_init(|| {
        (0..config::get().devices)
            .map(|_| {
                Mutex::new(Slice {
                    active: 0,
                    socket: None,
                })
            })
            .collect()
    })
}

fn try_bind(device: usize) -> Option<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh socket we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: getuid has no arguments and cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = format!("cuda-model-{uid}-device{device}-timeslice");
    // SAFETY: an all-zero sockaddr_un is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    // SAFETY: `addr` is a valid abstract address of `len` bytes.
    let r = unsafe {
        libc::bind(
            owned.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    };
    (r == 0).then_some(owned)
}

struct SliceHold(usize);

fn take_slice(st: &Stream) -> SliceHold {
    let d = st.device;
    let mut s = lock(&slices()[d]);
    if s.active == 0 {
        let mut said = false;
        loop {
            if let Some(sock) = try_bind(d) {
                s.socket = Some(sock);
                break;
            }
            if !said {
                st.set_state(State::WaitingDevice(
                    "another process's context holds the device's time slice (no MPS)".into(),
                ));
                said = true;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    s.active += 1;
    SliceHold(d)
}

impl Drop for SliceHold {
    fn drop(&mut self) {
        let mut s = lock(&slices()[self.0]);
        s.active -= 1;
        if s.active == 0 {
            s.socket = None;
        }
    }
}

/// `cuLaunchKernel` / `cuLaunchCooperativeKernel`.
///
/// # Safety
/// `params` holds one valid pointer per kernel parameter, each to a value
/// of that parameter's size.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    f: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> Res<()> {
    let ctx = context::current()?;
    let function = FUNCTIONS.get(f)?;
    MODULES
        .get(function.module)
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    if function.context != ctx.handle {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    if grid.contains(&0) || block.contains(&0) || block.iter().product::<u32>() > 1024 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if grid[1] != 1 || grid[2] != 1 || block[1] != 1 || block[2] != 1 || shared_bytes != 0 {
        crate::log_line("cuLaunchKernel: the model runs one-dimensional launches without dynamic shared memory only");
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    if !extra.is_null() || params.is_null() {
        crate::log_line("cuLaunchKernel: the model takes kernelParams, not extra");
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    if cooperative && u64::from(grid[0]) > resident_blocks(block[0]) {
        return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    }
    let sizes = function.family.param_sizes();
    let mut copied = Vec::with_capacity(sizes.len());
    for (i, n) in sizes.iter().enumerate() {
        // SAFETY: the caller's contract: params[i] points at `n` bytes.
        let p = unsafe { *params.add(i) };
        if p.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: as above.
        copied.push(unsafe { std::slice::from_raw_parts(p as *const u8, *n) }.to_vec());
    }
    let l = Launch {
        function,
        grid: grid[0],
        block: block[0],
        params: copied,
    };
    let s = crate::stream::resolve(stream)?;
    report::event("launches");
    s.issue(op(l)).map(|_| ())
}

/// The stream operation of a launch (also replayed by graphs).
pub fn op(l: Launch) -> Op {
    Op::new("cuLaunchKernel", move |st: &Stream| run(st, &l))
}

fn check_reduce_copy_pointers(args: &[u8]) -> Res<()> {
    let word = |i: usize| u64::from_le_bytes(args[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let nsrcs = i32::from_le_bytes(args[136..140].try_into().expect("4 bytes")).clamp(0, 8);
    let ndsts = i32::from_le_bytes(args[140..144].try_into().expect("4 bytes")).clamp(0, 8);
    for i in (0..nsrcs as usize).chain((0..ndsts as usize).map(|j| 8 + j)) {
        let p = word(i);
        if memory::find(p).is_none() {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        }
    }
    Ok(())
}

fn run(st: &Stream, l: &Launch) -> Res<()> {
    let _slice = (!config::get().mps).then(|| take_slice(st));
    st.set_state(State::Running(format!(
        "kernel {} <<<{}, {}>>>",
        l.function.name.to_string_lossy(),
        l.grid,
        l.block
    )));
    let name = l.function.name.as_ptr();
    let status = match l.function.family {
        Family::ReduceCopy => {
            check_reduce_copy_pointers(&l.params[0])?;
            let _seat = seat(st, l.block);
            // SAFETY: the argument struct as the caller passed it (its
            // pointers checked to be memory the model knows).
            unsafe { sncl_host_reduce_copy(name, l.params[0].as_ptr().cast(), l.grid, l.block) }
        }
        Family::Divide => {
            let w = |i: usize| u64::from_le_bytes(l.params[i][..8].try_into().expect("8 bytes"));
            if memory::find(w(0)).is_none() {
                return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            }
            let _seat = seat(st, l.block);
            // SAFETY: the data pointer is memory the model knows; the
            // kernel touches `count` elements of it as the caller asked.
            unsafe { sncl_host_divide(name, w(0) as *mut c_void, w(1), w(2), l.grid, l.block) }
        }
        Family::Codec => {
            let _seat = seat(st, l.block);
            // SAFETY: the argument struct as the caller passed it.
            unsafe { sncl_host_codec(name, l.params[0].as_ptr().cast(), l.grid, l.block) }
        }
        Family::Direct => run_blocks(st, l),
    };
    match status {
        0 => Ok(()),
        _ => Err(CUresult::CUDA_ERROR_LAUNCH_FAILED),
    }
}

/// Runs each block of a direct kernel on a thread of its own, each as soon
/// as it is resident.
fn run_blocks(st: &Stream, l: &Launch) -> i32 {
    let statuses: Vec<i32> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..l.grid)
            .map(|b| {
                let seat = seat(st, l.block);
                let name = l.function.name.as_ptr() as usize;
                let args = l.params[0].as_ptr() as usize;
                let (grid, block) = (l.grid, l.block);
                scope.spawn(move || {
                    let _seat = seat;
                    // SAFETY: the name and argument struct outlive the
                    // scope; block `b` of the grid runs alone here.
                    unsafe {
                        sncl_host_direct_block(
                            name as *const c_char,
                            args as *const c_void,
                            grid,
                            block,
                            b,
                        )
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(-3))
            .collect()
    });
    statuses.into_iter().find(|s| *s != 0).unwrap_or(0)
}

/// Holds device `device`'s time slice for this process until the guard
/// drops, as a running kernel does (tests of the no-MPS rule).
pub fn hold_time_slice(device: usize) -> impl Drop {
    let (h, s) = crate::stream::STREAMS.insert_with(|h| {
        let ctx = context::current().expect("a current context");
        Arc::new(crate::stream::Stream::for_context(h, &ctx))
    });
    let _ = crate::stream::STREAMS.remove(h);
    let _ = device;
    take_slice(&s)
}
