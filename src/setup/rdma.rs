//! The `rdma` transport kind: RC queue pairs over RDMA verbs
//! (transport-rdma), between nodes; before tcp in the registry, after shm
//! (ranks of one node keep shared memory unless `SNCL_TRANSPORT=rdma`).
//!
//! Ready where libibverbs finds an ACTIVE port allowed by `SNCL_IB_HCA`, or
//! with the emulated provider (`SNCL_IB_EMULATE=1`, a test double that
//! connects processes of one machine); elsewhere it declines with the
//! reason (logged once at INFO) and pairs fall through to tcp.

use comm_core::settings::Environment;
use comm_core::transport::registry::{
    PreparedTransport, RankCard, Readiness, SetupContext, TransportKind,
};
use comm_core::transport::Connection;
use comm_core::Result;
use sncl_bootstrap::ReadEnvironment;
use transport_rdma::{Availability, IbSettings, Provider, RdmaSetup};

/// RDMA verbs between ranks (typically of different nodes).
pub(crate) struct Rdma;

/// The card of the emulated provider: it connects only processes of one
/// machine (its memory is shared memory), told apart by the boot id.
fn emulated_card() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("emulated@{boot}")
}

impl TransportKind for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness> {
        let env = Environment::from_process()?;
        let settings = IbSettings::from_env(&env)?;
        // Ports are used as rails: rank r takes the (r mod ports)-th
        // allowed ACTIVE port (no GPU proximity yet: the runtime does not
        // know its GPU's PCI bus id here).
        match transport_rdma::probe_for(&settings, ctx.rank, None) {
            Availability::Unavailable(why) => {
                transport_rdma::log_skipped(&why);
                Ok(Readiness::Unavailable(why))
            }
            Availability::Ready(provider) => {
                let card = match &provider {
                    Provider::Emulated => emulated_card(),
                    other => format!("verbs:{other}"),
                };
                Ok(Readiness::Ready(Box::new(Prepared {
                    settings,
                    provider,
                    card,
                })))
            }
        }
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        let (ca, cb) = (a.card("rdma"), b.card("rdma"));
        let emulated = |c: &str| c.starts_with("emulated@");
        match (emulated(&ca), emulated(&cb)) {
            (false, false) if ca.starts_with("verbs:") && cb.starts_with("verbs:") => Ok(()),
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
}

impl PreparedTransport for Prepared {
    fn card(&self) -> String {
        self.card.clone()
    }

    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        _cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        if peers.is_empty() {
            return Ok(Vec::new());
        }
        let setup = RdmaSetup {
            rank: ctx.rank,
            comm_id: ctx.comm_id,
            settings: self.settings.clone(),
            slots: transport_rdma::DEFAULT_SLOTS,
            slot_bytes: transport_rdma::DEFAULT_SLOT_BYTES,
            deadline: ctx.deadline,
        };
        Ok(
            transport_rdma::establish(&setup, &self.provider, ctx.store, peers)?
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Connection>)
                .collect(),
        )
    }
}
