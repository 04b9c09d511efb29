//! Files under `/dev/shm` that only the user running the job can reach:
//! created `0600` with `O_EXCL | O_NOFOLLOW` under plain names holding a
//! 128-bit random token, their blocks reserved at creation (a full
//! `/dev/shm` is an error, not a SIGBUS later), and opened only by plain
//! names, without following links, after checking that the file is a
//! regular file of our effective uid that nobody else can read. Used by the
//! transport's segments and by the emulated device's allocations.
//!
//! Or anonymous ([`create_anonymous`]): a memfd with no name at all, which
//! peers open through `/proc/<pid>/fd` while its creator holds it, and
//! which the kernel frees with the last process that maps it — so a job
//! whose processes are all killed leaves nothing in `/dev/shm`.

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
///
/// `check_free` compares with the file system's free space first; not for
/// an anonymous file, whose internal file system reports none (its bound
/// is memory, which `posix_fallocate` reserves or refuses).
fn allocate(file: &File, len: usize, check_free: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statvfs is a valid value of the plain C struct.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open; `fs` is a valid place to write to.
    if check_free && unsafe { libc::fstatvfs(file.as_raw_fd(), &mut fs) } == 0 {
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
        allocate(&file, len, true)
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
/// read-write without following links, or the anonymous file a reference
/// of [`create_anonymous`] names; it must be a regular file owned by this
/// process's effective uid with no group or other access. Errors name the
/// file.
pub fn open(name: &str) -> io::Result<(File, PathBuf)> {
    check_name(name)?;
    if let Some(reference) = name.strip_prefix(ANONYMOUS_PREFIX) {
        return open_anonymous(name, reference);
    }
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

/// What [`create_anonymous`] names its files with, followed by
/// `<pid>-<fd>-<token>`: a reference, not a name in [`SHM_DIR`].
pub const ANONYMOUS_PREFIX: &str = "sncl-fd-";

/// A file this process made reachable to its peers, by the name it
/// published: a name under [`SHM_DIR`], or a reference to an anonymous
/// file held open by this process ([`create_anonymous`]).
/// [`Published::withdraw`] makes it unreachable (the mappings stay).
#[derive(Debug)]
pub struct Published {
    name: String,
    reach: Reach,
}

#[derive(Debug)]
enum Reach {
    /// A name under [`SHM_DIR`]: removed to withdraw it.
    Path(PathBuf),
    /// The descriptor peers open through `/proc/<pid>/fd/<fd>`: closed to
    /// withdraw it.
    Descriptor(std::sync::Mutex<Option<File>>),
}

impl Published {
    /// A file created by [`create`] at `path`.
    pub fn file(name: &str, path: PathBuf) -> Published {
        Published {
            name: name.to_owned(),
            reach: Reach::Path(path),
        }
    }

    /// The name peers open it by (with [`open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it has no name under [`SHM_DIR`]: the kernel frees it with
    /// the last process that maps it, even if every process is killed.
    pub fn is_anonymous(&self) -> bool {
        matches!(self.reach, Reach::Descriptor(_))
    }

    /// Makes the file unreachable by its name; mappings stay valid. Safe to
    /// call more than once.
    pub fn withdraw(&self) {
        match &self.reach {
            Reach::Path(path) => {
                let _ = std::fs::remove_file(path);
            }
            Reach::Descriptor(fd) => {
                fd.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
            }
        }
    }
}

/// Whether peers of this process can open its anonymous files: they reach
/// them through `/proc/<pid>/fd`, which the kernel opens to processes of
/// the same user only while this process is dumpable (`PR_GET_DUMPABLE`).
pub fn descriptors_reachable() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a flag of this process; the unused
    // arguments are ignored.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// Creates an anonymous private file (`memfd_create`) of `len` bytes, mode
/// `0600`, its blocks reserved: it has no name under [`SHM_DIR`], so
/// nothing is left behind whatever happens to the processes that use it.
/// Peers open it with [`open`] by the returned reference
/// (`sncl-fd-<pid>-<fd>-<token>`) while this process holds it, that is
/// until [`Published::withdraw`]; they must be in this process's pid
/// namespace and run as its user (see [`descriptors_reachable`]).
pub fn create_anonymous(len: usize) -> io::Result<(File, Published)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let token = random_token()?;
    let tag = std::ffi::CString::new(format!("{PREFIX}{token:032x}"))
        .expect("a hex name has no NUL byte");
    // SAFETY: `tag` is a NUL-terminated string that outlives the call;
    // MFD_CLOEXEC is a valid flag.
    let fd = unsafe { libc::memfd_create(tag.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_permissions(Permissions::from_mode(SEGMENT_MODE))?;
    file.set_len(len as u64)?;
    allocate(&file, len, false)?;
    // Held until withdrawn; the caller may close its own after mapping.
    let held = file.try_clone()?;
    let name = format!(
        "{ANONYMOUS_PREFIX}{}-{}-{token:032x}",
        std::process::id(),
        held.as_raw_fd()
    );
    Ok((
        file,
        Published {
            name,
            reach: Reach::Descriptor(std::sync::Mutex::new(Some(held))),
        },
    ))
}

/// Opens the anonymous file a reference names (`<pid>-<fd>-<token>` after
/// [`ANONYMOUS_PREFIX`]): through `/proc/<pid>/fd/<fd>`, then checks that
/// what it opened is the memfd of that token (so a reference cannot make
/// this process map another file of the user) and a private file.
fn open_anonymous(name: &str, reference: &str) -> io::Result<(File, PathBuf)> {
    use std::os::fd::AsRawFd;
    let parts: Vec<&str> = reference.split('-').collect();
    let parsed = match parts.as_slice() {
        [pid, fd, token] if token.len() == 32 => pid
            .parse::<u32>()
            .ok()
            .zip(fd.parse::<u32>().ok())
            .zip(u128::from_str_radix(token, 16).ok()),
        _ => None,
    };
    let Some(((pid, fd), token)) = parsed else {
        return Err(invalid_input(format!(
            "refusing shared-memory reference {name:?}: expected \
             {ANONYMOUS_PREFIX}<pid>-<fd>-<32 hex digits>"
        )));
    };
    let path = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "shared-memory segment {name}: cannot open {}: {e} (has process {pid} \
                     withdrawn it or ended? it must run as this user, in this pid namespace)",
                    path.display()
                ),
            )
        })?;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let expected = format!("/memfd:{PREFIX}{token:032x} (deleted)");
    if opened.as_os_str() != expected.as_str() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing shared-memory segment {name}: {} is {}, not the segment's memfd",
                path.display(),
                opened.display()
            ),
        ));
    }
    check_private(&file, &path)?;
    Ok((file, path))
}
