//! The `nvlink` transport kind (transport-nvlink): device pieces go device
//! to device between ranks of one node, host pieces through a
//! shared-memory FIFO as with `shm`.
//!
//! When it is ready. Communicators bind their device after setup
//! ([`crate::Communicator::bind_device`]), so setup cannot ask the bound
//! device; the rule is:
//!
//! * `SNCL_TRANSPORT=nvlink` forces it (any backend, the emulated device
//!   included: that is how CI runs it);
//! * otherwise it is not chosen yet: boards name devices by ordinal, which
//!   is per process (one GPU per rank through `CUDA_VISIBLE_DEVICES` makes
//!   every rank's device 0), so a pair's decision could be wrong or differ
//!   between its two ranks; automatic choice waits for boards that carry
//!   the PCI bus id and both sides' verdicts.
//!
//! The device side connects lazily: at the first device operation on a
//! pair, each side allocates its inbox on its bound device and publishes
//! it on the pair's board; the pair then uses the device path when both
//! devices have one backend and peer access, and stages device pieces
//! through the host otherwise (still correct, logged at INFO).

use comm_core::transport::registry::{
    PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::{Error, Result};
use transport_nvlink::{Geometry, Inbound, NvlinkConnection, BOARD_BYTES, RING_SLOT_BYTES};
use transport_shm::{create_inbound, Segment, ShmConnection};

use super::shm::{open_peer_segment, UnlinkOnDrop};

/// A device inbox slot is this many shared-memory slots (default 8 ×
/// 128 KiB = 1 MiB; `SNCL_SHM_SLOT_BYTES` scales it); it has
/// `SNCL_SHM_SLOTS` slots.
pub(crate) const SLOT_FACTOR: usize = 8;

/// Devices of one node through CUDA IPC / peer access.
pub(crate) struct Nvlink;

impl TransportKind for Nvlink {
    fn name(&self) -> &'static str {
        transport_nvlink::NAME
    }

    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        let dir = std::path::Path::new(transport_shm::SHM_DIR);
        if !dir.is_dir() {
            return Ok(Readiness::Unavailable(format!(
                "{} is not a directory on this host",
                dir.display()
            )));
        }
        // Not chosen automatically yet: the boards name devices by ordinal,
        // which means something only inside one process (one GPU per rank
        // through CUDA_VISIBLE_DEVICES makes every rank's device "0"), so
        // the pair's decision could be wrong or differ between its ranks.
        // Until boards carry the PCI bus id and both verdicts, the kind is
        // used where it is forced, and device pieces are staged otherwise.
        if ctx.config.transport.forced() != Some(transport_nvlink::NAME) {
            return Ok(Readiness::Unavailable(
                "not chosen automatically (devices are named by ordinal, which differs between \
                 processes); SNCL_TRANSPORT=nvlink forces it"
                    .into(),
            ));
        }
        let cuda = matches!(device::device_count(device::Backend::Cuda), Ok(n) if n > 0);
        let card = if cuda { "cuda" } else { "any" };
        transport_shm::cleanup_stale();
        Ok(Readiness::Ready(Box::new(Prepared {
            card,
            names: UnlinkOnDrop(Vec::new()),
        })))
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        if a.node != b.node {
            return Err(format!(
                "nvlink needs both ranks on one node, and rank {} is on node {:?}, rank {} on \
                 node {:?}",
                a.rank, a.node, b.rank, b.node
            ));
        }
        let (ca, cb) = (a.card(self.name()), b.card(self.name()));
        if ca.is_empty() || cb.is_empty() || (ca != cb && ca != "any" && cb != "any") {
            return Err(format!(
                "nvlink needs devices of one backend, and rank {} says {ca:?}, rank {} {cb:?}",
                a.rank, b.rank
            ));
        }
        Ok(())
    }
}

struct Prepared {
    card: &'static str,
    names: UnlinkOnDrop,
}

fn io_err(rank: usize, context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io {
        rank,
        context,
        source,
    }
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        self.card.to_string()
    }

    /// Per peer: creates the host FIFO, the descriptor ring and the board
    /// for data from that peer, publishes their names under
    /// `<peer>/<rank>/{host,ring,board}`, then opens the peers'.
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        _cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        let rank = ctx.rank;
        let cfg = ctx.config;
        let geometry = Geometry {
            slots: cfg.shm_slots,
            slot_bytes: cfg.shm_slot_bytes * SLOT_FACTOR,
        };
        let mut inbound = Vec::with_capacity(peers.len());
        for &p in peers {
            let what = |w: &str| format!("creating the nvlink {w} segment for data from rank {p}");
            let (host, host_name) =
                create_inbound(ctx.comm_id, p, rank, cfg.shm_slots, cfg.shm_slot_bytes)
                    .map_err(io_err(rank, what("host")))?;
            self.names.0.push(host_name.clone());
            let mut small = |slots: usize, bytes: usize, w: &str| -> Result<(Segment, String)> {
                let name = transport_shm::segment_name(ctx.comm_id, p, rank, 0, std::process::id())
                    .map_err(io_err(rank, what(w)))?;
                let seg = Segment::create(&name, slots, bytes).map_err(io_err(rank, what(w)))?;
                self.names.0.push(name.clone());
                Ok((seg, name))
            };
            let (ring, ring_name) = small(geometry.slots, RING_SLOT_BYTES, "descriptor ring")?;
            let (board, board_name) = small(1, BOARD_BYTES, "board")?;
            for (key, name) in [
                ("host", &host_name),
                ("ring", &ring_name),
                ("board", &board_name),
            ] {
                ctx.store
                    .set(&format!("{p}/{rank}/{key}"), name.as_bytes())?;
            }
            inbound.push((p, host, Inbound { ring, board }));
        }
        let mut conns: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        for (p, host, inb) in inbound {
            let open = |key: &str| {
                let what = format!("nvlink {key}");
                open_peer_segment(ctx.store, rank, p, (key, &what), ctx.remaining())
            };
            let out_host = open("host")?;
            let out_ring = open("ring")?;
            let out_board = open("board")?;
            let shm = ShmConnection::new(rank, p, host, out_host);
            conns.push(Box::new(NvlinkConnection::new(
                rank,
                p,
                ctx.comm_id,
                shm,
                inb,
                (out_ring, out_board),
                geometry,
            )));
        }
        Ok(conns)
    }
}
