//! The flight recorder: each communicator keeps its last N operations (op,
//! sequence number, sizes, algorithm, start and end times, state) in a ring
//! buffer, and dumps them as JSON lines on timeout, abort or on demand, as
//! PyTorch's NCCL flight recorder does. `commbench trace` reads all ranks'
//! dumps and names the rank(s) that did not reach the operation the others
//! wait in.
//!
//! Recording takes no lock: one compare-and-swap and a dozen plain stores
//! at the start and at the end of an operation, with the clock readings
//! the operation takes anyway; `SNCL_FLIGHT_RECORDER_ENTRIES=0` turns it
//! off.
//!
//! Dump format (one JSON object per line): first a header
//! `{"sncl_flight_recorder":1,"rank":R,"nranks":N,"comm_id":"<hex>","reason":"...","dumped_at_us":T,"entries":K,"init":[{"phase":"prepare","start_us":T0,"end_us":T1},...]}`
//! (`init`: the phases of the communicator's creation, [`InitPhase`]),
//! then one line per operation, oldest first:
//! `{"id":I,"seq":S,"op":"all_reduce","dtype":"f32","reduce":"sum","count":C,"bytes":B,"root":-1,"algo":"ring","start_us":T0,"end_us":T1|null,"state":"completed|running|failed","error":null|"..."}`.
//! Times are microseconds since the Unix epoch.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicI64, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clock::Instant;

pub use comm_core::flight::{DEFAULT_ENTRIES, MAX_ENTRIES};

/// One phase of a communicator's creation (issue 34: init traced per
/// phase), in the dump's header, the `commbench trace --chrome` export
/// and `Communicator::init_phases`. Times are microseconds since the Unix
/// epoch, as the entries'.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InitPhase {
    /// `prepare` (the standby store starts, every transport kind probes
    /// this rank), `rendezvous` (every rank's record published and read
    /// through the store), `connect` (the connections made at creation;
    /// those made at first use, `SNCL_RUNTIME_CONNECT`, belong to the first
    /// operation), `barrier` (until every rank has connected).
    pub phase: &'static str,
    /// When it began.
    pub start_us: u64,
    /// When it ended.
    pub end_us: u64,
}

impl InitPhase {
    /// How long it took.
    pub fn duration(&self) -> Duration {
        Duration::from_micros(self.end_us.saturating_sub(self.start_us))
    }
}

/// Microseconds since the Unix epoch, now (0 before it).
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What became of a recorded operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// Started, not finished (running, or hung).
    Running,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
}

impl EntryState {
    /// The state's name in dumps.
    pub fn name(self) -> &'static str {
        match self {
            EntryState::Running => "running",
            EntryState::Completed => "completed",
            EntryState::Failed => "failed",
        }
    }
}

/// What is known about an operation when it starts.
#[derive(Clone, Copy, Debug)]
pub struct OpRecord {
    /// Sequence number (0 for point-to-point groups).
    pub seq: u64,
    /// Collective name.
    pub op: &'static str,
    /// Element type name.
    pub dtype: &'static str,
    /// Reduction name.
    pub reduce: &'static str,
    /// Element count as the fingerprint carries it.
    pub count: u64,
    /// Bytes of the operation's output (or input, whichever is larger).
    pub bytes: u64,
    /// Root, or -1.
    pub root: i64,
    /// Algorithm name.
    pub algo: &'static str,
    /// The caller's tag of the operation (0: none; `sncl::CollConfig::tag`).
    pub tag: u64,
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Running number of the entry on this communicator.
    pub id: u64,
    /// The operation.
    pub record: OpRecord,
    /// Start, in microseconds since the Unix epoch.
    pub start_us: u64,
    /// End, if finished.
    pub end_us: Option<u64>,
    /// State.
    pub state: EntryState,
    /// The error, if failed.
    pub error: Option<String>,
}

/// Slots are allocated in chunks of this many, as the ring first reaches
/// them (a communicator that runs few operations allocates little).
const CHUNK: usize = 256;

/// `end_us` of an entry that has not finished.
const NO_END: u64 = u64::MAX;

/// A `&'static str` kept in two atomics (address and length), written and
/// read only inside a slot's write section and its validated read.
#[derive(Default)]
struct Name {
    ptr: AtomicUsize,
    len: AtomicUsize,
}

impl Name {
    fn set(&self, s: &'static str) {
        self.ptr.store(s.as_ptr() as usize, Relaxed);
        self.len.store(s.len(), Relaxed);
    }

    /// The raw parts; turned back into a `&str` by [`name_from`] only once
    /// the slot's version shows that no write overlapped the read.
    fn get(&self) -> (usize, usize) {
        (self.ptr.load(Relaxed), self.len.load(Relaxed))
    }
}

/// One ring entry. `version` is a sequence lock that also excludes
/// writers: a writer moves it from even to odd with a compare-and-swap
/// (one atomic operation per section: a recorder writes each entry once at
/// the start of an operation and once at its end), stores the fields and
/// makes it even again; a reader copies the fields and keeps the copy only
/// if the version was even and unchanged around it.
#[derive(Default)]
struct Slot {
    version: AtomicU64,
    /// The entry's id + 1 (0: never written).
    id: AtomicU64,
    seq: AtomicU64,
    count: AtomicU64,
    bytes: AtomicU64,
    root: AtomicI64,
    tag: AtomicU64,
    op: Name,
    dtype: Name,
    reduce: Name,
    algo: Name,
    start_us: AtomicU64,
    end_us: AtomicU64,
    state: AtomicU8,
}

impl Slot {
    /// Opens a write section; `None` when another writer holds the slot
    /// (operations on one communicator are serialised by its state lock,
    /// so that only happens to a misused recorder: the entry is dropped,
    /// the operation is never held up).
    fn begin(&self) -> Option<u64> {
        let v = self.version.load(Relaxed);
        if v % 2 == 1 {
            return None;
        }
        self.version
            .compare_exchange(v, v + 1, Acquire, Relaxed)
            .ok()?;
        // The odd version is visible before any field store below.
        fence(Release);
        Some(v)
    }

    fn end(&self, v: u64) {
        self.version.store(v + 2, Release);
    }

    /// A consistent copy of the entry (`None`: empty, or written while
    /// read, a few times over).
    fn read(&self) -> Option<Entry> {
        for _ in 0..64 {
            let v1 = self.version.load(Acquire);
            if v1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let id = self.id.load(Relaxed);
            let names = [
                self.op.get(),
                self.dtype.get(),
                self.reduce.get(),
                self.algo.get(),
            ];
            let (seq, count, bytes) = (
                self.seq.load(Relaxed),
                self.count.load(Relaxed),
                self.bytes.load(Relaxed),
            );
            let root = self.root.load(Relaxed);
            let tag = self.tag.load(Relaxed);
            let (start_us, end_us) = (self.start_us.load(Relaxed), self.end_us.load(Relaxed));
            let state = self.state.load(Relaxed);
            fence(Acquire);
            if self.version.load(Relaxed) != v1 {
                continue;
            }
            if id == 0 {
                return None;
            }
            let [op, dtype, reduce, algo] = names.map(name_from);
            let entry = Entry {
                id: id - 1,
                record: OpRecord {
                    seq,
                    op,
                    dtype,
                    reduce,
                    count,
                    bytes,
                    root,
                    algo,
                    tag,
                },
                start_us,
                end_us: (end_us != NO_END).then_some(end_us),
                state: match state {
                    1 => EntryState::Completed,
                    2 => EntryState::Failed,
                    _ => EntryState::Running,
                },
                error: None,
            };
            return Some(entry);
        }
        None
    }
}

/// The `&'static str` whose parts a validated slot read returned.
fn name_from((ptr, len): (usize, usize)) -> &'static str {
    if ptr == 0 {
        return "";
    }
    // SAFETY: `ptr`/`len` were read inside one write-free window of the
    // slot (even version, unchanged around the read), and writers hold the
    // slot exclusively (compare-and-swap to an odd version) while they store
    // both parts from one `&'static str` (`Name::set`); so they are the
    // address and length of a string that lives for the whole program.
    unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr as *const u8, len)) }
}

/// How [`FlightRecorder::finish_with`] learns an operation's end.
#[derive(Clone, Copy)]
enum End {
    /// At this clock reading.
    At(Instant),
    /// This long after the recorded start.
    After(Duration),
}

/// A communicator's ring of its last operations. Recording takes no lock:
/// each entry is a sequence-locked slot (see `Slot`), so a dump from
/// another thread (a hang, an abort) reads it while operations go on.
pub struct FlightRecorder {
    capacity: usize,
    base: Instant,
    base_us: u64,
    /// The id the next operation gets.
    next_id: AtomicU64,
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// Error messages of failed entries (id, text): rare, so kept apart
    /// under a lock, at most `capacity` of them.
    errors: Mutex<VecDeque<(u64, String)>>,
    /// The phases of the communicator's creation (set once, after it).
    init: Mutex<Vec<InitPhase>>,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl FlightRecorder {
    /// A recorder of the last `capacity` operations (0: records nothing).
    pub fn new(capacity: usize) -> FlightRecorder {
        let base_us = wall_us();
        let capacity = capacity.min(MAX_ENTRIES);
        FlightRecorder {
            capacity,
            base: Instant::now(),
            base_us,
            next_id: AtomicU64::new(0),
            chunks: (0..capacity.div_ceil(CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            errors: Mutex::new(VecDeque::new()),
            init: Mutex::new(Vec::new()),
        }
    }

    /// Keeps the phases of the communicator's creation (kept even when
    /// the recorder records no operation).
    pub fn set_init_phases(&self, phases: Vec<InitPhase>) {
        *self.init.lock().unwrap_or_else(|e| e.into_inner()) = phases;
    }

    /// The phases of the communicator's creation (empty for one derived
    /// from another: split, shrink).
    pub fn init_phases(&self) -> Vec<InitPhase> {
        self.init.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many operations it keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of the record slots allocated so far (chunks are allocated
    /// as the ring first reaches them).
    pub fn allocated_bytes(&self) -> usize {
        let chunks = self.chunks.iter().filter(|c| c.get().is_some()).count();
        chunks * CHUNK * std::mem::size_of::<Slot>()
    }

    fn now_us(&self) -> u64 {
        self.at_us(Instant::now())
    }

    fn at_us(&self, t: Instant) -> u64 {
        self.base_us + t.saturating_duration_since(self.base).as_micros() as u64
    }

    fn slot(&self, id: u64) -> &Slot {
        let i = (id % self.capacity as u64) as usize;
        let chunk = self.chunks[i / CHUNK].get_or_init(|| {
            let n = CHUNK.min(self.capacity - i / CHUNK * CHUNK);
            (0..n).map(|_| Slot::default()).collect()
        });
        &chunk[i % CHUNK]
    }

    /// Records the start of an operation now; returns its id for [`Self::finish`].
    pub fn start(&self, record: OpRecord) -> u64 {
        self.start_at(record, Instant::now())
    }

    /// Records the start of an operation at `t` (a clock reading the caller
    /// has anyway); returns its id for [`Self::finish_at`].
    pub fn start_at(&self, record: OpRecord, t: Instant) -> u64 {
        if self.capacity == 0 {
            return u64::MAX;
        }
        // One writer at a time in practice (the communicator's state lock);
        // a racing writer at worst loses an entry (`Slot::begin`).
        let id = self.next_id.load(Relaxed);
        self.next_id.store(id + 1, Relaxed);
        let s = self.slot(id);
        let Some(v) = s.begin() else {
            return u64::MAX;
        };
        s.id.store(id + 1, Relaxed);
        s.seq.store(record.seq, Relaxed);
        s.count.store(record.count, Relaxed);
        s.bytes.store(record.bytes, Relaxed);
        s.root.store(record.root, Relaxed);
        s.tag.store(record.tag, Relaxed);
        s.op.set(record.op);
        s.dtype.set(record.dtype);
        s.reduce.set(record.reduce);
        s.algo.set(record.algo);
        s.start_us.store(self.at_us(t), Relaxed);
        s.end_us.store(NO_END, Relaxed);
        s.state.store(0, Relaxed);
        s.end(v);
        id
    }

    /// Records the end of operation `id` now (a no-op if it left the ring).
    pub fn finish(&self, id: u64, error: Option<&dyn std::fmt::Display>) {
        self.finish_at(id, Instant::now(), error)
    }

    /// Records the end of operation `id` at `t` (a no-op if it left the ring).
    pub fn finish_at(&self, id: u64, t: Instant, error: Option<&dyn std::fmt::Display>) {
        self.finish_with(id, End::At(t), error)
    }

    /// Records the end of operation `id` `took` after its start (the
    /// caller's own clock readings: cheaper than [`Self::finish_at`], which
    /// converts an `Instant` again; a no-op if it left the ring).
    pub fn finish_after(&self, id: u64, took: Duration, error: Option<&dyn std::fmt::Display>) {
        self.finish_with(id, End::After(took), error)
    }

    fn finish_with(&self, id: u64, end: End, error: Option<&dyn std::fmt::Display>) {
        if self.capacity == 0 || id == u64::MAX {
            return;
        }
        let s = self.slot(id);
        let Some(v) = s.begin() else {
            return;
        };
        if s.id.load(Relaxed) == id + 1 {
            let end_us = match end {
                End::At(t) => self.at_us(t),
                End::After(took) => s
                    .start_us
                    .load(Relaxed)
                    .saturating_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX)),
            };
            s.end_us.store(end_us, Relaxed);
            s.state.store(if error.is_some() { 2 } else { 1 }, Relaxed);
        }
        s.end(v);
        if let Some(err) = error {
            let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            if errors.len() >= self.capacity {
                errors.pop_front();
            }
            errors.push_back((id, err.to_string()));
        }
    }

    /// The recorded operations, oldest first.
    pub fn snapshot(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = self
            .chunks
            .iter()
            .filter_map(|c| c.get())
            .flat_map(|c| c.iter())
            .filter_map(Slot::read)
            .collect();
        v.sort_by_key(|e| e.id);
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        for (id, text) in errors.iter() {
            if let Ok(k) = v.binary_search_by_key(id, |e| e.id) {
                v[k].error = Some(text.clone());
            }
        }
        v
    }

    /// The dump as JSON lines (header first).
    pub fn to_json_lines(&self, rank: usize, nranks: usize, comm_id: u64, reason: &str) -> String {
        let entries = self.snapshot();
        let header = DumpHeader {
            sncl_flight_recorder: 1,
            rank,
            nranks,
            comm_id: format!("{comm_id:016x}"),
            reason,
            dumped_at_us: self.now_us(),
            capacity: self.capacity,
            entries: entries.len(),
            init: self.init_phases(),
        };
        let mut s = json_line(&header);
        for e in &entries {
            let r = &e.record;
            s += &json_line(&DumpEntry {
                id: e.id,
                seq: r.seq,
                op: r.op,
                dtype: r.dtype,
                reduce: r.reduce,
                count: r.count,
                bytes: r.bytes,
                root: r.root,
                algo: r.algo,
                tag: r.tag,
                tag_name: crate::tags::name_of(r.tag),
                start_us: e.start_us,
                end_us: e.end_us,
                state: e.state.name(),
                error: e.error.as_deref(),
            });
        }
        s
    }

    /// Writes the dump to `dir/sncl-flight-<comm_id>-rank<rank>.jsonl`
    /// (mode 0600, replaced atomically: written to a new file, then renamed).
    pub fn dump(
        &self,
        dir: &Path,
        rank: usize,
        nranks: usize,
        comm_id: u64,
        reason: &str,
    ) -> std::io::Result<PathBuf> {
        let text = self.to_json_lines(rank, nranks, comm_id, reason);
        let path = dir.join(dump_file_name(comm_id, rank));
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            dump_file_name(comm_id, rank),
            std::process::id(),
            self.now_us()
        ));
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let written = opts.open(&tmp).and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_data()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(path)
    }
}

/// File name of rank `rank`'s dump of communicator `comm_id`.
pub fn dump_file_name(comm_id: u64, rank: usize) -> String {
    format!("sncl-flight-{comm_id:016x}-rank{rank}.jsonl")
}

/// The first line of a dump (field order is the format's).
#[derive(serde::Serialize)]
struct DumpHeader<'a> {
    sncl_flight_recorder: u32,
    rank: usize,
    nranks: usize,
    comm_id: String,
    reason: &'a str,
    dumped_at_us: u64,
    capacity: usize,
    entries: usize,
    init: Vec<InitPhase>,
}

/// One entry's line of a dump.
#[derive(serde::Serialize)]
struct DumpEntry<'a> {
    id: u64,
    seq: u64,
    op: &'a str,
    dtype: &'a str,
    reduce: &'a str,
    count: u64,
    bytes: u64,
    root: i64,
    algo: &'a str,
    /// Written only where the caller tagged the operation.
    #[serde(skip_serializing_if = "is_zero")]
    tag: u64,
    /// The tag's name, where it was made from one in this process
    /// ([`crate::tags::tag_of`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    tag_name: Option<String>,
    start_us: u64,
    end_us: Option<u64>,
    state: &'a str,
    error: Option<&'a str>,
}

/// Whether a tag is absent (serde's `skip_serializing_if` takes a reference).
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `v` as one line of JSON.
fn json_line<T: serde::Serialize>(v: &T) -> String {
    // Serialising these structs (strings, integers, options) cannot fail.
    let mut line = serde_json::to_string(v).unwrap_or_default();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> OpRecord {
        OpRecord {
            seq,
            op: "all_reduce",
            dtype: "f32",
            reduce: "sum",
            count: 4,
            bytes: 16,
            root: -1,
            algo: "ring",
            tag: seq % 3,
        }
    }

    #[test]
    fn ring_keeps_the_last_entries_in_order() {
        let f = FlightRecorder::new(3);
        for s in 1..=5 {
            let id = f.start(rec(s));
            if s != 5 {
                f.finish(id, None);
            }
        }
        let v = f.snapshot();
        assert_eq!(
            v.iter().map(|e| e.record.seq).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert_eq!(v[0].state, EntryState::Completed);
        assert_eq!(v[2].state, EntryState::Running);
        assert!(v[0].end_us.unwrap() >= v[0].start_us);
        // A finish for an entry that left the ring changes nothing.
        f.finish(0, Some(&"late"));
        assert!(f.snapshot().iter().all(|e| e.error.is_none()));
    }

    /// Recording must cost about nothing next to an operation (~0.5 µs for
    /// the smallest all-reduce): two compare-and-swaps and plain stores.
    #[test]
    fn finish_after_ends_the_entry_that_long_after_its_start() {
        let f = FlightRecorder::new(4);
        let t = Instant::now();
        let a = f.start_at(rec(1), t);
        f.finish_after(a, Duration::from_micros(1500), None);
        let b = f.start_at(rec(2), t);
        f.finish_after(b, Duration::ZERO, Some(&"boom" as &dyn std::fmt::Display));
        let v = f.snapshot();
        assert_eq!(v[0].end_us, Some(v[0].start_us + 1500));
        assert_eq!(v[0].state, EntryState::Completed);
        assert_eq!(v[1].end_us, Some(v[1].start_us));
        assert_eq!(v[1].state, EntryState::Failed);
        assert_eq!(v[1].error.as_deref(), Some("boom"));
        // An id that left the ring is not finished again.
        for s in 3..8 {
            f.start_at(rec(s), t);
        }
        f.finish_after(a, Duration::from_secs(1), None);
        assert!(f.snapshot().iter().all(|e| e.end_us.is_none()));
    }

    #[test]
    fn recording_costs_well_under_a_microsecond() {
        let f = FlightRecorder::new(DEFAULT_ENTRIES);
        let n = 200_000u32;
        let t = Instant::now();
        for s in 0..u64::from(n) {
            let now = Instant::now();
            let id = f.start_at(rec(s), now);
            f.finish_at(id, now, None);
        }
        let per = t.elapsed() / n;
        eprintln!("flight recorder: {per:?} per operation (start + finish)");
        // Loose: the test machine may be loaded.
        assert!(per < std::time::Duration::from_micros(2), "{per:?}");
        assert_eq!(f.snapshot().len(), DEFAULT_ENTRIES);
    }

    /// Past one chunk of slots, with failures: ids, order and errors stay
    /// right across chunk boundaries and wrap-around.
    #[test]
    fn ring_spans_chunks_and_keeps_errors() {
        let f = FlightRecorder::new(CHUNK + 3);
        for s in 0..(2 * CHUNK as u64 + 10) {
            let id = f.start(rec(s));
            f.finish(
                id,
                (s % 100 == 7).then_some(&"boom" as &dyn std::fmt::Display),
            );
        }
        let v = f.snapshot();
        assert_eq!(v.len(), CHUNK + 3);
        let first = 2 * CHUNK as u64 + 10 - (CHUNK as u64 + 3);
        for (k, e) in v.iter().enumerate() {
            assert_eq!(e.id, first + k as u64);
            assert_eq!(e.record.seq, e.id);
            assert_eq!(e.record.op, "all_reduce");
            let failed = e.id % 100 == 7;
            assert_eq!(e.state == EntryState::Failed, failed, "{e:?}");
            assert_eq!(e.error.as_deref() == Some("boom"), failed, "{e:?}");
        }
    }

    /// A dump from another thread while operations are recorded sees only
    /// whole entries (never a torn one) and never blocks the writer.
    #[test]
    fn snapshots_during_recording_see_whole_entries() {
        let f = std::sync::Arc::new(FlightRecorder::new(8));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (f, stop) = (f.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0usize;
                while !stop.load(Relaxed) {
                    for e in f.snapshot() {
                        // Every field of an entry comes from one operation.
                        assert_eq!(e.record.count, e.record.seq * 3, "{e:?}");
                        assert_eq!(
                            e.record.algo,
                            if e.record.seq % 2 == 0 {
                                "ring"
                            } else {
                                "tree"
                            }
                        );
                        seen += 1;
                    }
                }
                seen
            })
        };
        for s in 0..200_000u64 {
            let mut r = rec(s);
            r.count = s * 3;
            r.algo = if s % 2 == 0 { "ring" } else { "tree" };
            let id = f.start(r);
            f.finish(id, None);
        }
        stop.store(true, Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn the_phases_of_creation_are_in_the_header_even_when_disabled() {
        let f = FlightRecorder::new(0);
        assert!(f.init_phases().is_empty());
        let phase = |phase, start_us, end_us| InitPhase {
            phase,
            start_us,
            end_us,
        };
        f.set_init_phases(vec![phase("prepare", 10, 25), phase("rendezvous", 25, 40)]);
        assert_eq!(f.init_phases()[1].duration(), Duration::from_micros(15));
        let header = f.to_json_lines(0, 1, 1, "x");
        assert!(
            header.contains(
                r#""init":[{"phase":"prepare","start_us":10,"end_us":25},{"phase":"rendezvous","start_us":25,"end_us":40}]"#
            ),
            "{header}"
        );
    }

    #[test]
    fn disabled_recorder_records_nothing() {
        let f = FlightRecorder::new(0);
        let id = f.start(rec(1));
        f.finish(id, None);
        assert!(f.snapshot().is_empty());
        assert!(f.to_json_lines(0, 1, 1, "x").lines().count() == 1);
    }

    #[test]
    fn dump_is_json_lines_mode_0600_with_escaped_errors() {
        let dir = std::env::temp_dir().join(format!("sncl-flight-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = FlightRecorder::new(4);
        let id = f.start(rec(7));
        f.finish(id, Some(&"bad \"quote\"\nnext"));
        f.start(rec(8));
        let p = f.dump(&dir, 2, 4, 0xabc, "timeout").unwrap();
        // A second dump replaces the first.
        let p2 = f.dump(&dir, 2, 4, 0xabc, "on demand").unwrap();
        assert_eq!(p, p2);
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("\"rank\":2") && lines[0].contains("\"on demand\""));
        assert!(lines[0].contains("0000000000000abc"));
        assert!(lines[1].contains("\"seq\":7") && lines[1].contains("\"failed\""));
        assert!(lines[1].contains(r#"bad \"quote\"\nnext"#), "{}", lines[1]);
        assert!(lines[2].contains("\"running\"") && lines[2].contains("\"end_us\":null"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "temp file left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
