//! Transport *kinds* and the choice of one per peer pair.
//!
//! A [`TransportKind`] is one way of connecting two ranks (`self`, `shm`,
//! `tcp`, later `nvlink`, `rdma`). The runtime keeps them in one ordered
//! list, most preferred first (the root crate's `src/setup/registry.rs`);
//! setup then runs in three phases on every rank:
//!
//! 1. **prepare**: each kind checks what it needs on this rank (a device,
//!    a library, a setting) and either declines with the missing
//!    requirement or readies itself (binds a listener, opens a device) and
//!    states a one-line *card* — what peers need to decide and to connect
//!    (an address, a port GUID). Every rank publishes its cards.
//! 2. **choose**: [`choose`] gives each peer pair the first kind, in
//!    registry order, that is ready on both ranks and whose
//!    [`TransportKind::can_connect`] accepts the pair. It reads only
//!    published cards and is symmetric, so both ranks of a pair decide the
//!    same way without talking. `SNCL_TRANSPORT=<name>` forces one kind
//!    between every pair of distinct ranks and fails naming the missing
//!    requirement where it cannot.
//! 3. **connect**: every rank runs [`PreparedTransport::connect`] of every
//!    kind in registry order with the peers given to that kind (possibly
//!    none). A kind may exchange per-pair information (queue-pair numbers,
//!    memory keys, segment names) through its own store namespace
//!    ([`SetupContext::store`]): publish everything first, then read the
//!    peers'. Since all ranks visit the kinds in the same order, a kind
//!    waits only on peers that are in the same kind's connect.
//!
//! The prepared objects live until every rank has connected (a store
//! barrier), then are dropped: that is where a kind removes names it
//! published for its peers to open.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::Connection;
pub use super::{check_name, MemoryKind};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;

/// What a kind's setup may use.
pub struct SetupContext<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// The communicator's id.
    pub comm_id: u64,
    /// The job secret (connections prove they know it).
    pub secret: [u8; 16],
    /// The settings every rank plans with (rank 0's shared settings).
    pub config: &'a Config,
    /// This rank's node identity.
    pub node: &'a str,
    /// The address to listen on (`SNCL_SOCKET_IFNAME`'s, else the bootstrap's).
    pub ip: IpAddr,
    /// Every wait of the setup ends here with an error.
    pub deadline: Instant,
    /// The clock [`SetupContext::deadline`] is measured by, handed in by
    /// the caller (`Instant::now`; comm-core reads no clock itself).
    pub now: fn() -> Instant,
    /// The store, under a namespace of this communicator and this kind
    /// (`sncl/<comm>/<kind>/`): keys a kind sets cannot collide with
    /// another kind's or the runtime's.
    pub store: &'a dyn Store,
}

impl SetupContext<'_> {
    /// Time left until [`SetupContext::deadline`] (at least 1 ms, so that a
    /// store request still says what it waited for).
    pub fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since((self.now)())
            .max(Duration::from_millis(1))
    }
}

/// Whether the kind named `name` in `kinds` moves `mem` (false for a name
/// that is not there).
pub fn moves(kinds: &[&dyn TransportKind], name: &str, mem: MemoryKind) -> bool {
    kinds
        .iter()
        .find(|k| k.name() == name)
        .is_some_and(|k| k.memory_kinds().contains(&mem))
}

/// A kind's state on one rank, as that rank published it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindState {
    /// Ready; the card says what peers need (may be empty).
    Ready(String),
    /// Not usable on that rank; the missing requirement.
    Unavailable(String),
}

/// What one rank published: its node and the state of every kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankCard {
    /// The rank.
    pub rank: usize,
    /// Its node identity.
    pub node: String,
    /// `(kind name, state)`, one per kind the rank knows.
    pub kinds: Vec<(String, KindState)>,
}

impl RankCard {
    /// The state of kind `name`. A rank that stated nothing about a kind
    /// (a record written without it) counts as ready with an empty card;
    /// a kind that needs a card refuses that in `can_connect`.
    pub fn state(&self, name: &str) -> KindState {
        self.kinds
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .unwrap_or(KindState::Ready(String::new()))
    }

    /// The card of kind `name` (empty where the rank stated none).
    pub fn card(&self, name: &str) -> String {
        match self.state(name) {
            KindState::Ready(c) => c,
            KindState::Unavailable(_) => String::new(),
        }
    }
}

/// The outcome of [`TransportKind::prepare`] on this rank.
pub enum Readiness {
    /// Usable here: the prepared state, which states the card and connects.
    Ready(Box<dyn PreparedTransport>),
    /// Not usable here: the missing requirement ("libibverbs not found",
    /// "SNCL_IB_DISABLE=1"), shown when a forced choice needs this kind.
    Unavailable(String),
}

/// One way of connecting two ranks. Implementations are stateless values
/// listed once in the runtime's registry; per-communicator state lives in
/// the [`PreparedTransport`] that [`TransportKind::prepare`] returns.
pub trait TransportKind: Sync {
    /// The name (`SNCL_TRANSPORT=<name>`, `Communicator::transports()`, the
    /// init line): lower-case letters, digits, `-` or `_`.
    fn name(&self) -> &'static str;

    /// The memory its connections move ([`MemoryKind`]): every kind lists
    /// [`MemoryKind::Host`]; a kind lists [`MemoryKind::Device`] exactly
    /// when its connections move device regions (the setup checks each
    /// connection's [`Connection::memory_kinds`] against this, so the executor's choice — device to
    /// device, or staged through host memory — follows the declaration).
    fn memory_kinds(&self) -> &'static [MemoryKind];

    /// Checks this rank's requirements and readies the kind (an error here
    /// fails the setup: something that should work did not). `ctx.config`
    /// is still this process's own: the shared settings are agreed (rank
    /// 0's adopted) only after the records are exchanged, so a kind reads
    /// only per-process settings here and shared ones in `connect`.
    fn prepare(&self, ctx: &SetupContext<'_>) -> Result<Readiness>;

    /// Whether this kind can connect ranks `a` and `b` (`a.rank <= b.rank`;
    /// both ready for this kind), from their published cards alone. `Err`
    /// names the missing requirement ("ranks 0 and 3 are on different
    /// nodes"). It must depend only on the two cards, so both ranks of the
    /// pair decide the same way.
    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String>;

    /// Whether this kind's connections carry lanes
    /// ([`Connection::lane`]): the runtime runs small all-reduces over
    /// lanes only where [`every_pair_given`] says every pair of ranks has
    /// such a kind, so every rank decides alike.
    fn has_lanes(&self) -> bool {
        false
    }
}

/// A kind readied on this rank for one communicator.
pub trait PreparedTransport: Send {
    /// The one-line card every rank will see in [`RankCard::kinds`].
    fn card(&self) -> String;

    /// Connects to `peers` (those [`choose`] gave this kind; maybe none),
    /// returning one connection per peer, in any order. `cards[p]` is rank
    /// `p`'s published record. Runs on every rank for every kind, in
    /// registry order; every wait ends at [`SetupContext::deadline`].
    fn connect(
        &mut self,
        ctx: &SetupContext<'_>,
        cards: &[RankCard],
        peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>>;

    /// Whether this kind's pairs may be connected at their first use
    /// instead of at init (`SNCL_RUNTIME_CONNECT`): the runtime then calls
    /// [`PreparedTransport::connect`] again later, for the peers an
    /// operation needs, with a fresh deadline; every call must then use
    /// store keys of its own pairs only (both ranks of a pair connect it
    /// together, possibly in different batches), and must publish what
    /// its peers wait for before it waits on any of them. `config` is the
    /// communicator's (rank 0's shared settings adopted, so every rank
    /// answers alike) and `nranks` its size. The default: no (connected at
    /// init).
    fn connects_lazily(&self, config: &Config, nranks: usize) -> bool {
        let _ = (config, nranks);
        false
    }
}

/// The kind that connects a rank to itself: data never leaves the process
/// (the executor copies it), so there is no connection.
pub struct SelfKind;

struct SelfPrepared;

impl PreparedTransport for SelfPrepared {
    fn card(&self) -> String {
        String::new()
    }

    fn connect(
        &mut self,
        _ctx: &SetupContext<'_>,
        _cards: &[RankCard],
        _peers: &[usize],
    ) -> Result<Vec<Box<dyn Connection>>> {
        Ok(Vec::new())
    }
}

impl TransportKind for SelfKind {
    fn name(&self) -> &'static str {
        "self"
    }

    /// The executor copies within the rank's own memory, host or device.
    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
        Ok(Readiness::Ready(Box::new(SelfPrepared)))
    }

    fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
        if a.rank == b.rank {
            Ok(())
        } else {
            Err(format!(
                "self connects a rank only to itself, and ranks {} and {} are two",
                a.rank, b.rank
            ))
        }
    }
}

/// Gives every peer of rank `me` a kind: for `p == me` the first kind that
/// accepts the pair (`self`); for another rank the forced kind, or the
/// first kind in `kinds`' order that is ready on both ranks and accepts the
/// pair. Returns each peer's kind name, indexed by rank.
///
/// Errors (naming this rank, the peer and the missing requirement): a
/// forced name that is not in `kinds`, a forced kind not ready on one of
/// the two ranks or refusing the pair, or a pair no kind accepts.
pub fn choose(
    kinds: &[&dyn TransportKind],
    forced: Option<&str>,
    cards: &[RankCard],
    me: usize,
) -> Result<Vec<&'static str>> {
    let fail = |detail: String| Error::Bootstrap { rank: me, detail };
    let known = || {
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let forced_kind = match forced {
        None => None,
        Some(name) => Some(*kinds.iter().find(|k| k.name() == name).ok_or_else(|| {
            fail(format!(
                "SNCL_TRANSPORT={name}: no such transport in this build (known: {})",
                known()
            ))
        })?),
    };
    let Some(mine) = cards.get(me) else {
        return Err(fail(format!(
            "rank {me} has no published record ({} ranks)",
            cards.len()
        )));
    };
    let mut out = Vec::with_capacity(cards.len());
    for peer in cards {
        let chosen = match forced_kind {
            Some(k) if peer.rank != me => {
                accepts(k, mine, peer).map_err(|why| {
                    fail(format!(
                        "SNCL_TRANSPORT={} cannot connect rank {me} with peer rank {}: {why}",
                        k.name(),
                        peer.rank
                    ))
                })?;
                k
            }
            _ => first_accepting(kinds, mine, peer).map_err(|refusals| {
                fail(format!(
                    "no transport can connect rank {me} with peer rank {} ({refusals})",
                    peer.rank
                ))
            })?,
        };
        out.push(chosen.name());
    }
    Ok(out)
}

/// Whether kind `k` can connect the ranks of cards `x` and `y` (in either
/// order): ready on both, and its `can_connect` accepts the pair.
fn accepts(k: &dyn TransportKind, x: &RankCard, y: &RankCard) -> std::result::Result<(), String> {
    let (a, b) = if x.rank <= y.rank { (x, y) } else { (y, x) };
    for c in [a, b] {
        if let KindState::Unavailable(why) = c.state(k.name()) {
            return Err(format!("rank {} cannot use {}: {why}", c.rank, k.name()));
        }
    }
    k.can_connect(a, b)
}

/// The first kind in `kinds`' order that connects `x` and `y`, or every
/// kind's refusal.
fn first_accepting<'k>(
    kinds: &[&'k dyn TransportKind],
    x: &RankCard,
    y: &RankCard,
) -> std::result::Result<&'k dyn TransportKind, String> {
    let mut refusals = Vec::new();
    for k in kinds {
        match accepts(*k, x, y) {
            Ok(()) => return Ok(*k),
            Err(why) => refusals.push(format!("{}: {why}", k.name())),
        }
    }
    Err(refusals.join("; "))
}

/// Whether every pair of distinct ranks on one node gets a kind (as
/// [`choose`] gives it on both ranks: the forced one, else the first that
/// accepts) that moves `mem`. The runtime plans device operations with the
/// device tier where this holds for [`MemoryKind::Device`]. See
/// [`every_pair_given`].
pub fn every_local_pair_moves(
    kinds: &[&dyn TransportKind],
    forced: Option<&str>,
    cards: &[RankCard],
    mem: MemoryKind,
) -> bool {
    every_pair_given(
        kinds,
        forced,
        cards,
        |a, b| a.node == b.node,
        |k| k.memory_kinds().contains(&mem),
    )
}

/// Whether every pair of distinct ranks that `pair` selects gets a kind
/// (as [`choose`] gives it on both ranks: the forced one, else the first
/// that accepts) for which `wanted` holds. From the published cards alone,
/// so every rank decides alike, where each rank's own connections could
/// differ (a rank with a device has other kinds than one without); false
/// where a pair has no kind (the setup fails there anyway) or `forced`
/// names no kind in `kinds`.
pub fn every_pair_given(
    kinds: &[&dyn TransportKind],
    forced: Option<&str>,
    cards: &[RankCard],
    pair: impl Fn(&RankCard, &RankCard) -> bool,
    wanted: impl Fn(&dyn TransportKind) -> bool,
) -> bool {
    let forced_kind = match forced {
        Some(name) => match kinds.iter().find(|k| k.name() == name) {
            Some(k) => Some(*k),
            None => return false,
        },
        None => None,
    };
    cards.iter().enumerate().all(|(i, a)| {
        cards[i + 1..].iter().filter(|b| pair(a, b)).all(|b| {
            let kind = match forced_kind {
                Some(k) => accepts(k, a, b).map(|()| k),
                None => first_accepting(kinds, a, b),
            };
            kind.is_ok_and(&wanted)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects ranks on one node that both publish a non-empty card.
    struct SameNode(&'static str);

    impl TransportKind for SameNode {
        fn name(&self) -> &'static str {
            self.0
        }
        fn memory_kinds(&self) -> &'static [MemoryKind] {
            &[MemoryKind::Host, MemoryKind::Device]
        }
        fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
            Ok(Readiness::Unavailable("not in tests".into()))
        }
        fn can_connect(&self, a: &RankCard, b: &RankCard) -> std::result::Result<(), String> {
            if a.node != b.node {
                return Err(format!(
                    "ranks {} and {} are on different nodes",
                    a.rank, b.rank
                ));
            }
            if a.card(self.0).is_empty() || b.card(self.0).is_empty() {
                return Err("a rank published no card".into());
            }
            Ok(())
        }
    }

    /// Connects anything.
    struct Any;

    impl TransportKind for Any {
        fn name(&self) -> &'static str {
            "any"
        }
        fn memory_kinds(&self) -> &'static [MemoryKind] {
            &[MemoryKind::Host]
        }
        fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
            Ok(Readiness::Unavailable("not in tests".into()))
        }
        fn can_connect(&self, _a: &RankCard, _b: &RankCard) -> std::result::Result<(), String> {
            Ok(())
        }
    }

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

    const FAST: SameNode = SameNode("fast");

    fn registry() -> [&'static dyn TransportKind; 3] {
        [&SelfKind, &FAST, &Any]
    }

    fn world() -> Vec<RankCard> {
        vec![
            card(0, "a", &[("fast", ready("x"))]),
            card(1, "a", &[("fast", ready("y"))]),
            card(2, "b", &[("fast", ready("z"))]),
            card(
                3,
                "a",
                &[("fast", KindState::Unavailable("no device".into()))],
            ),
        ]
    }

    #[test]
    fn first_kind_that_accepts_wins_and_both_sides_agree() {
        let cards = world();
        let all: Vec<Vec<&str>> = (0..4)
            .map(|me| choose(&registry(), None, &cards, me).unwrap())
            .collect();
        assert_eq!(all[0], ["self", "fast", "any", "any"]);
        for (i, row) in all.iter().enumerate() {
            for (j, kind) in row.iter().enumerate() {
                assert_eq!(*kind, all[j][i], "ranks {i} and {j} disagree");
            }
        }
    }

    #[test]
    fn forcing_names_the_missing_requirement() {
        let cards = world();
        assert_eq!(
            choose(&registry(), Some("any"), &cards, 0).unwrap(),
            ["self", "any", "any", "any"]
        );
        let e = choose(&registry(), Some("fast"), &cards, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0") && e.contains("peer rank 2") && e.contains("different nodes"),
            "{e}"
        );
        let e = choose(&registry(), Some("fast"), &cards, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer rank 2"), "{e}");
        let mut w = world();
        w[2] = card(2, "a", &[]);
        let e = choose(&registry(), Some("fast"), &w, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer rank 2: a rank published no card"), "{e}");
        w[2] = card(2, "a", &[("fast", ready("z"))]);
        let e = choose(&registry(), Some("fast"), &w, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("peer rank 3: rank 3 cannot use fast: no device"),
            "{e}"
        );
        let e = choose(&registry(), Some("self"), &cards, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("only to itself"), "{e}");
        let e = choose(&registry(), Some("warp"), &cards, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SNCL_TRANSPORT=warp") && e.contains("self, fast, any"),
            "{e}"
        );
    }

    #[test]
    fn no_kind_at_all_lists_every_refusal() {
        let cards = world();
        let e = choose(&[&SelfKind, &FAST], None, &cards, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no transport can connect rank 0 with peer rank 2")
                && e.contains("self: ")
                && e.contains("fast: ranks 0 and 2 are on different nodes"),
            "{e}"
        );
    }

    #[test]
    fn device_memory_follows_the_kinds_chosen_within_each_node() {
        let device = |kinds: &[&dyn TransportKind], forced, cards: &[RankCard]| {
            every_local_pair_moves(kinds, forced, cards, MemoryKind::Device)
        };
        // Rank 3 shares node "a" but has no "fast": its pairs go over
        // "any", which moves host memory only.
        assert!(!device(&registry(), None, &world()));
        let mut w = world();
        w.truncate(3);
        // Ranks 0 and 1 use "fast" (device too); rank 2 is alone on "b".
        assert!(device(&registry(), None, &w));
        assert!(!device(&registry(), Some("any"), &w));
        assert!(!device(&registry(), Some("warp"), &w));
        assert!(!device(&[&SelfKind, &Any], None, &w));
        // No kind accepts a pair: no device tier (and the setup fails).
        assert!(!device(&[&SelfKind, &FAST], None, &world()));
        assert!(moves(&registry(), "fast", MemoryKind::Device));
        assert!(moves(&registry(), "any", MemoryKind::Host));
        assert!(!moves(&registry(), "any", MemoryKind::Device));
        assert!(!moves(&registry(), "warp", MemoryKind::Host));
        assert_eq!(MemoryKind::Device.name(), "device");
    }

    /// Connects anything, with lanes.
    struct Lined;

    impl TransportKind for Lined {
        fn name(&self) -> &'static str {
            "lined"
        }
        fn memory_kinds(&self) -> &'static [MemoryKind] {
            &[MemoryKind::Host]
        }
        fn prepare(&self, _ctx: &SetupContext<'_>) -> Result<Readiness> {
            Ok(Readiness::Unavailable("not in tests".into()))
        }
        fn can_connect(&self, _a: &RankCard, _b: &RankCard) -> std::result::Result<(), String> {
            Ok(())
        }
        fn has_lanes(&self) -> bool {
            true
        }
    }

    /// Ranks 0 and 1 share "fast" (no lanes), rank 2 has none: rank 2's
    /// own peers all get "lined", yet not every pair has lanes, and every
    /// rank reads that alike from the cards.
    #[test]
    fn a_pair_without_lanes_is_seen_by_every_rank() {
        let kinds: [&dyn TransportKind; 3] = [&SelfKind, &FAST, &Lined];
        let lanes = |cards: &[RankCard]| {
            every_pair_given(&kinds, None, cards, |_, _| true, |k| k.has_lanes())
        };
        let mut cards = vec![
            card(0, "a", &[("fast", ready("x"))]),
            card(1, "a", &[("fast", ready("y"))]),
            card(2, "a", &[]),
        ];
        let mine = choose(&kinds, None, &cards, 2).unwrap();
        assert_eq!(mine, ["lined", "lined", "self"]);
        assert_eq!(choose(&kinds, None, &cards, 0).unwrap()[1], "fast");
        assert!(!lanes(&cards));
        assert!(every_pair_given(
            &kinds,
            Some("lined"),
            &cards,
            |_, _| true,
            |k| k.has_lanes()
        ));
        cards[0] = card(0, "a", &[]);
        assert!(lanes(&cards));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("tcp").is_ok());
        assert!(check_name("nv-link_2").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("TCP").is_err());
        assert!(check_name("a/b").is_err());
        assert!(check_name(&"x".repeat(100)).is_err());
    }
}
