//! Building a communicator: rendezvous through a [`Store`], the choice of a
//! transport kind per peer pair from the one ordered registry
//! ([`registry::TRANSPORTS`]: self, shared memory within a node, TCP; or
//! the kind `SNCL_TRANSPORT` forces), connection setup and the init line at
//! `SNCL_DEBUG=INFO`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sncl_runtime::flight::{wall_us, InitPhase};

use comm_core::transport::registry::{
    self as kinds, KindState, MemoryKind, PreparedTransport, RankCard, Readiness, SetupContext,
};
use comm_core::transport::Connection;
use comm_core::{Config, Error, Result};
use sncl_bootstrap::{store_barrier, PrefixStore, Store, TcpStoreServer};

use crate::comm::{Inner, InnerParts};

pub(crate) mod lazy;
mod registry;
mod rendezvous;
pub use registry::transport_names;

/// This host's identity: `SNCL_NODE_ID`, else hostname + boot id (network
/// namespaces share both, so test beds must set `SNCL_NODE_ID`).
pub fn node_identity(config: &Config) -> String {
    if let Some(id) = &config.node_id {
        return id.clone();
    }
    format!(
        "{}/{}",
        host_name(),
        proc_text("/proc/sys/kernel/random/boot_id")
    )
}

/// This host's name (empty where the kernel does not say).
pub(crate) fn host_name() -> String {
    proc_text("/proc/sys/kernel/hostname")
}

/// A kernel value from /proc, trimmed (empty where unreadable).
fn proc_text(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// One rank's published record.
pub(crate) struct RankInfo {
    pub card: RankCard,
    pub digest: String,
    /// The standby store's address (see `crate::comm::Standby`); a record without
    /// one (an older writer) leaves it out.
    pub standby: Option<SocketAddr>,
}

/// The prefix of a line stating a transport kind's state.
const KIND_LINE: &str = "kind ";

/// The record, one item a line: `node`, a reserved line (`-`; it held the
/// TCP address before the transport registry, and readers skip it), the
/// settings digest, the standby address, then one line per transport kind:
/// `kind <name> ready <card>` or `kind <name> unavailable <reason>`. A
/// reader tells the standby address and the kind lines from the digest
/// (which holds `key=value` pairs, never an address or `kind `).
pub(crate) fn encode_info(
    rank: usize,
    node: &str,
    digest: &str,
    standby: SocketAddr,
    kinds: &[(&str, KindState)],
) -> Result<Vec<u8>> {
    let mut s = format!("{node}\n-\n{digest}\n{standby}");
    for (name, state) in kinds {
        let line = match state {
            KindState::Ready(card) => {
                if card.contains('\n') {
                    return Err(Error::Bootstrap {
                        rank,
                        detail: format!(
                            "transport {name} stated a card of several lines: {card:?}"
                        ),
                    });
                }
                format!("{KIND_LINE}{name} ready {card}")
            }
            KindState::Unavailable(why) => {
                format!("{KIND_LINE}{name} unavailable {}", why.replace('\n', " "))
            }
        };
        s.push('\n');
        s.push_str(&line);
    }
    Ok(s.into_bytes())
}

pub(crate) fn decode_info(rank: usize, peer: usize, b: &[u8]) -> Result<RankInfo> {
    let s = String::from_utf8_lossy(b);
    let mut lines = s.split('\n');
    let bad = |what: &str| Error::Bootstrap {
        rank,
        detail: format!("rank {peer} published malformed connection info ({what}): {s:?}"),
    };
    let node = lines.next().ok_or_else(|| bad("no node"))?.to_string();
    lines.next().ok_or_else(|| bad("no second line"))?;
    let digest = lines.next().ok_or_else(|| bad("no settings digest"))?;
    let mut standby = None;
    let mut kinds = Vec::new();
    for line in lines {
        if let Some(rest) = line.strip_prefix(KIND_LINE) {
            let mut it = rest.splitn(3, ' ');
            let (Some(name), Some(state)) = (it.next(), it.next()) else {
                return Err(bad("a kind line without a state"));
            };
            let text = it.next().unwrap_or("").to_string();
            let state = match state {
                "ready" => KindState::Ready(text),
                "unavailable" => KindState::Unavailable(text),
                _ => {
                    return Err(bad(
                        "a kind line whose state is neither ready nor unavailable",
                    ))
                }
            };
            kinds.push((name.to_string(), state));
        } else if let Ok(a) = line.parse::<SocketAddr>() {
            standby = Some(a);
        } else {
            return Err(bad("an unknown line"));
        }
    }
    Ok(RankInfo {
        card: RankCard {
            rank: peer,
            node,
            kinds,
        },
        digest: digest.to_string(),
        standby,
    })
}

/// Everything needed to build one communicator.
pub(crate) struct SetupArgs {
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub secret: [u8; 16],
    pub config: Config,
    pub local_ip: IpAddr,
    pub server: Option<TcpStoreServer>,
    /// How long the whole setup may take: [`Config::creation_timeout`] for
    /// a communicator made from a unique id or a store, or grown with new
    /// processes (ranks arrive with the launcher's skew),
    /// [`Config::timeout`] for one made from a live communicator's ranks
    /// alone (split, shrink, resume).
    pub wait: Duration,
}

/// A creation's error (`wait`: the creation timeout), naming the setting
/// that bounds it where a store wait timed out: ranks a launcher starts
/// further apart than that fail here, and the remedy is the setting, not
/// a hunt for a hang.
pub(crate) fn creation_error(e: Error, wait: Duration) -> Error {
    match e {
        Error::Bootstrap { rank, detail } if detail.contains("timed out after") => {
            Error::Bootstrap {
                rank,
                detail: format!(
                    "{detail} (creating a communicator waits {} ms for every rank: \
                     SNCL_INIT_TIMEOUT_MS, or SNCL_TIMEOUT_MS where that is unset; raise it where \
                     ranks start further apart)",
                    wait.as_millis()
                ),
            }
        }
        e => e,
    }
}

/// Connects this rank to every other rank of the communicator: prepares
/// every transport kind, publishes this rank's record, adopts rank 0's
/// settings, chooses a kind per peer ([`kinds::choose`]) and connects each
/// kind's peers in registry order.
pub(crate) fn build(args: SetupArgs) -> Result<Inner> {
    build_keeping(args, None)
}

/// [`build`], with the kind per peer given (`kept`: a resumed
/// communicator keeps its creation's, as its planning does) instead of
/// chosen anew.
pub(crate) fn build_keeping(args: SetupArgs, kept: Option<&[&'static str]>) -> Result<Inner> {
    let SetupArgs {
        store,
        rank,
        nranks,
        comm_id,
        secret,
        mut config,
        local_ip,
        server,
        wait,
    } = args;
    config.validate()?;
    check_world(rank, nranks, "init")?;
    let mut phases = PhaseTimer::start();
    let deadline = Instant::now() + wait;
    let prefix = format!("sncl/{comm_id:016x}");
    let kv = PrefixStore::new(prefix.clone(), store.clone());
    let node = config
        .tiers
        .node_of(rank)
        .map(str::to_string)
        .unwrap_or_else(|| node_identity(&config));
    let ip = match &config.tcp.socket_ifname {
        Some(ifname) => transport_tcp::interface_addr(ifname).map_err(|e| Error::Io {
            rank,
            context: format!("SNCL_SOCKET_IFNAME={ifname}"),
            source: e,
        })?,
        None => local_ip,
    };
    // The standby store: served from creation on, so that recovery
    // (agree_on_failed, shrink) finds every live rank answering, however
    // many strangers connect (the server's handshakes are bounded and the
    // oldest unauthenticated connection is dropped first); see
    // `crate::comm::Standby`.
    let tls = sncl_bootstrap::tls::TlsIdentity::from_settings(&config.tcp.tls)?;
    let standby =
        TcpStoreServer::start_tls(SocketAddr::new(ip, 0), secret, tls.clone()).map_err(|e| {
            Error::Io {
                rank,
                context: format!("starting the standby store on {ip}"),
                source: e,
            }
        })?;
    let standby_addr = standby.local_addr();
    // Each kind's store namespace, and the context its setup sees.
    let kind_stores: Vec<PrefixStore<Arc<dyn Store>>> = registry::TRANSPORTS
        .iter()
        .map(|k| PrefixStore::new(format!("{prefix}/{}", k.name()), store.clone()))
        .collect();
    // The context a kind's setup sees, under the kind's store namespace.
    let base = SetupContext {
        rank,
        nranks,
        comm_id,
        secret,
        config: &Config::default(),
        node: &node,
        ip,
        deadline,
        now: Instant::now,
        store: &kv,
    };
    fn ctx<'a>(
        base: &SetupContext<'a>,
        config: &'a Config,
        store: &'a dyn Store,
    ) -> SetupContext<'a> {
        SetupContext {
            config,
            store,
            ..*base
        }
    }
    // 1. Prepare every kind on this rank (with this process's settings:
    // the shared ones are agreed below).
    let mut prepared: Vec<Option<Box<dyn PreparedTransport>>> = Vec::new();
    let mut states: Vec<(&'static str, KindState)> = Vec::new();
    for (i, k) in registry::TRANSPORTS.iter().enumerate() {
        match k.prepare(&ctx(&base, &config, &kind_stores[i]))? {
            Readiness::Ready(p) => {
                states.push((k.name(), KindState::Ready(p.card())));
                prepared.push(Some(p));
            }
            Readiness::Unavailable(why) => {
                tracing::debug!(rank, transport = k.name(), why = %why, "transport unavailable");
                states.push((k.name(), KindState::Unavailable(why)));
                prepared.push(None);
            }
        }
    }
    phases.end("prepare");
    kv.set(
        &format!("info/{rank}"),
        &encode_info(rank, &node, &config.shared_digest(), standby_addr, &states)?,
    )?;
    // Every rank's record, down a tree of the standby stores
    // (`setup/rendezvous.rs`).
    let records = rendezvous::Rendezvous {
        store: &kv,
        standby: &standby,
        prefix: &prefix,
        rank,
        nranks,
        secret,
        tls: tls.as_ref(),
        deadline,
        standby_of: &|p, b| Ok(decode_info(rank, p, b)?.standby),
    }
    .records()?;
    let infos = records
        .iter()
        .enumerate()
        .map(|(p, b)| decode_info(rank, p, b))
        .collect::<Result<Vec<_>>>()?;
    // Every rank plans with rank 0's settings.
    config.adopt_digest(&infos[0].digest)?;
    // 2. Choose a kind per peer from the published records alone.
    let cards: Vec<RankCard> = infos.iter().map(|i| i.card.clone()).collect();
    let transports = match kept {
        Some(kept) => kept.to_vec(),
        None => kinds::choose(
            registry::TRANSPORTS,
            config.transport.forced(),
            &cards,
            rank,
        )?,
    };
    inter_tier_over_rdma(&mut config, &cards, rank);
    // Device operations plan with the device tier where every pair of a
    // node is given a kind that moves device memory (from the published
    // records, so every rank plans alike).
    let device_tier = kinds::every_local_pair_moves(
        registry::TRANSPORTS,
        config.transport.forced(),
        &cards,
        MemoryKind::Device,
    );
    // Small all-reduces go over lanes only where every pair of ranks has
    // them: decided from the records, as a rank's own connections may all
    // have lanes while a peer's do not (a rank with a device opened is
    // given another kind to its device peers). Only at sizes lanes serve:
    // the look is at every pair of ranks.
    let every_pair_has_lanes = comm_core::transport::lane::lanes_fit(nranks)
        && kinds::every_pair_given(
            registry::TRANSPORTS,
            config.transport.forced(),
            &cards,
            |_, _| true,
            |k| k.has_lanes(),
        );
    phases.end("rendezvous");
    // 3. Connect each kind's peers, in registry order on every rank; a kind
    // that connects at first use (SNCL_RUNTIME_CONNECT=1) keeps its peers
    // for later (`setup/lazy.rs`).
    let mut conns: Vec<Option<Box<dyn Connection>>> = (0..nranks).map(|_| None).collect();
    let mut lazy_kinds = Vec::new();
    let mut pending: Vec<Option<usize>> = vec![None; nranks];
    for (i, k) in registry::TRANSPORTS.iter().enumerate() {
        let peers: Vec<usize> = (0..nranks)
            .filter(|&p| p != rank && transports[p] == k.name())
            .collect();
        let later = config.runtime_connect
            && !peers.is_empty()
            && prepared[i]
                .as_ref()
                .is_some_and(|p| p.connects_lazily(&config, nranks));
        if later {
            for &p in &peers {
                pending[p] = Some(lazy_kinds.len());
            }
            lazy_kinds.push(lazy::LazyKind {
                index: i,
                prepared: prepared[i].take().expect("checked above"),
                store: PrefixStore::new(format!("{prefix}/{}", k.name()), store.clone()),
            });
            continue;
        }
        let Some(prep) = prepared[i].as_mut() else {
            if let Some(p) = peers.first() {
                return Err(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "transport {} was chosen for peer rank {p} but is unavailable here",
                        k.name()
                    ),
                });
            }
            continue;
        };
        if peers.is_empty() {
            // Nothing to connect, and no peer waits on this rank over this
            // kind (pairs are chosen alike on both sides): its setup (the
            // shared-memory kind measures its single-copy reads) is skipped.
            continue;
        }
        for mut c in prep.connect(&ctx(&base, &config, &kind_stores[i]), &cards, &peers)? {
            let p = c.peer();
            if !peers.contains(&p) || conns[p].is_some() {
                return Err(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "transport {} returned an unexpected connection to peer rank {p}",
                        k.name()
                    ),
                });
            }
            registry::check_memory_kinds(rank, *k, &mut *c)?;
            conns[p] = Some(c);
        }
        if let Some(p) = peers.iter().find(|&&p| conns[p].is_none()) {
            return Err(Error::Bootstrap {
                rank,
                detail: format!(
                    "transport {} returned no connection to peer rank {p}",
                    k.name()
                ),
            });
        }
    }
    phases.end("connect");
    // Once everyone has connected, the kinds may drop what they published
    // for their peers (shared-memory names).
    store_barrier(&kv, "connected", nranks, wait)?;
    release_store(&kv, rank, nranks, deadline);
    phases.end("barrier");
    drop(prepared);
    let summary: Vec<String> = transports
        .iter()
        .enumerate()
        .filter(|(p, _)| *p != rank)
        .map(|(p, t)| format!("{p}:{t}"))
        .collect();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        rank,
        nranks,
        node = %node,
        transports = %summary.join(","),
        init_ms = phases.total().as_secs_f64() * 1e3,
        phases = %phases.summary(),
        "sncl communicator ready"
    );
    let standby_addrs: Vec<Option<SocketAddr>> = infos.iter().map(|i| i.standby).collect();
    let lazy = (!lazy_kinds.is_empty()).then(|| lazy::LazyConnect {
        rank,
        nranks,
        comm_id,
        secret,
        node: node.clone(),
        ip,
        cards: cards.clone(),
        kinds: lazy_kinds,
        pending_count: pending.iter().flatten().count(),
        pending,
        comm_store: PrefixStore::new(prefix.clone(), store.clone()),
        standby: standby_addrs.clone(),
    });
    let node_ids = infos.into_iter().map(|i| i.card.node).collect();
    Ok(Inner::new(InnerParts {
        rank,
        nranks,
        comm_id,
        config,
        node_ids,
        transports,
        device_tier,
        every_pair_has_lanes,
        conns,
        store: Some(store),
        secret,
        local_ip,
        server,
        standby: Some(standby),
        standby_addrs,
        lazy,
        init_phases: phases.done,
    }))
}

/// The phases of a communicator's creation, each from the end of the
/// previous one (the flight recorder keeps them: [`InitPhase`]).
struct PhaseTimer {
    at_us: u64,
    done: Vec<InitPhase>,
}

impl PhaseTimer {
    fn start() -> PhaseTimer {
        PhaseTimer {
            at_us: wall_us(),
            done: Vec::new(),
        }
    }

    /// Ends the running phase, named `phase`, now.
    fn end(&mut self, phase: &'static str) {
        let now = wall_us().max(self.at_us);
        self.done.push(InitPhase {
            phase,
            start_us: self.at_us,
            end_us: now,
        });
        self.at_us = now;
    }

    fn total(&self) -> Duration {
        self.done.iter().map(InitPhase::duration).sum()
    }

    /// `prepare 1.2 ms, rendezvous 3.4 ms, ...` (the log's).
    fn summary(&self) -> String {
        let ms = |p: &InitPhase| format!("{} {:.1} ms", p.phase, p.duration().as_secs_f64() * 1e3);
        self.done.iter().map(ms).collect::<Vec<_>>().join(", ")
    }
}

/// Keeps rank 0 (whose process serves the store) in setup until every
/// rank has read the setup's last key: a communicator destroyed right
/// after its creation would otherwise take the store away from ranks still
/// waiting for that key ("the root closed the connection"). Each other
/// rank confirms with one key; rank 0 waits for all of them, until the
/// setup's deadline. Best effort: every rank is connected by now, so a
/// rank that dies before confirming is the communicator's first failure
/// (its operations and shrink see it), not a failed creation on rank 0.
fn release_store(kv: &dyn Store, rank: usize, nranks: usize, deadline: Instant) {
    let outcome = if rank != 0 {
        kv.set(&format!("released/{rank}"), b"")
    } else {
        let keys: Vec<String> = (1..nranks).map(|p| format!("released/{p}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let left = deadline.saturating_duration_since(Instant::now());
        kv.wait(&keys, left.max(Duration::from_millis(1)))
    };
    if let Err(e) = outcome {
        tracing::warn!(
            rank,
            "setup's last handshake with the store did not complete ({e}); continuing: \
             every rank is connected"
        );
    }
}

/// Checks a rank and world size before anything is sized by them: the
/// world at most [`comm_core::MAX_RANKS`], the rank inside it.
pub(crate) fn check_world(rank: usize, nranks: usize, op: &'static str) -> Result<()> {
    if nranks > comm_core::MAX_RANKS {
        return Err(Error::InvalidArgument {
            rank,
            op,
            detail: format!(
                "{nranks} ranks exceed the limit of {} ranks per communicator",
                comm_core::MAX_RANKS
            ),
        });
    }
    if rank >= nranks {
        return Err(Error::InvalidArgument {
            rank,
            op,
            detail: format!("rank {rank} is out of range for {nranks} ranks"),
        });
    }
    Ok(())
}

/// The memory the transport kind `name` moves (empty for a name this
/// build does not have).
pub(crate) fn memory_kinds_of(name: &str) -> &'static [MemoryKind] {
    registry::TRANSPORTS
        .iter()
        .find(|k| k.name() == name)
        .map_or(&[], |k| k.memory_kinds())
}

/// Whether transport `kind` connects every pair it can on every rank:
/// forced (`SNCL_TRANSPORT=kind`), or ready in every rank's published
/// record (the registry then gives it every pair it accepts before the
/// kinds after it). From the records alone, so every rank decides alike.
fn everywhere(config: &Config, cards: &[RankCard], kind: &str) -> bool {
    match config.transport.forced() {
        Some(forced) => forced == kind,
        None => cards
            .iter()
            .all(|c| matches!(c.state(kind), KindState::Ready(_))),
    }
}

/// The planner's inter-node tier costs RDMA's where pairs on different
/// nodes use the rdma transport: forced (`SNCL_TRANSPORT=rdma`), or every
/// rank has it ready (the registry then gives rdma to every pair of
/// different nodes, before tcp). Decided from the published records alone,
/// so every rank plans alike. A topology file or `SNCL_INTER_*` wins.
fn inter_tier_over_rdma(config: &mut Config, cards: &[RankCard], rank: usize) {
    if config.tiers.inter.is_some() {
        return;
    }
    if everywhere(
        config,
        cards,
        kinds::TransportKind::name(&transport_rdma::RdmaKind),
    ) {
        config.tiers.inter = Some(comm_core::tune::LinkCost::RDMA);
        if rank == 0 {
            tracing::debug!("planner: the inter-node tier is priced as RDMA");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::config::TransportChoice;
    use comm_core::tune::LinkCost;

    fn card(rank: usize, rdma: KindState) -> RankCard {
        RankCard {
            rank,
            node: format!("n{rank}"),
            kinds: vec![("rdma".into(), rdma)],
        }
    }

    fn inter(transport: TransportChoice, cards: &[RankCard]) -> Option<LinkCost> {
        let mut c = Config {
            transport,
            ..Config::default()
        };
        inter_tier_over_rdma(&mut c, cards, 0);
        c.tiers.inter
    }

    #[test]
    fn the_inter_tier_is_priced_as_rdma_only_where_every_rank_has_it() {
        let ready = || KindState::Ready("port".into());
        let all = [card(0, ready()), card(1, ready())];
        let one_without = [
            card(0, ready()),
            card(1, KindState::Unavailable("no device".into())),
        ];
        assert_eq!(inter(TransportChoice::Auto, &all), Some(LinkCost::RDMA));
        assert_eq!(inter(TransportChoice::Auto, &one_without), None);
        assert_eq!(inter(TransportChoice::Tcp, &all), None);
        let forced = TransportChoice::parse("rdma").unwrap();
        assert_eq!(inter(forced, &one_without), Some(LinkCost::RDMA));
        // A topology file or SNCL_INTER_* wins.
        let mut c = Config::default();
        c.tiers.inter = Some(LinkCost::TCP);
        inter_tier_over_rdma(&mut c, &all, 0);
        assert_eq!(c.tiers.inter, Some(LinkCost::TCP));
    }
}
