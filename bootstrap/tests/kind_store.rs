//! A transport kind shaped like RDMA exchanges per-pair information
//! (queue-pair numbers, keys) through its store namespace at setup
//! (comm-core's registry over this crate's `MemoryStore`).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use comm_core::transport::registry::{
    choose, KindState, MemoryKind, PreparedTransport, RankCard, Readiness, SelfKind, SetupContext,
    TransportKind,
};
use comm_core::transport::{Connection, ConsumeResult, Outgoing, Payload, Space};
use comm_core::wire::PieceHeader;
use comm_core::{Config, Result};
use sncl_bootstrap::{MemoryStore, PrefixStore};

fn card(rank: usize, node: &str, kinds: &[(&str, KindState)]) -> RankCard {
    RankCard {
        rank,
        node: node.into(),
        kinds: kinds
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect(),
    }
}

fn ready(c: &str) -> KindState {
    KindState::Ready(c.into())
}

/// A kind shaped like RDMA: its card is a port id, and its connect
/// publishes per-pair information (a queue-pair number, a key) for
/// each peer, then reads each peer's for it, through its store
/// namespace.
struct PairwiseKind;

struct PairwisePrepared {
    port: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(usize, String)>>>,
}

struct NoConnection(usize);

impl Connection for NoConnection {
    fn peer(&self) -> usize {
        self.0
    }
    fn max_piece(&self, _: MemoryKind) -> usize {
        1
    }
    fn try_post_send(&mut self, _: &PieceHeader, _: Outgoing<'_>) -> Result<bool> {
        Ok(false)
    }
    fn try_recv(
        &mut self,
        _: Space<'_>,
        _: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool> {
        Ok(false)
    }
    fn abort(&mut self, _: Option<usize>) {}
    fn kind(&self) -> &'static str {
        "pairwise"
    }
}

impl TransportKind for PairwiseKind {
    fn name(&self) -> &'static str {
        "pairwise"
    }
    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host]
    }
    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        Ok(Readiness::Ready(Box::new(PairwisePrepared {
            port: format!("port{}", ctx.rank),
            seen: Default::default(),
        })))
    }
    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        match (a.card("pairwise"), b.card("pairwise")) {
            (x, y) if x.starts_with("port") && y.starts_with("port") => Ok(()),
            _ => Err("no port".into()),
        }
    }
}

impl PreparedTransport for PairwisePrepared {
    fn card(&self) -> String {
        self.port.clone()
    }
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        for &p in peers {
            let qp = format!("qp {}->{p} via {}", ctx.rank, cards[p].card("pairwise"));
            ctx.store.set(&format!("{}/{p}", ctx.rank), qp.as_bytes())?;
        }
        let mut out: Vec<Box<dyn Connection>> = Vec::new();
        for &p in peers {
            let b = ctx
                .store
                .get(&format!("{p}/{}", ctx.rank), ctx.remaining())?;
            let mut seen = self.seen.lock().unwrap();
            seen.push((p, String::from_utf8(b).unwrap()));
            out.push(Box::new(NoConnection(p)));
        }
        Ok(out)
    }
}

#[test]
fn a_kind_can_exchange_per_pair_information_through_its_store() {
    let store = MemoryStore::new();
    let n = 3;
    let config = Config::default();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let store = PrefixStore::new("sncl/x/pairwise", store.for_rank(rank));
            let config = config.clone();
            std::thread::spawn(move || {
                let ctx = SetupContext {
                    rank,
                    nranks: n,
                    comm_id: 1,
                    secret: [0; 16],
                    config: &config,
                    node: "n",
                    ip: IpAddr::from([127, 0, 0, 1]),
                    deadline: Instant::now() + Duration::from_secs(10),
                    now: Instant::now,
                    store: &store,
                };
                let Readiness::Ready(prepared) = PairwiseKind.prepare(&ctx).unwrap() else {
                    panic!("pairwise is always ready")
                };
                assert_eq!(prepared.card(), format!("port{rank}"));
                let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let mut p = PairwisePrepared {
                    port: prepared.card(),
                    seen: seen.clone(),
                };
                let cards: Vec<RankCard> = (0..n)
                    .map(|r| card(r, "n", &[("pairwise", ready(&format!("port{r}")))]))
                    .collect();
                let chosen = choose(&[&SelfKind, &PairwiseKind], None, &cards, rank).unwrap();
                let peers: Vec<usize> = (0..n).filter(|&q| chosen[q] == "pairwise").collect();
                let conns = p.connect(&ctx, &cards, &peers).unwrap();
                assert_eq!(conns.len(), n - 1);
                let seen = seen.lock().unwrap().clone();
                assert_eq!(seen.len(), n - 1);
                (rank, seen)
            })
        })
        .collect();
    for h in handles {
        let (rank, seen) = h.join().unwrap();
        for (p, info) in seen {
            assert_eq!(info, format!("qp {p}->{rank} via port{rank}"));
        }
    }
}
