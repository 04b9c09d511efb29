//! The receiving side of tagged messages (`tagged.rs`): the mailbox of
//! messages that arrived before a receive asked for them, and where each
//! peer's arriving pieces go.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Payload, Space};
use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, Error, ReduceOp, Result};

/// A message that arrived (or is arriving) before a receive asked for it.
pub(super) struct Parked {
    pub(super) id: u64,
    pub(super) peer: usize,
    pub(super) tag: i32,
    pub(super) total: usize,
    pub(super) data: Vec<u8>,
}

impl Parked {
    pub(super) fn complete(&self) -> bool {
        self.data.len() == self.total
    }
}

/// Where the pieces of the message arriving from one peer go.
#[derive(Clone, Copy, Debug)]
pub(super) enum Arriving {
    /// Into the parked message with this id.
    Parked(u64),
    /// Into the running receive's buffer.
    Direct,
}

/// Tagged messages that arrived before a receive asked for them.
#[derive(Default)]
pub(crate) struct Mailbox {
    pub(super) parked: VecDeque<Parked>,
    pub(super) arriving: Vec<Option<Arriving>>,
    pub(super) next_id: u64,
    /// Tagged messages sent to each peer (this rank's own excepted).
    pub(super) sent: Vec<u64>,
    /// Tagged messages wholly arrived from each peer (parked or received).
    pub(super) received: Vec<u64>,
}

/// Adds one to `counts[peer]`.
fn count(counts: &mut Vec<u64>, peer: usize) {
    if counts.len() <= peer {
        counts.resize(peer + 1, 0);
    }
    counts[peer] += 1;
}

/// The receive being served: its buffer, whom it accepts, how far it is.
pub(super) struct Target<'b> {
    pub(super) buf: &'b mut [u8],
    pub(super) tag: i32,
    pub(super) src: Option<usize>,
    pub(super) matched: Option<usize>,
    pub(super) done: usize,
}

impl Target<'_> {
    pub(super) fn accepts(&self, peer: usize, tag: i32) -> bool {
        tag == self.tag && self.src.is_none_or(|s| s == peer)
    }

    pub(super) fn finished(&self) -> bool {
        self.matched.is_some() && self.done == self.buf.len()
    }
}

pub(super) fn fingerprint(tag: i32, bytes: usize) -> Fingerprint {
    Fingerprint {
        collective: Collective::Tagged,
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        root: tag,
        count: bytes as u64,
        settings: 0,
    }
}

/// Backs off while nothing moves: spin, then yield, then short sleeps.
pub(super) struct Backoff {
    pub(super) rounds: u32,
    pub(super) last_progress: Instant,
    pub(super) last_probe: Instant,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        let now = Instant::now();
        Backoff {
            rounds: 0,
            last_progress: now,
            last_probe: now,
        }
    }

    pub(super) fn progressed(&mut self) {
        if self.rounds > 0 {
            self.last_progress = Instant::now();
        }
        self.rounds = 0;
    }

    /// Waits a little; returns how long nothing has moved.
    pub(super) fn idle(&mut self, spin: Duration) -> Duration {
        self.rounds = self.rounds.saturating_add(1);
        let waited = self.last_progress.elapsed();
        if waited < spin {
            std::hint::spin_loop();
        } else if waited < spin + Duration::from_micros(200) {
            std::thread::yield_now();
        } else if waited < Duration::from_millis(20) {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
        waited
    }

    /// True every 100 ms of waiting: time to probe the peers.
    pub(super) fn probe_due(&mut self) -> bool {
        if self.last_probe.elapsed() >= Duration::from_millis(100) {
            self.last_probe = Instant::now();
            return true;
        }
        false
    }
}

impl Mailbox {
    /// Counts a tagged message sent to `peer`.
    pub(super) fn count_sent(&mut self, peer: usize) {
        count(&mut self.sent, peer);
    }

    /// This rank's tagged messages sent and wholly arrived per peer, as a
    /// suspend's note (`s:PEER=COUNT,...;r:PEER=COUNT,...`); `None` when
    /// it never sent or received one.
    pub(super) fn counts_note(&self) -> Option<String> {
        let list = |counts: &[u64]| {
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(p, c)| format!("{p}={c}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        (self.sent.iter().chain(&self.received).any(|&c| c > 0))
            .then(|| format!("s:{};r:{}", list(&self.sent), list(&self.received)))
    }

    /// Index of the earliest parked message from `src` (any: None) with
    /// `tag`, complete or not.
    pub(super) fn first_match(&self, src: Option<usize>, tag: i32) -> Option<usize> {
        self.parked
            .iter()
            .position(|m| m.tag == tag && src.is_none_or(|s| s == m.peer))
    }

    pub(super) fn park(&mut self, peer: usize, tag: i32, total: usize, data: Vec<u8>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.parked.push_back(Parked {
            id,
            peer,
            tag,
            total,
            data,
        });
        id
    }

    /// Takes one arrived piece of a tagged message from `peer`.
    pub(super) fn accept(
        &mut self,
        me: usize,
        peer: usize,
        fp: Fingerprint,
        data: &[u8],
        target: &mut Option<Target<'_>>,
    ) -> Result<()> {
        let tag = fp.root;
        let total = fp.count as usize;
        let corrupt = |detail: String| Error::Transport {
            rank: me,
            source: comm_core::transport::TransportError::Corrupt { peer, detail },
        };
        if self.arriving.len() <= peer {
            self.arriving.resize(peer + 1, None);
        }
        let dest = match self.arriving[peer] {
            Some(d) => d,
            None => {
                let direct = target.as_ref().is_some_and(|t| {
                    t.matched.is_none()
                        && t.accepts(peer, tag)
                        && self.first_match(t.src, t.tag).is_none()
                });
                if direct {
                    let t = target.as_mut().expect("checked above");
                    if total != t.buf.len() {
                        return Err(Error::InvalidArgument {
                            rank: me,
                            op: "recv_tagged",
                            detail: format!(
                                "peer rank {peer} sent {total} bytes with tag {tag}, the receive \
                                 expects {} bytes (sizes must match)",
                                t.buf.len()
                            ),
                        });
                    }
                    t.matched = Some(peer);
                    Arriving::Direct
                } else {
                    let cap = total.min(1 << 20);
                    Arriving::Parked(self.park(peer, tag, total, Vec::with_capacity(cap)))
                }
            }
        };
        let (done, want_tag, want_total) = match dest {
            Arriving::Direct => {
                let t = target.as_ref().ok_or_else(|| {
                    corrupt("a directly received message outlived its receive".into())
                })?;
                (t.done, t.tag, t.buf.len())
            }
            Arriving::Parked(id) => {
                let m =
                    self.parked.iter().find(|m| m.id == id).ok_or_else(|| {
                        corrupt("a parked message vanished while arriving".into())
                    })?;
                (m.data.len(), m.tag, m.total)
            }
        };
        if tag != want_tag || total != want_total || done + data.len() > total {
            return Err(corrupt(format!(
                "piece of {} bytes (tag {tag}, message of {total} bytes) in the middle of a \
                 message with tag {want_tag} of {want_total} bytes at byte {done}",
                data.len()
            )));
        }
        let end = done + data.len();
        match dest {
            Arriving::Direct => {
                let t = target.as_mut().expect("checked above");
                t.buf[done..end].copy_from_slice(data);
                t.done = end;
            }
            Arriving::Parked(id) => {
                let m = self
                    .parked
                    .iter_mut()
                    .find(|m| m.id == id)
                    .expect("checked above");
                m.data.extend_from_slice(data);
            }
        }
        self.arriving[peer] = (end < total).then_some(dest);
        if end == total {
            count(&mut self.received, peer);
        }
        Ok(())
    }

    /// Reads every arrived tagged piece from `conn`; stops at a piece that
    /// is not tagged (left in place). Returns whether anything moved.
    pub(super) fn pump(
        &mut self,
        me: usize,
        comm_id: u64,
        conn: &mut dyn Connection,
        target: &mut Option<Target<'_>>,
    ) -> Result<bool> {
        let peer = conn.peer();
        let mut moved = false;
        loop {
            let mut foreign = None;
            let r = conn.try_recv(Space::Host, &mut |h: &PieceHeader, p: Payload<'_>| {
                // Tagged messages are host memory, received as host bytes.
                let Some(data) = p.host() else {
                    return Err(Error::InvalidArgument {
                        rank: me,
                        op: "recv_tagged",
                        detail: format!(
                            "the connection with peer rank {peer} handed a device piece to a \
                             host receive"
                        ),
                    });
                };
                if h.comm_id != comm_id {
                    return Err(Error::CommMismatch {
                        rank: me,
                        peer,
                        seq: 0,
                        op: fingerprint(target.as_ref().map_or(0, |t| t.tag), 0),
                        ours: comm_id,
                        theirs: h.comm_id,
                        their_seq: h.seq,
                    });
                }
                // Every tagged piece carries its fingerprint; a collective's
                // continuation pieces carry none.
                let Some(fp) = h.fingerprint.filter(|f| f.collective == Collective::Tagged) else {
                    foreign = Some(h.fingerprint);
                    // Not ours: an error leaves the piece in the transport.
                    return Err(Error::Config(String::new()));
                };
                if let Some(want) = h.checksum {
                    let got = comm_core::wire::piece_checksum(data);
                    if got != want {
                        return Err(Error::PeerFailed {
                            rank: me,
                            op: fp,
                            seq: 0,
                            failed_rank: Some(peer),
                            source: comm_core::transport::TransportError::Corrupt {
                                peer,
                                detail: format!(
                                    "a tagged piece of {} bytes has CRC32C {got:#010x}, its \
                                     sender computed {want:#010x} (the data changed in memory \
                                     or on the link)",
                                    data.len()
                                ),
                            },
                        });
                    }
                }
                self.accept(me, peer, fp, data, target)
            });
            match r {
                Ok(true) => moved = true,
                Ok(false) => return Ok(moved),
                Err(_) if foreign.is_some() => {
                    let theirs = foreign.flatten().unwrap_or(fingerprint(-1, 0));
                    if self.arriving.get(peer).copied().flatten().is_some() {
                        return Err(Error::Mismatch {
                            rank: me,
                            peer,
                            seq: 0,
                            ours: fingerprint(-1, 0),
                            their_seq: 0,
                            theirs,
                        });
                    }
                    return Ok(moved);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
