//! The `shm` transport kind: a FIFO of slots per direction in `/dev/shm`
//! (transport-shm), between ranks of one node.

use comm_core::bootstrap::Store;
use comm_core::transport::registry::{
    PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::{Error, Result};
use transport_shm::{create_inbound, Segment, ShmConnection};

/// Shared memory between ranks of one node.
pub(crate) struct Shm;

impl TransportKind for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
        let dir = std::path::Path::new(transport_shm::SHM_DIR);
        if !dir.is_dir() {
            return Ok(Readiness::Unavailable(format!(
                "{} is not a directory on this host",
                dir.display()
            )));
        }
        transport_shm::cleanup_stale();
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

/// Removes the names of this rank's inbound segments when dropped: once
/// every rank has connected (each peer has mapped them), or on failure
/// (nobody will).
struct UnlinkOnDrop(Vec<String>);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = std::fs::remove_file(std::path::Path::new(transport_shm::SHM_DIR).join(name));
        }
    }
}

struct Prepared {
    inbound_names: UnlinkOnDrop,
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        String::new()
    }

    /// Creates an inbound FIFO per peer, publishes its name under
    /// `<peer>/<rank>`, then opens the peers' under `<rank>/<peer>`.
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        _cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        let rank = ctx.rank;
        let mut inbound = Vec::with_capacity(peers.len());
        for &p in peers {
            let (seg, name) = create_inbound(
                ctx.comm_id,
                p,
                rank,
                ctx.config.shm_slots,
                ctx.config.shm_slot_bytes,
            )
            .map_err(|e| Error::Io {
                rank,
                context: format!(
                    "creating shared-memory segment for data from rank {p} in {}",
                    transport_shm::SHM_DIR
                ),
                source: e,
            })?;
            ctx.store.set(&format!("{p}/{rank}"), name.as_bytes())?;
            self.inbound_names.0.push(name);
            inbound.push((p, seg));
        }
        let mut conns: Vec<Box<dyn Connection>> = Vec::with_capacity(peers.len());
        for (p, seg) in inbound {
            let out = open_peer_segment(ctx.store, rank, p, ctx.remaining())?;
            conns.push(Box::new(ShmConnection::new(rank, p, seg, out)));
        }
        Ok(conns)
    }
}

/// Opens the segment peer rank `p` created for data from `rank`, under the
/// name `p` published in the store. The name must be a plain segment name
/// (no path) and the file a private one of this user; errors say which rank,
/// which peer and what was wrong.
fn open_peer_segment(
    kv: &dyn Store,
    rank: usize,
    p: usize,
    timeout: std::time::Duration,
) -> Result<Segment> {
    let raw = kv.get(&format!("{rank}/{p}"), timeout)?;
    let name = String::from_utf8(raw).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published a shared-memory segment name (for data from rank {rank}) \
             that is not UTF-8: {:?}",
            String::from_utf8_lossy(e.as_bytes())
        ),
    })?;
    transport_shm::check_name(&name).map_err(|e| Error::Bootstrap {
        rank,
        detail: format!(
            "peer rank {p} published an invalid shared-memory segment name for data from \
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
                "opening shared-memory segment {name:?} that peer rank {p} created for data \
                 from rank {rank}{hint}"
            ),
            source: e,
        }
    })
}
