//! The node links' TCP goodput, measured once by the compressed all-reduce
//! when no topology says it (`SNCL_COMPRESS_PACING=auto` without
//! `inter.bandwidth`), so that its exchange is paced by default
//! (docs/perf-notes/NOTEBOOK.md §28).
//!
//! The exchange sends to every other node at once; unpaced, the dense
//! codecs' bursts overflow a slow link's queue and TCP spends the gain on
//! retransmits. Pacing each socket at its share of the link needs the
//! link's rate. The probe: the first rank of every node sends to the first
//! rank of the next node and receives from the previous one (a ring: each
//! link's upload and download carry one flow), every rank agreeing on the
//! slowest leader's time by an all-reduce; sizes grow until a transfer
//! takes [`PROBE_MIN_SECONDS`], and the rate is the slope between the last
//! two sizes (the per-transfer latency and the flow's start cancel). Links
//! that move [`PROBE_MAX_BYTES`] faster than that are left unpaced: they
//! are not where compression's bandwidth is scarce, and an estimate from
//! so short a transfer could pace a fast link below its rate.

use std::time::Instant;

use comm_core::{ReduceOp, Result};

use crate::Communicator;

/// A transfer at least this long ends the probe (a time worth a slope).
pub(crate) const PROBE_MIN_SECONDS: f64 = 0.05;
/// The probe's first size.
pub(crate) const PROBE_FIRST_BYTES: usize = 256 << 10;
/// The probe's largest size; links faster than this much per
/// [`PROBE_MIN_SECONDS`] (about 5 Gbit/s) are not paced.
pub(crate) const PROBE_MAX_BYTES: usize = 32 << 20;

/// What the probe found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LinkProbe {
    /// Goodput of the slowest node link, payload bytes per µs.
    Measured {
        /// Payload bytes per µs.
        bytes_per_us: f64,
        /// The last transfer's size and time (what the log reports).
        bytes: usize,
        /// Its time, seconds.
        seconds: f64,
    },
    /// The largest transfer took less than [`PROBE_MIN_SECONDS`].
    TooFast {
        /// Its time, seconds.
        seconds: f64,
    },
    /// A cross-node peer of some rank is reached by another transport than
    /// TCP (pacing applies to TCP sockets only): nothing was sent.
    NotTcp,
}

/// The next size after a transfer of `bytes` took `seconds`: aimed at
/// [`PROBE_MIN_SECONDS`], at least twice and at most 16 times larger, a
/// power of two, at most [`PROBE_MAX_BYTES`]. Every rank computes it from
/// the same agreed time, so all agree on it.
pub(crate) fn next_probe_size(bytes: usize, seconds: f64) -> usize {
    let factor = (PROBE_MIN_SECONDS / seconds.max(1e-9)).clamp(2.0, 16.0);
    ((bytes as f64 * factor) as usize)
        .next_power_of_two()
        .min(PROBE_MAX_BYTES)
}

/// Goodput from the last two transfers `(bytes, seconds)`: the slope, kept
/// between the last transfer's average rate (which still pays the fixed
/// costs the slope removes) and twice that (noise in the smaller one).
pub(crate) fn goodput_from(prev: Option<(usize, f64)>, last: (usize, f64)) -> f64 {
    let average = last.0 as f64 / last.1 / 1e6;
    match prev {
        Some((b, t)) if last.1 > t && last.0 > b => {
            let slope = (last.0 - b) as f64 / (last.1 - t) / 1e6;
            slope.clamp(average, 2.0 * average)
        }
        _ => average,
    }
}

/// Measures the node links (collective: every rank of `comm` calls it).
pub(crate) fn probe_node_links(comm: &Communicator) -> Result<LinkProbe> {
    let topo = comm.topology();
    let me = comm.rank();
    let leaders: Vec<usize> = topo.nodes.iter().map(|n| n[0]).collect();
    // Every rank must agree to probe: pacing is for TCP sockets.
    let transports = comm.transports();
    let tcp_only = (0..comm.size())
        .filter(|&p| !topo.same_node(me, p))
        .all(|p| transports[p] == "tcp");
    let mut agreed = [if tcp_only { 1.0f64 } else { 0.0 }];
    comm.all_reduce_in_place(&mut agreed[..], ReduceOp::Min)?;
    if agreed[0] == 0.0 {
        return Ok(LinkProbe::NotTcp);
    }
    let ring = leaders.iter().position(|&l| l == me).map(|k| {
        let n = leaders.len();
        (leaders[(k + 1) % n], leaders[(k + n - 1) % n])
    });
    let (mut out, mut back) = (Vec::new(), Vec::new());
    let mut size = PROBE_FIRST_BYTES;
    let mut prev = None;
    loop {
        let mut slowest = [0.0f64];
        if let Some((next, from)) = ring {
            out.resize(size, 0x5au8);
            back.resize(size, 0u8);
            let start = Instant::now();
            comm.group(|g| {
                g.send(&out[..size], next);
                g.recv(&mut back[..size], from);
            })?;
            slowest[0] = start.elapsed().as_secs_f64();
        }
        comm.all_reduce_in_place(&mut slowest[..], ReduceOp::Max)?;
        let seconds = slowest[0];
        if seconds >= PROBE_MIN_SECONDS {
            return Ok(LinkProbe::Measured {
                bytes_per_us: goodput_from(prev, (size, seconds)),
                bytes: size,
                seconds,
            });
        }
        if size >= PROBE_MAX_BYTES {
            return Ok(LinkProbe::TooFast { seconds });
        }
        prev = Some((size, seconds));
        size = next_probe_size(size, seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_aim_at_the_minimum_time_within_their_bounds() {
        // 100 Mbit/s: 256 KiB in 21 ms -> 2.38 times larger, rounded up to
        // a power of two: 1 MiB.
        assert_eq!(next_probe_size(256 << 10, 0.021), 1 << 20);
        // Loopback: 0.1 ms -> at most 16 times larger.
        assert_eq!(next_probe_size(256 << 10, 0.0001), 4 << 20);
        // Never past the cap, never smaller than twice.
        assert_eq!(next_probe_size(16 << 20, 0.001), PROBE_MAX_BYTES);
        assert_eq!(next_probe_size(1 << 20, 0.049), 2 << 20);
        assert_eq!(next_probe_size(1 << 20, 0.0), 16 << 20);
    }

    #[test]
    fn goodput_is_the_slope_kept_near_the_average() {
        // 1 MB more in 80 ms more: 12.5 MB/s; the last transfer averaged
        // 2 MB / 170 ms = 11.8 MB/s (it also paid a 10 ms start).
        let g = goodput_from(Some((1_000_000, 0.09)), (2_000_000, 0.17));
        assert!((g - 12.5).abs() < 1e-9, "{g}");
        // A slope below the average (noise) is the average.
        let g = goodput_from(Some((1_000_000, 0.01)), (2_000_000, 0.2));
        assert!((g - 10.0).abs() < 1e-9, "{g}");
        // A slope far above it is capped at twice the average.
        let g = goodput_from(Some((1_000_000, 0.099)), (2_000_000, 0.1));
        assert!((g - 40.0).abs() < 1e-9, "{g}");
        // No earlier transfer, or one that was not faster: the average.
        assert!((goodput_from(None, (1_000_000, 0.1)) - 10.0).abs() < 1e-9);
        let g = goodput_from(Some((500_000, 0.2)), (1_000_000, 0.1));
        assert!((g - 10.0).abs() < 1e-9, "{g}");
    }
}
