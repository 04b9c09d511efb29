//! `commbench trace --chrome OUT`: the flight-recorder dumps of every rank
//! as a Chrome trace (the JSON object format of the Trace Event Format,
//! which ui.perfetto.dev and chrome://tracing open).
//!
//! One process per communicator, one thread track per rank; each recorded
//! operation is a complete slice (`"ph": "X"`) from its start to its end —
//! to the dump's time while it was still running — named by the collective,
//! with its sequence number, type, count, bytes, root, algorithm, state and
//! error as arguments. A failed operation adds an instant event at its end;
//! the ranks `commbench trace` names (behind the stuck operation, or
//! running another one under its number) get an instant event saying so at
//! their dump's time. The phases of each rank's creation of the
//! communicator (`prepare`, `rendezvous`, `connect`, `barrier`) come first
//! on its track, as slices named `init: <phase>` (category `init`). Times
//! are microseconds from the earliest start in the dumps (the absolute
//! origin is in `otherData.t0_us`).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::trace::{Dump, TraceEntry, Verdict};

/// The Chrome trace of `dumps`, with the instant events of `verdicts`
/// (from [`crate::trace::report`] over the same dumps).
pub fn chrome_trace(dumps: &[Dump], verdicts: &[Verdict]) -> Value {
    let t0 = dumps
        .iter()
        .flat_map(|d| {
            let ops = d.entries.iter().filter_map(|e| e.start_us);
            ops.chain(d.init.iter().map(|p| p.1))
        })
        .min()
        .unwrap_or(0);
    let rel = |us: u64| us.saturating_sub(t0);
    let mut pids: BTreeMap<&str, usize> = BTreeMap::new();
    for d in dumps {
        let next = pids.len() + 1;
        pids.entry(d.comm_id.as_str()).or_insert(next);
    }
    let mut events = Vec::new();
    let mut untimed = 0usize;
    for (id, &pid) in &pids {
        let nranks = dumps
            .iter()
            .filter(|d| d.comm_id == *id)
            .map(|d| d.nranks)
            .max()
            .unwrap_or(0);
        events.push(json!({
            "ph": "M", "name": "process_name", "pid": pid,
            "args": {"name": format!("communicator {id} ({nranks} ranks)")}
        }));
    }
    for d in dumps {
        let pid = pids[d.comm_id.as_str()];
        events.extend(named_track(pid, d.rank, &format!("rank {}", d.rank)));
        for (phase, start, end) in &d.init {
            events.push(json!({
                "ph": "X",
                "name": format!("init: {phase}"),
                "cat": "init",
                "pid": pid,
                "tid": d.rank,
                "ts": rel(*start),
                "dur": end.saturating_sub(*start),
            }));
        }
        for e in &d.entries {
            let Some(start) = e.start_us else {
                untimed += 1;
                continue;
            };
            let end = e.end_us.or(d.dumped_at_us).unwrap_or(start).max(start);
            events.push(json!({
                "ph": "X",
                "name": e.op,
                "cat": if e.seq == 0 { "p2p" } else { "collective" },
                "pid": pid,
                "tid": d.rank,
                "ts": rel(start),
                "dur": end - start,
                "args": slice_args(e),
            }));
            if e.state == "failed" {
                events.push(json!({
                    "ph": "i", "s": "t", "name": format!("{} failed", e.op),
                    "cat": "error", "pid": pid, "tid": d.rank, "ts": rel(end),
                    "args": {"seq": e.seq, "error": e.error},
                }));
            }
        }
    }
    for v in verdicts {
        let Some(stuck) = &v.stuck else { continue };
        let Some(&pid) = pids.get(v.comm_id.as_str()) else {
            continue;
        };
        let named = v
            .behind
            .iter()
            .map(|&r| (r, format!("did not reach {} seq {}", stuck.op, stuck.seq)))
            .chain(v.diverged.iter().map(|&r| {
                (
                    r,
                    format!("runs another operation as seq {} ({})", stuck.seq, stuck.op),
                )
            }));
        for (rank, what) in named {
            let at = dumps
                .iter()
                .find(|d| d.comm_id == v.comm_id && d.rank == rank)
                .and_then(|d| d.dumped_at_us.or(last_time(&d.entries)))
                .unwrap_or(t0);
            events.push(json!({
                "ph": "i", "s": "t", "name": what, "cat": "verdict",
                "pid": pid, "tid": rank, "ts": rel(at),
            }));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "sncl flight recorder (commbench trace --chrome)",
            "t0_us": t0,
            "entries_without_times": untimed,
        },
    })
}

/// One simulated operation for [`simulated_trace`].
pub struct SimulatedSlice {
    /// The collective's name (the slice's name).
    pub op: String,
    /// Predicted time, µs.
    pub dur_us: f64,
    /// Shown with the slice (algorithm, bytes, cross-tier share, ...).
    pub args: Value,
    /// The critical path's stretches in time order (per-rank frame; empty
    /// otherwise): name, duration (µs) and arguments. Drawn on a second
    /// track under the operation, ending where it ends.
    pub path: Vec<(String, f64, Value)>,
    /// Who waited for their peers (see [`WaitBars`]).
    pub waits: WaitBars,
}

/// The per-rank waits under a simulated operation, drawn as bars that
/// start with it and last as long as the wait: one track per place in the
/// ranking (the longest wait on the first), so a 65,664-rank trace holds
/// only the few drawn.
#[derive(Default)]
pub struct WaitBars {
    /// The ranks that waited longest, longest first: name, wait (µs),
    /// arguments.
    pub ranks: Vec<(String, f64, Value)>,
    /// The nodes by their ranks' mean wait, longest first: name, mean wait
    /// (µs), arguments.
    pub nodes: Vec<(String, f64, Value)>,
}

/// Tracks of [`WaitBars::ranks`] at most (and as many of its nodes).
pub const WAIT_TRACKS: usize = 16;

/// Track (`tid`) of the `i`-th rank's wait bar and of the `i`-th node's.
fn wait_tids(i: usize) -> (usize, usize) {
    (2 + i, 2 + WAIT_TRACKS + i)
}

/// The metadata of track `tid` of process `pid`: its name, and its place
/// (sorted by `tid`).
fn named_track(pid: usize, tid: usize, name: &str) -> [Value; 2] {
    [
        json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}),
        json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
               "args": {"sort_index": tid}}),
    ]
}

/// A Chrome trace of simulated operations, one after another on one track
/// ("simulated", process `label`), in the same format as
/// [`chrome_trace`]: opened beside a measured run's trace, the two show
/// prediction and measurement side by side. Under it: the critical path
/// (track "critical path") and the waits (tracks "wait, rank #i" and
/// "mean wait, node #i", category `wait`: bars from the operation's start
/// as long as the wait).
pub fn simulated_trace(label: &str, slices: &[SimulatedSlice]) -> Value {
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": label}}),
        json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "simulated"}}),
    ];
    if slices.iter().any(|s| !s.path.is_empty()) {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                           "args": {"name": "critical path"}}));
    }
    let ranked = |f: fn(&WaitBars) -> usize| {
        slices
            .iter()
            .map(|s| f(&s.waits))
            .max()
            .unwrap_or(0)
            .min(WAIT_TRACKS)
    };
    for i in 0..ranked(|w| w.ranks.len()) {
        events.extend(named_track(
            1,
            wait_tids(i).0,
            &format!("wait, rank #{}", i + 1),
        ));
    }
    for i in 0..ranked(|w| w.nodes.len()) {
        events.extend(named_track(
            1,
            wait_tids(i).1,
            &format!("mean wait, node #{}", i + 1),
        ));
    }
    let mut t = 0.0f64;
    for s in slices {
        events.push(json!({
            "ph": "X", "name": s.op, "cat": "simulated", "pid": 1, "tid": 0,
            "ts": t, "dur": s.dur_us, "args": s.args,
        }));
        for (bars, rank) in [(&s.waits.ranks, true), (&s.waits.nodes, false)] {
            for (i, (name, us, args)) in bars.iter().take(WAIT_TRACKS).enumerate() {
                let (r, n) = wait_tids(i);
                events.push(json!({
                    "ph": "X", "name": name, "cat": "wait", "pid": 1,
                    "tid": if rank { r } else { n }, "ts": t, "dur": us, "args": args,
                }));
            }
        }
        // The path adds up to the operation's time; it ends where it ends.
        let mut at = t + s.dur_us - s.path.iter().map(|p| p.1).sum::<f64>();
        for (name, dur, args) in &s.path {
            events.push(json!({
                "ph": "X", "name": name, "cat": "critical path", "pid": 1, "tid": 1,
                "ts": at, "dur": dur, "args": args,
            }));
            at += dur;
        }
        t += s.dur_us;
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "sncl simulator (commbench sim --chrome)"},
    })
}

/// The arguments shown with an operation's slice.
fn slice_args(e: &TraceEntry) -> Value {
    let mut args = json!({
        "seq": e.seq,
        "dtype": e.dtype,
        "count": e.count,
        "bytes": e.bytes,
        "algo": e.algo,
        "state": e.state,
    });
    if e.root >= 0 {
        args["root"] = json!(e.root);
    }
    if e.tag != 0 {
        args["tag"] = json!(e.tag);
    }
    if let Some(name) = &e.tag_name {
        args["tag_name"] = json!(name);
    }
    if let Some(err) = &e.error {
        args["error"] = json!(err);
    }
    args
}

/// The latest start or end among `entries`.
fn last_time(entries: &[TraceEntry]) -> Option<u64> {
    entries.iter().filter_map(|e| e.end_us.or(e.start_us)).max()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::trace::{parse_dump, report};

    fn dump(rank: usize, lines: &[&str]) -> Dump {
        let mut text = format!(
            "{{\"sncl_flight_recorder\":1,\"rank\":{rank},\"nranks\":2,\"comm_id\":\"00000000000000aa\",\"reason\":\"t\",\"dumped_at_us\":1000900}}\n"
        );
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        parse_dump(Path::new("x"), &text).unwrap()
    }

    fn op(seq: u64, start: u64, end: Option<u64>, state: &str) -> String {
        format!(
            "{{\"id\":{seq},\"seq\":{seq},\"op\":\"all_reduce\",\"dtype\":\"f32\",\"reduce\":\"sum\",\"count\":4,\"bytes\":16,\"root\":-1,\"algo\":\"ring\",\"start_us\":{start},\"end_us\":{},\"state\":\"{state}\",\"error\":null}}",
            end.map_or("null".to_string(), |e| e.to_string())
        )
    }

    #[test]
    fn simulated_slices_follow_each_other_on_one_track() {
        let s = |dur| SimulatedSlice {
            op: "all_reduce".into(),
            dur_us: dur,
            args: json!({"algo": "ring"}),
            path: Vec::new(),
            waits: WaitBars::default(),
        };
        let t = simulated_trace("sim", &[s(10.0), s(2.5)]);
        let ev = t["traceEvents"].as_array().unwrap();
        let slices: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 2);
        assert_eq!(
            (slices[0]["ts"].as_f64(), slices[1]["ts"].as_f64()),
            (Some(0.0), Some(10.0))
        );
        assert_eq!(slices[1]["dur"].as_f64(), Some(2.5));
        assert_eq!(slices[1]["args"]["algo"], "ring");
    }

    #[test]
    fn wait_bars_start_with_their_operation_one_track_per_place() {
        let bar = |name: &str, us: f64| (name.to_string(), us, json!({"us": us}));
        let s = |dur, ranks: usize| SimulatedSlice {
            op: "all_reduce".into(),
            dur_us: dur,
            args: json!({}),
            path: Vec::new(),
            waits: WaitBars {
                ranks: (0..ranks)
                    .map(|i| bar(&format!("rank {i}"), 5.0 - i as f64 * 0.1))
                    .collect(),
                nodes: vec![bar("node 3", 2.0)],
            },
        };
        let t = simulated_trace("sim", &[s(10.0, 3), s(20.0, WAIT_TRACKS + 4)]);
        let ev = t["traceEvents"].as_array().unwrap();
        let waits: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "wait").collect();
        assert_eq!(
            waits.len(),
            3 + 1 + WAIT_TRACKS + 1,
            "capped at WAIT_TRACKS"
        );
        assert_eq!(
            (waits[0]["ts"].as_f64(), waits[0]["dur"].as_f64()),
            (Some(0.0), Some(5.0))
        );
        assert_eq!(waits[0]["tid"], 2);
        assert_eq!(waits[3]["name"], "node 3");
        assert_eq!(waits[3]["tid"], 2 + WAIT_TRACKS);
        let second: Vec<&&Value> = waits.iter().filter(|e| e["ts"] == 10.0).collect();
        assert_eq!(second.len(), WAIT_TRACKS + 1);
        let tracks: Vec<&Value> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| &e["args"]["name"])
            .collect();
        assert!(tracks.contains(&&json!("wait, rank #16")));
        assert!(!tracks.contains(&&json!("wait, rank #17")));
        assert!(tracks.contains(&&json!("mean wait, node #1")));
    }

    #[test]
    fn the_phases_of_creation_are_slices_before_the_operations() {
        let header = "{\"sncl_flight_recorder\":1,\"rank\":0,\"nranks\":1,\"comm_id\":\"00000000000000aa\",\"reason\":\"t\",\"init\":[{\"phase\":\"prepare\",\"start_us\":999000,\"end_us\":999400},{\"phase\":\"rendezvous\",\"start_us\":999400,\"end_us\":999900}]}";
        let text = format!(
            "{header}\n{}\n",
            op(1, 1_000_000, Some(1_000_100), "completed")
        );
        let d = [parse_dump(Path::new("x"), &text).unwrap()];
        let t = chrome_trace(&d, &[]);
        let ev = t["traceEvents"].as_array().unwrap();
        let init: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "init").collect();
        assert_eq!(init.len(), 2);
        assert_eq!(init[0]["name"], "init: prepare");
        assert_eq!(
            (init[0]["ts"].as_u64(), init[0]["dur"].as_u64()),
            (Some(0), Some(400))
        );
        assert_eq!(
            (init[1]["ts"].as_u64(), init[1]["dur"].as_u64()),
            (Some(400), Some(500))
        );
        let op = ev.iter().find(|e| e["cat"] == "collective").unwrap();
        assert_eq!(op["ts"], 1000, "times count from the first phase");
        let bad = header
            .replace("\"init\":[", "\"init\":{\"x\":[")
            .replace("]}", "]}}");
        assert!(parse_dump(Path::new("x"), &bad).is_err());
    }

    #[test]
    fn one_track_per_rank_with_a_slice_per_entry_and_the_verdict() {
        let d = [
            dump(
                0,
                &[
                    &op(1, 1_000_000, Some(1_000_100), "completed"),
                    &op(2, 1_000_200, None, "running"),
                ],
            ),
            dump(1, &[&op(1, 1_000_050, Some(1_000_120), "completed")]),
        ];
        let (_, verdicts) = report(&d);
        let t = chrome_trace(&d, &verdicts);
        let ev = t["traceEvents"].as_array().unwrap();
        let slices: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[0]["tid"], 0);
        assert_eq!(slices[0]["ts"], 0);
        assert_eq!(slices[0]["dur"], 100);
        assert_eq!(slices[0]["args"]["algo"], "ring");
        // Still running at the dump: the slice ends at the dump's time.
        assert_eq!(slices[1]["ts"], 200);
        assert_eq!(slices[1]["dur"], 700);
        assert_eq!(slices[2]["tid"], 1);
        assert_eq!(slices[2]["ts"], 50);
        let names: Vec<&Value> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| &e["args"]["name"])
            .collect();
        assert_eq!(names, ["rank 0", "rank 1"]);
        // Rank 1 never started seq 2: the verdict is on its track.
        let verdict: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "verdict").collect();
        assert_eq!(verdict.len(), 1);
        assert_eq!(verdict[0]["tid"], 1);
        assert_eq!(verdict[0]["name"], "did not reach all_reduce seq 2");
        assert_eq!(verdict[0]["ts"], 900);
    }
}
