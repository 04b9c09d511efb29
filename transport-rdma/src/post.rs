//! Host pieces of a [`ConnState`]: staged (copied into the
//! registered staging area and written with immediate into the peer's
//! FIFO slot) or lent (`SNCL_IB_ZERO_COPY`: the payload RDMA-written
//! straight from the user's registered buffer, then the header), and the
//! completion of lent writes (`Connection::flush`).

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, TransportError};
use comm_core::wire::{PieceHeader, HEADER_BYTES};

use crate::conn::{ConnState, FENCE_WR_ID, LENT_TAG, SQ_RESERVE, ZERO_COPY_MIN};
use crate::regcache::ZeroCopy;
use crate::verbs::SendWr;

impl ConnState {
    /// Whether no lent write is in flight (registrations behind them are
    /// dropped once none is).
    pub(crate) fn flush_host(&mut self) -> Result<bool, TransportError> {
        self.progress()?;
        if self.lent_in_flight > 0 {
            self.check_left()?;
            return Ok(false);
        }
        self.regs.idle(&mut *self.dev);
        Ok(!self.dev.needs_progress())
    }

    /// Sends a host piece through the staging copy.
    pub(crate) fn send_host(
        &mut self,
        header: &PieceHeader,
        data: &[u8],
    ) -> Result<bool, TransportError> {
        self.progress()?;
        self.check_left()?;
        self.check_piece(header, data)?;
        if !self.fifo_room()? {
            return Ok(false);
        }
        let q = (self.sent % self.qps.len() as u64) as usize;
        if !self.sq_room(q, SQ_RESERVE) {
            return Ok(false);
        }
        self.post_staged(q, header, data, HEADER_BYTES + data.len())
    }

    /// Sends a lent host piece: RDMA-written from the user's buffer where
    /// zero copy is on and the piece is large enough, else staged.
    ///
    /// # Safety
    /// As [`Outgoing::lent`](comm_core::transport::Outgoing::lent): `data` stays valid and unchanged until
    /// `flush` returns true (or the operation failed).
    pub(crate) unsafe fn send_lent(
        &mut self,
        header: &PieceHeader,
        data: &[u8],
    ) -> Result<bool, TransportError> {
        if self.regs.mode() == ZeroCopy::Off || data.len() < ZERO_COPY_MIN {
            return self.send_host(header, data);
        }
        self.progress()?;
        self.check_left()?;
        self.check_piece(header, data)?;
        if !self.fifo_room()? {
            return Ok(false);
        }
        let q = (self.sent % self.qps.len() as u64) as usize;
        // Two work requests: the payload from the user's buffer, then the
        // header with the immediate (RC keeps them in order, so the
        // receiver's completion for the second covers the first).
        if !self.sq_room(q, SQ_RESERVE + 1) {
            return Ok(false);
        }
        let addr = data.as_ptr() as u64;
        // SAFETY: this function's contract keeps `data` mapped and
        // unchanged until `flush` returns true, which it does only once no
        // lent write is in flight.
        let mr = match unsafe { self.regs.lookup(&mut *self.dev, addr, data.len()) } {
            Ok(mr) => mr,
            Err(e) => {
                tracing::warn!(
                    rank = self.rank,
                    peer = self.peer,
                    device = %self.device,
                    "registering a user buffer failed, sending through the staging copy from now on: {e}"
                );
                // Registrations behind lent writes still in flight stay
                // until nothing is in flight (`idle`).
                self.regs.disable();
                return self.send_host(header, data);
            }
        };
        let off = (self.sent % self.slots as u64) as usize * self.slot_bytes;
        let payload = SendWr {
            signaled: true,
            wr_id: LENT_TAG | self.sent,
            local: (addr, data.len() as u32, mr.lkey),
            remote_addr: self.remote_fifo.0 + (off + HEADER_BYTES) as u64,
            rkey: self.remote_fifo.1,
            imm: None,
        };
        // The NIC reads a lent payload; its checksum is this side's only
        // read of it (the receiver verifies it as it uses the piece).
        let mut h = *header;
        if h.checksum.is_some() {
            h.checksum = Some(comm_core::wire::piece_checksum(data));
        }
        // Payload and header in one chain: one doorbell per piece.
        let header_wr = self.stage_piece(self.sent, &h, &[], HEADER_BYTES + data.len());
        // Counted first: a chain that fails part way may have posted the
        // payload (a failed post breaks the connection, which ends any
        // drain of lent writes).
        self.lent_in_flight += 1;
        self.post_chain(q, &mut [payload, header_wr])?;
        self.sent += 1;
        Ok(true)
    }

    /// Copies `payload` and the encoded `header` into the next piece's
    /// staging slot and writes them with immediate into the peer's slot on
    /// QP `q`, announcing `announced` bytes (more than staged when a lent
    /// piece's payload was written before, straight from its buffer). A
    /// staged payload whose header asks for a checksum is checksummed in
    /// its copy; a lent one's header carries its checksum already.
    pub(crate) fn post_staged(
        &mut self,
        q: usize,
        header: &PieceHeader,
        payload: &[u8],
        announced: usize,
    ) -> Result<bool, TransportError> {
        self.post_piece(q, self.sent, header, payload, announced)?;
        self.sent += 1;
        Ok(true)
    }

    /// Whether the next piece may take its slot: the peer credited the
    /// slot (an abort seen from the peer while the FIFO is full is an
    /// error), and no WRITE still reads this side's staging slot — a
    /// WRITE's source is the NIC's until a completion covering it is
    /// polled (ibv_post_send(3)), however long ago the peer consumed the
    /// data (`sendq.rs`). Where no completion that would retire it is
    /// coming (it and everything after it on its QP unsignalled), a
    /// signalled zero-length WRITE is posted behind it.
    pub(crate) fn fifo_room(&mut self) -> Result<bool, TransportError> {
        if self.sent - self.acked >= self.slots as u64 {
            if let Some(cause) = self.peer_aborted {
                return Err(TransportError::PeerAborted {
                    peer: self.peer,
                    cause,
                });
            }
            return Ok(false);
        }
        let slot = (self.sent % self.slots as u64) as usize;
        match self.sendq.reader(slot) {
            None => Ok(true),
            Some((_, true)) => Ok(false),
            Some((q, false)) => {
                if self.sq_room(q, 1) {
                    let fence = SendWr {
                        signaled: true,
                        wr_id: FENCE_WR_ID,
                        local: (self.staging_mr.addr, 0, self.staging_mr.lkey),
                        remote_addr: self.remote_fifo.0,
                        rkey: self.remote_fifo.1,
                        imm: None,
                    };
                    self.post(q, fence)?;
                }
                Ok(false)
            }
        }
    }

    /// Checks a piece before it is sent.
    fn check_piece(&self, header: &PieceHeader, data: &[u8]) -> Result<(), TransportError> {
        if data.len() > self.max_piece(MemoryKind::Host) || header.len as usize != data.len() {
            return Err(TransportError::Corrupt {
                peer: self.peer,
                detail: format!(
                    "refusing to send a piece of {} bytes (header says {}, largest {})",
                    data.len(),
                    header.len,
                    self.max_piece(MemoryKind::Host)
                ),
            });
        }
        Ok(())
    }
}
