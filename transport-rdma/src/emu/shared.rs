//! What the emulated NIC shares with its peers: registered regions and the
//! QP table, each a private file in `/dev/shm` (mode 0600, created with
//! [`transport_shm::private_file`]; names end in the creator's pid, so
//! [`transport_shm::cleanup_stale`] removes a crashed process's files).
//! Every word another process reads or writes is accessed atomically.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

use super::qp_rules::{state_code, Responder};
use crate::mem;
use crate::verbs::QpState;

/// Header page of a region file: magic, valid flag, base address, length,
/// rkey (one word each); the region's bytes follow (a dma-buf region's lie
/// in another file, named in its header).
pub(super) const HEADER: usize = 4096;
const MAGIC: u64 = 0x534e_434c_4942_454d; // "SNCLIBEM"
/// Header word 5 of a dma-buf registration's descriptor (words 6 and 7:
/// offset in the backing file and the length of its name, which starts
/// at byte [`NAME_AT`]).
const DMABUF: u64 = 0x444d_4142_5546; // "DMABUF"
const NAME_AT: usize = 64;
/// QPs one emulated device can hold at once: the process's one context
/// per port serves every connection (`context.rs`), 64 peers at 8 QPs
/// each, or 8 ranks of one process (threads) at 8 peers of 8 QPs.
pub(super) const QP_SLOTS: usize = 512;
/// Messages a QP's inbound ring holds (more than the transport's largest
/// FIFO, 256 slots, plus credits and an abort).
const RING: usize = 512;
/// Words of one QP entry: state, head, tail, padding, then the ring of
/// 4-word messages.
const ENTRY_WORDS: usize = 8 + RING * 4;

/// The GID of an emulated device: `snem`, pid, random token.
pub(super) fn gid_of(pid: u32, token: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0..4].copy_from_slice(b"snem");
    g[4..8].copy_from_slice(&pid.to_le_bytes());
    g[8..16].copy_from_slice(&token.to_le_bytes());
    g
}

/// The pid and token of an emulated device's GID.
pub(super) fn split_gid(gid: &[u8; 16]) -> Option<(u32, u64)> {
    (&gid[0..4] == b"snem").then(|| {
        (
            u32::from_le_bytes(gid[4..8].try_into().unwrap()),
            u64::from_le_bytes(gid[8..16].try_into().unwrap()),
        )
    })
}

fn region_name(gid: &[u8; 16], rkey: u32) -> Option<String> {
    let (pid, token) = split_gid(gid)?;
    Some(format!(
        "{}ibemu-{token:016x}-{rkey:08x}-{pid}",
        transport_shm::PREFIX
    ))
}

fn table_name(gid: &[u8; 16]) -> Option<String> {
    let (pid, token) = split_gid(gid)?;
    Some(format!(
        "{}ibemu-{token:016x}-qps-{pid}",
        transport_shm::PREFIX
    ))
}

/// A file this process created and mapped; removed on drop.
pub(super) struct OwnedFile {
    pub map: MmapRaw,
    file: std::fs::File,
    path: PathBuf,
}

impl OwnedFile {
    fn create(name: &str, len: usize) -> Result<OwnedFile, String> {
        let (file, path) = transport_shm::private_file::create(name, len)
            .map_err(|e| format!("creating /dev/shm/{name}: {e}"))?;
        match MmapRaw::map_raw(&file) {
            Ok(map) => Ok(OwnedFile { map, file, path }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(format!("mapping /dev/shm/{name}: {e}"))
            }
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        mem::header_word(&self.map, i)
    }
}

impl Drop for OwnedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn open_map(name: Option<String>, min_len: usize) -> Option<(MmapRaw, std::fs::File)> {
    let (file, _) = transport_shm::private_file::open(&name?).ok()?;
    let map = MmapRaw::map_raw(&file)
        .ok()
        .filter(|m| m.len() >= min_len)?;
    Some((map, file))
}

/// A registered region of this process: its file and, for a dma-buf
/// registration, the dma-buf's descriptor (kept open: peers may open it
/// through `/proc`, [`is_memfd`]).
pub(super) struct LocalRegion {
    file: OwnedFile,
    _dmabuf: Option<std::fs::File>,
}

/// Whether `link` (a `/proc/PID/fd/N` link's target) is a memfd: the strict
/// CUDA model's device allocations, which peers open through `/proc`.
pub(super) fn is_memfd(link: &std::path::Path) -> bool {
    link.to_str().is_some_and(|t| t.starts_with("/memfd:"))
}

/// Opens a peer's memfd named `/proc/PID/fd/N` (both numbers, and the
/// link's target a memfd: no other file is opened this way) and maps it.
fn open_proc_memfd(name: &str, min_len: usize) -> Option<MmapRaw> {
    let rest = name.strip_prefix("/proc/")?;
    let (pid, fd) = rest.split_once("/fd/")?;
    if !pid.bytes().chain(fd.bytes()).all(|b| b.is_ascii_digit()) || pid.is_empty() || fd.is_empty()
    {
        return None;
    }
    if !is_memfd(&std::fs::read_link(name).ok()?) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name)
        .ok()?;
    MmapRaw::map_raw(&file).ok().filter(|m| m.len() >= min_len)
}

impl LocalRegion {
    /// Creates the region file for `rkey` of `len` bytes and fills its header.
    pub fn create(gid: &[u8; 16], rkey: u32, len: usize) -> Result<LocalRegion, String> {
        let f = OwnedFile::create(&region_name(gid, rkey).expect("own GID"), HEADER + len)?;
        let addr = f.map.as_mut_ptr() as u64 + HEADER as u64;
        f.word(2).store(addr, Ordering::Relaxed);
        f.word(3).store(len as u64, Ordering::Relaxed);
        f.word(4).store(u64::from(rkey), Ordering::Relaxed);
        f.word(1).store(1, Ordering::Relaxed);
        f.word(0).store(MAGIC, Ordering::Release);
        Ok(LocalRegion {
            file: f,
            _dmabuf: None,
        })
    }

    /// Creates the descriptor file of a dma-buf registration (`rkey`):
    /// `len` bytes at work-request address `iova`, lying at byte `offset`
    /// of the shared-memory file `backing` (the dma-buf's file, which a
    /// writer maps as a NIC maps the dma-buf's pages: a name in `/dev/shm`,
    /// or `/proc/PID/fd/N` of `dmabuf`, kept open here). No bytes follow
    /// the header.
    pub fn create_dmabuf(
        gid: &[u8; 16],
        rkey: u32,
        (iova, len): (u64, usize),
        (backing, offset): (&str, u64),
        dmabuf: std::fs::File,
    ) -> Result<LocalRegion, String> {
        if backing.len() > HEADER - NAME_AT {
            return Err(format!("dma-buf file name {backing:?} is too long"));
        }
        let f = OwnedFile::create(&region_name(gid, rkey).expect("own GID"), HEADER)?;
        // SAFETY: the header page is this process's fresh mapping of
        // HEADER bytes; the name fits behind NAME_AT (checked above), and
        // nobody reads it before the magic is published (Release below).
        unsafe {
            std::ptr::copy_nonoverlapping(
                backing.as_ptr(),
                f.map.as_mut_ptr().add(NAME_AT),
                backing.len(),
            )
        };
        f.word(2).store(iova, Ordering::Relaxed);
        f.word(3).store(len as u64, Ordering::Relaxed);
        f.word(4).store(u64::from(rkey), Ordering::Relaxed);
        f.word(5).store(DMABUF, Ordering::Relaxed);
        f.word(6).store(offset, Ordering::Relaxed);
        f.word(7).store(backing.len() as u64, Ordering::Relaxed);
        f.word(1).store(1, Ordering::Relaxed);
        f.word(0).store(MAGIC, Ordering::Release);
        Ok(LocalRegion {
            file: f,
            _dmabuf: Some(dmabuf),
        })
    }

    /// The region file's mapping (header, then the bytes).
    pub fn map(&self) -> &MmapRaw {
        &self.file.map
    }

    /// The address work requests use.
    pub fn addr(&self) -> u64 {
        self.file.word(2).load(Ordering::Relaxed)
    }

    /// Invalidates the region for every peer (deregistration).
    pub fn invalidate(&self) {
        self.file.word(1).store(0, Ordering::Release);
    }
}

/// A peer's region, mapped by a writer.
pub(super) struct RemoteRegion {
    /// The region's bytes: its own file, or a dma-buf region's backing
    /// file.
    pub map: MmapRaw,
    /// The dma-buf region's descriptor (the valid flag and rkey live
    /// there); `None`: they are in `map`'s header.
    desc: Option<MmapRaw>,
    /// Where the region's first byte lies in `map`.
    start: usize,
    base: u64,
    len: usize,
    rkey: u32,
}

impl RemoteRegion {
    /// Maps the peer `gid`'s region `rkey` (None: there is no such region).
    pub fn open(gid: &[u8; 16], rkey: u32) -> Option<RemoteRegion> {
        let (map, _) = open_map(region_name(gid, rkey), HEADER)?;
        if mem::header_word(&map, 0).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let base = mem::header_word(&map, 2).load(Ordering::Acquire);
        let len = mem::header_word(&map, 3).load(Ordering::Acquire) as usize;
        if mem::header_word(&map, 5).load(Ordering::Acquire) == DMABUF {
            return Self::open_dmabuf(map, base, len, rkey);
        }
        (len <= map.len() - HEADER).then_some(RemoteRegion {
            map,
            desc: None,
            start: HEADER,
            base,
            len,
            rkey,
        })
    }

    /// A dma-buf registration: maps the backing file its descriptor names.
    fn open_dmabuf(desc: MmapRaw, base: u64, len: usize, rkey: u32) -> Option<RemoteRegion> {
        let offset = mem::header_word(&desc, 6).load(Ordering::Acquire);
        let name_len = mem::header_word(&desc, 7).load(Ordering::Acquire) as usize;
        if name_len == 0 || name_len > HEADER - NAME_AT || desc.len() < HEADER {
            return None;
        }
        let mut name = vec![0u8; name_len];
        // SAFETY: NAME_AT + name_len <= HEADER <= the mapping's length
        // (checked above); the creator wrote the name before publishing
        // the magic (read with Acquire by `open`).
        unsafe {
            std::ptr::copy_nonoverlapping(desc.as_ptr().add(NAME_AT), name.as_mut_ptr(), name_len)
        };
        let name = String::from_utf8(name).ok()?;
        let start = usize::try_from(offset).ok()?;
        let min_len = start.checked_add(len)?;
        let map = if name.starts_with("/proc/") {
            open_proc_memfd(&name, min_len)?
        } else {
            open_map(Some(name), min_len)?.0
        };
        Some(RemoteRegion {
            map,
            desc: Some(desc),
            start,
            base,
            len,
            rkey,
        })
    }

    /// The offset in [`RemoteRegion::map`] of `addr .. addr + len` if the
    /// region is still registered under its rkey and holds that range.
    pub fn offset(&self, addr: u64, len: usize) -> Option<usize> {
        let header = self.desc.as_ref().unwrap_or(&self.map);
        let valid = mem::header_word(header, 1).load(Ordering::Acquire) == 1
            && mem::header_word(header, 4).load(Ordering::Acquire) == u64::from(self.rkey);
        let inside = addr >= self.base
            && (addr - self.base)
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.len as u64);
        (valid && inside).then(|| self.start + (addr - self.base) as usize)
    }
}

/// A message on a QP's inbound ring: a WRITE_WITH_IMM's immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Msg {
    pub imm: u32,
    pub byte_len: u32,
}

/// Words of a QP table: per QP slot its `qpn << 32 | state`, the ring's
/// head (written by the one peer QP that sends to it) and tail (by the
/// owner), what its responder side answers to (word 3, from RTR:
/// [`Responder`]), and the ring.
fn entry(qpn: u32) -> usize {
    (qpn as usize % QP_SLOTS) * ENTRY_WORDS
}

/// This device's QP table.
pub(super) struct LocalTable(OwnedFile);

impl LocalTable {
    pub fn create(gid: &[u8; 16]) -> Result<LocalTable, String> {
        let len = QP_SLOTS * ENTRY_WORDS * 8;
        let f = OwnedFile::create(&table_name(gid).expect("own GID"), len)?;
        // Held until this process exits: peers read it as "the NIC is alive".
        crate::sys::hold_lock(&f.file).map_err(|e| format!("locking the QP table: {e}"))?;
        Ok(LocalTable(f))
    }

    /// Publishes a QP's state (a new QP also empties its ring).
    pub fn publish(&self, qpn: u32, state: QpState, new: bool) {
        let e = entry(qpn);
        if new {
            let head = self.0.word(e + 1).load(Ordering::Acquire);
            self.0.word(e + 2).store(head, Ordering::Release);
            // A destroyed QP's slot may be taken again: its link word too.
            self.0.word(e + 4).store(0, Ordering::Release);
        }
        if matches!(state, QpState::Reset | QpState::Init) {
            self.0.word(e + 3).store(0, Ordering::Release);
        }
        self.0.word(e).store(
            (u64::from(qpn) << 32) | u64::from(state_code(state)),
            Ordering::Release,
        );
    }

    /// Publishes what QP `qpn` answers to as a responder (at RTR).
    pub fn publish_responder(&self, qpn: u32, r: Responder) {
        let w = u64::from(r.expected_psn & 0x00ff_ffff)
            | (u64::from(r.acks_to & 0x00ff_ffff) << 24)
            | (u64::from(r.port_mtu.trailing_zeros()) << 48)
            | u64::from(r.remote_write) << 62
            | 1 << 63;
        self.0.word(entry(qpn) + 3).store(w, Ordering::Release);
    }

    /// Marks the port's link down or up for the peers of the QPs `qpns`
    /// (word 4).
    pub fn set_link_down(&self, qpns: impl Iterator<Item = u32>, down: bool) {
        for qpn in qpns {
            self.0
                .word(entry(qpn) + 4)
                .store(u64::from(down), Ordering::Release);
        }
    }

    /// Takes the next message of `qpn`'s inbound ring.
    pub fn pop(&self, qpn: u32) -> Option<Msg> {
        let e = entry(qpn);
        let tail = self.0.word(e + 2).load(Ordering::Relaxed);
        if tail == self.0.word(e + 1).load(Ordering::Acquire) {
            return None;
        }
        let at = e + 8 + (tail as usize % RING) * 4;
        let w = self.0.word(at).load(Ordering::Relaxed);
        self.0.word(e + 2).store(tail + 1, Ordering::Release);
        Some(Msg {
            imm: w as u32,
            byte_len: (w >> 32) as u32,
        })
    }

    /// Marks the QPs `qpns` gone (destroyed, or the device closes).
    pub fn close(&self, qpns: impl Iterator<Item = u32>) {
        for qpn in qpns {
            self.0.word(entry(qpn)).store(0, Ordering::Release);
        }
    }
}

/// A peer device's QP table, mapped by a writer.
pub(super) struct RemoteTable(MmapRaw, std::fs::File);

impl RemoteTable {
    pub fn open(gid: &[u8; 16]) -> Option<RemoteTable> {
        let (map, file) = open_map(table_name(gid), QP_SLOTS * ENTRY_WORDS * 8)?;
        Some(RemoteTable(map, file))
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        mem::header_word(&self.0, i)
    }

    /// Whether the owning process is still alive (holds its lock; a crashed
    /// process's locks go when it exits, zombie or not).
    pub fn owner_alive(&self) -> bool {
        crate::sys::lock_held(&self.1)
    }

    /// Whether QP `qpn` exists and is in RTR or RTS.
    pub fn ready(&self, qpn: u32) -> bool {
        let w = self.word(entry(qpn)).load(Ordering::Acquire);
        (w >> 32) as u32 == qpn && matches!(w & 0xffff_ffff, 2 | 3)
    }

    /// Whether the link of the port holding QP `qpn` is down.
    pub fn link_down(&self, qpn: u32) -> bool {
        self.word(entry(qpn) + 4).load(Ordering::Acquire) == 1
    }

    /// What QP `qpn` answers to as a responder (`None` before its RTR).
    pub fn responder(&self, qpn: u32) -> Option<Responder> {
        let w = self.word(entry(qpn) + 3).load(Ordering::Acquire);
        (w >> 63 == 1).then(|| Responder {
            expected_psn: (w & 0x00ff_ffff) as u32,
            acks_to: ((w >> 24) & 0x00ff_ffff) as u32,
            port_mtu: 1 << ((w >> 48) & 0x1f),
            remote_write: (w >> 62) & 1 == 1,
        })
    }

    /// Appends a message to QP `qpn`'s ring; false when it is full.
    pub fn push(&self, qpn: u32, m: Msg) -> bool {
        let e = entry(qpn);
        let head = self.word(e + 1).load(Ordering::Relaxed);
        if head - self.word(e + 2).load(Ordering::Acquire) >= RING as u64 {
            return false;
        }
        let at = e + 8 + (head as usize % RING) * 4;
        self.word(at).store(
            u64::from(m.imm) | (u64::from(m.byte_len) << 32),
            Ordering::Relaxed,
        );
        self.word(e + 1).store(head + 1, Ordering::Release);
        true
    }
}
