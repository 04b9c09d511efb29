//! How C calls run: validated operations go into batches (one per
//! communicator), which run inline (NULL stream) or on a host stream, in
//! each communicator's issue order. Outside a group a batch holds one
//! operation; inside one, a batch holds everything the group issued on its
//! communicator: collectives in issue order, then all sends and receives
//! together.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::comm::{CommShared, PreMul, Scalar, Ticket};
use super::error::{catch, CError};
use super::stream::StreamShared;
use sncl_rs::{
    as_bytes_mut, Codec, Collective, Communicator, CompressScope, DataType, P2p, RawOp, ReduceOp,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A collective ready to run.
pub(crate) struct CollOp {
    pub raw: RawOp,
    /// A pre-multiplying operator: scale a copy of the input, then sum.
    pub premul: Option<PreMul>,
    /// Elements of input (for the scaled copy).
    pub input_elems: usize,
    /// A compressed float32 all-reduce (`snclAllReduceCompressed`,
    /// `snclAllReduceCompressedFeedback`); boxed: rare, and large.
    pub compress: Option<Box<Compress>>,
}

/// The codec of a compressed all-reduce, and its error feedback.
pub(crate) struct Compress {
    pub codec: Codec,
    pub feedback: Option<crate::feedback::SharedFeedback>,
}

/// One issued operation.
pub(crate) enum Item {
    Coll(CollOp),
    P2p {
        peer: usize,
        is_send: bool,
        ptr: usize,
        /// Elements of `dtype`.
        count: usize,
        dtype: DataType,
    },
}

/// Work deferred to the end of a group (communicator creation).
pub(crate) type Deferred = Box<dyn FnOnce() -> Result<(), CError> + Send>;

/// Completion of one batch.
#[derive(Default)]
struct Event {
    done: Mutex<Option<Result<(), CError>>>,
    cv: Condvar,
}

impl Event {
    fn set(&self, r: Result<(), CError>) {
        *lock(&self.done) = Some(r);
        self.cv.notify_all();
    }

    fn wait(&self) -> Result<(), CError> {
        let mut g = lock(&self.done);
        loop {
            if let Some(r) = &*g {
                return r.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Completes its event if the batch is dropped unrun (its stream was
/// destroyed), so streams waiting for it go on.
struct EventGuard(Arc<Event>);

impl Drop for EventGuard {
    fn drop(&mut self) {
        let mut g = lock(&self.0.done);
        if g.is_none() {
            *g = Some(Err(CError::usage(
                "the operation was not run: its stream was destroyed",
            )));
            self.0.cv.notify_all();
        }
    }
}

/// Everything one group (or one call) issued on one communicator.
struct Batch {
    comm: Arc<CommShared>,
    /// Where it runs: the first operation's stream (None: inline).
    stream: Option<Arc<StreamShared>>,
    /// Further streams named by its operations: they wait for the batch.
    others: Vec<Arc<StreamShared>>,
    /// Some operation named the NULL stream: the caller waits for the batch.
    sync: bool,
    colls: Vec<CollOp>,
    p2p: Vec<P2p>,
}

// SAFETY: the raw pointers in `p2p` are lent by the C caller until the
// operation completes (the documented contract of snclSend / snclRecv);
// only the thread that runs the batch touches them.
unsafe impl Send for Batch {}

impl Batch {
    fn new(comm: Arc<CommShared>, stream: Option<Arc<StreamShared>>) -> Batch {
        Batch {
            sync: stream.is_none(),
            comm,
            stream,
            others: Vec::new(),
            colls: Vec::new(),
            p2p: Vec::new(),
        }
    }

    fn add(&mut self, stream: Option<Arc<StreamShared>>, item: Item) {
        match stream {
            None => self.sync = true,
            Some(s) => {
                let same = |o: &Arc<StreamShared>| Arc::ptr_eq(o, &s);
                if !self.stream.as_ref().is_some_and(same) && !self.others.iter().any(same) {
                    self.others.push(s);
                }
            }
        }
        match item {
            Item::Coll(c) => self.colls.push(c),
            Item::P2p {
                peer,
                is_send,
                ptr,
                count,
                dtype,
            } => self.p2p.push(P2p {
                peer,
                is_send,
                ptr: ptr as *mut u8,
                count,
                dtype,
            }),
        }
    }
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    ops: Vec<(Arc<CommShared>, Option<Arc<StreamShared>>, Item)>,
    deferred: Vec<Deferred>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Whether this thread is inside `snclGroupStart` / `snclGroupEnd`.
pub(crate) fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `snclGroupStart`.
pub(crate) fn group_start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// `snclGroupEnd`: at the outermost level, creates the communicators the
/// group started, then runs its operations.
pub(crate) fn group_end() -> Result<(), CError> {
    let taken = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(CError::usage(
                "snclGroupEnd without a matching snclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((
            std::mem::take(&mut g.ops),
            std::mem::take(&mut g.deferred),
        )))
    })?;
    let Some((ops, deferred)) = taken else {
        return Ok(());
    };
    let mut first = run_concurrently(deferred).err();
    let mut batches: Vec<Batch> = Vec::new();
    for (comm, stream, item) in ops {
        let i = match batches.iter().position(|b| Arc::ptr_eq(&b.comm, &comm)) {
            Some(i) => i,
            None => {
                batches.push(Batch::new(comm, stream.clone()));
                batches.len() - 1
            }
        };
        batches[i].add(stream, item);
    }
    if let Err(e) = dispatch(batches) {
        first.get_or_insert(e);
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Defers `job` to the end of the current group.
pub(crate) fn defer(job: Deferred) {
    GROUP.with(|g| g.borrow_mut().deferred.push(job));
}

/// Issues a validated operation: into the current group, or run now.
pub(crate) fn issue(
    comm: Arc<CommShared>,
    stream: Option<Arc<StreamShared>>,
    item: Item,
) -> Result<(), CError> {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((comm.clone(), stream.clone(), item));
            None
        } else {
            Some(item)
        }
    });
    let Some(item) = queued else {
        return Ok(());
    };
    let mut b = Batch::new(comm, stream.clone());
    b.add(stream, item);
    dispatch(vec![b])
}

/// Runs jobs on threads of their own (inline when there is one); returns
/// the first error.
pub(crate) fn run_concurrently(jobs: Vec<Deferred>) -> Result<(), CError> {
    if jobs.len() <= 1 {
        return jobs.into_iter().try_for_each(catch);
    }
    let results: Vec<Result<(), CError>> = std::thread::scope(|s| {
        let hs: Vec<_> = jobs.into_iter().map(|j| s.spawn(|| catch(j))).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CError::internal("a group thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Takes each batch's place in its communicator's order, then runs the
/// batches: inline ones now (concurrently, as they may be ranks of one
/// communicator driven by this thread), the others on their streams.
fn dispatch(batches: Vec<Batch>) -> Result<(), CError> {
    let mut inline: Vec<Deferred> = Vec::new();
    let mut queued: Vec<(Arc<StreamShared>, Vec<Deferred>)> = Vec::new();
    let mut waits: Vec<Arc<Event>> = Vec::new();
    let mut first: Option<CError> = None;
    for b in batches {
        let ticket = b.comm.ticket();
        let ev = Arc::new(Event::default());
        for o in &b.others {
            let ev = ev.clone();
            if let Err(e) = o.enqueue(Box::new(move || ev.wait())) {
                first.get_or_insert(e);
            }
        }
        let stream = b.stream.clone();
        if b.sync && stream.is_some() {
            waits.push(ev.clone());
        }
        let guard = EventGuard(ev);
        let job: Deferred = Box::new(move || {
            let r = catch(|| run_batch(b, ticket));
            guard.0.set(r.clone());
            r
        });
        match stream {
            None => inline.push(job),
            Some(s) => match queued.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &s)) {
                Some((_, jobs)) => jobs.push(job),
                None => queued.push((s, vec![job])),
            },
        }
    }
    for (s, jobs) in queued {
        if let Err(e) = s.enqueue(Box::new(move || run_concurrently(jobs))) {
            // The jobs were dropped unrun; their tickets passed their turns.
            first.get_or_insert(e);
        }
    }
    if let Err(e) = run_concurrently(inline) {
        first.get_or_insert(e);
    }
    for w in waits {
        if let Err(e) = w.wait() {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn run_batch(b: Batch, mut ticket: Ticket) -> Result<(), CError> {
    let shared = b.comm.clone();
    let r = (|| {
        let comm = shared.get()?;
        ticket.wait_turn();
        for c in &b.colls {
            run_coll(comm, c)?;
        }
        run_p2p(comm, &b.p2p)
    })();
    drop(ticket);
    if let Err(e) = &r {
        shared.record(e);
    }
    r
}

fn run_p2p(comm: &Communicator, p2p: &[P2p]) -> Result<(), CError> {
    if p2p.is_empty() {
        return Ok(());
    }
    // Sends to and receives from this rank itself are local copies, paired
    // in issue order by the communicator (NCCL allows them; alltoall loops
    // rely on it).
    let mut op = RawOp::new(Collective::SendRecv, DataType::Uint8, 0);
    op.p2p = p2p.to_vec();
    // SAFETY: every buffer is lent by the caller for its count until
    // the operation completes (snclSend / snclRecv's contract).
    unsafe { comm.run_raw(&op) }.map_err(CError::from)
}

fn run_coll(comm: &Communicator, c: &CollOp) -> Result<(), CError> {
    if let Some(compress) = &c.compress {
        return run_compressed(comm, c, compress);
    }
    let Some(p) = c.premul else {
        // SAFETY: the caller lends the buffers for the extents NCCL's
        // conventions give until the operation completes.
        return unsafe { comm.run_raw(&c.raw) }.map_err(CError::from);
    };
    let esize = c.raw.dtype.size();
    let bytes = c.input_elems * esize;
    let mut tmp: Vec<u64> = Vec::new();
    tmp.try_reserve_exact(bytes.div_ceil(8)).map_err(|e| {
        CError::new(
            super::types::snclResult_t::snclSystemError,
            format!(
                "rank {}: cannot allocate {bytes} bytes for the scaled copy of sendbuff: {e}",
                comm.rank()
            ),
        )
    })?;
    tmp.resize(bytes.div_ceil(8), 0);
    let tb = &mut as_bytes_mut(&mut tmp)[..bytes];
    if bytes > 0 {
        if c.raw.send.is_null() {
            return Err(CError::invalid(format!(
                "rank {}: sendbuff is NULL",
                comm.rank()
            )));
        }
        // SAFETY: the caller lends sendbuff for `input_elems` elements;
        // `tmp` is ours and at least as long; they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(c.raw.send, tb.as_mut_ptr(), bytes) };
    }
    let mut scalar = [0u8; 8];
    match p.scalar {
        Scalar::Immediate(b) => scalar = b,
        // SAFETY: with snclScalarDevice the caller keeps the scalar (one
        // element of the operator's type) valid while the operator is used.
        Scalar::Pointer(a) => unsafe {
            std::ptr::copy_nonoverlapping(a as *const u8, scalar.as_mut_ptr(), esize)
        },
    }
    super::premul::scale(tb, c.raw.dtype, &scalar[..esize]);
    let mut raw = c.raw.clone();
    raw.send = tmp.as_ptr() as *const u8;
    raw.op = ReduceOp::Sum;
    // SAFETY: as above; the input is now our scaled copy, alive until this
    // returns.
    unsafe { comm.run_raw(&raw) }.map_err(CError::from)
}

/// A compressed all-reduce (float32, sum or avg): copies sendbuff into
/// recvbuff unless they are the same, then reduces recvbuff in place.
fn run_compressed(comm: &Communicator, c: &CollOp, compress: &Compress) -> Result<(), CError> {
    let n = c.raw.count;
    if n == 0 {
        return Ok(());
    }
    if c.raw.send.is_null() || c.raw.recv.is_null() {
        return Err(CError::invalid(format!(
            "rank {}: sendbuff or recvbuff is NULL",
            comm.rank()
        )));
    }
    if !std::ptr::eq(c.raw.send, c.raw.recv) {
        // SAFETY: the caller lends both buffers for `n` float32 elements
        // until the operation completes; `copy` allows overlap.
        unsafe { std::ptr::copy(c.raw.send, c.raw.recv, n * 4) };
    }
    if !(c.raw.recv as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(CError::invalid(format!(
            "rank {}: recvbuff is not aligned for float32",
            comm.rank()
        )));
    }
    // SAFETY: recvbuff holds `n` aligned float32 elements lent by the
    // caller, touched by nothing else until the operation completes.
    let buf = unsafe { std::slice::from_raw_parts_mut(c.raw.recv as *mut f32, n) };
    // One operation at a time per handle: a second one running now (on
    // another communicator or stream) is an error, not a wait that could
    // deadlock the ranks.
    let mut feedback = match compress.feedback.as_ref().map(|f| f.try_lock()) {
        None => None,
        Some(Ok(g)) => Some(g),
        Some(Err(std::sync::TryLockError::Poisoned(p))) => Some(p.into_inner()),
        Some(Err(std::sync::TryLockError::WouldBlock)) => {
            return Err(CError::usage(format!(
                "rank {}: an error-feedback handle is used by another operation running now; \
                 give each tensor its own handle",
                comm.rank()
            )))
        }
    };
    comm.all_reduce_compressed(
        buf,
        c.raw.op,
        &compress.codec,
        feedback.as_deref_mut(),
        CompressScope::Hier,
    )
    .map_err(CError::from)
}
