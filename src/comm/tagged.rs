//! Tagged point-to-point messages and receives from any source (an sncl
//! extension: NCCL has neither; gloo and MPI have both).
//!
//! # Design
//!
//! A tagged message travels on the ordinary connection to its receiver as
//! pieces whose header names the collective `Tagged`, with the tag in the
//! fingerprint's `root` and the message's byte count in its `count` (a
//! message of 0 bytes is one empty piece). A send runs whole under the
//! communicator's lock, in stream order like any operation, so a message's
//! pieces are contiguous on its connection.
//!
//! The receiver keeps a *mailbox* per communicator: messages that arrived
//! before a receive asked for them, in arrival order (by first piece), and
//! per peer the message whose pieces are arriving. A receive for (sources,
//! tag) first takes the earliest parked message from one of the sources
//! with that tag; otherwise it polls the sources' connections: the first
//! new message that matches is written straight into the receive's buffer
//! (no copy through the mailbox), any other tagged message is parked. A
//! piece that is not tagged (the peer has gone on to a collective) is left
//! where it is, and that connection is not read further by this receive.
//! Messages from one peer with one tag are received in the order they were
//! sent (MPI's non-overtaking rule); messages with different tags never
//! match each other.
//!
//! A send that finds no room waits, and while it waits it parks the tagged
//! messages its peer sends it, so two ranks that send each other large
//! messages before receiving do not deadlock. A send to the rank itself is
//! parked at once (it completes without a receive).
//!
//! Normal point-to-point (`send` / `recv` / `group`) and collectives keep
//! their paths unchanged: nothing here runs unless a tagged call is made.
//! The one rule to keep: a tagged message must be received before a
//! collective (or untagged transfer) that reads the same connection after
//! it; otherwise that operation reports a mismatch naming the peer's
//! `tagged(...)` piece.
//!
//! Every wait has a deadline: the communicator's timeout, counted from the
//! last progress, with a liveness probe of the awaited peers every 100 ms.

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, Outgoing};
use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{Error, Result};

use super::mailbox::{fingerprint, Backoff, Target};
use super::{Inner, State};

/// How often a receive from any source looks for unconnected peers that
/// want to send to this rank.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

impl Inner {
    fn tagged_turn<R>(&self, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        let t = self.ticket();
        self.order.wait_turn(t);
        let r = {
            let mut guard = self.lock();
            let st = &mut *guard;
            match &st.aborted {
                Some(reason) => Err(Error::Aborted {
                    rank: self.rank,
                    reason: Some(reason.clone()),
                }),
                None if st.suspension != super::suspension::Suspension::Active => {
                    Err(self.suspended_error("a tagged send or receive"))
                }
                None => {
                    let r = f(st);
                    if let Err(e) = &r {
                        if !matches!(e, Error::InvalidArgument { .. }) {
                            self.fail(st, e);
                        }
                    }
                    r
                }
            }
        };
        self.order.finish();
        r
    }

    fn timed_out(&self, fp: Fingerprint, waiting_on: Vec<usize>) -> Error {
        Error::Timeout {
            rank: self.rank,
            op: fp,
            seq: 0,
            waiting_on,
            timeout_ms: self.config.timeout.as_millis() as u64,
        }
    }

    fn interrupted(&self, fp: Fingerprint) -> Option<Error> {
        self.abort_flag
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| Error::Aborted {
                rank: self.rank,
                reason: Some(format!("{fp} interrupted by abort")),
            })
    }

    /// Sends `data` to `peer` as one message with `tag`, in stream order.
    pub(crate) fn send_tagged(&self, data: &[u8], peer: usize, tag: i32) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::InvalidArgument {
                rank: self.rank,
                op: "send_tagged",
                detail: format!("peer rank {peer} out of range (size {})", self.nranks),
            });
        }
        self.tagged_turn(|st| {
            st.count_op(Collective::Tagged);
            if peer == self.rank {
                st.mailbox.park(peer, tag, data.len(), data.to_vec());
                return Ok(());
            }
            let fp = fingerprint(tag, data.len());
            let (me, comm_id) = (self.rank, self.comm_id);
            // A peer not connected yet is connected now: its matching
            // receive connects this rank too (`crate::setup::lazy`).
            let ctx = self.op_context(0, fp, fp.op, self.spin);
            self.connect_lazily(st, &ctx, [peer])?;
            let State {
                conns,
                mailbox,
                traffic,
                ..
            } = st;
            let conn = conns
                .get_mut(peer)
                .and_then(|c| c.as_deref_mut())
                .ok_or_else(|| Error::InvalidArgument {
                    rank: me,
                    op: "send_tagged",
                    detail: format!("no connection to rank {peer}"),
                })?;
            let max = conn.max_piece(MemoryKind::Host).max(1);
            let mut off = 0;
            let mut first = true;
            let mut backoff = Backoff::new();
            while first || off < data.len() {
                let n = max.min(data.len() - off);
                let h = PieceHeader {
                    // The transport computes the CRC in the pass that
                    // copies the piece (`Connection::try_post_send`).
                    checksum: self.config.checksum.then_some(0),
                    comm_id,
                    seq: 0,
                    fingerprint: Some(fp),
                    len: n as u32,
                };
                let piece = Outgoing::copied(&data[off..off + n]);
                if conn
                    .try_post_send(&h, piece)
                    .map_err(|e| self.in_tagged(fp, e))?
                {
                    off += n;
                    first = false;
                    backoff.progressed();
                    continue;
                }
                // No room: take what the peer sends us meanwhile.
                let moved = mailbox
                    .pump(me, comm_id, conn, &mut None)
                    .map_err(|e| self.in_tagged(fp, e))?;
                conn.flush().map_err(|e| self.in_tagged(fp, e))?;
                if moved {
                    backoff.progressed();
                } else if self.wait_once(&mut backoff, fp, &[peer])? {
                    self.probe(fp, conn)?;
                }
            }
            // Push out what the transport buffered (TCP).
            let mut backoff = Backoff::new();
            while !conn.flush().map_err(|e| self.in_tagged(fp, e))? {
                if mailbox
                    .pump(me, comm_id, conn, &mut None)
                    .map_err(|e| self.in_tagged(fp, e))?
                {
                    backoff.progressed();
                } else if self.wait_once(&mut backoff, fp, &[peer])? {
                    self.probe(fp, conn)?;
                }
            }
            if traffic.sent.len() < self.nranks {
                traffic.sent.resize(self.nranks, 0);
            }
            traffic.sent[peer] += data.len() as u64;
            mailbox.count_sent(peer);
            Ok(())
        })
    }

    /// One idle round of a tagged wait: deadline and abort. Returns true
    /// when the awaited peers (`waiting_on`) are due a liveness probe.
    fn wait_once(
        &self,
        backoff: &mut Backoff,
        fp: Fingerprint,
        waiting_on: &[usize],
    ) -> Result<bool> {
        let waited = backoff.idle(self.spin);
        if let Some(e) = self.interrupted(fp) {
            return Err(e);
        }
        if waited >= self.config.timeout {
            return Err(self.timed_out(fp, waiting_on.to_vec()));
        }
        Ok(backoff.probe_due())
    }

    fn probe(&self, fp: Fingerprint, conn: &mut dyn Connection) -> Result<()> {
        let peer = conn.peer();
        conn.check_alive().map_err(|source| Error::PeerFailed {
            rank: self.rank,
            op: fp,
            seq: 0,
            failed_rank: Some(peer),
            source,
        })
    }

    fn in_tagged(&self, fp: Fingerprint, e: Error) -> Error {
        match e {
            Error::Transport { source, .. } => {
                let failed_rank = match &source {
                    comm_core::transport::TransportError::PeerAborted { cause, .. } => {
                        comm_core::transport::AbortCause::failed_rank(*cause)
                    }
                    comm_core::transport::TransportError::PeerGone { peer, .. }
                    | comm_core::transport::TransportError::Corrupt { peer, .. }
                    | comm_core::transport::TransportError::Io { peer, .. } => Some(*peer),
                };
                Error::PeerFailed {
                    rank: self.rank,
                    op: fp,
                    seq: 0,
                    failed_rank,
                    source,
                }
            }
            other => other,
        }
    }

    /// Receives one message with `tag` from `src` (None: any rank, this one
    /// included) into `buf` (its size must match the message's); returns
    /// the sender's rank.
    pub(crate) fn recv_tagged(
        &self,
        buf: &mut [u8],
        src: Option<usize>,
        tag: i32,
    ) -> Result<usize> {
        if let Some(s) = src.filter(|&s| s >= self.nranks) {
            return Err(Error::InvalidArgument {
                rank: self.rank,
                op: "recv_tagged",
                detail: format!("source rank {s} out of range (size {})", self.nranks),
            });
        }
        self.tagged_turn(|st| {
            st.count_op(Collective::Tagged);
            let fp = fingerprint(tag, buf.len());
            let (me, comm_id) = (self.rank, self.comm_id);
            let len = buf.len();
            // A named source not connected yet is connected now; a receive
            // from any source connects the peers that ask for this rank
            // while it waits (`crate::setup::lazy`).
            let ctx = self.op_context(0, fp, fp.op, self.spin);
            if let Some(s) = src.filter(|&s| s != me) {
                self.connect_lazily(st, &ctx, [s])?;
            }
            let mut asked_at: Option<std::time::Instant> = None;
            let mut target = Some(Target {
                buf,
                tag,
                src,
                matched: None,
                done: 0,
            });
            let State {
                conns,
                mailbox,
                traffic,
                lazy,
                ..
            } = st;
            let mut backoff = Backoff::new();
            loop {
                if let Some(l) = lazy
                    .as_mut()
                    .filter(|l| src.is_none() && l.pending() > 0)
                    .filter(|_| asked_at.is_none_or(|t| t.elapsed() >= ASK_EVERY))
                {
                    asked_at = Some(std::time::Instant::now());
                    l.connect_askers(&self.config, conns, &ctx, &self.abort_flag)?;
                }
                // The earliest parked match wins, once it is complete
                // (unless a message is already arriving into the buffer).
                let direct = target.as_ref().is_some_and(|t| t.matched.is_some());
                if let Some(i) = mailbox.first_match(src, tag).filter(|_| !direct) {
                    if mailbox.parked[i].complete() {
                        let m = mailbox.parked.remove(i).expect("index from first_match");
                        if m.total != len {
                            return Err(Error::InvalidArgument {
                                rank: me,
                                op: "recv_tagged",
                                detail: format!(
                                    "peer rank {} sent {} bytes with tag {tag}, the receive \
                                     expects {len} bytes (sizes must match)",
                                    m.peer, m.total
                                ),
                            });
                        }
                        let t = target.as_mut().expect("target lives for the loop");
                        t.buf.copy_from_slice(&m.data);
                        return Ok(m.peer);
                    }
                }
                if src == Some(me) {
                    return Err(Error::InvalidArgument {
                        rank: me,
                        op: "recv_tagged",
                        detail: format!(
                            "no message with tag {tag} was sent to this rank by itself (a send \
                             to self must come before its receive)"
                        ),
                    });
                }
                let mut moved = false;
                for (p, c) in conns.iter_mut().enumerate() {
                    if src.is_some_and(|s| s != p) {
                        continue;
                    }
                    if let Some(c) = c.as_deref_mut() {
                        moved |= mailbox
                            .pump(me, comm_id, c, &mut target)
                            .map_err(|e| self.in_tagged(fp, e))?;
                    }
                }
                let t = target.as_ref().expect("target lives for the loop");
                if t.finished() {
                    let peer = t.matched.expect("finished implies matched");
                    if traffic.received.len() < self.nranks {
                        traffic.received.resize(self.nranks, 0);
                    }
                    traffic.received[peer] += len as u64;
                    return Ok(peer);
                }
                if moved {
                    backoff.progressed();
                    continue;
                }
                let waiting: Vec<usize> = (0..conns.len())
                    .filter(|&p| match t.matched.or(src) {
                        Some(s) => s == p,
                        None => p != me,
                    })
                    .filter(|&p| {
                        conns[p].is_some() || lazy.as_ref().is_some_and(|l| l.is_pending(p))
                    })
                    .collect();
                if waiting.is_empty() {
                    return Err(Error::InvalidArgument {
                        rank: me,
                        op: "recv_tagged",
                        detail: format!(
                            "no peer can send the message with tag {tag} (communicator of {} rank(s))",
                            self.nranks
                        ),
                    });
                }
                if self.wait_once(&mut backoff, fp, &waiting)? {
                    for &p in &waiting {
                        if let Some(c) = conns[p].as_deref_mut() {
                            self.probe(fp, c)?;
                        }
                    }
                }
            }
        })
    }
}

impl crate::Communicator {
    /// Sends `buf` to `peer` as one message with `tag` (an sncl extension,
    /// as in gloo and MPI). It is matched by the peer's
    /// [`recv_tagged`](Self::recv_tagged) with the same tag, from this rank
    /// or from any source; messages with different tags never match each
    /// other, and messages with one tag arrive in the order they were sent.
    ///
    /// Returns once the message is handed to the transport (or parked at
    /// the receiver); it may wait for the receiver to make room, and parks
    /// the peer's tagged messages meanwhile. A send to this rank itself is
    /// parked at once. See the module notes in `comm/tagged.rs` for the one
    /// ordering rule against collectives.
    pub fn send_tagged<T: crate::Element>(&self, buf: &[T], peer: usize, tag: i32) -> Result<()> {
        self.inner.send_tagged(crate::as_bytes(buf), peer, tag)
    }

    /// Receives one message with `tag` into `buf`, from `src`, or from any
    /// rank (this one included) when `src` is None: the first message with
    /// that tag to arrive. Returns the sender's rank. The message's size
    /// must equal `buf`'s (else [`Error::InvalidArgument`]); no progress
    /// for the communicator's timeout is [`Error::Timeout`].
    pub fn recv_tagged<T: crate::Element>(
        &self,
        buf: &mut [T],
        src: Option<usize>,
        tag: i32,
    ) -> Result<usize> {
        self.inner.recv_tagged(crate::as_bytes_mut(buf), src, tag)
    }
}
