//! The `nvlink` transport kind (transport-nvlink): device pieces go device
//! to device between ranks of one node, host pieces through a
//! shared-memory FIFO as with `shm`.
//!
//! When it is ready (`SNCL_NVLINK`, per process; a pair uses the kind only
//! where both ranks have it ready):
//!
//! * `auto` (default): for every pair of ranks on one node, ahead of `shm`,
//!   where this process can run device operations at all (a CUDA driver
//!   library loads, or an emulated device is open: `device::devices_possible`).
//!   Host operations go through `shm`'s own connection (single copy
//!   included), and nothing device-related happens until the first device
//!   operation on the pair, so a host-only run costs nothing extra. At that
//!   operation each side publishes its device (PCI bus id) and inbox, then
//!   its verdict (it sees the peer's device, and has peer access or shares
//!   it); both use the AND: device to device, else staged through the
//!   host (logged at INFO);
//! * `1`: as `auto`, but a pair that cannot go device to device fails its
//!   first device operation with an error naming what is missing;
//! * `0`: not used (device pieces between ranks of a node are staged over
//!   `shm`).
//!
//! `SNCL_TRANSPORT=nvlink` forces the kind for every pair (`auto`'s
//! decision, or `1`'s); with `SNCL_NVLINK=0` it is unavailable.

use crate::{Geometry, Inbound, Mode, NvlinkConnection, BOARD_BYTES, RING_SLOT_BYTES};
use comm_core::config::{NvlinkMode, NvlinkSettings};
use comm_core::transport::registry::{
    MemoryKind, PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::{Error, Result};
use transport_shm::Segment;

use transport_shm::{open_peer_segment, ShmKind, UnlinkOnDrop};

/// A device inbox slot is this many shared-memory slots (default 8 ×
/// 128 KiB = 1 MiB; `SNCL_SHM_SLOT_BYTES` scales it); it has
/// `SNCL_SHM_SLOTS` slots.
pub(crate) const SLOT_FACTOR: usize = 8;

/// Devices of one node through CUDA IPC / peer access.
pub struct NvlinkKind;

impl TransportKind for NvlinkKind {
    fn name(&self) -> &'static str {
        crate::NAME
    }

    /// Device to device between the pair's devices where both reach each
    /// other (peer access, or one device), else staged over its shm FIFO
    /// (`SNCL_NVLINK=1`: an error instead); host pieces over that FIFO.
    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        let mode = match nvlink_mode(&ctx.config.nvlink) {
            Some(m) => m,
            None => return Ok(Readiness::Unavailable(format!("{NVLINK_ENV}=0"))),
        };
        // Only where device operations can happen at all: a host-only run
        // keeps `shm` (and its name in stats and logs).
        let forced = ctx.config.transport.forced() == Some(crate::NAME);
        if matches!(mode, Mode::Auto) && !forced && !device::devices_possible() {
            return Ok(Readiness::Unavailable(
                "no CUDA driver library loads and no emulated device is open in this process \
                 (host-only: shm carries everything)"
                    .into(),
            ));
        }
        // Host pieces go through shm's connection: ready where shm is.
        let shm = match ShmKind.prepare(ctx)? {
            Readiness::Ready(p) => p,
            Readiness::Unavailable(why) => return Ok(Readiness::Unavailable(why)),
        };
        Ok(Readiness::Ready(Box::new(Prepared {
            shm,
            mode,
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
        // Devices are decided at the first device operation (see above).
        Ok(())
    }
}

struct Prepared {
    /// `shm`'s prepared state: the host connections.
    shm: Box<dyn PreparedTransport>,
    mode: Mode,
    names: UnlinkOnDrop,
}

/// The setting that turns the transport on or off (`Config::nvlink`),
/// named in logs.
pub(crate) const NVLINK_ENV: &str = "SNCL_NVLINK";

/// This rank's `SNCL_NVLINK` as the transport's mode: `None` for off.
fn nvlink_mode(settings: &NvlinkSettings) -> Option<Mode> {
    match settings.mode {
        NvlinkMode::Auto => Some(Mode::Auto),
        NvlinkMode::Required => Some(Mode::Required),
        NvlinkMode::Off => None,
    }
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
        String::new()
    }

    /// Connects `shm`'s host connections, then per peer creates the
    /// descriptor ring and the board for data from that peer, publishes
    /// their names under `<peer>/<rank>/{ring,board}`, then opens the
    /// peers'.
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        let rank = ctx.rank;
        // shm's keys (`<peer>/<rank>` and its probes) and ours
        // (`<peer>/<rank>/{ring,board}`) share this kind's namespace
        // without colliding.
        let hosts = self.shm.connect(ctx, cards, peers)?;
        let cfg = ctx.config;
        let geometry = Geometry {
            slots: cfg.shm.slots,
            slot_bytes: cfg.shm.slot_bytes * SLOT_FACTOR,
        };
        let mut inbound = Vec::with_capacity(peers.len());
        for &p in peers {
            let what = |w: &str| format!("creating the nvlink {w} segment for data from rank {p}");
            let anonymous = transport_shm::anonymous_with(cards, rank, p);
            let mut small = |slots: usize, bytes: usize, w: &str| -> Result<(Segment, String)> {
                let seg = if anonymous {
                    Segment::create_anonymous(slots, bytes)
                } else {
                    transport_shm::segment_name(ctx.comm_id, p, rank, 0, std::process::id())
                        .and_then(|name| Segment::create(&name, slots, bytes))
                }
                .map_err(io_err(rank, what(w)))?;
                let name = seg
                    .published_name()
                    .expect("a created segment has a name")
                    .to_owned();
                self.names.0.extend(seg.published());
                Ok((seg, name))
            };
            let (ring, ring_name) = small(geometry.slots, RING_SLOT_BYTES, "descriptor ring")?;
            let (board, board_name) = small(1, BOARD_BYTES, "board")?;
            for (key, name) in [("ring", &ring_name), ("board", &board_name)] {
                ctx.store
                    .set(&format!("{p}/{rank}/{key}"), name.as_bytes())?;
            }
            inbound.push((p, Inbound { ring, board }));
        }
        let mut conns: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        for ((p, inb), host) in inbound.into_iter().zip(hosts) {
            let open = |key: &str| {
                let what = format!("nvlink {key}");
                open_peer_segment(ctx.store, rank, p, (key, &what), ctx.remaining())
            };
            let out_ring = open("ring")?;
            let out_board = open("board")?;
            debug_assert_eq!(host.peer(), p);
            conns.push(Box::new(NvlinkConnection::new(
                rank,
                p,
                ctx.comm_id,
                host,
                inb,
                (out_ring, out_board),
                geometry,
                self.mode,
            )));
        }
        Ok(conns)
    }
}
