//! Communicator split (like `ncclCommSplit` / `MPI_Comm_split`) and the
//! usual 2-D layout of a data-parallel job on supernodes: groups inside a
//! node (tensor / sequence parallel) and replica groups across nodes.
//!
//! A sub-communicator rendezvouses through its parent's store (no new root)
//! and connects only its own members; connections themselves are not shared
//! between communicators.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use comm_core::{Error, Result};

use crate::{setup, Communicator};

/// Hash of the parent id, the split's sequence number and the color.
fn child_id(parent: u64, split: u64, color: i64) -> u64 {
    // FNV-1a over the three values: identical on every rank.
    comm_core::hash::fnv1a(
        [parent, split, color as u64]
            .into_iter()
            .flat_map(u64::to_le_bytes),
    )
}

impl Communicator {
    /// Splits this communicator: ranks passing the same `color` form a new
    /// communicator, ordered by `key` then by rank here. `color = None`
    /// takes part without joining any (like `NCCL_SPLIT_NOCOLOR`). Every
    /// rank must call it, in the same order relative to other operations.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.split_configured(color, key, |_| {})
    }

    /// [`Communicator::split`] with `adjust` applied to the new
    /// communicator's configuration (a copy of this one's) before it connects.
    pub(crate) fn split_configured(
        &self,
        color: Option<u32>,
        key: i64,
        adjust: impl FnOnce(&mut comm_core::Config),
    ) -> Result<Option<Communicator>> {
        let (n, r) = (self.size(), self.rank());
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * n];
        self.all_gather(&mine, &mut all)?;
        let split = self.inner.splits.fetch_add(1, Ordering::SeqCst);
        let Some(color) = color else {
            return Ok(None);
        };
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|&q| all[2 * q] == i64::from(color))
            .map(|q| (all[2 * q + 1], q))
            .collect();
        members.sort();
        let new_rank = members.iter().position(|&(_, q)| q == r).expect("member");
        let store = self.inner.store.clone().ok_or_else(|| Error::Bootstrap {
            rank: r,
            detail: "this communicator has no store to split through".into(),
        })?;
        let comm_id = child_id(self.comm_id(), split, i64::from(color));
        let mut config = self.inner.config.clone();
        config.node_id = Some(self.inner.node_ids[r].clone());
        adjust(&mut config);
        let inner = setup::build(setup::SetupArgs {
            store: Arc::clone(&store),
            rank: new_rank,
            nranks: members.len(),
            comm_id,
            secret: self.inner.secret,
            wait: config.timeout,
            config,
            local_ip: self.inner.local_ip,
            server: None,
        })?;
        Ok(Some(Communicator::from_inner(inner)))
    }

    /// The 2-D layout in one call: `(node, replicas)` where `node` holds
    /// this node's ranks (ordered by rank) and `replicas` the ranks with the
    /// same local rank on every node (ordered by node). Data-parallel
    /// gradients then go `node` reduce-scatter → `replicas` all-reduce →
    /// `node` all-gather.
    pub fn split_2d(&self) -> Result<(Communicator, Communicator)> {
        self.split_2d_configured(|_| {})
    }

    /// [`Communicator::split_2d`] with `adjust_replicas` applied to the
    /// replica communicator's configuration.
    pub(crate) fn split_2d_configured(
        &self,
        adjust_replicas: impl FnOnce(&mut comm_core::Config),
    ) -> Result<(Communicator, Communicator)> {
        let topo = &self.inner.topo;
        let r = self.rank();
        let node = topo.node_of[r];
        let local = topo.local_rank(r);
        let intra = self
            .split(Some(node as u32), r as i64)?
            .expect("has a color");
        let inter = self
            .split_configured(Some(local as u32), node as i64, adjust_replicas)?
            .expect("has a color");
        Ok((intra, inter))
    }
}
