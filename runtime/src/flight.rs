//! The flight recorder: each communicator keeps its last N operations (op,
//! sequence number, sizes, algorithm, start and end times, state) in a ring
//! buffer, and dumps them as JSON lines on timeout, abort or on demand, as
//! PyTorch's NCCL flight recorder does. `commbench trace` reads all ranks'
//! dumps and names the rank(s) that did not reach the operation the others
//! wait in.
//!
//! Recording costs two short uncontended lock sections and two clock reads
//! per operation; `SNCL_FLIGHT_RECORDER_ENTRIES=0` turns it off.
//!
//! Dump format (one JSON object per line): first a header
//! `{"sncl_flight_recorder":1,"rank":R,"nranks":N,"comm_id":"<hex>","reason":"...","dumped_at_us":T,"entries":K}`,
//! then one line per operation, oldest first:
//! `{"id":I,"seq":S,"op":"all_reduce","dtype":"f32","reduce":"sum","count":C,"bytes":B,"root":-1,"algo":"ring","start_us":T0,"end_us":T1|null,"state":"completed|running|failed","error":null|"..."}`.
//! Times are microseconds since the Unix epoch.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use comm_core::flight::{DEFAULT_ENTRIES, MAX_ENTRIES};

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

struct Ring {
    next_id: u64,
    entries: Vec<Entry>,
}

/// A communicator's ring of its last operations.
pub struct FlightRecorder {
    capacity: usize,
    base: Instant,
    base_us: u64,
    ring: Mutex<Ring>,
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
        let base_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        FlightRecorder {
            capacity: capacity.min(MAX_ENTRIES),
            base: Instant::now(),
            base_us,
            ring: Mutex::new(Ring {
                next_id: 0,
                entries: Vec::new(),
            }),
        }
    }

    /// How many operations it keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn now_us(&self) -> u64 {
        self.at_us(Instant::now())
    }

    fn at_us(&self, t: Instant) -> u64 {
        self.base_us + t.saturating_duration_since(self.base).as_micros() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
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
        let start_us = self.at_us(t);
        let mut ring = self.lock();
        let id = ring.next_id;
        ring.next_id += 1;
        let e = Entry {
            id,
            record,
            start_us,
            end_us: None,
            state: EntryState::Running,
            error: None,
        };
        if ring.entries.len() < self.capacity {
            ring.entries.push(e);
        } else {
            let slot = (id % self.capacity as u64) as usize;
            ring.entries[slot] = e;
        }
        id
    }

    /// Records the end of operation `id` now (a no-op if it left the ring).
    pub fn finish(&self, id: u64, error: Option<&dyn std::fmt::Display>) {
        self.finish_at(id, Instant::now(), error)
    }

    /// Records the end of operation `id` at `t` (a no-op if it left the ring).
    pub fn finish_at(&self, id: u64, t: Instant, error: Option<&dyn std::fmt::Display>) {
        if self.capacity == 0 || id == u64::MAX {
            return;
        }
        let end_us = self.at_us(t);
        let mut ring = self.lock();
        let slot = (id % self.capacity as u64) as usize;
        if let Some(e) = ring.entries.get_mut(slot).filter(|e| e.id == id) {
            e.end_us = Some(end_us);
            match error {
                None => e.state = EntryState::Completed,
                Some(err) => {
                    e.state = EntryState::Failed;
                    e.error = Some(err.to_string());
                }
            }
        }
    }

    /// The recorded operations, oldest first.
    pub fn snapshot(&self) -> Vec<Entry> {
        let ring = self.lock();
        let mut v = ring.entries.clone();
        v.sort_by_key(|e| e.id);
        v
    }

    /// The dump as JSON lines (header first).
    pub fn to_json_lines(&self, rank: usize, nranks: usize, comm_id: u64, reason: &str) -> String {
        let entries = self.snapshot();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{{\"sncl_flight_recorder\":1,\"rank\":{rank},\"nranks\":{nranks},\"comm_id\":\"{comm_id:016x}\",\"reason\":{},\"dumped_at_us\":{},\"capacity\":{},\"entries\":{}}}",
            json_str(reason),
            self.now_us(),
            self.capacity,
            entries.len()
        );
        for e in &entries {
            let r = &e.record;
            let _ = writeln!(
                s,
                "{{\"id\":{},\"seq\":{},\"op\":{},\"dtype\":{},\"reduce\":{},\"count\":{},\"bytes\":{},\"root\":{},\"algo\":{},\"start_us\":{},\"end_us\":{},\"state\":\"{}\",\"error\":{}}}",
                e.id,
                r.seq,
                json_str(r.op),
                json_str(r.dtype),
                json_str(r.reduce),
                r.count,
                r.bytes,
                r.root,
                json_str(r.algo),
                e.start_us,
                e.end_us.map_or("null".to_string(), |t| t.to_string()),
                e.state.name(),
                e.error.as_deref().map_or("null".to_string(), json_str),
            );
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

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
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

    /// Recording must cost about nothing next to an operation (~2 µs for
    /// the smallest all-reduce): two clock reads and two uncontended locks.
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
