//! The only reader of the process environment and of the settings files:
//! [`ReadEnvironment`] fills a [`comm_core::settings::Environment`] (a pure
//! value, parsed and validated by comm-core's settings table) from them.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use comm_core::settings::Environment;
use comm_core::Config;
use comm_core::{Error, Result};

/// The system-wide settings file, read when neither `SNCL_CONF_FILE` nor
/// `~/.sncl.conf` applies.
pub const SYSTEM_CONF_FILE: &str = "/etc/sncl.conf";
/// The user's settings file, relative to `$HOME`.
pub const USER_CONF_FILE: &str = ".sncl.conf";

/// Prefixes of the variables [`ReadEnvironment::from_process`] captures: sncl's
/// own and the launchers' that [`crate::LaunchEnv`] reads.
const PREFIXES: [&str; 5] = ["SNCL_", "OMPI_", "SLURM_", "TORCHELASTIC_", "PMIX_"];
/// Other variables it captures (torchrun's, `HOME` for `~/.sncl.conf` and
/// the kernel cache, and where CUDA is installed for the device layer).
const NAMES: [&str; 13] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HOME",
    "XDG_CACHE_HOME",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    // The log filter of `tracing`'s EnvFilter (sncl's logging set-up).
    "RUST_LOG",
    // Which GPU a rank sees (its NIC is the one nearest that GPU).
    "CUDA_VISIBLE_DEVICES",
];

/// Reading an [`Environment`] from the process and the settings files (an
/// extension of comm-core's pure value, so `Environment::from_process()`
/// reads as before wherever this trait is in scope).
pub trait ReadEnvironment: Sized {
    /// Captures the process environment and overlays the settings file on
    /// it (see [`Environment`]). The one place sncl reads its environment.
    fn from_process() -> Result<Self>;

    /// The process environment alone, without a settings file; for callers
    /// that cannot report an error (logging set-up), falling back to it when
    /// [`ReadEnvironment::from_process`] fails.
    fn process_variables() -> Self;

    /// Overlays the settings file that applies (see [`Environment`]), with
    /// `system` in place of `/etc/sncl.conf`.
    fn with_conf_file(self, system: &Path) -> Result<Self>;

    /// Reads the topology file `SNCL_TOPO_FILE` names (from the environment
    /// or the settings file), if any, and attaches its text
    /// ([`Environment::set_topo_text`]); an unreadable file is an error
    /// naming it.
    fn with_topo_file(self) -> Result<Self>;
}

/// Whether a settings file's text sets `SNCL_SECRET`.
fn names_the_secret(text: &str) -> bool {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .any(|(name, _)| name.trim() == "SNCL_SECRET")
}

/// Checks that a file holding a secret (`what` names it in errors) is a
/// regular file owned by this user and readable by nobody else: a FIFO
/// would block the read past every deadline, another user's file could be
/// swapped, a file others can read leaks the secret.
pub fn check_private_file(what: &str, path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if !meta.file_type().is_file() {
        return Err(Error::Config(format!(
            "{what} is not a regular file (a FIFO, device or directory cannot hold a secret)"
        )));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(Error::Config(format!(
            "{what} is owned by uid {}, not by this user (uid {me}); a secret must be in a file of \
             the user who runs the job",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::Config(format!(
            "{what} is readable by other users (mode {mode:o}); restrict it with `chmod 600 {}`",
            path.display()
        )));
    }
    Ok(())
}

impl ReadEnvironment for Environment {
    fn from_process() -> Result<Environment> {
        Environment::process_variables()
            .with_conf_file(Path::new(SYSTEM_CONF_FILE))?
            .with_topo_file()
    }

    fn process_variables() -> Environment {
        let pairs = std::env::vars_os().filter_map(|(k, v)| {
            let (k, v) = (k.into_string().ok()?, v.into_string().ok()?);
            let wanted = PREFIXES.iter().any(|p| k.starts_with(p)) || NAMES.contains(&k.as_str());
            wanted.then_some((k, v))
        });
        Environment::from_pairs(pairs)
    }

    fn with_conf_file(mut self, system: &Path) -> Result<Environment> {
        let explicit = self.get("SNCL_CONF_FILE").filter(|p| !p.trim().is_empty());
        let candidates: Vec<(PathBuf, bool)> = match explicit {
            Some(p) => vec![(PathBuf::from(p.trim()), true)],
            None => {
                let mut c = Vec::new();
                if let Some(home) = self.get("HOME").filter(|h| !h.is_empty()) {
                    c.push((Path::new(home).join(USER_CONF_FILE), false));
                }
                c.push((system.to_path_buf(), false));
                c
            }
        };
        for (path, required) in candidates {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    if names_the_secret(&text) {
                        let what = format!(
                            "the sncl settings file {}, which sets SNCL_SECRET,",
                            path.display()
                        );
                        let meta = std::fs::metadata(&path)
                            .map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))?;
                        check_private_file(&what, &path, &meta)?;
                    }
                    self.overlay_conf(&path, &text)?;
                    return Ok(self);
                }
                Err(e) if e.kind() == ErrorKind::NotFound && !required => continue,
                Err(e) => {
                    let how = if required {
                        " (named by SNCL_CONF_FILE)"
                    } else {
                        ""
                    };
                    return Err(Error::Config(format!(
                        "the sncl settings file {}{how} cannot be read: {e}",
                        path.display()
                    )));
                }
            }
        }
        Ok(self)
    }

    fn with_topo_file(mut self) -> Result<Environment> {
        let Some(path) = self.get("SNCL_TOPO_FILE").filter(|p| !p.is_empty()) else {
            return Ok(self);
        };
        let path = path.to_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| {
            self.annotate(
                "SNCL_TOPO_FILE",
                Error::Config(format!("SNCL_TOPO_FILE={path}: {e}")),
            )
        })?;
        self.set_topo_text(text);
        Ok(self)
    }
}

/// [`Config`] from the process environment and settings file (an extension
/// of comm-core's pure `Config`, in scope through `sncl::ConfigFromEnv`).
pub trait ConfigFromEnv: Sized {
    /// Defaults overlaid with the process environment and settings file
    /// ([`ReadEnvironment::from_process`]).
    fn from_env() -> Result<Self>;
}

impl ConfigFromEnv for Config {
    fn from_env() -> Result<Config> {
        Config::from_environment(&Environment::from_process()?)
    }
}
