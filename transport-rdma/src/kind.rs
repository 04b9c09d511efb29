//! The `rdma` transport kind: RC queue pairs over RDMA verbs
//! (transport-rdma), between nodes; before tcp in the registry, after shm
//! (ranks of one node keep shared memory unless `SNCL_TRANSPORT=rdma`).
//!
//! Ready where libibverbs finds an ACTIVE port allowed by `SNCL_IB_HCA`, or
//! with the emulated provider (`SNCL_IB_EMULATE=1`, a test double that
//! connects processes of one machine); elsewhere it declines with the
//! reason (logged once at INFO) and pairs fall through to tcp.
//!
//! Which port, where a node has several (rails): the one nearest this
//! process's GPU in the PCI tree, ties and unknown topology shared out by
//! the rank's index among the ranks of its node (`crate::probe_for`).
//! The port is chosen at connect, once every rank's node is known; the GPU
//! is the CUDA device current on the setting-up thread, else the one device
//! `CUDA_VISIBLE_DEVICES` leaves visible.

use crate::{Availability, IbSettings, Provider, RdmaSetup};
use comm_core::settings::Environment;
use comm_core::transport::registry::{
    MemoryKind, PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::Result;
use device::Backend;
use sncl_bootstrap::ReadEnvironment;

/// RDMA verbs between ranks (typically of different nodes).
pub struct RdmaKind;

/// The card of the emulated provider: it connects only processes of one
/// machine (its memory is shared memory), told apart by the boot id.
fn emulated_card() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("emulated@{boot}")
}

impl TransportKind for RdmaKind {
    fn name(&self) -> &'static str {
        "rdma"
    }

    /// Device memory through the NIC (GPUDirect RDMA) where both sides
    /// can take part — `SNCL_IB_GDR` is not 0, the device exports
    /// dma-bufs, libibverbs has `ibv_reg_dmabuf_mr`, the inbox registers —
    /// decided per pair at its first device operation; else device pieces
    /// are staged through host memory (`SNCL_IB_GDR=1`: an error instead).
    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        let settings = ctx.config.ib.clone();
        // Which GPU this process sees (its NIC is the one nearest it): not a
        // setting, the launcher's CUDA_VISIBLE_DEVICES.
        let env = Environment::from_process()?;
        // Whether a port is usable at all; which one, at connect (the
        // rank's index in its node is known once the cards are).
        match crate::probe(&settings) {
            Availability::Unavailable(why) => {
                crate::log_skipped(&why);
                Ok(Readiness::Unavailable(why))
            }
            Availability::Ready(provider) => {
                // Pinning the FIFOs to every other rank must be allowed by
                // the kernel's rule, or no pair of this rank uses RDMA: they
                // fall back to TCP together (unless SNCL_TRANSPORT=rdma
                // asks for RDMA, which then fails with this reason).
                let real_pinning = match provider {
                    Provider::Emulated => settings.emulate_strict,
                    Provider::Device { .. } => true,
                };
                let rules = crate::sys::PinRules::of_process();
                let peers = ctx.nranks.saturating_sub(1);
                if let Some(why) = crate::memlock_shortfall(&rules, peers).filter(|_| real_pinning)
                {
                    tracing::warn!(
                        rank = ctx.rank,
                        "rdma transport not used, TCP instead: {why}"
                    );
                    return Ok(Readiness::Unavailable(why));
                }
                // (With several ports, the card names the first allowed;
                // peers only check that it is a real device.)
                let card = match &provider {
                    Provider::Emulated => emulated_card(),
                    // With the fabrics of every port this rank may use, so
                    // that pairs with none in common are refused up front.
                    other => {
                        let ports = crate::list_ports().unwrap_or_default();
                        let fabrics: Vec<String> = crate::usable_ports(&settings, &ports)
                            .iter()
                            .map(crate::DevicePort::fabric)
                            .collect();
                        format!("verbs:{other}{}", crate::fabric::card_suffix(&fabrics))
                    }
                };
                Ok(Readiness::Ready(Box::new(Prepared {
                    settings,
                    provider,
                    card,
                    env,
                })))
            }
        }
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        let (ca, cb) = (a.card("rdma"), b.card("rdma"));
        let emulated = |c: &str| c.starts_with("emulated@");
        match (emulated(&ca), emulated(&cb)) {
            (false, false) if ca.starts_with("verbs:") && cb.starts_with("verbs:") => {
                crate::fabric::share_a_fabric((a.rank, &ca), (b.rank, &cb))
            }
            (true, true) if ca == cb => Ok(()),
            (true, true) => Err(format!(
                "the emulated RDMA provider connects processes of one machine, and ranks {} and {} \
                 run on different machines",
                a.rank, b.rank
            )),
            _ => Err(format!(
                "rank {} uses {:?} and rank {} uses {:?}: the emulated provider and real devices \
                 do not connect",
                a.rank, ca, b.rank, cb
            )),
        }
    }
}

struct Prepared {
    settings: IbSettings,
    provider: Provider,
    card: String,
    env: Environment,
}

/// This rank's index among the ranks of its node (`cards[p]` is rank `p`'s).
fn local_rank(cards: &[RankCard], rank: usize, node: &str) -> usize {
    cards
        .iter()
        .filter(|c| c.node == node && c.rank < rank)
        .count()
}

/// Whether `CUDA_VISIBLE_DEVICES` leaves exactly one device visible (then
/// it is ordinal 0 of this process).
fn one_visible_device(env: &Environment) -> bool {
    env.get("CUDA_VISIBLE_DEVICES").is_some_and(|v| {
        // CUDA stops at the first invalid entry (`-1`, an empty one).
        let valid = v
            .split(',')
            .map(str::trim)
            .take_while(|id| !id.is_empty() && !id.starts_with('-'))
            .count();
        valid == 1
    })
}

/// The PCI bus id of this process's CUDA device, where setup knows it: the
/// device current on this thread, else the only one `CUDA_VISIBLE_DEVICES`
/// leaves visible. `None` without CUDA.
fn gpu_bus_id(env: &Environment) -> Option<String> {
    let ordinal = match device::current_device(Backend::Cuda) {
        Ok(Some(o)) => o,
        _ if one_visible_device(env) => 0,
        _ => return None,
    };
    match device::open(Backend::Cuda, ordinal).and_then(|d| d.pci_bus_id()) {
        Ok(bus) => Some(bus),
        Err(e) => {
            tracing::debug!("rdma: the GPU's PCI bus id is unknown ({e}); ports by local rank");
            None
        }
    }
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        self.card.clone()
    }

    /// Yes (issue 36, risk 7): a pair's queue pairs, FIFOs and liveness
    /// socket are made at its first operation, so a job pins and connects
    /// only what its schedules use (`establish` keys every exchange by the
    /// pair and publishes for every peer of a call before it waits).
    fn connects_lazily(&self, _config: &comm_core::Config, _nranks: usize) -> bool {
        true
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
        let provider = match &self.provider {
            Provider::Emulated => Provider::Emulated,
            Provider::Device { .. } => {
                let local = local_rank(cards, ctx.rank, ctx.node);
                match crate::probe_for(&self.settings, local, || gpu_bus_id(&self.env)) {
                    Availability::Ready(p) => p,
                    // The ports changed since `prepare`: its choice.
                    Availability::Unavailable(why) => {
                        tracing::warn!(
                            rank = ctx.rank,
                            "rdma: choosing a port again: {why}; using {}",
                            self.provider
                        );
                        self.provider.clone()
                    }
                }
            }
        };
        let setup = RdmaSetup {
            rank: ctx.rank,
            comm_id: ctx.comm_id,
            settings: self.settings.clone(),
            slots: crate::DEFAULT_SLOTS,
            slot_bytes: crate::DEFAULT_SLOT_BYTES,
            deadline: ctx.deadline,
            liveness_ip: Some(ctx.ip),
            context: crate::ContextScope::Process,
        };
        Ok(crate::establish(&setup, &provider, ctx.store, peers)?
            .into_iter()
            .map(|c| Box::new(c) as Box<dyn Connection>)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(rank: usize, node: &str) -> RankCard {
        RankCard {
            rank,
            node: node.into(),
            kinds: Vec::new(),
        }
    }

    #[test]
    fn the_local_rank_counts_lower_ranks_of_the_same_node() {
        let cards = [
            card(0, "a"),
            card(1, "b"),
            card(2, "a"),
            card(3, "b"),
            card(4, "a"),
        ];
        let local: Vec<usize> = cards
            .iter()
            .map(|c| local_rank(&cards, c.rank, &c.node))
            .collect();
        assert_eq!(local, [0, 0, 1, 1, 2]);
    }

    #[test]
    fn one_visible_device_is_known_from_the_environment() {
        let env = |v: &str| Environment::from_pairs([("CUDA_VISIBLE_DEVICES", v)]);
        assert!(one_visible_device(&env("3")));
        assert!(one_visible_device(&env(" GPU-8a3f0c1e ")));
        assert!(one_visible_device(&env("2,-1,3")), "CUDA stops at -1");
        for many_or_none in ["0,1", "", "-1", "-1,2"] {
            assert!(!one_visible_device(&env(many_or_none)), "{many_or_none:?}");
        }
        assert!(!one_visible_device(&Environment::default()));
    }
}

#[cfg(test)]
mod fabric_tests {
    use super::*;
    use comm_core::transport::registry::KindState;

    fn rdma_card(rank: usize, card: &str) -> RankCard {
        RankCard {
            rank,
            node: format!("n{rank}"),
            kinds: vec![("rdma".into(), KindState::Ready(card.into()))],
        }
    }

    /// Issue 36, risk 5: an InfiniBand rank and a RoCE rank are refused
    /// before connecting (their pair falls back to TCP), naming both
    /// fabrics; ranks with a fabric in common pair.
    #[test]
    fn ranks_without_a_fabric_in_common_are_refused_before_connecting() {
        let ib = rdma_card(0, "verbs:mlx5_0:1;fabrics=ib/fe80000000000000");
        let eth = rdma_card(1, "verbs:mlx5_1:1;fabrics=eth");
        let e = RdmaKind.can_connect(&ib, &eth).unwrap_err();
        assert!(
            e.contains("ib/fe80000000000000") && e.contains("[eth]"),
            "{e}"
        );
        let ib2 = rdma_card(2, "verbs:mlx5_3:1;fabrics=eth,ib/fe80000000000000");
        assert!(RdmaKind.can_connect(&ib, &ib2).is_ok());
        assert!(RdmaKind.can_connect(&eth, &ib2).is_ok());
    }
}
