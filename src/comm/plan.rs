//! Planning: the schedule of an operation (cached per shape) and the
//! algorithm the planner picks, or the one forced.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use comm_core::algo::{self, Algorithm, Params};
use comm_core::schedule::Schedule;
use comm_core::tune;
use comm_core::wire::Collective;
use comm_core::{DataType, Error, Result};

use super::memo::{PlanKey, MEMO_ENTRIES};
use super::{Inner, RawOp, State};

impl Inner {
    /// The schedule of `op` with the algorithm the planner chose for it.
    /// Uniform-count operations are memoised per [`PlanKey`]: the planner's
    /// cost functions and the schedule's construction run once per shape.
    /// `device`: the buffers are device memory (planned with
    /// [`Inner::device_shape`]).
    pub(crate) fn schedule(
        &self,
        st: &mut State,
        op: &RawOp,
        device: bool,
    ) -> Result<(Arc<Schedule>, Algorithm)> {
        if matches!(
            op.coll,
            Collective::AllGatherV | Collective::AllToAllV | Collective::SendRecv
        ) {
            return self.schedule_fresh(op, device);
        }
        let epoch = self.forced_epoch.load(Ordering::Acquire);
        let memo = &mut st.plans;
        if memo.epoch != epoch {
            memo.plans.clear();
            memo.epoch = epoch;
        }
        let key = PlanKey {
            coll: op.coll,
            esize: op.dtype.size(),
            count: op.count,
            root: op.root,
            device,
            algo: op.config.algorithm,
            chunk_bytes: op.config.chunk_bytes,
        };
        if let Some((s, a)) = memo.plans.get(&key) {
            return Ok((s.clone(), *a));
        }
        let planned = self.schedule_fresh(op, device)?;
        if memo.plans.len() >= MEMO_ENTRIES {
            memo.plans.clear();
        }
        memo.plans.insert(key, planned.clone());
        Ok(planned)
    }

    /// The schedule of `op` and its algorithm, planned and built now.
    pub(super) fn schedule_fresh(
        &self,
        op: &RawOp,
        device: bool,
    ) -> Result<(Arc<Schedule>, Algorithm)> {
        let plan = self.plan_call(op.coll, op.dtype, op.count, device, &op.config)?;
        let params = Params {
            nranks: self.nranks,
            rank: self.rank,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        let build = |blocks| {
            let input = algo::Input {
                p: params,
                topo: &self.topo,
                blocks,
                check_roots: self.config.check_roots,
            };
            if self.config.deterministic {
                algo::build_deterministic(op.coll, plan.algo, &input)
            } else {
                algo::build_input(op.coll, plan.algo, &input)
            }
            .ok_or_else(|| Error::Config(algo::unavailable(op.coll, plan.algo)))
        };
        let s = match op.coll {
            Collective::AllGatherV | Collective::AllToAllV => {
                let v = op.v.as_ref().ok_or_else(|| {
                    self.invalid(op.coll.name(), "variable counts are missing".into())
                })?;
                let counts = algo::VarCounts {
                    send_counts: &v.send_counts,
                    send_displs: &v.send_displs,
                    recv_counts: &v.recv_counts,
                    recv_displs: &v.recv_displs,
                };
                build(algo::Blocks::Var(counts))?
            }
            Collective::SendRecv => {
                let transfers: Vec<algo::Transfer> = op
                    .p2p
                    .iter()
                    .map(|p| algo::Transfer {
                        peer: p.peer,
                        is_send: p.is_send,
                        len: p.bytes(),
                    })
                    .collect();
                build(algo::Blocks::P2p(&transfers))?
            }
            _ => build(algo::Blocks::Uniform)?,
        };
        Ok((Arc::new(s), plan.algo))
    }

    /// The planner's choice for `coll` over `count` elements of `dtype`,
    /// with the algorithm forced for it (if any).
    pub(super) fn plan(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        device: bool,
    ) -> Result<tune::Plan> {
        self.plan_call(coll, dtype, count, device, &crate::CollConfig::default())
    }

    /// [`Inner::plan`] for a call with its own settings: the call's
    /// algorithm wins over the communicator's forced one, the call's chunk
    /// over `SNCL_CHUNK_BYTES`. The one place an operation's algorithm is
    /// decided.
    pub(super) fn plan_call(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
        device: bool,
        call: &crate::CollConfig,
    ) -> Result<tune::Plan> {
        let forced = call.algorithm.or_else(|| {
            self.forced
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .find(|(c, _)| *c == coll)
                .map(|(_, a)| *a)
        });
        let chunk_bytes = match call.chunk_bytes {
            0 => self.config.chunk_bytes,
            c => c,
        };
        let esize = dtype.size();
        // The topology file's local reduction speed (`intra.reduce_bandwidth`,
        // B/s; e.g. written by `commbench calibrate`), so the runtime charges
        // reductions as the simulator does; absent: reductions are free.
        let reduce_bytes_per_us = self
            .config
            .tiers
            .cluster
            .reduce_bytes_per_s
            .filter(|b| *b > 0.0)
            .map(|b| b / 1e6);
        tune::choose_reducing(
            coll,
            forced,
            if device {
                &self.device_shape
            } else {
                &self.shape
            },
            count.saturating_mul(esize),
            esize,
            chunk_bytes,
            reduce_bytes_per_us,
        )
    }

    /// The algorithm the planner picks for a collective of `count` elements
    /// (the lanes' one-shot all-reduce where they serve it).
    pub fn algorithm_for(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<&'static str> {
        let plan = self.plan(coll, dtype, count, false)?;
        let bytes = count.saturating_mul(dtype.size());
        if self.takes_lanes(&mut self.lock(), coll, bytes) {
            return Ok(super::lane::LANE_ALGORITHM);
        }
        Ok(plan.algo.name())
    }

    /// Forces (or releases) the algorithm of one collective; the name must
    /// be one of the collective's rows in [`algo::ALGORITHMS`].
    pub fn force_algorithm(&self, coll: Collective, algo: Option<&str>) -> Result<()> {
        let chosen = match algo {
            Some(name) => Some(
                Algorithm::parse_for(coll, name.trim())
                    .map_err(|detail| self.invalid("force_algorithm", detail))?,
            ),
            None => None,
        };
        let mut f = self.forced.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|(c, _)| *c != coll);
        f.extend(chosen.map(|a| (coll, a)));
        // Every memoised plan may have been the planner's choice where one
        // is forced now (or the forced one): the next operation starts over.
        self.forced_epoch.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::InnerParts;

    /// A communicator of `nranks` ranks over `nnodes` nodes as rank `rank`
    /// sees it, without connections: enough to plan.
    fn inner(nranks: usize, nnodes: usize, rank: usize) -> Inner {
        Inner::new(InnerParts {
            device_tier: false,
            every_pair_has_lanes: false,
            rank,
            nranks,
            comm_id: 1,
            config: comm_core::Config::default(),
            node_ids: (0..nranks).map(|r| format!("n{}", r % nnodes)).collect(),
            transports: vec!["shm"; nranks],
            conns: (0..nranks).map(|_| None).collect(),
            store: None,
            secret: [0; 16],
            local_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            server: None,
            standby: None,
            standby_addrs: vec![None; nranks],
            lazy: None,
            init_phases: Vec::new(),
        })
    }

    /// Counts from 0 to 64 Mi elements: powers of two, their neighbours,
    /// and counts that do not divide by the ranks.
    fn counts() -> Vec<usize> {
        let mut v = vec![0, 1, 2, 3, 5, 7, 1000, 12_345];
        for k in 1..=26 {
            let p = 1usize << k;
            v.extend([p - 1, p, p + 1]);
        }
        v
    }

    /// The memo returns exactly what the planner and the schedule builder
    /// return afresh (the simulator runs the same table and relies on
    /// it), on its first use of a key and on every later one.
    #[test]
    fn memoised_plans_are_the_fresh_plans() {
        let mut checked = 0;
        for (nranks, nnodes) in [(2, 1), (3, 1), (4, 1), (8, 4), (6, 2)] {
            for rank in [0, nranks - 1] {
                let c = inner(nranks, nnodes, rank);
                let mut st = c.lock();
                for coll in Collective::UNIFORM {
                    for dtype in [DataType::Float32, DataType::Float64, DataType::Float16] {
                        for count in counts() {
                            for device in [false, true] {
                                let mut op = RawOp::new(coll, dtype, count);
                                op.root = nranks - 1;
                                let fresh = c.schedule_fresh(&op, device).unwrap();
                                let planned = c.plan(coll, dtype, count, device).unwrap();
                                assert_eq!(fresh.1, planned.algo);
                                for _ in 0..2 {
                                    let (s, a) = c.schedule(&mut st, &op, device).unwrap();
                                    assert_eq!(a, fresh.1, "{coll:?} {dtype:?} {count} {nranks}");
                                    assert_eq!(*s, *fresh.0, "{coll:?} {dtype:?} {count} {nranks}");
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    /// Forcing an algorithm (and releasing it) takes effect on the next
    /// operation although its shape is memoised.
    #[test]
    fn forcing_an_algorithm_starts_the_memo_over() {
        let c = inner(4, 1, 0);
        let mut st = c.lock();
        let op = RawOp::new(Collective::AllReduce, DataType::Float32, 2);
        let algo = |st: &mut State| c.schedule(st, &op, false).unwrap().1;
        assert_eq!(algo(&mut st), Algorithm::Rd);
        assert_eq!(algo(&mut st), Algorithm::Rd);
        c.force_algorithm(Collective::AllReduce, Some("ring"))
            .unwrap();
        assert_eq!(algo(&mut st), Algorithm::Ring);
        let ring = c.schedule(&mut st, &op, false).unwrap().0;
        assert_eq!(*ring, *c.schedule_fresh(&op, false).unwrap().0);
        // Forcing another collective leaves this one's choice as it was.
        c.force_algorithm(Collective::Broadcast, Some("ring"))
            .unwrap();
        assert_eq!(algo(&mut st), Algorithm::Ring);
        c.force_algorithm(Collective::AllReduce, None).unwrap();
        assert_eq!(algo(&mut st), Algorithm::Rd);
    }

    /// The memo stays bounded whatever the variety of shapes.
    #[test]
    fn the_memo_stays_bounded() {
        let c = inner(2, 1, 0);
        let mut st = c.lock();
        for count in 0..3 * MEMO_ENTRIES {
            let op = RawOp::new(Collective::AllReduce, DataType::Float32, count);
            c.schedule(&mut st, &op, false).unwrap();
            assert!(st.plans.plans.len() <= MEMO_ENTRIES);
        }
    }
}
