//! One shared-memory FIFO of slots in a file under `/dev/shm`, written by one
//! sender process and read by one receiver. Flow control is NCCL's: the
//! sender's `head` counts slots posted, the receiver's `tail` counts slots
//! consumed; `head - tail` slots are full. This module holds all the
//! pointer work; everything above it is safe code.

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use comm_core::wire::{PieceHeader, HEADER_BYTES};
use memmap2::MmapMut;

const MAGIC: u64 = 0x534e_434c_5348_4d31; // "SNCLSHM1"
const LINE: usize = 128; // two cache lines: no false sharing with the prefetcher
const OFF_MAGIC: usize = 0;
const OFF_GEOMETRY: usize = 8; // u32 slots, u32 slot_bytes
const OFF_CREATOR_PID: usize = 16;
const OFF_HEAD: usize = LINE;
const OFF_TAIL: usize = 2 * LINE;
const OFF_ABORT_BY_SENDER: usize = 3 * LINE;
const OFF_ABORT_BY_RECEIVER: usize = 3 * LINE + 8;
const OFF_SENDER_PID: usize = 3 * LINE + 16;
const OFF_SLOTS: usize = 4 * LINE;
const SLOT_HEADER: usize = 64;

/// Directory of the segments.
pub const SHM_DIR: &str = "/dev/shm";
/// File name prefix of every sncl segment.
pub const PREFIX: &str = "sncl-";

/// A mapped FIFO.
pub struct Segment {
    map: MmapMut,
    path: PathBuf,
    slots: usize,
    slot_bytes: usize,
}

fn total_bytes(slots: usize, slot_bytes: usize) -> usize {
    OFF_SLOTS + slots * (SLOT_HEADER + slot_bytes)
}

impl Segment {
    /// Creates (as the receiver) a new segment file `name` and maps it.
    pub fn create(name: &str, slots: usize, slot_bytes: usize) -> io::Result<Segment> {
        assert!(slots >= 1 && slot_bytes.is_multiple_of(64));
        let path = Path::new(SHM_DIR).join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.set_len(total_bytes(slots, slot_bytes) as u64)?;
        // SAFETY: the file was just created by us with exclusive access; its
        // contents are only read and written through atomics and the slot
        // protocol below, by this process and the one sender.
        let map = unsafe { MmapMut::map_mut(&file)? };
        let mut seg = Segment {
            map,
            path,
            slots,
            slot_bytes,
        };
        seg.map[OFF_GEOMETRY..OFF_GEOMETRY + 4].copy_from_slice(&(slots as u32).to_ne_bytes());
        seg.map[OFF_GEOMETRY + 4..OFF_GEOMETRY + 8]
            .copy_from_slice(&(slot_bytes as u32).to_ne_bytes());
        seg.map[OFF_CREATOR_PID..OFF_CREATOR_PID + 4]
            .copy_from_slice(&std::process::id().to_ne_bytes());
        seg.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Opens (as the sender) a segment the receiver created.
    pub fn open(name: &str) -> io::Result<Segment> {
        let path = Path::new(SHM_DIR).join(name);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        // SAFETY: as in `create`; the receiver created the file and sized it
        // before publishing its name.
        let map = unsafe { MmapMut::map_mut(&file)? };
        if map.len() < OFF_SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "segment too short",
            ));
        }
        let mut seg = Segment {
            map,
            path,
            slots: 0,
            slot_bytes: 0,
        };
        if seg.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an sncl segment",
            ));
        }
        let slots = u32::from_ne_bytes(seg.map[OFF_GEOMETRY..OFF_GEOMETRY + 4].try_into().unwrap());
        let slot_bytes = u32::from_ne_bytes(
            seg.map[OFF_GEOMETRY + 4..OFF_GEOMETRY + 8]
                .try_into()
                .unwrap(),
        );
        seg.slots = slots as usize;
        seg.slot_bytes = slot_bytes as usize;
        if seg.map.len() < total_bytes(seg.slots, seg.slot_bytes) || seg.slots == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "segment geometry",
            ));
        }
        seg.pid_word(OFF_SENDER_PID)
            .store(std::process::id(), Ordering::Release);
        Ok(seg)
    }

    /// Removes the file name (the mapping stays valid for both sides).
    pub fn unlink(&self) {
        let _ = fs::remove_file(&self.path);
    }

    /// Payload bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= OFF_SLOTS);
        // SAFETY: the mapping is page aligned, `off` is 8-aligned and inside
        // the header; AtomicU64 has the layout of u64, and all cross-process
        // accesses to these words are atomic.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn pid_word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `word`, for a 4-aligned u32.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    /// Slots posted by the sender.
    pub fn head(&self) -> &AtomicU64 {
        self.word(OFF_HEAD)
    }

    /// Slots consumed by the receiver.
    pub fn tail(&self) -> &AtomicU64 {
        self.word(OFF_TAIL)
    }

    /// Abort word written by the sender (0: none; else cause rank + 1, or u64::MAX).
    pub fn abort_by_sender(&self) -> &AtomicU64 {
        self.word(OFF_ABORT_BY_SENDER)
    }

    /// Abort word written by the receiver.
    pub fn abort_by_receiver(&self) -> &AtomicU64 {
        self.word(OFF_ABORT_BY_RECEIVER)
    }

    /// Pid of the process that created (receives from) this segment.
    pub fn creator_pid(&self) -> u32 {
        u32::from_ne_bytes(
            self.map[OFF_CREATOR_PID..OFF_CREATOR_PID + 4]
                .try_into()
                .unwrap(),
        )
    }

    /// Pid of the sender, once it opened the segment (0 before).
    pub fn sender_pid(&self) -> u32 {
        self.pid_word(OFF_SENDER_PID).load(Ordering::Acquire)
    }

    fn slot_ptr(&self, index: u64) -> *mut u8 {
        let i = (index % self.slots as u64) as usize;
        let off = OFF_SLOTS + i * (SLOT_HEADER + self.slot_bytes);
        // SAFETY: i < slots, so the slot lies inside the mapping (checked
        // against the geometry in create/open).
        unsafe { (self.map.as_ptr() as *mut u8).add(off) }
    }

    /// Writes header and payload into slot `index` (the caller owns it: it
    /// is posted but not yet published by `head`).
    pub fn write_slot(&self, index: u64, header: &PieceHeader, data: &[u8]) {
        assert!(data.len() <= self.slot_bytes);
        let mut h = [0u8; HEADER_BYTES];
        header.encode(&mut h);
        let p = self.slot_ptr(index);
        // SAFETY: the slot is free (head - tail < slots, checked by the
        // caller under acquire ordering), so the receiver is not reading it;
        // header and payload fit in the slot (asserted above).
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), p, HEADER_BYTES);
            let dst = std::slice::from_raw_parts_mut(p.add(SLOT_HEADER), data.len());
            kernels::copy(dst, data);
        }
    }

    /// Borrows slot `index` (published by `head`, not yet released by `tail`).
    pub fn read_slot(&self, index: u64) -> Result<(PieceHeader, &[u8]), &'static str> {
        let p = self.slot_ptr(index);
        let mut h = [0u8; HEADER_BYTES];
        // SAFETY: the slot was published (acquire on head by the caller) and
        // the sender will not touch it until tail moves past it.
        unsafe { std::ptr::copy_nonoverlapping(p, h.as_mut_ptr(), HEADER_BYTES) };
        let header = PieceHeader::decode(&h).map_err(|e| e.0)?;
        let len = header.len as usize;
        if len > self.slot_bytes {
            return Err("piece longer than a slot");
        }
        // SAFETY: as above; len fits in the slot.
        let data = unsafe { std::slice::from_raw_parts(p.add(SLOT_HEADER), len) };
        Ok((header, data))
    }

    /// Number of slots.
    pub fn slots(&self) -> u64 {
        self.slots as u64
    }
}

/// Whether a process exists (shares the PID space across net namespaces).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes segments left by processes that no longer exist. Names end with
/// the creator's pid. Returns how many were removed.
pub fn cleanup_stale() -> usize {
    let Ok(dir) = fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(PREFIX) {
            continue;
        }
        let Some(pid) = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) && fs::remove_file(entry.path()).is_ok() {
            tracing::info!(
                segment = name,
                pid,
                "removed stale shared-memory segment of a dead process"
            );
            removed += 1;
        }
    }
    removed
}
