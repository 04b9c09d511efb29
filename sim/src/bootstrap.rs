//! What creating one communicator costs at scale (issue 34, item 4),
//! phase by phase as sncl runs it (`src/setup.rs`; the phases of
//! `Communicator::init_phases`):
//!
//! * **prepare**: local and in parallel on every rank (the standby store
//!   starts, every transport kind probes the rank): a fixed time.
//! * **rendezvous** ([`Rendezvous::Tree`], `src/setup/rendezvous.rs`):
//!   every rank writes its record (`info/<rank>`) to the one store server;
//!   rank 0 reads all N, one request each, and every other rank reads its
//!   parent's record, then the table of records from its parent's standby
//!   store (a TCP connection, its handshake and the read: 3 round trips,
//!   and the table's bytes), down a binary tree. [`Rendezvous::AllReadAll`]
//!   prices what ran before: every rank read all N records from the one
//!   server, N + N² requests and N² records.
//! * **connect**: with connections at creation (`SNCL_RUNTIME_CONNECT=0`)
//!   every rank connects its N − 1 peers; per RDMA pair each side writes
//!   its queue-pair record and a ready mark and reads the peer's (4
//!   requests a side), plus the local work of a pair (queue pairs,
//!   registrations). At first use (the default) nothing is connected at
//!   creation; the peers an operation talks to are connected by it
//!   ([`BootstrapCost::first_use_connect_s`]).
//! * **barrier**: every rank adds to one counter and waits for N: 2N
//!   requests.
//!
//! Each phase takes the longest of the server's request work (requests ÷
//! its rate), its bytes (÷ its bandwidth), one rank's round trips in series
//! and that rank's local work; the largest names the phase's bound, and
//! the longest phase names the job's bottleneck.
//!

/// How the ranks exchange their records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// Before stop 51: every rank read every record from the one store.
    AllReadAll,
    /// Gathered by rank 0, passed down a binary tree of standby stores
    /// (what sncl does).
    Tree,
}

/// The bootstrap's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BootstrapModel {
    /// Ranks.
    pub nranks: usize,
    /// Requests per second the store server answers.
    pub store_requests_per_s: f64,
    /// Bytes per second the store server's host sends.
    pub store_bytes_per_s: f64,
    /// One request's round trip, µs.
    pub round_trip_us: f64,
    /// Bytes of one rank's record.
    pub record_bytes: usize,
    /// A rank's local preparation, µs.
    pub prepare_us: f64,
    /// A pair's local connection work (queue pairs, registrations), µs.
    pub pair_us: f64,
    /// Connections made at creation (`SNCL_RUNTIME_CONNECT=0`).
    pub eager: bool,
    /// Peers the first operation connects per rank (2 for a ring).
    pub first_use_peers: usize,
    /// How the records are exchanged.
    pub rendezvous: Rendezvous,
}

impl BootstrapModel {
    /// Measured on this project's 2-core VM (`bootstrap/tests/store_rate.rs`,
    /// loopback, 16 clients sharing the cores with the server: 50 800 gets/s
    /// and a 107 µs round trip; a rank's record 491 bytes with RDMA; init's
    /// `prepare` phase a few ms), with a 100 Gb/s store host and 2 ms of
    /// local work per RDMA pair (two queue pairs, an 8 MiB registration).
    pub fn measured_here(nranks: usize) -> BootstrapModel {
        BootstrapModel {
            nranks,
            store_requests_per_s: 50_000.0,
            store_bytes_per_s: 12.5e9,
            round_trip_us: 107.0,
            record_bytes: 512,
            prepare_us: 5_000.0,
            pair_us: 2_000.0,
            eager: false,
            first_use_peers: 2,
            rendezvous: Rendezvous::Tree,
        }
    }
}

/// One phase's predicted time and what bounds it.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseCost {
    /// `prepare`, `rendezvous`, `connect`, `barrier`.
    pub phase: &'static str,
    /// Seconds.
    pub seconds: f64,
    /// What bounds it, in words.
    pub bound: String,
}

/// The predicted creation.
#[derive(Clone, Debug, PartialEq)]
pub struct BootstrapCost {
    /// Each phase, in order.
    pub phases: Vec<PhaseCost>,
    /// Requests the one store server answers during creation.
    pub store_requests: f64,
    /// Connecting the first operation's peers (connections at first use).
    pub first_use_connect_s: f64,
}

impl BootstrapCost {
    /// Seconds to a ready communicator.
    pub fn total_s(&self) -> f64 {
        self.phases.iter().map(|p| p.seconds).sum()
    }

    /// The longest phase.
    pub fn bottleneck(&self) -> &PhaseCost {
        self.phases
            .iter()
            .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .expect("four phases")
    }
}

/// The longest of `(seconds, bound)` candidates.
fn longest(candidates: &[(f64, String)]) -> (f64, String) {
    candidates
        .iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .cloned()
        .unwrap_or((0.0, String::new()))
}

fn phase(name: &'static str, candidates: &[(f64, String)]) -> PhaseCost {
    let (seconds, bound) = longest(candidates);
    PhaseCost {
        phase: name,
        seconds,
        bound,
    }
}

/// The predicted creation of a communicator under `m`.
pub fn bootstrap(m: &BootstrapModel) -> BootstrapCost {
    let n = m.nranks as f64;
    let rate = m.store_requests_per_s;
    let rtt = m.round_trip_us * 1e-6;
    let rec = m.record_bytes as f64;
    let server = |requests: f64| {
        (
            requests / rate,
            format!("{requests:.3e} requests at one store server"),
        )
    };
    // Each phase's requests at the one server, counted once.
    let rendezvous_requests = match m.rendezvous {
        Rendezvous::AllReadAll => n + n * n,
        // Everyone's write and read of its parent's record, and rank 0's
        // gathering of every record.
        Rendezvous::Tree => 3.0 * n,
    };
    // Per pair and side: queue-pair record, ready mark, and the reads of
    // the peer's two; plus the first-use request.
    let pair_requests = |peers: f64| 5.0 * n * peers;
    let barrier_requests = 2.0 * n;
    let rendezvous = match m.rendezvous {
        Rendezvous::AllReadAll => {
            let bytes = n * n * rec;
            [
                server(rendezvous_requests),
                (
                    bytes / m.store_bytes_per_s,
                    format!("{:.3e} bytes of records from one store server", bytes),
                ),
                (
                    (n + 1.0) * rtt,
                    format!("{n} round trips in series on every rank"),
                ),
            ]
            .to_vec()
        }
        Rendezvous::Tree => {
            let depth = n.log2().ceil().max(1.0);
            let table = n * rec;
            let hop = 3.0 * rtt + table / m.store_bytes_per_s;
            [
                server(rendezvous_requests),
                (
                    n * rtt + depth * hop,
                    format!(
                        "rank 0's {n} reads, then {depth} tree levels of a {table:.3e}-byte table"
                    ),
                ),
            ]
            .to_vec()
        }
    };
    let pair_work = |peers: f64| {
        [
            server(pair_requests(peers)),
            (
                peers * (4.0 * rtt + m.pair_us * 1e-6),
                format!(
                    "{peers} pairs in series on every rank (4 round trips and local work each)"
                ),
            ),
        ]
    };
    let connect = if m.eager {
        pair_work(n - 1.0).to_vec()
    } else {
        vec![(
            0.0,
            "connections at first use: none at creation".to_string(),
        )]
    };
    let first_use_connect_s = longest(&pair_work(m.first_use_peers as f64)).0;
    let phases = vec![
        phase(
            "prepare",
            &[(m.prepare_us * 1e-6, "local work on every rank".to_string())],
        ),
        phase("rendezvous", &rendezvous),
        phase("connect", &connect),
        phase(
            "barrier",
            &[
                server(barrier_requests),
                (2.0 * rtt, "2 round trips".to_string()),
            ],
        ),
    ];
    let connect_requests = if m.eager { pair_requests(n - 1.0) } else { 0.0 };
    BootstrapCost {
        phases,
        store_requests: rendezvous_requests + connect_requests + barrier_requests,
        first_use_connect_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_65664_ranks_the_all_read_all_rendezvous_is_the_bottleneck() {
        let m = BootstrapModel {
            rendezvous: Rendezvous::AllReadAll,
            ..BootstrapModel::measured_here(65_664)
        };
        let c = bootstrap(&m);
        let b = c.bottleneck();
        assert_eq!(b.phase, "rendezvous");
        assert!(
            b.bound.contains("requests at one store server"),
            "{}",
            b.bound
        );
        // (N + N²) / 50 000 per s: about a day.
        assert!((b.seconds - (65_664.0 + 65_664f64.powi(2)) / 50_000.0).abs() < 1.0);
        assert!(c.total_s() > 80_000.0);
        // The tree: rank 0's gathering bounds it, about 7 s at this rate.
        let t = bootstrap(&BootstrapModel {
            rendezvous: Rendezvous::Tree,
            ..m
        });
        assert!(t.total_s() < 10.0, "{t:?}");
        assert!(t.store_requests <= 5.0 * 65_664.0);
    }

    #[test]
    fn at_64_ranks_the_server_still_bounds_and_eager_connections_add_pairs() {
        let m = BootstrapModel {
            rendezvous: Rendezvous::AllReadAll,
            ..BootstrapModel::measured_here(64)
        };
        let c = bootstrap(&m);
        let r = &c.phases[1];
        assert_eq!(r.phase, "rendezvous");
        // 64 + 64² requests at 50 000 a second: 83 ms, against 65 round
        // trips (7 ms) on each rank.
        assert!(
            r.bound.contains("requests at one store server"),
            "{}",
            r.bound
        );
        assert!((r.seconds - 4160.0 / 50_000.0).abs() < 1e-9);
        assert_eq!(c.phases[2].seconds, 0.0, "connections at first use");
        // A ring's 2 peers: 8 round trips and 2 pairs' work on a rank
        // (4.9 ms), or all ranks' 640 requests at the server (12.8 ms).
        let serial: f64 = 8.0 * 107e-6 + 2.0 * 2e-3;
        let at_server: f64 = 5.0 * 64.0 * 2.0 / 50_000.0;
        assert!((c.first_use_connect_s - at_server.max(serial)).abs() < 1e-9);
        let eager = bootstrap(&BootstrapModel { eager: true, ..m });
        assert!(eager.phases[2].seconds > 63.0 * 2e-3);
        assert!(eager.store_requests > c.store_requests);
    }
}
