//! The `shm` transport kind: a FIFO of slots per direction in shared
//! memory (transport-shm), between ranks of one node, and single copy for
//! large pieces by cross-memory attach where the kernel permits it. A
//! rank's card is its pid namespace when its peers can open its
//! descriptors; between two ranks with the same card the segments are
//! anonymous (never named in `/dev/shm`), else private files there.
//!
//! Single copy is agreed per direction at setup: every rank publishes the
//! address of a probe word (`cma/<rank>`, empty when it cannot or may not
//! lend), each rank reads every peer's word with `process_vm_readv` and
//! publishes whether it can (`cma-ok/<peer>/<rank>`); a sender lends only to
//! receivers that proved it. Settings (read by each rank from its own
//! environment): `SNCL_SHM_CMA=auto` (default) lets it on where it works
//! and this host's cross-memory reads are about as fast as a copy
//! ([`cma::read_speed`], measured once per process by each reader), `1`
//! wherever it works, `0` never; `SNCL_SHM_CMA_MIN_BYTES` is the smallest
//! piece lent (smaller ones go through the slots).

use std::sync::Arc;

use crate::{cma, create_inbound, Published, Segment, ShmConnection};
use comm_core::config::{ShmSettings, SingleCopy};
use comm_core::store::Store;
use comm_core::transport::registry::{
    MemoryKind, PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::{Error, Result};

/// The setting that turns single copy (cross-memory attach) on or off
/// (`Config::shm`), named in logs.
pub(crate) const CMA_ENV: &str = "SNCL_SHM_CMA";

/// Under `auto`, a reader accepts lent pieces only if its cross-memory
/// reads run at least at this fraction of a plain copy's speed (below it
/// the slot FIFO wins; see docs/perf-notes/NOTEBOOK.md).
pub(crate) const CMA_MIN_SPEED_RATIO: f64 = 0.75;

/// Single-copy settings of this rank.
#[derive(Clone, Copy)]
struct CmaSettings {
    /// The smallest piece lent.
    min_bytes: usize,
    /// `SNCL_SHM_CMA=1`: skip the speed check.
    forced: bool,
}

/// The single-copy settings of this rank (`Config::shm`): `None` when
/// turned off.
fn cma_settings(shm: &ShmSettings) -> Option<CmaSettings> {
    let forced = match shm.single_copy {
        SingleCopy::Off => return None,
        SingleCopy::Auto => false,
        SingleCopy::On => true,
    };
    Some(CmaSettings {
        min_bytes: shm.single_copy_min_bytes,
        forced,
    })
}

/// Under `auto`: whether this host's cross-memory reads are fast enough
/// for lending to win; says why not.
fn fast_enough() -> std::result::Result<(), String> {
    match cma::read_speed() {
        Some((cma, copy)) if cma >= CMA_MIN_SPEED_RATIO * copy => Ok(()),
        Some((cma, copy)) => Err(format!(
            "cross-memory reads run at {:.2} GB/s here against {:.2} GB/s for a copy \
             (below {CMA_MIN_SPEED_RATIO} of it the slot FIFO is faster; {CMA_ENV}=1 forces \
             single copy)",
            cma / 1e9,
            copy / 1e9
        )),
        None => Err("a cross-memory read of this process's own memory failed".into()),
    }
}

/// Logs once per process why single copy is off.
fn log_fallback_once(reason: &str) {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| {
        tracing::info!(
            reason,
            "shared memory: single copy (cross-memory attach) is off, large pieces go \
             through the slot FIFO"
        );
    });
}

/// Shared memory between ranks of one node.
pub struct ShmKind;

impl TransportKind for ShmKind {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host]
    }

    fn has_lanes(&self) -> bool {
        true
    }

    fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
        let dir = std::path::Path::new(crate::SHM_DIR);
        if !dir.is_dir() {
            return Ok(Readiness::Unavailable(format!(
                "{} is not a directory on this host",
                dir.display()
            )));
        }
        crate::cleanup_stale();
        Ok(Readiness::Ready(Box::new(Prepared {
            inbound_names: UnlinkOnDrop(Vec::new()),
        })))
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        if a.node == b.node {
            Ok(())
        } else {
            Err(format!(
                "shared memory needs both ranks on one node, and rank {} is on node {:?}, \
                 rank {} on node {:?}",
                a.rank, a.node, b.rank, b.node
            ))
        }
    }
}

/// Withdraws the names of this rank's inbound segments when dropped: once
/// every rank has connected (each peer has mapped them), or on failure
/// (nobody will).
pub struct UnlinkOnDrop(pub Vec<Arc<Published>>);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        for name in &self.0 {
            name.withdraw();
        }
    }
}

/// This process's card: its pid namespace (`pid:[<inode>]`) when its
/// peers can open its anonymous segments (it is dumpable), else empty.
fn anonymous_card() -> String {
    // /proc must be the one of this pid namespace (after an `unshare -p`
    // without a new /proc mount it is not, and `/proc/<pid>` names others).
    let own_proc = std::fs::read_link("/proc/self")
        .is_ok_and(|p| p.to_str() == Some(std::process::id().to_string().as_str()));
    if !own_proc || !crate::private_file::descriptors_reachable() {
        return String::new();
    }
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether the segments `rank` creates for data from `peer` can be
/// anonymous: both published the same pid namespace as their `shm` card
/// (so each can open the other's descriptors).
pub fn anonymous_with(cards: &[RankCard], rank: usize, peer: usize) -> bool {
    let card = |r: usize| cards.iter().find(|c| c.rank == r).map(|c| c.card("shm"));
    match (card(rank), card(peer)) {
        (Some(mine), Some(theirs)) => !mine.is_empty() && mine == theirs,
        _ => false,
    }
}

struct Prepared {
    inbound_names: UnlinkOnDrop,
}

impl PreparedTransport for Prepared {
    /// See [`anonymous_card`].
    fn card(&self) -> String {
        anonymous_card()
    }

    /// Creates an inbound FIFO per peer, publishes its name under
    /// `<peer>/<rank>`, then opens the peers' under `<rank>/<peer>`.
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        let rank = ctx.rank;
        // First publish what peers need to probe us, so that nobody waits.
        let settings = match cma_settings(&ctx.config.shm) {
            None => {
                log_fallback_once(&format!("{CMA_ENV}=0"));
                None
            }
            Some(s) => match cma::allow_attach() {
                Ok(()) => Some(s),
                Err(why) => {
                    log_fallback_once(&why);
                    None
                }
            },
        };
        let cma_min = settings.map(|s| s.min_bytes);
        // Whether this rank, as a reader, wants lent pieces: under `auto`
        // only if its reads are fast (a peer may still read what it lends).
        let reads_wanted = match settings {
            Some(s) if !s.forced => match fast_enough() {
                Ok(()) => true,
                Err(why) => {
                    log_fallback_once(&why);
                    false
                }
            },
            Some(_) => true,
            None => false,
        };
        let probe = match cma_min {
            Some(_) => {
                let (address, value) = cma::probe_word().map_err(|e| Error::Io {
                    rank,
                    context: "drawing the shared-memory single-copy probe".into(),
                    source: e,
                })?;
                [address.to_le_bytes(), value.to_le_bytes()].concat()
            }
            None => Vec::new(),
        };
        ctx.store.set(&format!("cma/{rank}"), &probe)?;
        let mut inbound = Vec::with_capacity(peers.len());
        for &p in peers {
            let (seg, name) = create_inbound(
                ctx.comm_id,
                p,
                rank,
                (ctx.config.shm.slots, ctx.config.shm.slot_bytes),
                anonymous_with(cards, rank, p),
            )
            .map_err(|e| Error::Io {
                rank,
                context: format!(
                    "creating shared-memory segment for data from rank {p} in {}",
                    crate::SHM_DIR
                ),
                source: e,
            })?;
            ctx.store.set(&format!("{p}/{rank}"), name.as_bytes())?;
            self.inbound_names.0.extend(seg.published());
            inbound.push((p, seg));
        }
        let mut conns = Vec::with_capacity(peers.len());
        for (p, seg) in inbound {
            let out =
                open_peer_segment(ctx.store, rank, p, ("", "shared-memory"), ctx.remaining())?;
            let mut c = ShmConnection::new(rank, p, seg, out);
            let readable = reads_wanted && probe_peer(ctx, p, c.peer_pid())?;
            if readable {
                c.enable_cma_reads();
            }
            ctx.store
                .set(&format!("cma-ok/{p}/{rank}"), &[u8::from(readable)])?;
            conns.push(c);
        }
        let mut lending = 0;
        for c in &mut conns {
            let p = c.peer();
            let ok = ctx
                .store
                .get(&format!("cma-ok/{rank}/{p}"), ctx.remaining())?;
            if let (Some(min), [1]) = (cma_min, ok.as_slice()) {
                c.enable_lending(min);
                lending += 1;
            }
        }
        if cma_min.is_some() {
            if lending < conns.len() {
                log_fallback_once(&format!(
                    "rank {rank}: {} of {} peers on this node do not read this process's \
                     memory (the probe failed, or their reads are slow)",
                    conns.len() - lending,
                    conns.len()
                ));
            }
            tracing::debug!(
                rank,
                lending,
                peers = conns.len(),
                min_bytes = cma_min,
                "shared memory: single copy agreed"
            );
        }
        Ok(conns
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}

/// Whether this rank can read peer `p`'s memory: reads the probe word `p`
/// published (`cma/<p>`) in process `pid` and compares it. An empty entry
/// (single copy off at `p`), a malformed one or a failed read answer no; only
/// a store failure is an error.
fn probe_peer(ctx: &SetupContext<'_>, p: usize, pid: u32) -> Result<bool> {
    let raw = ctx.store.get(&format!("cma/{p}"), ctx.remaining())?;
    if raw.is_empty() {
        return Ok(false);
    }
    let Ok::<[u8; 16], _>(raw) = raw.as_slice().try_into() else {
        tracing::warn!(
            rank = ctx.rank,
            peer = p,
            len = raw.len(),
            "shared memory: peer published a malformed single-copy probe (expected 16 bytes)"
        );
        return Ok(false);
    };
    let word = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
    let (address, value) = (word(0), word(8));
    let mut got = [0u8; 8];
    match cma::read_from(pid, address, &mut got) {
        Ok(()) if u64::from_ne_bytes(got) == value => Ok(true),
        Ok(()) => {
            tracing::info!(
                rank = ctx.rank,
                peer = p,
                pid,
                "shared memory: single-copy probe read a different value (another pid \
                 namespace?)"
            );
            Ok(false)
        }
        Err(e) => {
            tracing::info!(
                rank = ctx.rank,
                peer = p,
                pid,
                error = %e,
                "shared memory: single-copy probe read failed"
            );
            Ok(false)
        }
    }
}

/// Opens the segment peer rank `p` created for data from `rank`, under the
/// name `p` published in the store at `<rank>/<p>` (with `/<key>` when
/// `key` is not empty; `what` names the segment in errors:
/// "shared-memory", "nvlink ring"). The name must be a plain segment name
/// (no path) and the file a private one of this user; errors say which
/// rank, which peer and what was wrong.
pub fn open_peer_segment(
    kv: &dyn Store,
    rank: usize,
    p: usize,
    (key, what): (&str, &str),
    timeout: std::time::Duration,
) -> Result<Segment> {
    let store_key = if key.is_empty() {
        format!("{rank}/{p}")
    } else {
        format!("{rank}/{p}/{key}")
    };
    let raw = kv.get(&store_key, timeout)?;
    let name = String::from_utf8(raw).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published a {what} segment name (for data from rank {rank}) \
             that is not UTF-8: {:?}",
            String::from_utf8_lossy(e.as_bytes())
        ),
    })?;
    crate::check_name(&name).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published an invalid {what} segment name for data from \
             rank {rank}: {e}"
        ),
    })?;
    Segment::open(&name).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            "; shared memory needs every rank of a node to run as the same user \
             (else set SNCL_TRANSPORT=tcp)"
        } else {
            ""
        };
        Error::Io {
            rank,
            context: format!(
                "opening {what} segment {name:?} that peer rank {p} created for data \
                 from rank {rank}{hint}"
            ),
            source: e,
        }
    })
}
