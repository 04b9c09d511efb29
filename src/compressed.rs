//! Compressed all-reduce: the codec applies where bandwidth is scarce — the
//! cross-node phase of the hierarchical algorithm — while the intra-node
//! reduce-scatter and all-gather stay in full precision.
//!
//! Dense codecs (fp16, bf16, int8): the cross-node phase is a reduce-scatter
//! done as an all-to-all of encoded parts, each owner decodes and sums in
//! f32 (never in low precision), re-encodes its reduced part, and an
//! all-gather of encoded parts finishes (as ZeRO++'s qgZ does). Top-k: a
//! sparse all-gather of (index, value) pairs, summed densely.
//!
//! Error bounds (per element, `b(x)` = the codec's [`Codec::error_bound`]):
//! dense codecs: `|result − exact| ≤ Σ_r b(x_r) + b(sum)` over the ranks r of
//! the cross-node group; top-k: `Σ_r b(x_r)` (the largest magnitude each rank
//! left in its residual), and with error feedback nothing is lost over time.

use comm_core::config::TcpPacing;
use comm_core::{Error, ReduceOp, Result};
use compress::{Codec, ErrorFeedback};

use crate::Communicator;

mod dense;
mod exchange;
mod link_probe;
use exchange::bytes_err;
use link_probe::LinkProbe;

/// Where the codec applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressScope {
    /// Only across nodes, inside the hierarchical all-reduce (when every
    /// node has the same number of ranks; otherwise as `Flat`).
    Hier,
    /// On the one tier of a flat all-reduce over all ranks.
    Flat,
}

/// Node groups and cross-node replica groups, built once per communicator.
pub(crate) struct Layout {
    node: Communicator,
    replicas: Communicator,
}

impl Layout {
    /// The sub-communicators.
    pub(crate) fn comms(&self) -> [&Communicator; 2] {
        [&self.node, &self.replicas]
    }
}

impl Communicator {
    /// The node and replica sub-communicators of the hierarchical scope
    /// (`None` where the layout is not uniform with several nodes of
    /// several ranks), built on first use.
    pub(crate) fn compress_layout(&self) -> Result<Option<&Layout>> {
        if let Some(l) = self.layout.get() {
            return Ok(l.as_deref());
        }
        let topo = &self.inner.topo;
        let uniform = topo.nodes.iter().all(|n| n.len() == topo.nodes[0].len());
        let built = if uniform && topo.nnodes() > 1 && topo.nodes[0].len() > 1 {
            let (nodes, local) = (topo.nnodes(), topo.nodes[0].len());
            // No link rate configured: measure it (every rank sees the same
            // configuration, so all probe or none does).
            let config = self.config();
            let measured =
                if config.tcp.compress_pacing == TcpPacing::Auto && config.tiers.inter.is_none() {
                    self.measure_links_for_pacing(nodes, local)?
                } else {
                    None
                };
            // The exchange sends to every other node at once: pace each of
            // its sockets at that share of the node link (SNCL_COMPRESS_PACING).
            let (node, replicas) = self.split_2d_configured(|c| {
                match c.tcp.compress_pacing {
                    TcpPacing::Off => {}
                    // No configured rate: the measured one paces; without
                    // one either, SNCL_TCP_PACING decides.
                    TcpPacing::Auto if c.tiers.inter.is_none() => {
                        if let Some(link) = measured {
                            c.tiers.inter = Some(link);
                            c.tcp.pacing = TcpPacing::Auto;
                        }
                    }
                    paced => c.tcp.pacing = paced,
                }
                c.tcp.flows_per_rank = nodes - 1;
                // One socket per peer: a round's message to a peer is often
                // one piece, which would leave a second socket's share idle.
                c.tcp.nsocks = 1;
                // The replica communicator has one rank per node; the link
                // is shared by all of the node's ranks.
                c.tiers.cluster.ranks_per_node.get_or_insert(local);
            })?;
            Some(Box::new(Layout { node, replicas }))
        } else {
            None
        };
        let _ = self.layout.set(built);
        Ok(self.layout.get().and_then(|l| l.as_deref()))
    }

    /// The node links' goodput for the exchange's pacing where no topology
    /// gives it (collective), with the inter tier's default latency; `None`
    /// where the probe found nothing to pace (links too fast, or not TCP).
    fn measure_links_for_pacing(
        &self,
        nodes: usize,
        local: usize,
    ) -> Result<Option<comm_core::tune::LinkCost>> {
        let probe = link_probe::probe_node_links(self)?;
        let speaks = self.rank() == 0;
        match probe {
            LinkProbe::Measured {
                bytes_per_us,
                bytes,
                seconds,
            } => {
                if speaks {
                    tracing::info!(
                        link_mb_per_s = bytes_per_us,
                        probe_bytes = bytes,
                        probe_ms = seconds * 1e3,
                        socket_share = format!("1/{}", local * (nodes - 1)),
                        "compressed all-reduce: node links measured; the exchange paces each cross-node socket at its share"
                    );
                }
                Ok(Some(comm_core::tune::LinkCost {
                    alpha_us: comm_core::tune::LinkCost::TCP.alpha_us,
                    bytes_per_us,
                }))
            }
            LinkProbe::TooFast { seconds } => {
                if speaks {
                    tracing::info!(
                        probe_bytes = link_probe::PROBE_MAX_BYTES,
                        probe_ms = seconds * 1e3,
                        "compressed all-reduce: node links too fast to need pacing"
                    );
                }
                Ok(None)
            }
            LinkProbe::NotTcp => Ok(None),
        }
    }

    /// The host form of [`Communicator::all_reduce_compressed`].
    pub(crate) fn all_reduce_compressed_host(
        &self,
        buf: &mut [f32],
        op: ReduceOp,
        codec: &Codec,
        feedback: Option<&mut ErrorFeedback>,
        scope: CompressScope,
    ) -> Result<()> {
        if !matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            return Err(Error::InvalidArgument {
                rank: self.rank(),
                op: "all_reduce_compressed",
                detail: format!(
                    "{} is not supported with compression (sum or avg)",
                    op.name()
                ),
            });
        }
        self.check_codec_deterministic(codec, "all_reduce_compressed")?;
        let layout = match scope {
            CompressScope::Hier => self.compress_layout()?,
            CompressScope::Flat => None,
        };
        match layout {
            Some(l) => {
                let (local, nodes) = (l.node.size(), l.replicas.size());
                let unit = local * nodes;
                let padded = buf.len().div_ceil(unit) * unit;
                let mut full = vec![0f32; padded];
                full[..buf.len()].copy_from_slice(buf);
                let mut shard = vec![0f32; padded / local];
                l.node.reduce_scatter(&full, &mut shard, ReduceOp::Sum)?;
                cross_tier(&l.replicas, &mut shard, codec, feedback)?;
                l.node.all_gather(&shard, &mut full)?;
                buf.copy_from_slice(&full[..buf.len()]);
            }
            None => cross_tier(self, buf, codec, feedback)?,
        }
        if op == ReduceOp::Avg {
            let n = self.size() as f32;
            buf.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }
}

impl Communicator {
    /// In deterministic mode (`SNCL_DETERMINISTIC=1`), refuses a codec
    /// whose result is not a function of the inputs alone: top-k (on
    /// devices, which of equal magnitudes it keeps depends on the order of
    /// concurrent updates). The dense codecs are deterministic: each owner
    /// sums the decoded parts in f32 in rank order.
    pub(crate) fn check_codec_deterministic(&self, codec: &Codec, op: &'static str) -> Result<()> {
        if self.config().deterministic && matches!(codec, Codec::TopK { .. }) {
            return Err(Error::InvalidArgument {
                rank: self.rank(),
                op,
                detail: format!(
                    "the {} codec is not deterministic (which of equal magnitudes it keeps is \
                     not fixed), and this communicator is in deterministic mode \
                     (SNCL_DETERMINISTIC=1); use a dense codec (fp16, bf16, int8, mxfp8, mxfp4)",
                    codec.name()
                ),
            });
        }
        Ok(())
    }
}

/// Sums `data` over `comm` moving only encoded bytes.
fn cross_tier(
    comm: &Communicator,
    data: &mut [f32],
    codec: &Codec,
    feedback: Option<&mut ErrorFeedback>,
) -> Result<()> {
    let n = comm.size();
    if n == 1 || data.is_empty() {
        return Ok(());
    }
    // Error feedback: compensate, and keep what encoding drops.
    let ef = feedback.map(|f| {
        if f.residual().len() != data.len() {
            *f = ErrorFeedback::new(data.len());
        }
        f
    });
    if let Codec::TopK { .. } = codec {
        let mut enc = Vec::new();
        match ef {
            Some(f) => f.encode_with_feedback(codec, data, &mut enc),
            None => codec.encode(data, &mut enc),
        }
        // Sparse all-gather: lengths first, then the bytes.
        let mut lens = vec![0u64; n];
        comm.all_gather(&[enc.len() as u64], &mut lens)?;
        let counts: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
        let displs = comm_core::algo::displacements(&counts);
        let mut all = vec![0u8; counts.iter().sum()];
        let me = comm.rank();
        all[displs[me]..displs[me] + counts[me]].copy_from_slice(&enc);
        {
            let mut chunks: Vec<&mut [u8]> = Vec::with_capacity(n);
            let mut rest: &mut [u8] = &mut all;
            for &c in &counts {
                let (head, tail) = rest.split_at_mut(c);
                chunks.push(head);
                rest = tail;
            }
            comm.group(|g| {
                for (r, chunk) in chunks.into_iter().enumerate() {
                    if r != me {
                        g.send(&enc, r);
                        g.recv(chunk, r);
                    }
                }
            })?;
        }
        data.iter_mut().for_each(|x| *x = 0.0);
        for r in 0..n {
            codec
                .decode_add(&all[displs[r]..displs[r] + counts[r]], data.len(), data)
                .map_err(|e| bytes_err(comm, e))?;
        }
        return Ok(());
    }
    // Dense: part j of every rank goes to rank j, pipelined (dense.rs).
    dense::exchange_dense(comm, data, codec, ef)
}
