//! Per-call settings of one collective ([`CollConfig`]): the algorithm,
//! the pipeline chunk and the protocol for this call instead of the
//! planner's (or the communicator's forced) choice, and a user tag that
//! follows the call into the flight recorder, `commbench trace` and the
//! statistics. NCCL 2.31's `ncclCollConfig_t` where its fields mean
//! something on sncl; the C ABI's `snclCollConfig_t`.
//!
//! ```no_run
//! # let comm = sncl::Communicator::from_env()?;
//! # let mut grads = vec![0.0f32; 1 << 20];
//! use sncl::{Algorithm, CollConfig};
//! let backward = CollConfig {
//!     algorithm: Some(Algorithm::Ring),
//!     chunk_bytes: 1 << 20,
//!     ..CollConfig::tagged(2)
//! };
//! comm.configured(&backward).all_reduce_in_place(&mut grads, sncl::ReduceOp::Sum)?;
//! # Ok::<(), sncl::Error>(())
//! ```
//!
//! Every rank passes the same settings for the same call, as it passes
//! the same count and type: the schedule follows them.

use std::hash::{Hash, Hasher};

use comm_core::algo::{self, Algorithm};
use comm_core::wire::Collective;
use comm_core::{Error, Result};

/// How a device collective moves its data (NCCL's protocols). sncl's
/// device path moves whole pieces with a flag per piece, NCCL's `Simple`;
/// the low-latency protocols are not implemented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Pieces with a flag each (what sncl's device path does).
    Simple,
    /// NCCL's LL: 8-byte lines with an inline flag (not implemented).
    Ll,
    /// NCCL's LL128: 128-byte lines with an inline flag (not implemented).
    Ll128,
}

impl Protocol {
    /// The name NCCL_PROTO uses.
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Simple => "Simple",
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
        }
    }

    /// Parses NCCL_PROTO's names (any case).
    pub fn from_name(name: &str) -> Option<Protocol> {
        match name.to_ascii_lowercase().as_str() {
            "simple" => Some(Protocol::Simple),
            "ll" => Some(Protocol::Ll),
            "ll128" => Some(Protocol::Ll128),
            _ => None,
        }
    }
}

/// Largest per-call chunk, bytes (the planner's chunks are counted in
/// `u32` elements of at least one byte).
pub const MAX_CALL_CHUNK_BYTES: usize = u32::MAX as usize;

/// Per-call settings of one collective; `CollConfig::default()` changes
/// nothing (the planner decides, no tag).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CollConfig {
    /// The algorithm of this call: one of the collective's rows in
    /// [`comm_core::algo::ALGORITHMS`]; `None`: the planner's choice (or
    /// the one forced with [`crate::Communicator::force_algorithm`]).
    pub algorithm: Option<Algorithm>,
    /// The pipeline chunk of this call in bytes; 0: the communicator's
    /// (`SNCL_CHUNK_BYTES`).
    pub chunk_bytes: usize,
    /// The protocol of a device collective; `None`: sncl's own. Host
    /// memory has none: setting one there is an error.
    pub protocol: Option<Protocol>,
    /// A tag of the caller's (0: none), shown with the operation in the
    /// flight recorder, `commbench trace` and [`crate::Stats::ops_by_tag`].
    pub tag: u64,
    /// The most thread blocks (CTAs) the call's device kernel runs with
    /// (NCCL's `maxCTAs`), to leave a GPU's SMs to the compute beside it;
    /// 0: sncl's own grid. Device memory only; every rank passes the same.
    pub max_ctas: u32,
}

impl CollConfig {
    /// Settings that only tag the call.
    pub const fn tagged(tag: u64) -> CollConfig {
        CollConfig {
            algorithm: None,
            chunk_bytes: 0,
            protocol: None,
            tag,
            max_ctas: 0,
        }
    }

    /// Settings that only carry the calling thread's tag
    /// ([`crate::tags::set_thread_tag`]; none: the default): what a call
    /// without settings of its own gets.
    pub fn of_this_thread() -> CollConfig {
        CollConfig::tagged(crate::tags::thread_tag())
    }

    /// These settings, with `tag` where they have none of their own (a
    /// call's settings over the calling thread's tag).
    pub fn or_tag(self, tag: u64) -> CollConfig {
        CollConfig {
            tag: if self.tag != 0 { self.tag } else { tag },
            ..self
        }
    }

    /// Whether the schedule follows the planner (no algorithm or chunk of
    /// the call's own).
    pub(crate) fn planned(&self) -> bool {
        self.algorithm.is_none() && self.chunk_bytes == 0
    }

    /// A digest of the settings that shape the call's schedule (its
    /// algorithm and chunk) and its kernels' grid (`max_ctas`: every
    /// rank's blocks wait on their peers'), carried in the call's
    /// fingerprint ([`comm_core::wire::Fingerprint::settings`]): 0 for a
    /// planned call on sncl's own grid, 1..=255 otherwise, the same on
    /// every rank for the same settings. Ranks whose settings differ fail
    /// the call as mismatched (but for the 1 in 255 pairs of settings
    /// whose digests collide).
    pub(crate) fn schedule_digest(&self) -> u8 {
        if self.planned() && self.max_ctas == 0 {
            return 0;
        }
        // FxHasher: no per-process seed, so every rank computes the same.
        let mut h = rustc_hash::FxHasher::default();
        (self.algorithm.map(Algorithm::name), self.chunk_bytes as u64).hash(&mut h);
        if self.max_ctas != 0 {
            self.max_ctas.hash(&mut h);
        }
        (h.finish() % 255) as u8 + 1
    }

    /// Checks the settings against the call, before anything is sent:
    /// an algorithm the collective lacks, a chunk beyond
    /// [`MAX_CALL_CHUNK_BYTES`], a protocol on host memory or one sncl
    /// does not implement are errors naming the rank and the operation.
    pub(crate) fn check(&self, rank: usize, coll: Collective, device: bool) -> Result<()> {
        let bad = |detail: String| Error::InvalidArgument {
            rank,
            op: coll.name(),
            detail,
        };
        if let Some(a) = self.algorithm {
            if algo::row(coll, a).is_none() {
                return Err(bad(format!(
                    "the call's settings ask for {}: {}",
                    a.name(),
                    algo::unavailable(coll, a)
                )));
            }
        }
        if self.chunk_bytes > MAX_CALL_CHUNK_BYTES {
            return Err(bad(format!(
                "the call's chunk of {} bytes exceeds {MAX_CALL_CHUNK_BYTES}",
                self.chunk_bytes
            )));
        }
        if self.max_ctas != 0 && !device {
            return Err(bad(format!(
                "the call's settings cap its device kernel at {} CTAs, but CTAs apply to device \
                 memory and these buffers are host memory",
                self.max_ctas
            )));
        }
        match self.protocol {
            None => {}
            Some(p) if !device => {
                return Err(bad(format!(
                    "the call's settings ask for protocol {}, but protocols apply to device \
                     memory and these buffers are host memory",
                    p.name()
                )))
            }
            Some(Protocol::Simple) => {}
            Some(p) => {
                return Err(bad(format!(
                    "protocol {} is not implemented by sncl's device path (it has Simple)",
                    p.name()
                )))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_do_not_apply_are_errors_naming_the_call() {
        let ok = CollConfig::tagged(7);
        assert!(ok.check(0, Collective::AllReduce, false).is_ok());
        let tree_gather = CollConfig {
            algorithm: Some(Algorithm::Tree),
            ..ok
        };
        let e = tree_gather.check(3, Collective::Gather, false).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("rank 3") && text.contains("gather"), "{text}");
        assert!(text.contains("no tree algorithm"), "{text}");
        let host_ctas = CollConfig { max_ctas: 4, ..ok };
        assert!(host_ctas.check(0, Collective::AllReduce, true).is_ok());
        let text = host_ctas
            .check(1, Collective::AllReduce, false)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("4 CTAs") && text.contains("host memory"),
            "{text}"
        );
        assert_ne!(host_ctas.schedule_digest(), 0);
        assert_ne!(
            host_ctas.schedule_digest(),
            CollConfig { max_ctas: 8, ..ok }.schedule_digest()
        );
        let host_protocol = CollConfig {
            protocol: Some(Protocol::Simple),
            ..ok
        };
        let e = host_protocol
            .check(0, Collective::AllReduce, false)
            .unwrap_err();
        assert!(e.to_string().contains("host memory"), "{e}");
        assert!(host_protocol.check(0, Collective::AllReduce, true).is_ok());
        let ll = CollConfig {
            protocol: Some(Protocol::Ll128),
            ..ok
        };
        let e = ll.check(0, Collective::AllReduce, true).unwrap_err();
        assert!(e.to_string().contains("LL128 is not implemented"), "{e}");
        let huge = CollConfig {
            chunk_bytes: MAX_CALL_CHUNK_BYTES + 1,
            ..ok
        };
        assert!(huge.check(0, Collective::AllReduce, false).is_err());
        assert_eq!(Protocol::from_name("ll128"), Some(Protocol::Ll128));
        assert!(CollConfig::default().planned() && !tree_gather.planned());
    }

    #[test]
    fn the_schedule_digest_tells_settings_apart_and_ignores_the_tag() {
        let planned = CollConfig::tagged(3);
        assert_eq!(planned.schedule_digest(), 0);
        let ring = CollConfig {
            algorithm: Some(Algorithm::Ring),
            ..CollConfig::default()
        };
        let tree = CollConfig {
            algorithm: Some(Algorithm::Tree),
            ..ring
        };
        let ring_chunk = CollConfig {
            chunk_bytes: 1 << 20,
            ..ring
        };
        let digests = [ring, tree, ring_chunk].map(|c| c.schedule_digest());
        assert!(digests.iter().all(|&d| d != 0), "{digests:?}");
        assert!(
            digests[0] != digests[1] && digests[0] != digests[2] && digests[1] != digests[2],
            "{digests:?}"
        );
        assert_eq!(
            CollConfig { tag: 9, ..ring }.schedule_digest(),
            ring.schedule_digest()
        );
    }
}
