//! One shared-memory FIFO of slots in a file under `/dev/shm`, written by one
//! sender process and read by one receiver. Flow control is NCCL's: the
//! sender's `head` counts slots posted, the receiver's `tail` counts slots
//! consumed; `head - tail` slots are full. Each slot also carries its own
//! publication, as NCCL's LL protocol puts flag and data in one line: the
//! slot header's last words are a *stamp* naming the slot's index, stored
//! last with release ordering, so a receiver that polls the slot it
//! expects ([`Segment::is_published`]) learns of a piece, its header and
//! its first bytes from one cache-line pair instead of first fetching
//! `head`'s line (docs/perf-notes/NOTEBOOK.md §27). This module holds all
//! the pointer work; everything above it is safe code.
//!
//! Segments carry gradients, so they are private to the user that runs the
//! job: created `0600` with `O_EXCL | O_NOFOLLOW`, under names holding a
//! 128-bit random token, and opened only by plain names, without following
//! links, after checking that the file is a regular file of our effective
//! uid that nobody else can read.

use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use comm_core::wire::{copy_checksummed, PieceHeader, FINGERPRINT_BYTES, HEADER_BYTES};
use memmap2::MmapMut;

use crate::private_file::{self, check_name, Published, PREFIX, SHM_DIR};

const MAGIC: u64 = 0x534e_434c_5348_4d33; // "SNCLSHM3": slots carry stamps; lanes
const LINE: usize = 128; // two cache lines: no false sharing with the prefetcher
const OFF_MAGIC: usize = 0;
const OFF_GEOMETRY: usize = 8; // u32 slots, u32 slot_bytes
const OFF_CREATOR_PID: usize = 16;
const OFF_HEAD: usize = LINE;
const OFF_TAIL: usize = 2 * LINE;
const OFF_ABORT_BY_SENDER: usize = 3 * LINE;
const OFF_ABORT_BY_RECEIVER: usize = 3 * LINE + 8;
const OFF_SENDER_PID: usize = 3 * LINE + 16;
// The lane (comm_core::transport::lane): two 64-byte lines the sender
// writes, by the parity of the operation's sequence number, and the word in
// which the receiver acknowledges the last line it took (a line of its own).
const OFF_LANES: usize = 4 * LINE;
const OFF_LANE_ACK: usize = 5 * LINE;
const OFF_SLOTS: usize = 6 * LINE;
/// Bytes of one lane line: the stamp (the operation's sequence number,
/// stored last with release ordering), the sender's acknowledgement of the
/// reverse lane, the fingerprint, the payload.
const LANE_LINE: usize = 64;
const LANE_ACK_AT: usize = 8;
const LANE_FINGERPRINT_AT: usize = 16;
const LANE_PAYLOAD_AT: usize = LANE_FINGERPRINT_AT + FINGERPRINT_BYTES;
/// Payload bytes of a lane line.
pub const LANE_PAYLOAD: usize = LANE_LINE - LANE_PAYLOAD_AT;
const _: () = assert!(2 * LANE_LINE <= LINE && OFF_LANES + 2 * LANE_LINE <= OFF_LANE_ACK);

/// A lane line as read: the sender's acknowledgement of the reverse lane,
/// the fingerprint's bytes and the payload.
pub struct LaneLine {
    /// The last sequence number the line's writer took from the reverse lane.
    pub ack: u64,
    /// The operation's fingerprint, encoded (`Fingerprint::encode`).
    pub fingerprint: [u8; FINGERPRINT_BYTES],
    /// The payload, zero-padded.
    pub payload: [u8; LANE_PAYLOAD],
}
const SLOT_HEADER: usize = 64;
// After the piece header, a slot header holds the address a lent piece
// has in its sender, then the stamp: `2 * (index + 1)` for a slot that
// carries the payload itself, one more for a descriptor of a lent piece.
// A stamp from the slot's previous lap (index - slots) or a fresh
// segment's zero never matches the index expected.
const SLOT_ADDRESS: usize = HEADER_BYTES;
const SLOT_STAMP: usize = HEADER_BYTES + 8;
const _: () = assert!(SLOT_STAMP + 8 <= SLOT_HEADER && SLOT_STAMP.is_multiple_of(8));
/// A payload of at most this many bytes travels in the slot header, in the
/// word a lent piece's address takes: stamp, header and payload share one
/// cache line, so an 8-byte piece costs the receiver one line.
pub const IN_HEADER_BYTES: usize = 8;

/// The stamp of slot `index` carrying a lent piece (`lent`) or its payload.
fn stamp(index: u64, lent: bool) -> u64 {
    index.wrapping_add(1).wrapping_mul(2) | u64::from(lent)
}

/// What a published slot carries.
#[derive(Debug)]
pub enum SlotData<'a> {
    /// The payload, in the slot.
    Inline(&'a [u8]),
    /// A descriptor: the sender lent `header.len` bytes at this address in
    /// its own memory (read them with [`crate::cma::read_from`]).
    Lent(u64),
}

/// A mapped FIFO.
pub struct Segment {
    map: MmapMut,
    /// The creator's handle on the name its peer opens it by.
    published: Option<Arc<Published>>,
    slots: usize,
    slot_bytes: usize,
}

fn invalid_input(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, detail)
}

/// Bytes of a segment with this geometry, or `None` when it overflows.
fn total_bytes(slots: usize, slot_bytes: usize) -> Option<usize> {
    SLOT_HEADER
        .checked_add(slot_bytes)?
        .checked_mul(slots)?
        .checked_add(OFF_SLOTS)
}

/// Checks a geometry for [`Segment::create`]; returns the segment's size.
fn check_geometry(slots: usize, slot_bytes: usize) -> io::Result<usize> {
    if slots == 0 || u32::try_from(slots).is_err() {
        return Err(invalid_input(format!(
            "shared-memory segment with {slots} slots: expected 1 to {} slots",
            u32::MAX
        )));
    }
    if slot_bytes == 0 || !slot_bytes.is_multiple_of(64) || u32::try_from(slot_bytes).is_err() {
        return Err(invalid_input(format!(
            "shared-memory slot of {slot_bytes} bytes: expected a non-zero multiple of 64 \
             of at most {} bytes",
            u32::MAX / 64 * 64
        )));
    }
    total_bytes(slots, slot_bytes)
        .filter(|&t| u64::try_from(t).is_ok_and(|t| t <= i64::MAX as u64))
        .ok_or_else(|| {
            invalid_input(format!(
                "shared-memory segment of {slots} slots of {slot_bytes} bytes: size overflows"
            ))
        })
}

/// Decodes the header a sender wrote into a slot of `slot_bytes` payload
/// bytes; the peer controls these bytes, so anything that is not a header of
/// a piece that fits the slot is an error. Public for the fuzz targets in
/// `fuzz/` only.
#[doc(hidden)]
pub fn decode_slot_header(
    h: &[u8; HEADER_BYTES],
    slot_bytes: usize,
) -> Result<PieceHeader, &'static str> {
    let header = PieceHeader::decode(h).map_err(|e| e.0)?;
    if header.len as usize > slot_bytes {
        return Err("piece longer than a slot");
    }
    Ok(header)
}

/// Maps a segment file with every page mapped in now (`MAP_POPULATE`).
/// Without it each process takes a page fault the first time it touches
/// each page of each slot: a message size's first pass through the
/// ring of slots ran 3–4× slower (2 ranks, 4 KiB all-reduce: 5–6 µs for
/// the first eight operations, one per slot, then 1.3–1.7 µs; 32 KiB:
/// 15–16 then 5 µs). The file's blocks are already allocated (see
/// `private_file::create`), so this costs page-table entries only.
///
/// # Safety
/// As [`MmapMut::map_mut`]: the caller keeps the mapping's contents
/// consistent with other processes that map the file.
unsafe fn map_populated(file: &std::fs::File) -> io::Result<MmapMut> {
    // SAFETY: passed on to the caller (see above).
    unsafe { memmap2::MmapOptions::new().populate().map_mut(file) }
}

impl Segment {
    /// Creates (as the receiver) a new segment file `name` and maps it.
    ///
    /// The file is created exclusively (`O_EXCL`), without following links,
    /// with mode `0600` whatever the umask. Bad geometry (no slots, a slot
    /// size that is zero, not a multiple of 64 or over `u32::MAX`, or a total
    /// that overflows) and a bad name are `InvalidInput` errors.
    pub fn create(name: &str, slots: usize, slot_bytes: usize) -> io::Result<Segment> {
        let total = check_geometry(slots, slot_bytes)?;
        check_name(name)?;
        let (file, path) = private_file::create(name, total).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "creating shared-memory segment {}: {e}",
                    Path::new(SHM_DIR).join(name).display()
                ),
            )
        })?;
        let published = Published::file(name, path.clone());
        match Segment::init(file, published, slots, slot_bytes) {
            Ok(seg) => Ok(seg),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(io::Error::new(
                    e.kind(),
                    format!(
                        "setting up shared-memory segment {} ({slots} slots of {slot_bytes} \
                         bytes): {e}",
                        path.display()
                    ),
                ))
            }
        }
    }

    /// Creates (as the receiver) a new anonymous segment (see
    /// [`private_file::create_anonymous`]) and maps it; its peer opens it by
    /// [`Self::published_name`] while it is not withdrawn ([`Self::unlink`]).
    /// Nothing of it is ever named in `/dev/shm`.
    pub fn create_anonymous(slots: usize, slot_bytes: usize) -> io::Result<Segment> {
        let total = check_geometry(slots, slot_bytes)?;
        let (file, published) = private_file::create_anonymous(total).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("creating an anonymous shared-memory segment of {total} bytes: {e}"),
            )
        })?;
        Segment::init(file, published, slots, slot_bytes)
    }

    /// The name its peer opens it by (the creator's side only).
    pub fn published_name(&self) -> Option<&str> {
        self.published.as_deref().map(Published::name)
    }

    /// The creator's handle on that name, to withdraw it later.
    pub fn published(&self) -> Option<Arc<Published>> {
        self.published.clone()
    }

    fn init(
        file: File,
        published: Published,
        slots: usize,
        slot_bytes: usize,
    ) -> io::Result<Segment> {
        // SAFETY: the file was just created by us with exclusive access; its
        // contents are only read and written through atomics and the slot
        // protocol below, by this process and the one sender.
        let map = unsafe { map_populated(&file)? };
        let mut seg = Segment {
            map,
            published: Some(Arc::new(published)),
            slots,
            slot_bytes,
        };
        // Both fit u32: checked by `check_geometry`.
        seg.map[OFF_GEOMETRY..OFF_GEOMETRY + 4].copy_from_slice(&(slots as u32).to_ne_bytes());
        seg.map[OFF_GEOMETRY + 4..OFF_GEOMETRY + 8]
            .copy_from_slice(&(slot_bytes as u32).to_ne_bytes());
        seg.map[OFF_CREATOR_PID..OFF_CREATOR_PID + 4]
            .copy_from_slice(&std::process::id().to_ne_bytes());
        seg.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Opens (as the sender) a segment the receiver created.
    ///
    /// `name` must pass [`check_name`] (a plain name, no path); the file is
    /// opened without following links and must be a regular file owned by
    /// this process's effective uid with no group or other access.
    pub fn open(name: &str) -> io::Result<Segment> {
        let (file, path) = private_file::open(name)?;
        let bad = |kind: io::ErrorKind, what: &str| {
            io::Error::new(
                kind,
                format!("shared-memory segment {}: {what}", path.display()),
            )
        };
        // SAFETY: as in `create`; the receiver (same uid, checked above)
        // created the file and sized it before publishing its name.
        let map = unsafe { map_populated(&file)? };
        if map.len() < OFF_SLOTS {
            return Err(bad(io::ErrorKind::InvalidData, "segment too short"));
        }
        let mut seg = Segment {
            map,
            published: None,
            slots: 0,
            slot_bytes: 0,
        };
        if seg.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(bad(io::ErrorKind::InvalidData, "not an sncl segment"));
        }
        let field = |off: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&seg.map[off..off + 4]);
            u32::from_ne_bytes(b) as usize
        };
        let (slots, slot_bytes) = (field(OFF_GEOMETRY), field(OFF_GEOMETRY + 4));
        let fits = check_geometry(slots, slot_bytes).is_ok_and(|t| t <= seg.map.len());
        if !fits {
            return Err(bad(
                io::ErrorKind::InvalidData,
                &format!(
                    "geometry of {slots} slots of {slot_bytes} bytes does not fit its {} bytes",
                    seg.map.len()
                ),
            ));
        }
        seg.slots = slots;
        seg.slot_bytes = slot_bytes;
        seg.pid_word(OFF_SENDER_PID)
            .store(std::process::id(), Ordering::Release);
        Ok(seg)
    }

    /// Withdraws the name its peer opens it by (the creator's side; the
    /// mappings stay valid for both sides).
    pub fn unlink(&self) {
        if let Some(p) = &self.published {
            p.withdraw();
        }
    }

    /// Bytes of the mapping (header, lanes and slots).
    pub fn mapped_bytes(&self) -> usize {
        self.map.len()
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

    /// Writes payload and header into slot `index` (the caller owns it: it
    /// is posted but not yet published by `head`). A header that asks for
    /// a checksum gets the CRC32C of `data`, computed in the copy itself
    /// ([`copy_checksummed`]) and written into the header after it.
    pub fn write_slot(&self, index: u64, header: &PieceHeader, data: &[u8]) {
        assert!(data.len() <= self.slot_bytes);
        let mut in_header = [0u8; 8];
        let dst: &mut [u8] = if data.len() <= IN_HEADER_BYTES {
            &mut in_header[..data.len()]
        } else {
            let p = self.slot_ptr(index);
            // SAFETY: the slot is free (head - tail < slots, checked by the
            // caller under acquire ordering), so the receiver is not reading
            // it; the payload fits in the slot after its header (asserted
            // above).
            unsafe { std::slice::from_raw_parts_mut(p.add(SLOT_HEADER), data.len()) }
        };
        let mut h = *header;
        match h.checksum {
            Some(_) => h.checksum = Some(copy_checksummed(dst, data)),
            None => kernels::copy(dst, data),
        }
        self.write_slot_header(index, &h, false, in_header);
    }

    /// Writes into slot `index` (owned by the caller, as in `write_slot`) a
    /// descriptor of `header.len` bytes lent at `address` in this process.
    pub fn write_lent(&self, index: u64, header: &PieceHeader, address: u64) {
        assert!(header.len as usize <= self.slot_bytes);
        self.write_slot_header(index, header, true, address.to_ne_bytes());
    }

    /// Writes the slot header (piece header; a lent piece's address or a
    /// payload of at most [`IN_HEADER_BYTES`]), then its stamp with release
    /// ordering: the slot's payload, written before, and its header are
    /// visible to a receiver that acquires the stamp.
    fn write_slot_header(&self, index: u64, header: &PieceHeader, lent: bool, word: [u8; 8]) {
        let mut h = [0u8; SLOT_STAMP];
        let (piece, rest) = h.split_at_mut(HEADER_BYTES);
        header.encode(piece.try_into().expect("HEADER_BYTES"));
        rest[..8].copy_from_slice(&word);
        let p = self.slot_ptr(index);
        // SAFETY: the slot is free (head - tail < slots, checked by the
        // caller under acquire ordering), so the receiver is not reading it;
        // the slot header lies inside the slot.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), p, SLOT_STAMP) };
        self.stamp_word(index)
            .store(stamp(index, lent), Ordering::Release);
    }

    /// The stamp word of slot `index`'s header.
    fn stamp_word(&self, index: u64) -> &AtomicU64 {
        // SAFETY: the slot header lies inside the mapping (`slot_ptr`), the
        // mapping is page aligned and slots are 64-byte multiples apart, so
        // the word is 8-aligned; AtomicU64 has the layout of u64, and both
        // processes access the stamp atomically only.
        unsafe { &*(self.slot_ptr(index).add(SLOT_STAMP) as *const AtomicU64) }
    }

    /// Whether the sender published slot `index` (its stamp names it),
    /// with acquire ordering: `true` makes the slot's header and payload
    /// visible, as an acquire of `head` past it does.
    pub fn is_published(&self, index: u64) -> bool {
        self.stamp_word(index).load(Ordering::Acquire) >> 1 == index.wrapping_add(1)
    }

    /// Borrows slot `index` (published by `head`, not yet released by `tail`).
    pub fn read_slot(&self, index: u64) -> Result<(PieceHeader, SlotData<'_>), &'static str> {
        let p = self.slot_ptr(index);
        let mut h = [0u8; SLOT_HEADER];
        // SAFETY: the slot was published (acquire on head by the caller) and
        // the sender will not touch it until tail moves past it.
        unsafe { std::ptr::copy_nonoverlapping(p, h.as_mut_ptr(), SLOT_HEADER) };
        let header = decode_slot_header(
            h[..HEADER_BYTES].try_into().expect("HEADER_BYTES"),
            self.slot_bytes,
        )?;
        let word = |off: usize| u64::from_ne_bytes(h[off..off + 8].try_into().expect("8 bytes"));
        match word(SLOT_STAMP) {
            s if s == stamp(index, false) => {
                let len = header.len as usize;
                let at = if len <= IN_HEADER_BYTES {
                    SLOT_ADDRESS
                } else {
                    SLOT_HEADER
                };
                // SAFETY: as above; len fits in the slot, or in the header
                // word at SLOT_ADDRESS.
                let data = unsafe { std::slice::from_raw_parts(p.add(at), len) };
                Ok((header, SlotData::Inline(data)))
            }
            s if s == stamp(index, true) => Ok((header, SlotData::Lent(word(SLOT_ADDRESS)))),
            _ => Err("a published slot whose stamp names another slot"),
        }
    }

    /// As [`Segment::read_slot`], for FIFOs that never carry lent pieces
    /// (control rings): a descriptor is an error.
    pub fn read_inline_slot(&self, index: u64) -> Result<(PieceHeader, &[u8]), &'static str> {
        match self.read_slot(index)? {
            (h, SlotData::Inline(data)) => Ok((h, data)),
            (_, SlotData::Lent(_)) => {
                Err("a lent-piece descriptor in a ring that carries bytes only")
            }
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> u64 {
        self.slots as u64
    }

    fn lane_line(&self, seq: u64) -> *mut u8 {
        let off = OFF_LANES + (seq & 1) as usize * LANE_LINE;
        // SAFETY: both lane lines lie in the header, before the slots,
        // inside every mapping (`open` checks the length against
        // OFF_SLOTS).
        unsafe { (self.map.as_ptr() as *mut u8).add(off) }
    }

    fn lane_stamp(&self, seq: u64) -> &AtomicU64 {
        // SAFETY: the line is 64-byte aligned in the page-aligned mapping;
        // AtomicU64 has the layout of u64, and both processes access the
        // stamp atomically only.
        unsafe { &*(self.lane_line(seq) as *const AtomicU64) }
    }

    /// The sender's side: writes the lane line of operation `seq` (its
    /// parity's) — `ack`, the fingerprint, `payload` (at most
    /// `LANE_PAYLOAD` bytes, zero-padded) — then its stamp, `seq`, with
    /// release ordering. The caller knows the receiver has taken what the
    /// line held (its acknowledgement reached `seq - 2` or the line's last
    /// stamp).
    pub fn write_lane(
        &self,
        seq: u64,
        ack: u64,
        fingerprint: &[u8; FINGERPRINT_BYTES],
        payload: &[u8],
    ) {
        assert!(
            payload.len() <= LANE_PAYLOAD,
            "a lane payload of {} bytes",
            payload.len()
        );
        let mut body = [0u8; LANE_LINE - LANE_ACK_AT];
        body[..8].copy_from_slice(&ack.to_ne_bytes());
        body[LANE_FINGERPRINT_AT - LANE_ACK_AT..LANE_PAYLOAD_AT - LANE_ACK_AT]
            .copy_from_slice(fingerprint);
        body[LANE_PAYLOAD_AT - LANE_ACK_AT..][..payload.len()].copy_from_slice(payload);
        // SAFETY: the line lies in the mapping (`lane_line`); the receiver
        // reads its body only after acquiring a stamp naming the operation
        // it waits for, and has acknowledged the line's previous one (the
        // caller's promise), so nobody reads these bytes now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                body.as_ptr(),
                self.lane_line(seq).add(LANE_ACK_AT),
                body.len(),
            )
        };
        self.lane_stamp(seq).store(seq, Ordering::Release);
    }

    /// The receiver's side: the lane line of operation `seq`, if its stamp
    /// names `seq` (acquire ordering: its body is then complete).
    pub fn read_lane(&self, seq: u64) -> Option<LaneLine> {
        if seq == 0 || self.lane_stamp(seq).load(Ordering::Acquire) != seq {
            return None;
        }
        let mut body = [0u8; LANE_LINE - LANE_ACK_AT];
        // SAFETY: the stamp was acquired; the sender rewrites the line only
        // after this side acknowledged it (`lane_ack`), after this read.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.lane_line(seq).add(LANE_ACK_AT),
                body.as_mut_ptr(),
                body.len(),
            )
        };
        let mut line = LaneLine {
            ack: u64::from_ne_bytes(body[..8].try_into().expect("8 bytes")),
            fingerprint: [0; FINGERPRINT_BYTES],
            payload: [0; LANE_PAYLOAD],
        };
        line.fingerprint.copy_from_slice(
            &body[LANE_FINGERPRINT_AT - LANE_ACK_AT..LANE_PAYLOAD_AT - LANE_ACK_AT],
        );
        line.payload
            .copy_from_slice(&body[LANE_PAYLOAD_AT - LANE_ACK_AT..]);
        Some(line)
    }

    /// The sequence number of the last lane line the receiver took
    /// (written by the receiver, read by the sender).
    pub fn lane_ack(&self) -> &AtomicU64 {
        self.word(OFF_LANE_ACK)
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
