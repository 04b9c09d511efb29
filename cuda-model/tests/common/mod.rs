//! Helpers of the model's rule tests: calling the entry points, a primary
//! context, mapped host words, and running one test alone in a child
//! process (for the rules that end the process, or that need settings of
//! their own: the model reads its settings once per process).

// Each test binary uses a part of the helpers and of the entry points.
#![allow(dead_code, unused_imports)]

use std::ffi::c_void;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use cuda_model::api::device::*;
pub use cuda_model::api::memory::*;
pub use cuda_model::api::module::*;
pub use cuda_model::api::stream::*;
pub use cuda_model::CUresult;
pub use CUresult::*;

/// Panics unless `r` is success, naming the call.
pub fn ok(what: &str, r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "{what}");
}

/// Initialises the model and makes device 0's primary context current on
/// the calling thread; returns the context.
pub fn setup() -> *mut c_void {
    // SAFETY: the entry points with live out-pointers.
    unsafe {
        ok("cuInit", cuInit(0));
        let mut ctx = std::ptr::null_mut();
        ok("retain", cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok("set current", cuCtxSetCurrent(ctx));
        ctx
    }
}

/// A stream (`non_blocking`: `CU_STREAM_NON_BLOCKING`).
pub fn stream(non_blocking: bool) -> *mut c_void {
    let mut s = std::ptr::null_mut();
    // SAFETY: a live out-pointer.
    ok("cuStreamCreate", unsafe {
        cuStreamCreate(&mut s, u32::from(non_blocking))
    });
    s
}

/// A mapped page-locked host word (0), and its device address.
pub fn host_word() -> (&'static AtomicU32, u64) {
    let mut p = std::ptr::null_mut();
    let mut d = 0u64;
    // SAFETY: live out-pointers; DEVICEMAP = 2.
    unsafe {
        ok("cuMemHostAlloc", cuMemHostAlloc(&mut p, 64, 2));
        ok(
            "cuMemHostGetDevicePointer",
            cuMemHostGetDevicePointer_v2(&mut d, p, 0),
        );
        let w = &*(p as *const AtomicU32);
        w.store(0, Ordering::SeqCst);
        (w, d)
    }
}

/// A device allocation of `bytes`.
pub fn alloc(bytes: usize) -> u64 {
    let mut p = 0u64;
    // SAFETY: a live out-pointer.
    ok("cuMemAlloc", unsafe { cuMemAlloc_v2(&mut p, bytes) });
    p
}

/// Parks stream `s` on `word >= value` (GEQ).
pub fn park(s: *mut c_void, word: u64, value: u32) {
    // SAFETY: `word` is a mapped host word the model knows.
    ok("cuStreamWaitValue32", unsafe {
        cuStreamWaitValue32_v2(s, word, value, 0)
    });
}

/// Whether stream `s` has finished its work.
pub fn idle(s: *mut c_void) -> bool {
    // SAFETY: a handle from cuStreamCreate (or 0).
    match unsafe { cuStreamQuery(s) } {
        CUDA_SUCCESS => true,
        CUDA_ERROR_NOT_READY => false,
        r => panic!("cuStreamQuery: {r:?}"),
    }
}

/// Waits until `f` holds, at most `limit`; whether it did.
pub fn eventually(limit: Duration, f: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// The environment variable that tells a re-run test it is the child.
pub const CHILD: &str = "CUDA_MODEL_TEST_CHILD";

/// Whether this process is the child run of test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(name)
}

/// Runs test `name` of this binary alone in a child process with `env`;
/// its output (killed after 60 s).
pub fn run_child(name: &str, env: &[(&str, &str)]) -> (Output, Duration) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env(CHILD, name)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn the child test");
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("child output");
    // A child that ran no test (a filtered-out name) must not pass for one.
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("1 passed"),
            "the child ran no test {name}: {text}"
        );
    }
    (out, start.elapsed())
}

/// The child's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A PTX text declaring `names` as kernels (the model reads the entries;
/// the host build of each kernel runs it).
pub fn ptx(names: &[&str]) -> Vec<u8> {
    let mut t = String::from(".version 8.0\n.target sm_90\n.address_size 64\n");
    for n in names {
        t.push_str(&format!(
            ".visible .entry {n}(\n.param .align 8 .b8 p[144]\n)\n{{\nret;\n}}\n"
        ));
    }
    t.push('\0');
    t.into_bytes()
}
