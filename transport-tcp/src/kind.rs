//! The `tcp` transport kind: authenticated sockets (transport-tcp) between
//! any two ranks; the fallback, last in the registry. A communicator of at
//! least `SNCL_RUNTIME_CONNECT_TCP_RANKS` ranks connects its TCP pairs at
//! their first use (`SNCL_RUNTIME_CONNECT=1`): both ranks of a pair first
//! note in the store that they reached it and wait for the other's note
//! (a wait the runtime watches for aborts and dead peers), then shake hands.

use std::collections::BTreeSet;
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
        Ok(Readiness::Ready(Box::new(Prepared {
            endpoint,
            connected: BTreeSet::new(),
        })))
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        address(a)?;
        address(b)?;
        Ok(())
    }
}

struct Prepared {
    endpoint: TcpEndpoint,
    /// Peers connected so far (by earlier batches, at first use).
    connected: BTreeSet<usize>,
}

/// Whether a communicator of `nranks` with `config` connects its TCP pairs
/// at their first use.
fn lazy(config: &comm_core::Config, nranks: usize) -> bool {
    config.runtime_connect && nranks >= config.runtime_connect_tcp_ranks
}

/// The store key rank `from` sets once it reached the connection of its
/// pair with `to`.
fn reached(from: usize, to: usize) -> String {
    format!("reached/{from}-{to}")
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        self.endpoint.local_addr().to_string()
    }

    fn connects_lazily(&self, config: &comm_core::Config, nranks: usize) -> bool {
        lazy(config, nranks)
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
        if let Some(&p) = peers.iter().find(|p| self.connected.contains(p)) {
            return Err(bad(format!("peer rank {p} is connected already")));
        }
        let at_first_use = lazy(ctx.config, ctx.nranks);
        if at_first_use {
            // Both ranks of each pair reached it before either shakes hands
            // (published for every peer before waiting on any): a wait in
            // the store, which the runtime cuts short when this
            // communicator aborts or the peer is gone.
            for &p in peers {
                ctx.store.set(&reached(ctx.rank, p), b"")?;
            }
            let keys: Vec<String> = peers.iter().map(|&p| reached(p, ctx.rank)).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let left = ctx.deadline.saturating_duration_since((ctx.now)());
            ctx.store.wait(&keys, left)?;
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
        // Higher-ranked peers that may connect at a later first use.
        let later: BTreeSet<usize> = if at_first_use {
            (ctx.rank + 1..ctx.nranks)
                .filter(|p| !self.connected.contains(p) && !peers.contains(p))
                .collect()
        } else {
            BTreeSet::new()
        };
        let made = self.endpoint.establish_some(&setup, &addrs, &later)?;
        self.connected.extend(peers.iter().copied());
        Ok(made
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}
