//! The backing store of one emulated allocation: a file under `/dev/shm`,
//! mapped shared, so any allocation can be exported to another process by
//! name.
//!
//! As for sncl's shared-memory transport, files are private to the user that
//! runs the job: created `0600` with `O_EXCL | O_NOFOLLOW` under a name with
//! a 128-bit random token and the creator's pid at the end (so
//! `transport_shm::cleanup_stale` removes those of dead processes), and
//! opened only by plain names, without following links, after checking that
//! the file is a regular file of our effective uid that nobody else can read.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::IpcHandle;

/// Directory of the files.
const SHM_DIR: &str = "/dev/shm";
/// File name prefix of every emulated allocation.
const PREFIX: &str = "sncl-emu-";
/// Permission bits: read and write for the owner only.
const MODE: u32 = 0o600;
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
    let mut token = [0u8; 16];
    getrandom::fill(&mut token).map_err(|e| {
        io::Error::other(format!(
            "drawing a random name for an emulated allocation: getrandom failed: {e}"
        ))
    })?;
    let token = u128::from_ne_bytes(token);
    Ok(format!("{PREFIX}{token:032x}-{}", std::process::id()))
}

/// Refuses anything but a plain name made by [`new_name`].
fn check_name(name: &str) -> io::Result<()> {
    let plain = name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if name.len() > PREFIX.len() && name.len() <= MAX_NAME && name.starts_with(PREFIX) && plain {
        Ok(())
    } else {
        Err(invalid(format!(
            "refusing shared-memory name {name:?}: expected {PREFIX:?} followed by ASCII \
             letters, digits, '-' or '_', at most {MAX_NAME} bytes"
        )))
    }
}

/// The effective uid of this process.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses a file that is not a regular file of our uid closed to others.
fn check_private(file: &File, path: &Path) -> io::Result<()> {
    let meta = file.metadata()?;
    let mode = meta.mode() & 0o7777;
    if !meta.file_type().is_file() || meta.uid() != euid() || mode & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing shared-memory file {}: expected a regular file of uid {} with mode \
                 {MODE:04o}, found uid {} mode {mode:04o}",
                path.display(),
                euid(),
                meta.uid()
            ),
        ));
    }
    Ok(())
}

/// Allocates the file's blocks now, so a full `/dev/shm` is an error here
/// rather than a SIGBUS at the first write. A request larger than the free
/// space fails at once (ENOSPC) instead of filling the file system first.
fn allocate(file: &File, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statvfs is a valid value of the plain C struct.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open; `fs` is a valid place to write to.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut fs) } == 0 {
        let free = (fs.f_bavail as u128) * (fs.f_frsize as u128);
        if len as u128 > free {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
    }
    let len =
        libc::off_t::try_from(len).map_err(|_| invalid(format!("{len} bytes do not fit off_t")))?;
    // SAFETY: the descriptor is open and owned by `file` for the call.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 | libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
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
        let path = Path::new(SHM_DIR).join(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let setup = || -> io::Result<(MmapMut, *mut u8)> {
            // The umask may have cleared bits; set exactly 0600.
            file.set_permissions(Permissions::from_mode(MODE))?;
            file.set_len(len.max(1) as u64)?;
            allocate(&file, len.max(1))?;
            map(&file, len)
        };
        match setup() {
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
        let path = Path::new(SHM_DIR).join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)?;
        check_private(&file, &path)?;
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
