//! Planning: the schedule of an operation (cached per shape) and the
//! algorithm the planner picks, or the one forced.

use std::sync::Arc;

use comm_core::algo::{self, Params};
use comm_core::schedule::{BufId, Op, Region, Schedule};
use comm_core::tune;
use comm_core::wire::Collective;
use comm_core::{Config, DataType, Error, Result};

use super::{Inner, RawOp, ShapeKey, State};

impl Inner {
    pub(super) fn schedule(
        &self,
        st: &mut State,
        op: &RawOp,
    ) -> Result<(Arc<Schedule>, &'static str)> {
        let (n, r) = (self.nranks, self.rank);
        match op.coll {
            Collective::AllGatherV => {
                let v = op.v.as_ref().expect("v counts");
                let chunk = (self.config.chunk_bytes / op.dtype.size()).max(1);
                let s = algo::ring_all_gatherv_ordered(
                    &self.topo.ring_order(),
                    r,
                    &v.recv_counts,
                    &v.recv_displs,
                    chunk,
                );
                return Ok((Arc::new(s), "ring"));
            }
            Collective::AllToAllV => {
                let v = op.v.as_ref().expect("v counts");
                let s = algo::alltoallv(
                    n,
                    r,
                    &v.send_counts,
                    &v.send_displs,
                    &v.recv_counts,
                    &v.recv_displs,
                );
                return Ok((Arc::new(s), "pairwise"));
            }
            Collective::SendRecv => {
                let mut s = Schedule::new(n, r);
                let ops = op
                    .p2p
                    .iter()
                    .enumerate()
                    .map(|(k, p)| {
                        let reg = Region::new(BufId::Peer(k as u16), 0, p.count);
                        if p.is_send {
                            Op::Send {
                                peer: p.peer,
                                src: reg,
                            }
                        } else {
                            Op::Recv {
                                peer: p.peer,
                                dst: reg,
                            }
                        }
                    })
                    .collect();
                s.push(ops);
                return Ok((Arc::new(s), "pairwise"));
            }
            _ => {}
        }
        let plan = self.plan(op.coll, op.dtype, op.count)?;
        let key = ShapeKey {
            coll: op.coll,
            algo: plan.algo,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        if let Some(s) = st.cache.get(&key) {
            return Ok((s.clone(), plan.algo.name()));
        }
        let params = Params {
            nranks: n,
            rank: r,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        let s = algo::build(op.coll, plan.algo, &params, &self.topo).ok_or_else(|| {
            Error::Config(format!(
                "{} has no {} algorithm",
                op.coll.name(),
                plan.algo.name()
            ))
        })?;
        let s = Arc::new(s);
        if st.cache.len() > 256 {
            st.cache.clear();
        }
        st.cache.insert(key, s.clone());
        Ok((s, plan.algo.name()))
    }

    pub(super) fn plan(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<tune::Plan> {
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let cfg = Config {
            algo: forced,
            ..self.config.clone()
        };
        tune::plan(&cfg, coll, &self.shape, count * dtype.size(), dtype.size())
    }

    /// The algorithm the planner picks for a collective of `count` elements.
    pub fn algorithm_for(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<&'static str> {
        match coll {
            Collective::AllGatherV => Ok("ring"),
            Collective::AllToAllV | Collective::SendRecv => Ok("pairwise"),
            _ => Ok(self.plan(coll, dtype, count)?.algo.name()),
        }
    }

    /// Forces (or releases) the algorithm of one collective.
    pub fn force_algorithm(&self, coll: Collective, algo: Option<&str>) -> Result<()> {
        let mut f = self.forced.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|(c, _)| *c != coll);
        if let Some(name) = algo {
            let spec = comm_core::config::parse_algo(&format!("{}:{name}", coll.name()))?;
            f.extend(spec);
        }
        Ok(())
    }
}
