//! Counters: per host thread and per API, written as JSON at exit (and at
//! a deadlock or stall) to `CUDA_MODEL_REPORT` (`%p` in the path is the
//! process id, for jobs of several processes).
//!
//! Per thread: each API's calls, errors and time blocked; events
//! (`allocations`, `frees`, `host_allocations`, `host_frees`,
//! `module_loads`, `function_loads`, `module_unloads`, `launches`,
//! `ipc_opens`, `stream_waits`); `events_between_operations`: those of
//! them (but launches and stream waits) made after the process's first
//! operation and before its last, where an operation is what a
//! communication library puts on a stream for a collective — a kernel
//! launch or a stream memory wait (`cuStreamWaitValue*`), captured or
//! not — so an allocation, free, module load or IPC mapping counted there
//! happened inside a run of operations, where it synchronises or stalls
//! work already queued; and `synchronising_calls_while_parked`: implicitly
//! synchronising calls made while some stream of the process was parked
//! on a stream memory wait (each one a deadlock on a GPU if the parked
//! wait is released after the call).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

use crate::handles::lock;
use crate::{activity, config, CUresult};

#[derive(Default)]
struct Api {
    calls: u64,
    errors: u64,
    blocked: Duration,
}

#[derive(Default)]
struct Thread {
    name: String,
    apis: BTreeMap<&'static str, Api>,
    events: BTreeMap<&'static str, u64>,
    /// Each event but operations, with the operations issued before it.
    marks: Vec<(&'static str, u64)>,
    synchronising_while_parked: BTreeMap<&'static str, u64>,
}

fn threads() -> &'static Mutex<HashMap<i64, Thread>> {
    static T: OnceLock<Mutex<HashMap<i64, Thread>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

thread_local! {
    static TID: i64 = activity::tid();
}

/// The calling thread's name as the OS knows it (`pthread_getname_np`):
/// this library has its own copy of Rust's std, which does not know the
/// names the program's std gave its threads, but the OS does (up to 15
/// bytes).
fn os_thread_name() -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is writable for its length, which is passed; the call
    // writes a NUL-terminated name of at most 16 bytes into it.
    let rc = unsafe {
        libc::pthread_getname_np(libc::pthread_self(), buf.as_mut_ptr().cast(), buf.len())
    };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

fn with_thread(f: impl FnOnce(&mut Thread)) {
    let tid = TID.with(|t| *t);
    let mut map = lock(threads());
    let t = map.entry(tid).or_insert_with(|| Thread {
        name: os_thread_name().unwrap_or_else(|| "unnamed".into()),
        ..Thread::default()
    });
    f(t);
}

/// One call of `api` with result `r`.
pub fn call(api: &'static str, r: CUresult) {
    with_thread(|t| {
        let a = t.apis.entry(api).or_default();
        a.calls += 1;
        if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_NOT_READY {
            a.errors += 1;
        }
    });
}

/// `api` blocked the calling thread for `d`.
pub fn blocked_time(api: &'static str, d: Duration) {
    with_thread(|t| t.apis.entry(api).or_default().blocked += d);
}

/// Operations (launches and stream memory waits) issued so far in this
/// process.
static OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// The events that are operations (see the module docs).
const OPERATION_EVENTS: [&str; 2] = ["launches", "stream_waits"];

/// One event of kind `what` (see the module docs).
pub fn event(what: &'static str) {
    let before = if OPERATION_EVENTS.contains(&what) {
        OPERATIONS.fetch_add(1, Ordering::SeqCst);
        None
    } else {
        Some(OPERATIONS.load(Ordering::SeqCst))
    };
    with_thread(|t| {
        *t.events.entry(what).or_default() += 1;
        if let Some(n) = before {
            t.marks.push((what, n));
        }
    });
}

/// An implicitly synchronising call; `parked`: some stream was parked on
/// a stream memory wait at the time.
pub fn synchronising_call(api: &'static str, parked: bool) {
    if parked {
        with_thread(|t| *t.synchronising_while_parked.entry(api).or_default() += 1);
    }
}

/// The counters as JSON.
pub fn snapshot() -> Value {
    let map = lock(threads());
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut list: Vec<Value> = Vec::new();
    let mut tids: Vec<&i64> = map.keys().collect();
    tids.sort();
    let operations = OPERATIONS.load(Ordering::SeqCst);
    for tid in tids {
        let t = &map[tid];
        let apis: BTreeMap<&str, Value> = t
            .apis
            .iter()
            .map(|(k, a)| {
                *totals.entry(format!("calls.{k}")).or_default() += a.calls;
                (
                    *k,
                    json!({"calls": a.calls, "errors": a.errors,
                           "blocked_ms": a.blocked.as_secs_f64() * 1e3}),
                )
            })
            .collect();
        for (k, v) in &t.events {
            *totals.entry((*k).to_string()).or_default() += v;
        }
        // After the first operation and before the last.
        let mut between: BTreeMap<&str, u64> = BTreeMap::new();
        for &(what, n) in &t.marks {
            if n >= 1 && n < operations {
                *between.entry(what).or_default() += 1;
            }
        }
        for (k, v) in &between {
            *totals.entry(format!("between_operations.{k}")).or_default() += v;
        }
        let parked: u64 = t.synchronising_while_parked.values().sum();
        *totals
            .entry("synchronising_calls_while_parked".into())
            .or_default() += parked;
        list.push(json!({
            "tid": tid, "name": t.name, "apis": apis, "events": t.events,
            "events_between_operations": between,
            "synchronising_calls_while_parked": t.synchronising_while_parked,
        }));
    }
    json!({"pid": std::process::id(), "operations": operations, "threads": list,
           "totals": totals})
}

/// The report's path for this process, if asked for.
pub fn path() -> Option<std::path::PathBuf> {
    let p = config::get().report.as_ref()?;
    let text = p
        .to_string_lossy()
        .replace("%p", &std::process::id().to_string());
    Some(text.into())
}

/// Writes the report now (at exit, or before the detector ends the process).
pub fn write_now() {
    let Some(p) = path() else { return };
    let text = serde_json::to_string_pretty(&snapshot()).unwrap_or_default();
    if let Err(e) = std::fs::write(&p, text) {
        crate::log_line(&format!("could not write the report {}: {e}", p.display()));
    }
}

extern "C" fn at_exit() {
    write_now();
}

/// Registers the at-exit writer (once).
pub fn install() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        if config::get().report.is_some() {
            // SAFETY: registers a plain extern "C" function with no
            // arguments, which only reads the model's state.
            unsafe { libc::atexit(at_exit) };
        }
    });
}
