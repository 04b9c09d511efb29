//! The board: where a receiver publishes its device inbox for its peer (a
//! one-slot [`Segment`]; `head == 1` once published), and then its
//! [`Verdict`] on the pair (the segment's `tail`, nonzero once published).
//! The peer controls the bytes it reads, so [`Board::read`] checks every
//! field.
//!
//! Devices are named by PCI bus id, not ordinal: an ordinal means something
//! only inside one process (one GPU per rank through `CUDA_VISIBLE_DEVICES`
//! makes every rank's device 0). Each side maps the peer's bus id to a
//! device of its own, decides whether it can reach it and publishes that;
//! both then use the AND of the two verdicts, so they decide alike and
//! never wait on each other.

use std::sync::atomic::Ordering;

use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, ReduceOp};
use device::{Backend, IpcHandle};
use transport_shm::Segment;

/// Payload bytes of a board (the segment's slot size).
pub const BOARD_BYTES: usize = 192;
/// Longest PCI bus id a board carries.
const BUS_ID_BYTES: usize = 32;
const MAGIC: [u8; 4] = *b"NVLB";

/// What a receiver publishes about its inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Board {
    /// The device's backend.
    pub backend: Backend,
    /// The device's ordinal in the receiver's process (for logs only).
    pub ordinal: usize,
    /// The device's PCI bus id (empty where the device reports none: then
    /// no peer can find it and the pair stages).
    pub bus_id: String,
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
        fingerprint: Some(Fingerprint {
            collective: Collective::Barrier,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count: 0,
            settings: 0,
        }),
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
        let id = self.bus_id.as_bytes();
        let n = id.len().min(BUS_ID_BYTES);
        b[128..128 + n].copy_from_slice(&id[..n]);
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
        let id = &b[128..128 + BUS_ID_BYTES];
        let id = &id[..id.iter().position(|&c| c == 0).unwrap_or(BUS_ID_BYTES)];
        let bus_id = std::str::from_utf8(id)
            .ok()
            .filter(|s| s.bytes().all(|c| c.is_ascii_graphic()))
            .ok_or_else(|| format!("the nvlink board's PCI bus id {id:02x?} is not text"))?
            .to_string();
        Ok(Board {
            backend,
            pid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            ordinal: to_usize(u64_at(12), "ordinal")?,
            bus_id,
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

/// One side's verdict on the pair, published after it has read the peer's
/// board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// This side can map the peer's device memory (the same device, or
    /// peer access between the two).
    Reach = 1,
    /// The peer's device is not visible in this process (not in its
    /// `CUDA_VISIBLE_DEVICES`, or no bus id).
    NotVisible = 2,
    /// Visible, but without peer access from this side's device.
    NoPeerAccess = 3,
    /// The two devices are of different backends.
    OtherBackend = 4,
    /// Deciding failed on this side (a device call, a bad board); it
    /// reports the error itself.
    Failed = 5,
}

impl Verdict {
    /// What the verdict says, for errors and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Verdict::Reach => "can reach the other rank's device",
            Verdict::NotVisible => {
                "does not see the other rank's device (not visible in its process)"
            }
            Verdict::NoPeerAccess => "has no peer access to the other rank's device",
            Verdict::OtherBackend => "has a device of another backend than the other rank's",
            Verdict::Failed => "failed to decide (a device call or a bad board)",
        }
    }

    /// Publishes this side's verdict on `seg` (this side's board, already
    /// published).
    pub fn publish(self, seg: &Segment) {
        seg.tail().store(self as u64, Ordering::Release);
    }

    /// The peer's verdict on its board `seg`, once published.
    pub fn read(seg: &Segment) -> Result<Option<Verdict>, String> {
        Ok(Some(match seg.tail().load(Ordering::Acquire) {
            0 => return Ok(None),
            1 => Verdict::Reach,
            2 => Verdict::NotVisible,
            3 => Verdict::NoPeerAccess,
            4 => Verdict::OtherBackend,
            5 => Verdict::Failed,
            x => return Err(format!("the nvlink board's verdict {x} is not one")),
        }))
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
            bus_id: "0000:1B:00.0".into(),
            pid: 77,
            token: process_token(),
            slots: 8,
            slot_bytes: 1 << 20,
            addr: 0x4000_0000_0000_1000,
            handle: IpcHandle([7; 64]),
        };
        assert_eq!(Board::decode(&b.encode()), Ok(b.clone()));
        let mut bad = b.encode();
        bad[4] = 9;
        assert!(Board::decode(&bad).unwrap_err().contains("backend"));
        let mut bad = b.encode();
        bad[20..28].copy_from_slice(&0u64.to_le_bytes());
        assert!(Board::decode(&bad).unwrap_err().contains("geometry"));
        assert!(Board::decode(&[0; 16]).is_err());
        let mut bad = b.encode();
        bad[130] = 0xff;
        assert!(Board::decode(&bad).unwrap_err().contains("bus id"));
        // The token tells processes apart where pids repeat (containers).
        assert_ne!(process_token(), 0);
        assert_eq!(process_token(), process_token());
    }
}
