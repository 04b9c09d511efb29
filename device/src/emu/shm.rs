//! The backing store of one emulated allocation: a file under `/dev/shm`,
//! mapped shared, so any allocation can be exported to another process by
//! name.
//!
//! The files are private to the user that runs the job, as the
//! shared-memory transport's segments are ([`sncl_shm_files`]
//! creates and opens both); their names end in the creator's pid, so
//! `transport_shm::cleanup_stale` removes those of dead processes.

use std::fs::File;
use std::io;
use std::path::PathBuf;

use memmap2::MmapMut;

use crate::IpcHandle;

/// File name prefix of every emulated allocation.
const PREFIX: &str = "sncl-emu-";
/// First bytes of an emulated IPC handle.
const MAGIC: [u8; 4] = *b"SNEM";
/// Where the name starts in a handle (after the magic and a u64 length).
const NAME_AT: usize = 12;
/// The longest name a handle holds.
const MAX_NAME: usize = 64 - NAME_AT;

/// One mapped allocation. The creator's mapping unlinks the file on drop;
/// an importer's only unmaps.
pub(super) struct ShmMap {
    _map: MmapMut,
    ptr: *mut u8,
    len: usize,
    name: String,
    owned: Option<PathBuf>,
}

// SAFETY: the mapping is plain shared memory; `ptr` is only dereferenced by
// the emulator's copies and kernels, which the Device contract orders with
// streams, as for device memory.
unsafe impl Send for ShmMap {}
// SAFETY: as above; `&ShmMap` hands out only the raw pointer.
unsafe impl Sync for ShmMap {}

impl std::fmt::Debug for ShmMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmMap")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, detail)
}

/// A fresh name: prefix, 128 random bits, our pid (at most 52 bytes).
fn new_name() -> io::Result<String> {
    let token = sncl_shm_files::random_token()?;
    Ok(format!("{PREFIX}{token:032x}-{}", std::process::id()))
}

/// Refuses anything but a plain name made by [`new_name`]: a plain sncl
/// name ([`sncl_shm_files::check_name`]) that is an emulated allocation's
/// and fits a handle.
fn check_name(name: &str) -> io::Result<()> {
    sncl_shm_files::check_name(name)?;
    if name.len() > PREFIX.len() && name.len() <= MAX_NAME && name.starts_with(PREFIX) {
        Ok(())
    } else {
        Err(invalid(format!(
            "refusing shared-memory name {name:?}: expected {PREFIX:?} followed by more, at \
             most {MAX_NAME} bytes"
        )))
    }
}

/// Maps `file` (at least `max(len, 1)` bytes) read-write, shared.
fn map(file: &File, len: usize) -> io::Result<(MmapMut, *mut u8)> {
    // SAFETY: the file is ours (created here, or checked by
    // `check_private`); its contents are only accessed through raw pointers
    // by the emulator's stream-ordered operations, never as Rust references
    // that another process could change underneath.
    let mut map = unsafe { memmap2::MmapOptions::new().len(len.max(1)).map_mut(file)? };
    let ptr = map.as_mut_ptr();
    Ok((map, ptr))
}

impl ShmMap {
    /// Creates and maps a new zero-filled file of `len` bytes (one byte for
    /// a zero-length allocation, so every allocation has its own address).
    pub(super) fn create(len: usize) -> io::Result<ShmMap> {
        let name = new_name()?;
        let (file, path) = sncl_shm_files::create(&name, len.max(1))?;
        match map(&file, len) {
            Ok((map, ptr)) => Ok(ShmMap {
                _map: map,
                ptr,
                len,
                name,
                owned: Some(path),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps another mapping's file, named in an exported handle.
    pub(super) fn open(name: &str, len: usize) -> io::Result<ShmMap> {
        check_name(name)?;
        let (file, path) = sncl_shm_files::open(name)?;
        let size = file.metadata()?.len();
        if size < len.max(1) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared-memory file {} has {size} bytes; the handle says {len}",
                    path.display()
                ),
            ));
        }
        let (map, ptr) = map(&file, len)?;
        Ok(ShmMap {
            _map: map,
            ptr,
            len,
            name: name.to_string(),
            owned: None,
        })
    }

    /// The start of the mapping.
    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The allocation's length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// A new file descriptor of the allocation's file (what a dma-buf
    /// export hands out on the emulated device).
    pub(super) fn reopen(&self) -> io::Result<std::os::fd::OwnedFd> {
        let (file, _) = sncl_shm_files::open(&self.name)?;
        Ok(file.into())
    }

    /// The handle another process opens this mapping with.
    pub(super) fn handle(&self) -> IpcHandle {
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&MAGIC);
        h[4..NAME_AT].copy_from_slice(&(self.len as u64).to_le_bytes());
        // new_name's names fit: checked by the unit test below.
        h[NAME_AT..NAME_AT + self.name.len()].copy_from_slice(self.name.as_bytes());
        IpcHandle(h)
    }
}

impl Drop for ShmMap {
    fn drop(&mut self) {
        if let Some(path) = &self.owned {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e,
                    "unlinking an emulated allocation's shared-memory file failed");
            }
        }
    }
}

/// Reads an emulated IPC handle: the file name and the allocation's length.
pub(super) fn decode_handle(handle: &IpcHandle) -> Result<(String, usize), String> {
    let h = &handle.0;
    if h[..4] != MAGIC {
        return Err(format!(
            "{handle:?} is not an emulated device's handle (expected it to start with {:?})",
            std::str::from_utf8(&MAGIC).unwrap_or("?")
        ));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[4..NAME_AT]);
    let len = usize::try_from(u64::from_le_bytes(len))
        .map_err(|_| format!("{handle:?}: the length does not fit usize"))?;
    let name = &h[NAME_AT..];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let name = std::str::from_utf8(&name[..end])
        .map_err(|_| format!("{handle:?}: the name is not UTF-8"))?;
    check_name(name).map_err(|e| e.to_string())?;
    Ok((name.to_string(), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_a_handle_and_pass_the_check() {
        let name = new_name().unwrap();
        check_name(&name).unwrap();
        let longest = format!("{PREFIX}{:032x}-{}", u128::MAX, u32::MAX);
        assert!(longest.len() <= MAX_NAME, "{longest} is too long");
        for bad in ["sncl-emu-", "sncl-emu-../x", "other-1", "sncl-emu-a/b"] {
            assert!(check_name(bad).is_err(), "{bad} passed");
        }
    }

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let m = ShmMap::create(100).unwrap();
        let (name, len) = decode_handle(&m.handle()).unwrap();
        assert_eq!((name.as_str(), len), (m.name.as_str(), 100));
        assert!(decode_handle(&IpcHandle([0; 64])).is_err());
        let mut h = m.handle();
        h.0[NAME_AT] = b'/';
        assert!(decode_handle(&h).is_err());
    }
}
