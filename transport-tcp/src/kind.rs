//! The `tcp` transport kind: authenticated sockets (transport-tcp) between
//! any two ranks; the fallback, last in the registry.

use std::net::SocketAddr;

use crate::{TcpEndpoint, TcpSetup};
use comm_core::transport::registry::{
    MemoryKind, PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::{Error, Result};

/// TCP between any two ranks.
pub struct TcpKind;

fn address(c: &RankCard) -> std::result::Result<SocketAddr, String> {
    let card = c.card("tcp");
    card.parse().map_err(|_| {
        format!(
            "rank {} published no TCP listener address (card {card:?})",
            c.rank
        )
    })
}

impl TransportKind for TcpKind {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host]
    }

    /// Binds the listener peers of higher rank connect to; its address is
    /// the card.
    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        let endpoint = TcpEndpoint::bind(ctx.ip).map_err(|e| Error::Io {
            rank: ctx.rank,
            context: format!("binding a TCP listener on {}", ctx.ip),
            source: e,
        })?;
        Ok(Readiness::Ready(Box::new(Prepared { endpoint })))
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        address(a)?;
        address(b)?;
        Ok(())
    }
}

struct Prepared {
    endpoint: TcpEndpoint,
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        self.endpoint.local_addr().to_string()
    }

    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let bad = |detail: String| Error::Bootstrap {
            rank: ctx.rank,
            detail,
        };
        // SNCL_TCP_PACING: sockets to other nodes share this node's link
        // with the other ranks of the node (and, where this communicator
        // sends to several nodes at once, with each other).
        let local_ranks = cards.iter().filter(|c| c.node == ctx.node).count();
        let rate = crate::socket_pacing_rate(
            ctx.config.tcp.pacing,
            &ctx.config.tiers,
            local_ranks,
            ctx.config.tcp.nsocks,
            ctx.config.tcp.flows_per_rank,
        );
        let mut addrs = Vec::with_capacity(peers.len());
        let mut pacing = std::collections::BTreeMap::new();
        for &p in peers {
            let card = cards
                .get(p)
                .ok_or_else(|| bad(format!("peer rank {p} has no published record")))?;
            addrs.push((p, address(card).map_err(bad)?));
            if let Some(rate) = rate.filter(|_| card.node != ctx.node) {
                pacing.insert(p, rate);
            }
        }
        let setup = TcpSetup {
            rank: ctx.rank,
            comm_id: ctx.comm_id,
            secret: ctx.secret,
            nsocks: ctx.config.tcp.nsocks,
            max_piece: ctx.config.tcp.piece_bytes,
            deadline: ctx.deadline,
            pacing,
            tls: sncl_bootstrap::tls::TlsIdentity::from_settings(&ctx.config.tcp.tls)?,
        };
        Ok(self
            .endpoint
            .establish(&setup, &addrs)?
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}
