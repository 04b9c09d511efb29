//! The board: where a receiver publishes its device inbox for its peer (a
//! one-slot [`Segment`]; `head == 1` once published). The peer controls
//! the bytes it reads, so [`Board::read`] checks every field.

use std::sync::atomic::Ordering;

use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, ReduceOp};
use device::{Backend, IpcHandle};
use transport_shm::Segment;

/// Payload bytes of a board (the segment's slot size).
pub const BOARD_BYTES: usize = 128;
const MAGIC: [u8; 4] = *b"NVLB";

/// What a receiver publishes about its inbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Board {
    /// The device's backend.
    pub backend: Backend,
    /// The device's ordinal.
    pub ordinal: usize,
    /// The receiver's process (for logs).
    pub pid: u32,
    /// A random number of the receiver's process ([`process_token`]): pids
    /// repeat across PID namespaces (containers sharing `/dev/shm`), this
    /// does not, so "the same process" is decided by it.
    pub token: u64,
    /// Inbox slots.
    pub slots: usize,
    /// Bytes per inbox slot.
    pub slot_bytes: usize,
    /// The inbox's address in the receiver's process.
    pub addr: u64,
    /// The inbox's IPC handle.
    pub handle: IpcHandle,
}

/// This process's random token (see [`Board::token`]), drawn once.
pub fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut b = [0u8; 8];
        // A failed draw leaves zeros: then pids decide, as before.
        let _ = getrandom::fill(&mut b);
        u64::from_le_bytes(b) | 1
    })
}

fn header(comm_id: u64) -> PieceHeader {
    PieceHeader {
        comm_id,
        seq: 0,
        fingerprint: Fingerprint {
            collective: Collective::Barrier,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count: 0,
        },
        len: BOARD_BYTES as u32,
        checksum: None,
    }
}

impl Board {
    /// The board's bytes as [`Board::publish`] writes them.
    pub fn encode(&self) -> [u8; BOARD_BYTES] {
        let mut b = [0u8; BOARD_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = match self.backend {
            Backend::Cuda => 1,
            Backend::Emu => 2,
        };
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..20].copy_from_slice(&(self.ordinal as u64).to_le_bytes());
        b[20..28].copy_from_slice(&(self.slots as u64).to_le_bytes());
        b[28..36].copy_from_slice(&(self.slot_bytes as u64).to_le_bytes());
        b[36..44].copy_from_slice(&self.addr.to_le_bytes());
        b[44..52].copy_from_slice(&self.token.to_le_bytes());
        b[64..128].copy_from_slice(&self.handle.0);
        b
    }

    /// Decodes a board a peer wrote (every field checked: the peer controls
    /// these bytes).
    pub fn decode(b: &[u8]) -> Result<Board, String> {
        if b.len() != BOARD_BYTES || b[0..4] != MAGIC {
            return Err("the nvlink board is not one (bad magic or length)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let backend = match b[4] {
            1 => Backend::Cuda,
            2 => Backend::Emu,
            x => return Err(format!("the nvlink board names unknown backend {x}")),
        };
        let to_usize = |v: u64, what: &str| {
            usize::try_from(v).map_err(|_| format!("the nvlink board's {what} ({v}) does not fit"))
        };
        let slots = to_usize(u64_at(20), "slot count")?;
        let slot_bytes = to_usize(u64_at(28), "slot size")?;
        if slots == 0 || slot_bytes == 0 || slots.checked_mul(slot_bytes).is_none() {
            return Err(format!(
                "the nvlink board's inbox geometry ({slots} slots of {slot_bytes} bytes) is invalid"
            ));
        }
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[64..128]);
        Ok(Board {
            backend,
            pid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            ordinal: to_usize(u64_at(12), "ordinal")?,
            slots,
            slot_bytes,
            addr: u64_at(36),
            token: u64_at(44),
            handle: IpcHandle(handle),
        })
    }

    /// Writes the board into `seg` (this side's, never published before)
    /// and publishes it.
    pub fn publish(&self, seg: &Segment, comm_id: u64) {
        seg.write_slot(0, &header(comm_id), &self.encode());
        seg.head().store(1, Ordering::Release);
    }

    /// The peer's board, once published (`Ok(None)` before).
    pub fn read(seg: &Segment) -> Result<Option<Board>, String> {
        if seg.head().load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        let (_, data) = seg
            .read_inline_slot(0)
            .map_err(|e| format!("the nvlink board: {e}"))?;
        Board::decode(data).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boards_round_trip_and_garbage_is_refused() {
        let b = Board {
            backend: Backend::Emu,
            ordinal: 3,
            pid: 77,
            token: process_token(),
            slots: 8,
            slot_bytes: 1 << 20,
            addr: 0x4000_0000_0000_1000,
            handle: IpcHandle([7; 64]),
        };
        assert_eq!(Board::decode(&b.encode()), Ok(b));
        let mut bad = b.encode();
        bad[4] = 9;
        assert!(Board::decode(&bad).unwrap_err().contains("backend"));
        let mut bad = b.encode();
        bad[20..28].copy_from_slice(&0u64.to_le_bytes());
        assert!(Board::decode(&bad).unwrap_err().contains("geometry"));
        assert!(Board::decode(&[0; 16]).is_err());
        // The token tells processes apart where pids repeat (containers).
        assert_ne!(process_token(), 0);
        assert_eq!(process_token(), process_token());
    }
}
