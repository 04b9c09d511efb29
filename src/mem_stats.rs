//! What memory a communicator holds on one rank, by purpose and residence
//! ([`crate::Communicator::mem_stats`], NCCL's `ncclCommMemStats`).

pub use comm_core::transport::footprint::{Purpose, Residence};

/// Bytes one rank of one communicator holds, by purpose (FIFOs, staging,
/// registration cache, scratch, windows, flight recorder, device staging)
/// and residence (host, pinned, shared, device). Shared memory counts
/// what this rank created for its peers (what it maps of theirs is theirs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// The rank.
    pub rank: usize,
    /// Peers this rank has a connection to.
    pub connected_peers: usize,
    /// `(purpose, residence, bytes)` for every pair with bytes, in the
    /// order of [`Purpose::ALL`] and [`Residence::ALL`].
    pub rows: Vec<(Purpose, Residence, u64)>,
    /// Bytes the suspend in effect released ([`crate::Communicator::suspend`];
    /// 0 while not suspended): NCCL's `ncclStatGpuMemSuspended`.
    pub suspended: u64,
}

/// What [`crate::Communicator::suspend`] releases: the peer buffers and
/// the scratch.
pub const RELEASED_BY_SUSPEND: [Purpose; 4] = [
    Purpose::Fifo,
    Purpose::Staging,
    Purpose::RegistrationCache,
    Purpose::Scratch,
];

impl MemStats {
    /// Adds `bytes` of `purpose` in `residence`.
    pub fn add(&mut self, purpose: Purpose, residence: Residence, bytes: u64) {
        if bytes == 0 {
            return;
        }
        match self
            .rows
            .iter_mut()
            .find(|(p, r, _)| *p == purpose && *r == residence)
        {
            Some(row) => row.2 += bytes,
            None => {
                self.rows.push((purpose, residence, bytes));
                // Both enums order as their `ALL` lists them.
                self.rows.sort_by_key(|&(p, r, _)| (p, r));
            }
        }
    }

    /// Adds another communicator's bytes (the sub-communicators of a
    /// compressed all-reduce).
    pub fn absorb(&mut self, other: &MemStats) {
        for &(p, r, b) in &other.rows {
            self.add(p, r, b);
        }
        self.suspended += other.suspended;
    }

    /// Bytes a suspend would release now ([`RELEASED_BY_SUSPEND`]; NCCL's
    /// `ncclStatGpuMemSuspend`).
    pub fn releasable(&self) -> u64 {
        self.sum(|p, r| owned(r) && RELEASED_BY_SUSPEND.contains(&p))
    }

    /// Every byte this rank holds, every purpose: not what it maps of its
    /// peers' ([`Residence::Mapped`], in their totals), so the totals of
    /// all ranks add up to the job's.
    pub fn total_bytes(&self) -> u64 {
        self.sum(|_, r| owned(r))
    }

    /// Bytes in `residence`, every purpose.
    pub fn total(&self, residence: Residence) -> u64 {
        self.sum(|_, r| r == residence)
    }

    /// Bytes for `purpose` this rank holds, every residence but
    /// [`Residence::Mapped`].
    pub fn of(&self, purpose: Purpose) -> u64 {
        self.sum(|p, r| owned(r) && p == purpose)
    }

    /// What the communicator adds to this process's resident host memory
    /// (`RssAnon` + `RssShmem` once its buffers are used): every byte but
    /// device memory, peers' shared memory this rank maps included.
    pub fn resident_bytes(&self) -> u64 {
        self.sum(|_, r| r != Residence::Device)
    }

    fn sum(&self, keep: impl Fn(Purpose, Residence) -> bool) -> u64 {
        self.rows
            .iter()
            .filter(|&&(p, r, _)| keep(p, r))
            .map(|row| row.2)
            .sum()
    }
}

/// Whether bytes in `residence` are this rank's own (in its totals).
fn owned(residence: Residence) -> bool {
    residence != Residence::Mapped
}

impl std::fmt::Display for MemStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {}, {} peers:", self.rank, self.connected_peers)?;
        if self.suspended > 0 {
            write!(f, " suspended ({} B released);", self.suspended)?;
        }
        if self.rows.is_empty() {
            return write!(f, " nothing");
        }
        for (p, r, b) in &self.rows {
            write!(f, " {} {} {b} B;", p.name(), r.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_merge_sort_and_sum() {
        let mut m = MemStats::default();
        m.add(Purpose::Scratch, Residence::Host, 5);
        m.add(Purpose::Fifo, Residence::Shared, 7);
        m.add(Purpose::Fifo, Residence::Shared, 1);
        m.add(Purpose::Fifo, Residence::Host, 0);
        m.add(Purpose::Fifo, Residence::Host, 2);
        assert_eq!(
            m.rows,
            vec![
                (Purpose::Fifo, Residence::Host, 2),
                (Purpose::Fifo, Residence::Shared, 8),
                (Purpose::Scratch, Residence::Host, 5)
            ]
        );
        assert_eq!(m.total(Residence::Host), 7);
        assert_eq!(m.of(Purpose::Fifo), 10);
        assert_eq!(m.releasable(), 15);
        m.add(Purpose::Windows, Residence::Shared, 4);
        assert_eq!((m.releasable(), m.total_bytes()), (15, 19));
        // A peer's segment mapped here: resident, not this rank's.
        m.add(Purpose::Fifo, Residence::Mapped, 100);
        m.add(Purpose::DeviceStaging, Residence::Device, 1000);
        assert_eq!((m.releasable(), m.of(Purpose::Fifo)), (15, 10));
        assert_eq!(m.total(Residence::Mapped), 100);
        assert_eq!(m.total_bytes(), 1019);
        assert_eq!(m.resident_bytes(), 119);
        let mut n = MemStats::default();
        n.absorb(&m);
        n.absorb(&m);
        assert_eq!(n.of(Purpose::Scratch), 10);
    }
}
