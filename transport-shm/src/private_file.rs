//! Files under `/dev/shm` that only the user running the job can reach:
//! created `0600` with `O_EXCL | O_NOFOLLOW` under plain names holding a
//! 128-bit random token, their blocks reserved at creation (a full
//! `/dev/shm` is an error, not a SIGBUS later), and opened only by plain
//! names, without following links, after checking that the file is a
//! regular file of our effective uid that nobody else can read. Used by the
//! transport's segments and by the emulated device's allocations.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Directory of the files.
pub const SHM_DIR: &str = "/dev/shm";
/// File name prefix of every sncl file there.
pub const PREFIX: &str = "sncl-";
/// The longest name [`open`] accepts (segment names are at most 128 bytes).
pub const MAX_NAME_LEN: usize = 160;
/// Permission bits of every file: read and write for the owner only.
pub const SEGMENT_MODE: u32 = 0o600;

fn invalid_input(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, detail)
}

/// 128 random bits for a name nobody can guess.
pub fn random_token() -> io::Result<u128> {
    let mut token = [0u8; 16];
    getrandom::fill(&mut token).map_err(|e| {
        io::Error::other(format!(
            "drawing a random shared-memory name: getrandom failed: {e}"
        ))
    })?;
    Ok(u128::from_ne_bytes(token))
}

/// Checks that `name` is a plain sncl name: it starts with [`PREFIX`], has
/// at most [`MAX_NAME_LEN`] bytes and only ASCII letters, digits, `_` and
/// `-` (so no `/`, no `.`, no `..`).
pub fn check_name(name: &str) -> io::Result<()> {
    let bad_char = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'));
    let why = if !name.starts_with(PREFIX) || name.len() == PREFIX.len() {
        Some(format!(
            "expected a name starting with {PREFIX:?} followed by more"
        ))
    } else if name.len() > MAX_NAME_LEN {
        Some(format!(
            "expected at most {MAX_NAME_LEN} bytes, got {}",
            name.len()
        ))
    } else {
        bad_char.map(|c| {
            format!("character {c:?} is not allowed (only ASCII letters, digits, '_' and '-')")
        })
    };
    match why {
        Some(why) => Err(invalid_input(format!(
            "refusing shared-memory segment name {name:?}: {why}"
        ))),
        None => Ok(()),
    }
}

/// The effective uid of this process.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses a file that is not a regular file owned by our effective uid and
/// closed to group and others.
fn check_private(file: &File, path: &Path) -> io::Result<()> {
    let meta = file.metadata()?; // fstat on the open descriptor
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    let why = if !meta.file_type().is_file() {
        Some("it is not a regular file".to_string())
    } else if uid != euid() {
        Some(format!(
            "it is owned by uid {uid}, not by this process's uid {}",
            euid()
        ))
    } else if mode & 0o077 != 0 {
        Some(format!(
            "its mode {mode:04o} lets group or others access it (expected {SEGMENT_MODE:04o})"
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing shared-memory segment {}: {why}", path.display()),
        )),
        None => Ok(()),
    }
}

/// Allocates the file's blocks now, so a full `/dev/shm` is an error here
/// rather than a SIGBUS on the first write. A request larger than the free
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
    let len = libc::off_t::try_from(len)
        .map_err(|_| invalid_input(format!("file size {len} does not fit off_t")))?;
    // SAFETY: the descriptor is open and owned by `file` for the call.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        // File systems without fallocate: the pages come on first touch.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Creates the private file `name` (a plain name, see [`check_name`]) of
/// `len` bytes, exclusively, with mode `0600` whatever the umask, its
/// blocks reserved. Returns it open read-write with its path; on any error
/// nothing is left behind.
pub fn create(name: &str, len: usize) -> io::Result<(File, PathBuf)> {
    check_name(name)?;
    let path = Path::new(SHM_DIR).join(name);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(SEGMENT_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    let setup = || -> io::Result<()> {
        // The umask may have cleared bits of the mode; set exactly 0600.
        file.set_permissions(Permissions::from_mode(SEGMENT_MODE))?;
        file.set_len(len as u64)?;
        allocate(&file, len)
    };
    match setup() {
        Ok(()) => Ok((file, path)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// Opens the private file `name` (a plain name, see [`check_name`])
/// read-write without following links; it must be a regular file owned by
/// this process's effective uid with no group or other access. Errors name
/// the file.
pub fn open(name: &str) -> io::Result<(File, PathBuf)> {
    check_name(name)?;
    let path = Path::new(SHM_DIR).join(name);
    let bad = |kind: io::ErrorKind, what: &str| {
        io::Error::new(
            kind,
            format!("shared-memory segment {}: {what}", path.display()),
        )
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => bad(
                io::ErrorKind::InvalidInput,
                "is a symbolic link; refusing to follow it",
            ),
            _ => bad(e.kind(), &format!("cannot open it: {e}")),
        })?;
    check_private(&file, &path)?;
    Ok((file, path))
}
