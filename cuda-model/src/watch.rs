//! The deadlock and stall detector: a hang is reported, never silent.
//!
//! On a GPU, a host thread blocked in a synchronising driver call (see
//! [`crate::sync`]) while the stream it waits for is parked on a
//! `cuStreamWaitValue32` that only a host write can release never returns
//! if the host thread that would write is the blocked one (or waits for
//! it): the driver has no timeout. The model watches every blocked call
//! and every stream:
//! * **deadlock**: a thread has been blocked for `CUDA_MODEL_DEADLOCK_S`
//!   in a call that waits (directly or through other streams) for a stream
//!   parked on a wait on host memory, and in that time nothing in the
//!   process progressed (no operation completed, no awaited word changed,
//!   no work was issued);
//! * **stall**: work is pending or a thread is blocked, and nothing
//!   progressed for `CUDA_MODEL_STALL_S` (kernels spinning on flags nobody
//!   raises, kernels waiting for a device another process holds without
//!   MPS, blocks that can never be resident together).
//!
//! Either prints `cuda-model: deadlock` / `cuda-model: stall` with the
//! calls, threads and streams involved, writes the counters report, and
//! ends the process with exit status 86.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::handles::lock;
use crate::stream::{State, Stream};
use crate::{activity, config, context, report, HANG_EXIT_STATUS};

static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);

/// A host thread blocked in a driver call.
#[derive(Clone)]
struct Blocked {
    call: &'static str,
    thread: String,
    tid: i64,
    since: Instant,
    /// The streams it waits for, each up to an operation number.
    on: Vec<(Arc<Stream>, u64)>,
}

fn blocked_calls() -> &'static Mutex<HashMap<u64, Blocked>> {
    static B: OnceLock<Mutex<HashMap<u64, Blocked>>> = OnceLock::new();
    B.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Unregisters a blocked call when dropped.
pub struct BlockedGuard(u64, Instant, &'static str);

impl Drop for BlockedGuard {
    fn drop(&mut self) {
        lock(blocked_calls()).remove(&self.0);
        report::blocked_time(self.2, self.1.elapsed());
        activity::progress();
    }
}

/// Registers the calling thread as blocked in `call` until the returned
/// guard drops, waiting for each stream to reach its operation number.
pub fn blocked(call: &'static str, on: Vec<(Arc<Stream>, u64)>) -> BlockedGuard {
    let id = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed);
    let thread = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_string();
    let since = Instant::now();
    lock(blocked_calls()).insert(
        id,
        Blocked {
            call,
            thread,
            tid: activity::tid(),
            since,
            on,
        },
    );
    BlockedGuard(id, since, call)
}

/// Whether some stream of the process is parked on a stream memory wait
/// now (counted against synchronising calls made meanwhile).
///
/// A stream counts as parked while its wait's word does not pass: a wait
/// whose word was written before the call (the worker has not read it
/// again yet) lets the device go on — "work ordered after the operation
/// will block until the given condition on the memory is satisfied"
/// (cuStreamWaitValue32, CUDA Driver API) — so a synchronising call then
/// waits for it and does not deadlock, on the device as here.
pub fn some_stream_parked() -> bool {
    all_streams()
        .iter()
        .any(|s| matches!(s.state(), State::WaitingValue { passes_now, .. } if !(passes_now.0)()))
}

/// Every live stream of the process (a stream belongs to one context).
fn all_streams() -> Vec<Arc<Stream>> {
    (0..config::get().devices)
        .flat_map(context::of_device)
        .flat_map(|c| crate::stream::of_context(c.handle))
        .collect()
}

/// Starts the detector thread (once).
pub fn start() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("cuda-model-watch".into())
            .spawn(watch);
    });
}

fn watch() {
    let cfg = config::get();
    let mut last = activity::count();
    let mut last_change = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = activity::count();
        if now != last {
            last = now;
            last_change = Instant::now();
            continue;
        }
        let quiet = last_change.elapsed();
        let blocked: Vec<Blocked> = lock(blocked_calls()).values().cloned().collect();
        if quiet >= cfg.deadlock {
            if let Some((b, parked)) = blocked.iter().find_map(|b| {
                b.on.iter()
                    .find_map(|(s, _)| parked_on_host(s, 0))
                    .map(|p| (b, p))
            }) {
                if b.since.elapsed() >= cfg.deadlock {
                    let mut text = format!(
                        "cuda-model: deadlock: thread '{}' (tid {}) has been blocked in {} for {:.1} s waiting for {}, \
                         which is parked on a wait that only a host write can release; nothing wrote it or progressed for {:.1} s\n",
                        b.thread,
                        b.tid,
                        b.call,
                        b.since.elapsed().as_secs_f64(),
                        parked.label(),
                        quiet.as_secs_f64()
                    );
                    describe(&mut text, &blocked);
                    hang(&text);
                }
            }
        }
        let pending =
            !blocked.is_empty() || all_streams().iter().any(|s| s.completed() < s.enqueued());
        if pending && quiet >= cfg.stall {
            let mut text = format!(
                "cuda-model: stall: no progress for {:.1} s (CUDA_MODEL_STALL_S) while work is pending\n",
                quiet.as_secs_f64()
            );
            describe(&mut text, &blocked);
            hang(&text);
        }
    }
}

/// The stream parked on a host-memory wait that `s` waits for, following
/// dependencies on other streams (at most a few levels).
fn parked_on_host(s: &Arc<Stream>, depth: u32) -> Option<Arc<Stream>> {
    match s.state() {
        State::WaitingValue { host: true, .. } => Some(s.clone()),
        State::WaitingDeps(_) if depth < 4 => all_streams()
            .iter()
            .filter(|o| !Arc::ptr_eq(o, s))
            .find_map(|o| parked_on_host(o, depth + 1)),
        _ => None,
    }
}

fn describe(text: &mut String, blocked: &[Blocked]) {
    for b in blocked {
        let on: Vec<String> =
            b.on.iter()
                .map(|(s, n)| format!("{} up to operation {n}", s.label()))
                .collect();
        let _ = writeln!(
            text,
            "  thread '{}' (tid {}) blocked in {} for {:.1} s, waiting for: {}",
            b.thread,
            b.tid,
            b.call,
            b.since.elapsed().as_secs_f64(),
            on.join("; ")
        );
    }
    for s in all_streams() {
        let state = match s.state() {
            State::Idle => continue,
            State::Running(w) => format!("running {w}"),
            State::WaitingValue {
                addr,
                test,
                seen,
                host,
                since,
                ..
            } => format!(
                "parked on a stream memory wait at {addr:#x} ({} memory) for {test}, word is {seen}, for {:.1} s",
                if host { "host" } else { "device" },
                since.elapsed().as_secs_f64()
            ),
            State::WaitingDeps(w) => format!("waiting for {w}"),
            State::WaitingDevice(w) => format!("waiting for the device: {w}"),
        };
        let _ = writeln!(
            text,
            "  {}: {state} ({} of {} operations done)",
            s.label(),
            s.completed(),
            s.enqueued()
        );
    }
}

fn hang(text: &str) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
    report::write_now();
    // SAFETY: ends the process at once; the other threads are blocked for
    // good (that is the finding), so no cleanup is possible anyway.
    unsafe { libc::_exit(HANG_EXIT_STATUS) }
}
