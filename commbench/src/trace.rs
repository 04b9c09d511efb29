//! `commbench trace FILES...`: reads the flight-recorder dumps of all ranks
//! (`SNCL_DEBUG_DUMP_DIR`, format in `sncl_runtime::flight`) and names the
//! rank(s) that did not reach the operation the others wait in.
//!
//! Per communicator: the stuck operation is the lowest sequence number any
//! rank started but did not complete; a rank whose last collective is
//! below it did not reach it, a rank with another operation at that number
//! diverged, and a rank with no dump is named as missing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// One operation of a dump.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    /// Sequence number (0: point-to-point).
    pub seq: u64,
    /// Collective.
    pub op: String,
    /// Element type.
    pub dtype: String,
    /// Count.
    pub count: u64,
    /// Root or -1.
    pub root: i64,
    /// running / completed / failed.
    pub state: String,
    /// The error of a failed one.
    pub error: Option<String>,
    /// Algorithm (empty in dumps that lack it).
    pub algo: String,
    /// Bytes of the operation.
    pub bytes: u64,
    /// Start, µs since the Unix epoch (dumps of older builds lack it).
    pub start_us: Option<u64>,
    /// End, µs since the Unix epoch; `None` while running.
    pub end_us: Option<u64>,
    /// The caller's tag (`sncl::CollConfig::tag`; 0: none).
    pub tag: u64,
    /// The tag's name, where the dumping process made it from one
    /// (`sncl::tags::tag_of`).
    pub tag_name: Option<String>,
}

impl TraceEntry {
    fn describe(&self) -> String {
        format!(
            "{}(dtype={}, count={}{}{}) seq {}",
            self.op,
            self.dtype,
            self.count,
            if self.root >= 0 {
                format!(", root={}", self.root)
            } else {
                String::new()
            },
            match (&self.tag_name, self.tag) {
                (Some(name), _) => format!(", tag={name:?}"),
                (None, 0) => String::new(),
                (None, tag) => format!(", tag={tag}"),
            },
            self.seq
        )
    }

    fn same_op(&self, o: &TraceEntry) -> bool {
        self.op == o.op && self.dtype == o.dtype && self.count == o.count && self.root == o.root
    }
}

/// One rank's dump.
#[derive(Clone, Debug)]
pub struct Dump {
    /// File read.
    pub path: PathBuf,
    /// Rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Communicator id (hex).
    pub comm_id: String,
    /// Why it was dumped.
    pub reason: String,
    /// When, µs since the Unix epoch.
    pub dumped_at_us: Option<u64>,
    /// Operations, oldest first.
    pub entries: Vec<TraceEntry>,
    /// The phases of the communicator's creation (`prepare`,
    /// `rendezvous`, ...) as (phase, start µs, end µs); empty in dumps
    /// written before they were recorded.
    pub init: Vec<(String, u64, u64)>,
}

fn field<'a>(v: &'a Value, k: &str, path: &Path, line: usize) -> Result<&'a Value, String> {
    v.get(k)
        .ok_or_else(|| format!("{}:{line}: no field {k:?}", path.display()))
}

fn as_u64(v: &Value, k: &str, path: &Path, line: usize) -> Result<u64, String> {
    field(v, k, path, line)?.as_u64().ok_or_else(|| {
        format!(
            "{}:{line}: {k:?} is not an unsigned integer",
            path.display()
        )
    })
}

fn as_str(v: &Value, k: &str, path: &Path, line: usize) -> Result<String, String> {
    field(v, k, path, line)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{}:{line}: {k:?} is not a string", path.display()))
}

/// The header's `init` array (absent: none).
fn init_phases(h: &Value, path: &Path) -> Result<Vec<(String, u64, u64)>, String> {
    let Some(list) = h.get("init") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| format!("{}:1: \"init\" is not an array", path.display()))?;
    list.iter()
        .map(|p| {
            Ok((
                as_str(p, "phase", path, 1)?,
                as_u64(p, "start_us", path, 1)?,
                as_u64(p, "end_us", path, 1)?,
            ))
        })
        .collect()
}

/// Parses one dump's text.
pub fn parse_dump(path: &Path, text: &str) -> Result<Dump, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines
        .next()
        .ok_or_else(|| format!("{}: empty file", path.display()))?;
    let h: Value =
        serde_json::from_str(first).map_err(|e| format!("{}:1: not JSON: {e}", path.display()))?;
    if h.get("sncl_flight_recorder").is_none() {
        return Err(format!(
            "{}:1: not an sncl flight-recorder dump (no \"sncl_flight_recorder\" header)",
            path.display()
        ));
    }
    let mut d = Dump {
        path: path.to_path_buf(),
        rank: as_u64(&h, "rank", path, 1)? as usize,
        nranks: as_u64(&h, "nranks", path, 1)? as usize,
        comm_id: as_str(&h, "comm_id", path, 1)?,
        reason: as_str(&h, "reason", path, 1).unwrap_or_default(),
        dumped_at_us: h.get("dumped_at_us").and_then(Value::as_u64),
        entries: Vec::new(),
        init: init_phases(&h, path)?,
    };
    if d.rank >= d.nranks {
        return Err(format!(
            "{}:1: rank {} is not below nranks {}",
            path.display(),
            d.rank,
            d.nranks
        ));
    }
    for (i, l) in lines {
        let n = i + 1;
        let v: Value = serde_json::from_str(l)
            .map_err(|e| format!("{}:{n}: not JSON: {e}", path.display()))?;
        d.entries.push(TraceEntry {
            seq: as_u64(&v, "seq", path, n)?,
            op: as_str(&v, "op", path, n)?,
            dtype: as_str(&v, "dtype", path, n)?,
            count: as_u64(&v, "count", path, n)?,
            root: field(&v, "root", path, n)?.as_i64().unwrap_or(-1),
            state: as_str(&v, "state", path, n)?,
            error: v.get("error").and_then(Value::as_str).map(str::to_string),
            algo: v
                .get("algo")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            bytes: v.get("bytes").and_then(Value::as_u64).unwrap_or(0),
            start_us: v.get("start_us").and_then(Value::as_u64),
            end_us: v.get("end_us").and_then(Value::as_u64),
            tag: v.get("tag").and_then(Value::as_u64).unwrap_or(0),
            tag_name: v
                .get("tag_name")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
    }
    Ok(d)
}

/// The verdict on one communicator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    /// Communicator id.
    pub comm_id: String,
    /// The operation the others wait in, if any is unfinished.
    pub stuck: Option<TraceEntry>,
    /// Ranks that did not reach it (their last collective is earlier).
    pub behind: Vec<usize>,
    /// Ranks that run another operation under its sequence number.
    pub diverged: Vec<usize>,
    /// Ranks without a dump.
    pub missing: Vec<usize>,
    /// Human-readable lines, one per rank.
    pub lines: Vec<String>,
}

/// Analyses the dumps of one communicator (all with the same `comm_id`).
pub fn analyse(dumps: &[&Dump]) -> Verdict {
    let mut v = Verdict {
        comm_id: dumps.first().map(|d| d.comm_id.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let nranks = dumps.iter().map(|d| d.nranks).max().unwrap_or(0);
    let by_rank: BTreeMap<usize, &Dump> = dumps.iter().map(|d| (d.rank, *d)).collect();
    // The lowest collective sequence number some rank started and did not complete.
    v.stuck = dumps
        .iter()
        .flat_map(|d| d.entries.iter())
        .filter(|e| e.seq > 0 && e.state != "completed")
        .min_by_key(|e| e.seq)
        .cloned();
    for r in 0..nranks {
        let Some(d) = by_rank.get(&r) else {
            v.missing.push(r);
            v.lines
                .push(format!("rank {r}: no dump (dead, or it never dumped)"));
            continue;
        };
        let last = d.entries.iter().filter(|e| e.seq > 0).max_by_key(|e| e.seq);
        let line = match (&v.stuck, last) {
            (_, None) => {
                if v.stuck.is_some() {
                    v.behind.push(r);
                }
                format!("rank {r}: no collective recorded")
            }
            (None, Some(l)) => format!("rank {r}: last {} ({})", l.describe(), l.state),
            (Some(s), Some(l)) if l.seq < s.seq => {
                v.behind.push(r);
                format!(
                    "rank {r}: did NOT reach {}; its last collective is {} ({})",
                    s.describe(),
                    l.describe(),
                    l.state
                )
            }
            (Some(s), Some(_)) => match d.entries.iter().find(|e| e.seq == s.seq) {
                Some(e) if !e.same_op(s) => {
                    v.diverged.push(r);
                    format!(
                        "rank {r}: runs {} where others run {}",
                        e.describe(),
                        s.describe()
                    )
                }
                Some(e) => format!(
                    "rank {r}: in {} ({}){}",
                    e.describe(),
                    e.state,
                    e.error
                        .as_deref()
                        .map(|x| format!(": {x}"))
                        .unwrap_or_default()
                ),
                None => format!("rank {r}: passed seq {} (older than its ring)", s.seq),
            },
        };
        v.lines.push(line);
    }
    v
}

/// Reads FILES (a directory stands for its `sncl-flight-*.jsonl` files).
pub fn read_dumps(args: &[String]) -> Result<Vec<Dump>, String> {
    let mut files = Vec::new();
    for a in args {
        let p = PathBuf::from(a);
        if p.is_dir() {
            let rd = std::fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let mut found: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("sncl-flight-") && n.ends_with(".jsonl"))
                })
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(p);
        }
    }
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            parse_dump(f, &text)
        })
        .collect()
}

/// Renders the verdicts of all communicators in `dumps`.
pub fn report(dumps: &[Dump]) -> (String, Vec<Verdict>) {
    let mut comms: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        comms.entry(d.comm_id.as_str()).or_default().push(d);
    }
    let mut out = String::new();
    let mut verdicts = Vec::new();
    for (id, ds) in comms {
        let v = analyse(&ds);
        out.push_str(&format!(
            "communicator {id}: {} dump(s) of {} rank(s)\n",
            ds.len(),
            ds.iter().map(|d| d.nranks).max().unwrap_or(0)
        ));
        for d in &ds {
            out.push_str(&format!(
                "  dump of rank {}: {} ({})\n",
                d.rank,
                d.path.display(),
                d.reason
            ));
        }
        for l in &v.lines {
            out.push_str(&format!("  {l}\n"));
        }
        match &v.stuck {
            None => out.push_str("  verdict: no rank is stuck in a collective\n"),
            Some(s) => {
                let mut parts = Vec::new();
                if !v.behind.is_empty() {
                    parts.push(format!(
                        "rank(s) {:?} did not reach {}",
                        v.behind,
                        s.describe()
                    ));
                }
                if !v.diverged.is_empty() {
                    parts.push(format!(
                        "rank(s) {:?} run another operation as seq {}",
                        v.diverged, s.seq
                    ));
                }
                if !v.missing.is_empty() {
                    parts.push(format!("rank(s) {:?} left no dump", v.missing));
                }
                if parts.is_empty() {
                    parts.push(format!(
                        "every rank reached {}; look for a slow or dead link",
                        s.describe()
                    ));
                }
                out.push_str(&format!("  verdict: {}\n", parts.join("; ")));
            }
        }
        verdicts.push(v);
    }
    (out, verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(rank: usize, entries: &[(u64, &str, &str)]) -> Dump {
        let mut text = format!(
            "{{\"sncl_flight_recorder\":1,\"rank\":{rank},\"nranks\":3,\"comm_id\":\"00000000000000aa\",\"reason\":\"t\"}}\n"
        );
        for (seq, op, state) in entries {
            text.push_str(&format!(
                "{{\"seq\":{seq},\"op\":\"{op}\",\"dtype\":\"f32\",\"count\":4,\"root\":-1,\"state\":\"{state}\",\"error\":null}}\n"
            ));
        }
        parse_dump(Path::new("x"), &text).unwrap()
    }

    #[test]
    fn names_the_rank_that_did_not_reach_the_op() {
        let d = [
            dump(
                0,
                &[(1, "all_reduce", "completed"), (2, "all_reduce", "failed")],
            ),
            dump(
                1,
                &[(1, "all_reduce", "completed"), (2, "all_reduce", "running")],
            ),
            dump(2, &[(1, "all_reduce", "completed")]),
        ];
        let (text, v) = report(&d);
        assert_eq!(v[0].behind, [2], "{text}");
        assert!(v[0].diverged.is_empty() && v[0].missing.is_empty());
        assert!(
            text.contains("rank(s) [2] did not reach all_reduce"),
            "{text}"
        );
    }

    #[test]
    fn names_diverged_and_missing_ranks() {
        let d = [
            dump(0, &[(1, "all_reduce", "running")]),
            dump(1, &[(1, "broadcast", "running")]),
        ];
        let (text, v) = report(&d);
        assert_eq!(v[0].diverged, [1], "{text}");
        assert_eq!(v[0].missing, [2], "{text}");
    }

    #[test]
    fn bad_input_is_an_error_naming_the_line() {
        let e = parse_dump(Path::new("f"), "{\"x\":1}\n").unwrap_err();
        assert!(e.contains("not an sncl flight-recorder dump"), "{e}");
        let e = parse_dump(
            Path::new("f"),
            "{\"sncl_flight_recorder\":1,\"rank\":0,\"nranks\":1,\"comm_id\":\"a\"}\n{oops\n",
        )
        .unwrap_err();
        assert!(e.contains("f:2"), "{e}");
        let e = parse_dump(
            Path::new("f"),
            "{\"sncl_flight_recorder\":1,\"rank\":5,\"nranks\":1,\"comm_id\":\"a\"}\n",
        )
        .unwrap_err();
        assert!(e.contains("not below"), "{e}");
    }
}
