//! A plain shared-memory region: one rank creates it, the other ranks of
//! its node map it and read it directly (no slot protocol). Windows
//! (`Communicator::alloc_window`) are built from these.

use std::fs;
use std::io;
use std::path::PathBuf;

use memmap2::MmapMut;

use crate::private_file::{self, PREFIX};

/// A mapped shared-memory region, created by this process or opened from a
/// peer's name.
pub struct Region {
    map: MmapMut,
    path: PathBuf,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .finish()
    }
}

/// A fresh region name for window `window` of communicator `comm_id` on
/// `rank`: random, and ending with this process's pid so that
/// [`crate::cleanup_stale`] removes it after a crash.
pub fn region_name(comm_id: u64, window: u64, rank: usize) -> io::Result<String> {
    let token = private_file::random_token()?;
    let pid = std::process::id();
    Ok(format!(
        "{PREFIX}{comm_id:016x}-w{window}-{rank}-{token:032x}-{pid}"
    ))
}

impl Region {
    /// Creates the private file `name` of `len` bytes (mode 0600, zeroed)
    /// and maps it.
    pub fn create(name: &str, len: usize) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a shared-memory region needs at least one byte",
            ));
        }
        let (file, path) = private_file::create(name, len)?;
        // SAFETY: the file was just created by us with exclusive access and
        // sized to `len`; peers only map it after its name is published, and
        // the owner's users synchronise reads and writes through the
        // region's own flags (acquire/release atomics).
        match unsafe { MmapMut::map_mut(&file) } {
            Ok(map) => Ok(Region { map, path }),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps the region a peer created under `name`; it must be a private
    /// file of this user of exactly `len` bytes.
    pub fn open(name: &str, len: usize) -> io::Result<Region> {
        let (file, path) = private_file::open(name)?;
        let actual = file.metadata()?.len();
        if actual != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared-memory region {} has {actual} bytes, expected {len}",
                    path.display()
                ),
            ));
        }
        // SAFETY: a private file of this user (checked by `open`) of the
        // expected size, created and sized by its owner before the name was
        // published; accesses are synchronised as in `create`.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Region { map, path })
    }

    /// The first byte of the mapping (valid for [`Region::len`] bytes while
    /// the region lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the region is empty (never: regions have ≥ 1 byte).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Removes the file name; mappings stay valid.
    pub fn unlink(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_shared_between_mappings_and_checked_on_open() {
        let name = region_name(7, 1, 0).unwrap();
        let a = Region::create(&name, 8192).unwrap();
        let b = Region::open(&name, 8192).unwrap();
        // SAFETY: both map 8192 bytes of the same file; one thread.
        unsafe {
            a.as_ptr().add(100).write(42);
            assert_eq!(b.as_ptr().add(100).read(), 42);
        }
        let e = Region::open(&name, 4096).unwrap_err();
        assert!(e.to_string().contains("expected 4096"), "{e}");
        a.unlink();
        assert!(Region::open(&name, 8192).is_err());
        assert!(Region::create(&region_name(7, 2, 0).unwrap(), 0).is_err());
    }
}
