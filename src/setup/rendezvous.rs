//! The rendezvous of a communicator's creation: every rank's record
//! ([`super::encode_info`]) reaches every rank, as a tree.
//!
//! Rank 0 reads every record from the store (N reads) and keeps the table
//! of records in its standby store; every other rank reads its parent's
//! record (rank `(r - 1) / 2`) for the parent's standby address, fetches
//! the table from the parent's standby store and keeps it in its own for
//! its two children. The store server answers about 3N requests instead of
//! N + N² when every rank read every record, and no standby store serves
//! more than two children (issue 34: `sim::bootstrap` names the N² reads
//! the bottleneck of creation at scale; `commbench sim init --rendezvous
//! tree`). Every rank ends with rank 0's one table.
//!
//! A parent that is gone (it failed after its rendezvous, or during it, and
//! its standby store closed) is no failure of this rank's: the rank reads
//! every record from the store itself, as every rank did before the tree.
//!
//! The table is kept as parts of at most [`PART_BYTES`] (a store message
//! is at most `MAX_FRAME_BYTES`): `<prefix>/table/<i>` for each part,
//! then `<prefix>/table/parts` holding their count, written last so that a
//! child that sees the count finds every part. A part is a run of records,
//! each a little-endian `u32` length and its bytes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use comm_core::{Error, Result};
use sncl_bootstrap::{Store, TcpStore, TcpStoreServer};

/// The largest part of the table in one store message.
const PART_BYTES: usize = 1 << 20;
/// How long a rank tries to reach its parent's standby store, which
/// listens from before the parent published its address: refused means
/// the parent is gone.
const PARENT_CONNECT: Duration = Duration::from_secs(2);

/// Reads the standby store's address out of rank `p`'s record.
pub(crate) type StandbyOf<'a> = &'a dyn Fn(usize, &[u8]) -> Result<Option<SocketAddr>>;

/// What the rendezvous needs of this rank's creation.
pub(crate) struct Rendezvous<'a> {
    /// The communicator's store, under its prefix (`info/<rank>` keys).
    pub store: &'a dyn Store,
    /// This rank's standby store, which keeps the table for its children.
    pub standby: &'a TcpStoreServer,
    /// The communicator's key prefix (`sncl/<comm_id>`).
    pub prefix: &'a str,
    pub rank: usize,
    pub nranks: usize,
    pub secret: [u8; 16],
    pub tls: Option<&'a sncl_bootstrap::tls::TlsIdentity>,
    pub deadline: Instant,
    /// Decodes a record's standby address (`decode_info`'s).
    pub standby_of: StandbyOf<'a>,
}

impl Rendezvous<'_> {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn bad(&self, detail: String) -> Error {
        Error::Bootstrap {
            rank: self.rank,
            detail,
        }
    }

    /// Every rank's record, in rank order.
    pub(crate) fn records(&self) -> Result<Vec<Vec<u8>>> {
        let records = if self.rank == 0 {
            self.read_all()?
        } else {
            match self.table_from_parent() {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(rank = self.rank, error = %e,
                        "rendezvous: reading every record from the store instead");
                    self.read_all()?
                }
            }
        };
        self.keep(&records)?;
        Ok(records)
    }

    /// Every record from the store, one read each.
    fn read_all(&self) -> Result<Vec<Vec<u8>>> {
        (0..self.nranks)
            .map(|p| self.store.get(&format!("info/{p}"), self.left()))
            .collect()
    }

    /// The table from the parent's standby store.
    fn table_from_parent(&self) -> Result<Vec<Vec<u8>>> {
        let parent = (self.rank - 1) / 2;
        let record = self.store.get(&format!("info/{parent}"), self.left())?;
        let Some(addr) = (self.standby_of)(parent, &record)? else {
            return Err(self.bad(format!(
                "rank {parent} (this rank's parent in the rendezvous tree) published no standby \
                 store address"
            )));
        };
        let fetching = |e: Error| {
            self.bad(format!(
                "fetching the table of records from rank {parent} (this rank's parent in the \
                 rendezvous tree) at {addr}: {e}"
            ))
        };
        let reach = self.deadline.min(Instant::now() + PARENT_CONNECT);
        let parent_store = TcpStore::connect_tls(addr, self.secret, self.rank, reach, self.tls)
            .map_err(fetching)?;
        let parts_key = format!("{}/table/parts", self.prefix);
        let parts = parent_store
            .get(&parts_key, self.left())
            .map_err(fetching)?;
        let parts: usize = std::str::from_utf8(&parts)
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&k| k <= self.nranks.max(1))
            .ok_or_else(|| {
                self.bad(format!(
                    "rank {parent} kept a malformed table ({parts:?} parts)"
                ))
            })?;
        let mut records = Vec::with_capacity(self.nranks);
        for i in 0..parts {
            let part = parent_store
                .get(&format!("{}/table/{i}", self.prefix), self.left())
                .map_err(fetching)?;
            self.unpack(parent, &part, &mut records)?;
        }
        if records.len() != self.nranks {
            return Err(self.bad(format!(
                "rank {parent} kept a table of {} records for {} ranks",
                records.len(),
                self.nranks
            )));
        }
        Ok(records)
    }

    /// Appends the records of one part to `out`.
    fn unpack(&self, parent: usize, mut part: &[u8], out: &mut Vec<Vec<u8>>) -> Result<()> {
        while !part.is_empty() {
            let (len, rest) = part
                .split_first_chunk::<4>()
                .map(|(l, r)| (u32::from_le_bytes(*l) as usize, r))
                .filter(|(len, rest)| *len <= rest.len() && out.len() < self.nranks)
                .ok_or_else(|| self.bad(format!("rank {parent} kept a malformed table part")))?;
            out.push(rest[..len].to_vec());
            part = &rest[len..];
        }
        Ok(())
    }

    /// Keeps the table in this rank's standby store for its children.
    fn keep(&self, records: &[Vec<u8>]) -> Result<()> {
        let mine = self.standby.local_store();
        let mut parts = 0;
        let mut part = Vec::new();
        let mut flush = |part: &mut Vec<u8>| {
            let r = mine.set(&format!("{}/table/{parts}", self.prefix), part);
            part.clear();
            parts += 1;
            r
        };
        for r in records {
            // A record larger than a part travels alone.
            if !part.is_empty() && part.len() + 4 + r.len() > PART_BYTES {
                flush(&mut part)?;
            }
            part.extend_from_slice(&(r.len() as u32).to_le_bytes());
            part.extend_from_slice(r);
        }
        if !part.is_empty() {
            flush(&mut part)?;
        }
        mine.set(
            &format!("{}/table/parts", self.prefix),
            parts.to_string().as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's view of the store that counts its reads.
    struct Counted<'a> {
        inner: &'a sncl_bootstrap::MemoryStore,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl Store for Counted<'_> {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.inner.set(key, value)
        }
        fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.get(key, timeout)
        }
        fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
            self.inner.try_get(key)
        }
        fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
            self.inner.wait(keys, timeout)
        }
        fn add(&self, key: &str, delta: i64) -> Result<i64> {
            self.inner.add(key, delta)
        }
    }

    fn server() -> TcpStoreServer {
        TcpStoreServer::start("127.0.0.1:0".parse().unwrap(), [3; 16]).unwrap()
    }

    /// Ranks 0, 1 and 2 of 3: each ends with the same records, the
    /// children through their parent's standby store.
    #[test]
    fn every_rank_ends_with_rank_0s_table() {
        let store = sncl_bootstrap::MemoryStore::new();
        let servers: Vec<TcpStoreServer> = (0..3).map(|_| server()).collect();
        for (r, s) in servers.iter().enumerate() {
            // A record whose first line is its standby address.
            let rec = format!("{}\nbig{}", s.local_addr(), "x".repeat(r * 700_000));
            store.set(&format!("info/{r}"), rec.as_bytes()).unwrap();
        }
        let standby_of = |_: usize, b: &[u8]| -> Result<Option<SocketAddr>> {
            Ok(String::from_utf8_lossy(b)
                .lines()
                .next()
                .and_then(|l| l.parse().ok()))
        };
        let views: Vec<Counted> = (0..3)
            .map(|_| Counted {
                inner: &store,
                gets: Default::default(),
            })
            .collect();
        let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let (view, servers, standby_of) = (&views[rank], &servers, &standby_of);
                    sc.spawn(move || {
                        Rendezvous {
                            store: view,
                            standby: &servers[rank],
                            prefix: "sncl/t",
                            rank,
                            nranks: 3,
                            secret: [3; 16],
                            tls: None,
                            deadline: Instant::now() + Duration::from_secs(10),
                            standby_of,
                        }
                        .records()
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got[0].len(), 3);
        assert_eq!(got[1], got[0]);
        assert_eq!(got[2], got[0]);
        // Rank 0 read every record; its children only their parent's, the
        // rest came down the tree.
        let gets: Vec<usize> = views
            .iter()
            .map(|v| v.gets.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        assert_eq!(gets, [3, 1, 1]);
        // 2.1 MB of records: the first two in one part, the third alone.
        let parts = servers[1]
            .local_store()
            .try_get("sncl/t/table/parts")
            .unwrap();
        assert_eq!(parts.as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn a_malformed_part_is_an_error_naming_the_parent() {
        let s = server();
        let r = Rendezvous {
            store: &sncl_bootstrap::MemoryStore::new(),
            standby: &s,
            prefix: "p",
            rank: 3,
            nranks: 4,
            secret: [3; 16],
            tls: None,
            deadline: Instant::now(),
            standby_of: &|_, _| Ok(None),
        };
        let mut out = Vec::new();
        let e = r
            .unpack(1, &[9, 0, 0, 0, 1], &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 1 kept a malformed table part"), "{e}");
        // No standby address for the parent: named too.
        r.store.set("info/1", b"x").unwrap();
        let e = r.table_from_parent().unwrap_err().to_string();
        assert!(e.contains("rank 1 (this rank's parent"), "{e}");
        // Without the parent, the rank reads every record itself.
        for p in [0, 2, 3] {
            r.store.set(&format!("info/{p}"), b"y").unwrap();
        }
        let all = r.records().unwrap();
        assert_eq!(all, [&b"y"[..], b"x", b"y", b"y"]);
    }

    /// A parent whose standby store is gone (refused): the child reads
    /// every record from the store, well before its deadline.
    #[test]
    fn a_gone_parent_leaves_the_child_to_read_every_record() {
        let gone = server().local_addr();
        let store = sncl_bootstrap::MemoryStore::new();
        let mine = server();
        for p in 0..2 {
            let rec = format!("{gone}\nrank {p}");
            store.set(&format!("info/{p}"), rec.as_bytes()).unwrap();
        }
        let t0 = Instant::now();
        let got = Rendezvous {
            store: &store,
            standby: &mine,
            prefix: "p",
            rank: 1,
            nranks: 2,
            secret: [3; 16],
            tls: None,
            deadline: Instant::now() + Duration::from_secs(30),
            standby_of: &|_, b| {
                Ok(String::from_utf8_lossy(b)
                    .lines()
                    .next()
                    .and_then(|l| l.parse().ok()))
            },
        }
        .records()
        .unwrap();
        assert_eq!(got.len(), 2);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}
