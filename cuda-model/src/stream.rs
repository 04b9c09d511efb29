//! Streams: an in-order queue of device work run by a worker thread of its
//! own, as a GPU's queues run beside the host.
//!
//! Rules (CUDA C++ Programming Guide, "Streams", "Default Stream",
//! "Implicit Synchronization"; Driver API, "Stream synchronization
//! behavior"):
//! * work on one stream runs in issue order; work on different streams may
//!   run concurrently;
//! * the legacy default stream (handle 0 or `CU_STREAM_LEGACY`) waits for
//!   all earlier work on every *blocking* stream of its context, and every
//!   blocking stream waits for all earlier work on the legacy stream;
//!   streams made with `CU_STREAM_NON_BLOCKING` do neither;
//! * the per-thread default stream (`CU_STREAM_PER_THREAD`) is one
//!   blocking stream per host thread and context;
//! * while a stream is capturing (see [`crate::graph`]) its work is
//!   recorded, not run.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::context::{self, Context};
use crate::handles::{lock, Table};
use crate::{CUresult, Res};

/// The legacy default stream's special handle.
pub const STREAM_LEGACY: u64 = 0x1;
/// The per-thread default stream's special handle.
pub const STREAM_PER_THREAD: u64 = 0x2;

/// What kind of stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The context's legacy default stream.
    Legacy,
    /// A host thread's per-thread default stream (blocking).
    PerThread,
    /// A stream made by `cuStreamCreate`.
    User {
        /// `CU_STREAM_NON_BLOCKING`.
        non_blocking: bool,
    },
}

impl Kind {
    /// Whether the stream synchronises with the legacy default stream.
    pub fn blocking(self) -> bool {
        !matches!(self, Kind::User { non_blocking: true })
    }
}

/// What a stream is doing now (for the detector's reports).
#[derive(Clone, Debug)]
pub enum State {
    /// Nothing queued.
    Idle,
    /// Running an operation.
    Running(String),
    /// Parked on a stream memory wait.
    WaitingValue {
        /// The awaited word's address.
        addr: u64,
        /// The comparison, as the call wrote it (`GEQ 5`).
        test: String,
        /// The word's value when last read.
        seen: u64,
        /// Whether the word is host memory (only a host write or another
        /// stream's write releases it).
        host: bool,
        /// When the wait began.
        since: Instant,
        /// Whether the word passes the comparison now (it may have been
        /// written since the worker last read it).
        passes_now: PassesNow,
    },
    /// Waiting for other streams' work (events, legacy-stream order).
    WaitingDeps(String),
    /// A kernel waiting for the device (time slice or resident blocks).
    WaitingDevice(String),
}

/// Reads a waited word and says whether it passes the wait's comparison.
#[derive(Clone)]
pub struct PassesNow(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for PassesNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PassesNow({})", (self.0)())
    }
}

/// A dependency an operation waits for before it runs.
#[derive(Clone)]
pub enum Dep {
    /// Operation `seq` (1-based) of a stream has completed.
    Stream(Arc<Stream>, u64),
    /// A shared counter (an IPC event) has reached a value.
    Shared(Arc<crate::ipc::SharedEvent>, u64),
}

/// The work of one operation (an `Fn`: a captured operation replays).
pub type Work = Arc<dyn Fn(&Stream) -> Res<()> + Send + Sync>;

/// One queued operation.
pub struct Op {
    /// The API that issued it.
    pub what: &'static str,
    /// What it waits for first.
    pub deps: Vec<Dep>,
    /// What it does (run on the stream's worker).
    pub work: Work,
    /// Whether a stream capture may record it.
    pub capturable: bool,
}

impl Op {
    /// A capturable operation without dependencies.
    pub fn new(
        what: &'static str,
        work: impl Fn(&Stream) -> Res<()> + Send + Sync + 'static,
    ) -> Op {
        Op {
            what,
            deps: Vec::new(),
            work: Arc::new(work),
            capturable: true,
        }
    }
}

struct Queue {
    ops: VecDeque<Op>,
    enqueued: u64,
    completed: u64,
    state: State,
    /// The first error of an operation (sticky, returned by query and
    /// synchronize).
    error: Option<CUresult>,
    destroyed: bool,
    worker: bool,
}

/// A stream.
pub struct Stream {
    /// The handle the caller holds (`CUstream`; 0 for the legacy stream).
    pub handle: u64,
    /// The device of its context.
    pub device: usize,
    /// Its context's handle.
    pub context: u64,
    /// Its kind.
    pub kind: Kind,
    /// Capture state (see [`crate::graph`]).
    pub capture: Mutex<Option<Capture>>,
    q: Mutex<Queue>,
    cv: Condvar,
}

/// Every user stream.
pub static STREAMS: Table<Stream> = Table::new(0x05e0_0000_0000);

/// The streams of one context: its legacy default stream (made on first
/// use), every stream made in it, and the per-thread default stream of
/// each host thread that used one.
#[derive(Default)]
struct ContextStreams {
    legacy: Option<Arc<Stream>>,
    made: Vec<Weak<Stream>>,
    per_thread: HashMap<ThreadId, Arc<Stream>>,
}

/// The streams of every context, by context handle.
fn by_context() -> &'static Mutex<HashMap<u64, ContextStreams>> {
    static M: OnceLock<Mutex<HashMap<u64, ContextStreams>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Every live stream of context `ctx` (legacy and per-thread ones included).
pub fn of_context(ctx: u64) -> Vec<Arc<Stream>> {
    let map = lock(by_context());
    let Some(c) = map.get(&ctx) else {
        return Vec::new();
    };
    let mut out: Vec<Arc<Stream>> = c.made.iter().filter_map(Weak::upgrade).collect();
    out.extend(c.legacy.iter().cloned());
    out.extend(c.per_thread.values().cloned());
    out.sort_by_key(|s| Arc::as_ptr(s) as usize);
    out.dedup_by_key(|s| Arc::as_ptr(s) as usize);
    out
}

/// Forgets the streams of a destroyed context (their queued work still
/// runs; the handles of its user streams stay in [`STREAMS`] until
/// destroyed).
pub fn forget_context(ctx: u64) {
    lock(by_context()).remove(&ctx);
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

impl Stream {
    fn new(handle: u64, ctx: &Context, kind: Kind) -> Stream {
        Stream {
            handle,
            device: ctx.device,
            context: ctx.handle,
            kind,
            capture: Mutex::new(None),
            q: Mutex::new(Queue {
                ops: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                state: State::Idle,
                error: None,
                destroyed: false,
                worker: false,
            }),
            cv: Condvar::new(),
        }
    }

    /// A blocking stream of `ctx` not registered with it (tests).
    pub fn for_context(handle: u64, ctx: &Context) -> Stream {
        Stream::new(
            handle,
            ctx,
            Kind::User {
                non_blocking: false,
            },
        )
    }

    /// A name for reports: `stream 0x5e0000000010 (non-blocking, device 0)`.
    pub fn label(&self) -> String {
        let kind = match self.kind {
            Kind::Legacy => "legacy default".to_string(),
            Kind::PerThread => "per-thread default".to_string(),
            Kind::User { non_blocking } => if non_blocking {
                "non-blocking"
            } else {
                "blocking"
            }
            .to_string(),
        };
        format!("stream {:#x} ({kind}, device {})", self.handle, self.device)
    }

    /// Operations issued so far.
    pub fn enqueued(&self) -> u64 {
        lock(&self.q).enqueued
    }

    /// Operations completed so far.
    pub fn completed(&self) -> u64 {
        lock(&self.q).completed
    }

    /// What the stream is doing now.
    pub fn state(&self) -> State {
        lock(&self.q).state.clone()
    }

    /// Records what the worker is doing (for reports).
    pub fn set_state(&self, s: State) {
        lock(&self.q).state = s;
    }

    /// Whether every issued operation has completed; the sticky error.
    pub fn query(&self) -> Res<bool> {
        let q = lock(&self.q);
        if let Some(e) = q.error {
            return Err(e);
        }
        Ok(q.completed >= q.enqueued)
    }

    /// Issues `op`: recorded when capturing, else queued behind the
    /// legacy-stream dependencies of the stream's kind. Returns the
    /// operation's sequence number (0 when captured).
    pub fn issue(self: &Arc<Self>, mut op: Op) -> Res<u64> {
        if capture_op(self, &mut op)? {
            return Ok(0);
        }
        check_implicit(self)?;
        if context::by_handle(self.context).is_ok() {
            match self.kind {
                Kind::Legacy => {
                    for s in of_context(self.context) {
                        if s.kind.blocking() && s.kind != Kind::Legacy {
                            let n = s.enqueued();
                            if n > s.completed() {
                                op.deps.push(Dep::Stream(s, n));
                            }
                        }
                    }
                }
                k if k.blocking() => {
                    let legacy = lock(by_context())
                        .get(&self.context)
                        .and_then(|c| c.legacy.clone());
                    if let Some(l) = legacy {
                        let n = l.enqueued();
                        if n > l.completed() {
                            op.deps.push(Dep::Stream(l.clone(), n));
                        }
                    }
                }
                _ => {}
            }
        }
        let mut q = lock(&self.q);
        if q.destroyed {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        q.ops.push_back(op);
        q.enqueued += 1;
        let seq = q.enqueued;
        if !q.worker {
            q.worker = true;
            let me = self.clone();
            let name = format!("cuda-model-s{}", SERIAL.fetch_add(1, Ordering::Relaxed));
            std::thread::Builder::new()
                .name(name)
                .spawn(move || me.run())
                .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        }
        drop(q);
        self.cv.notify_all();
        crate::activity::progress();
        Ok(seq)
    }

    fn run(self: Arc<Self>) {
        loop {
            let op = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.destroyed {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            for dep in &op.deps {
                self.wait_dep(dep);
            }
            self.set_state(State::Running(op.what.to_string()));
            let r = (op.work)(&self);
            let mut q = lock(&self.q);
            if let Err(e) = r {
                crate::log_line(&format!("{} failed on {}: {e:?}", op.what, self.label()));
                q.error.get_or_insert(e);
            }
            q.completed += 1;
            q.state = State::Idle;
            drop(q);
            self.cv.notify_all();
            crate::activity::progress();
        }
    }

    fn wait_dep(&self, dep: &Dep) {
        match dep {
            Dep::Stream(s, n) => {
                if s.completed() >= *n {
                    return;
                }
                self.set_state(State::WaitingDeps(format!(
                    "operation {n} of {}",
                    s.label()
                )));
                s.wait_for(*n, None);
            }
            Dep::Shared(e, n) => {
                self.set_state(State::WaitingDeps(format!("IPC event reaching {n}")));
                let mut pause = Duration::from_micros(1);
                while e.completed() < *n {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_micros(200));
                }
            }
        }
    }

    /// Blocks until operation `n` has completed or `deadline` passes;
    /// whether it completed.
    pub fn wait_for(&self, n: u64, deadline: Option<Instant>) -> bool {
        let mut q = lock(&self.q);
        while q.completed < n {
            let step = Duration::from_millis(50);
            let step = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    step.min(d - now)
                }
                None => step,
            };
            q = self
                .cv
                .wait_timeout(q, step)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Marks the stream destroyed: queued work still runs, then the worker
    /// ends (`cuStreamDestroy` returns at once).
    pub fn destroy(&self) {
        lock(&self.q).destroyed = true;
        self.cv.notify_all();
    }

    /// The sticky error of the stream, if any.
    pub fn error(&self) -> Option<CUresult> {
        lock(&self.q).error
    }
}

/// The stream a call names: `0` / `CU_STREAM_LEGACY` the current context's
/// legacy stream, `CU_STREAM_PER_THREAD` this thread's, else a user stream
/// (of the current context: a stream of another context is
/// `CUDA_ERROR_INVALID_HANDLE`, as the driver answers).
pub fn resolve(h: u64) -> Res<Arc<Stream>> {
    let ctx = context::current()?;
    match h {
        0 | STREAM_LEGACY => Ok(legacy(&ctx)),
        STREAM_PER_THREAD => {
            let id = std::thread::current().id();
            let mut map = lock(by_context());
            let streams = map.entry(ctx.handle).or_default();
            if let Some(s) = streams.per_thread.get(&id) {
                return Ok(s.clone());
            }
            let s = Arc::new(Stream::new(STREAM_PER_THREAD, &ctx, Kind::PerThread));
            streams.made.push(Arc::downgrade(&s));
            streams.per_thread.insert(id, s.clone());
            Ok(s)
        }
        _ => {
            let s = STREAMS.get(h)?;
            if s.context != ctx.handle {
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            Ok(s)
        }
    }
}

/// The legacy default stream of `ctx`.
pub fn legacy(ctx: &Context) -> Arc<Stream> {
    lock(by_context())
        .entry(ctx.handle)
        .or_default()
        .legacy
        .get_or_insert_with(|| Arc::new(Stream::new(0, ctx, Kind::Legacy)))
        .clone()
}

/// `cuStreamCreate`.
pub fn create(flags: u32) -> Res<u64> {
    let ctx = context::current()?;
    let non_blocking = match flags {
        0 => false,
        1 => true,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let (h, s) =
        STREAMS.insert_with(|h| Arc::new(Stream::new(h, &ctx, Kind::User { non_blocking })));
    lock(by_context())
        .entry(ctx.handle)
        .or_default()
        .made
        .push(Arc::downgrade(&s));
    Ok(h)
}

/// `cuStreamDestroy`.
pub fn destroy(h: u64) -> Res<()> {
    context::current()?;
    if h == 0 || h == STREAM_LEGACY || h == STREAM_PER_THREAD {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let s = STREAMS.remove(h)?;
    s.destroy();
    Ok(())
}

// Stream capture (rules: [`crate::graph`]): the state a capturing stream
// keeps and the checks issuing and synchronising calls make.

/// `CUstreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Prohibits unsafe calls in every thread.
    Global,
    /// Prohibits unsafe calls in the capturing thread.
    ThreadLocal,
    /// Prohibits nothing.
    Relaxed,
}

/// A capture in progress on a stream.
pub struct Capture {
    pub(crate) mode: Mode,
    pub(crate) thread: ThreadId,
    pub(crate) ops: Vec<Op>,
    pub(crate) invalidated: Option<CUresult>,
    pub(crate) id: u64,
}

/// An active capture: (stream handle, mode, thread, id).
pub(crate) type Active = (u64, Mode, ThreadId, u64);

/// Active captures.
pub(crate) fn active() -> &'static Mutex<Vec<Active>> {
    static A: OnceLock<Mutex<Vec<Active>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(Vec::new()))
}

pub(crate) fn clone_op(op: &Op) -> Op {
    Op {
        what: op.what,
        deps: Vec::new(),
        work: op.work.clone(),
        capturable: op.capturable,
    }
}

/// Whether `s` is capturing.
pub fn is_capturing(s: &Stream) -> bool {
    lock(&s.capture).is_some()
}

/// The capture status and id of `s` (for `cuStreamGetCaptureInfo`):
/// 0 none, 1 active, 2 invalidated.
pub fn capture_status(s: &Stream) -> (u32, u64) {
    match &*lock(&s.capture) {
        None => (0, 0),
        Some(c) if c.invalidated.is_some() => (2, c.id),
        Some(c) => (1, c.id),
    }
}

pub(crate) fn invalidate(s: &Stream, why: CUresult) {
    if let Some(c) = lock(&s.capture).as_mut() {
        c.invalidated.get_or_insert(why);
    }
}

fn invalidate_handle(h: u64, why: CUresult) {
    if let Ok(s) = STREAMS.get(h) {
        invalidate(&s, why);
    }
}

/// Records `op` when `s` captures (true), else leaves it to be issued.
pub fn capture_op(s: &Stream, op: &mut Op) -> Res<bool> {
    let mut cap = lock(&s.capture);
    let Some(c) = cap.as_mut() else {
        return Ok(false);
    };
    if !op.capturable {
        c.invalidated
            .get_or_insert(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    c.ops.push(clone_op(op));
    Ok(true)
}

/// Refuses a call on a capturing stream that the capture forbids
/// (`cuStreamQuery`, `cuStreamSynchronize`), invalidating the capture.
pub fn refuse_on_capturing(s: &Stream) -> Res<()> {
    if is_capturing(s) {
        invalidate(s, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Issuing to the legacy stream while a blocking stream of its context
/// captures: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
pub fn check_implicit(s: &Stream) -> Res<()> {
    if s.kind != Kind::Legacy {
        return Ok(());
    }
    let caps: Vec<Active> = lock(active()).clone();
    let mut hit = false;
    for (h, mode, _, _) in caps {
        if mode == Mode::Relaxed {
            continue;
        }
        if let Ok(o) = STREAMS.get(h) {
            if o.context == s.context && o.kind.blocking() {
                invalidate(&o, CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
                hit = true;
            }
        }
    }
    if hit {
        Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    } else {
        Ok(())
    }
}

/// Refuses a potentially unsafe call (`call`) during a capture that
/// prohibits it, invalidating that capture.
pub fn check_unsafe_call(call: &'static str) -> Res<()> {
    let me = std::thread::current().id();
    let caps: Vec<Active> = lock(active()).clone();
    let mut hit = false;
    for (h, mode, thread, _) in caps {
        let prohibits = match mode {
            Mode::Global => true,
            Mode::ThreadLocal => thread == me,
            Mode::Relaxed => false,
        };
        if prohibits {
            invalidate_handle(h, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            hit = true;
        }
    }
    if hit {
        crate::trace_line(|| format!("{call}: not permitted while a stream is capturing"));
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}
