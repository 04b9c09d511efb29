//! [`Environment`]: the only reader of the process environment.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::lookup;
use crate::error::{Error, Result};

/// The system-wide settings file, read when neither `SNCL_CONF_FILE` nor
/// `~/.sncl.conf` applies.
pub const SYSTEM_CONF_FILE: &str = "/etc/sncl.conf";
/// The user's settings file, relative to `$HOME`.
pub const USER_CONF_FILE: &str = ".sncl.conf";

/// Prefixes of the variables [`Environment::from_process`] captures: sncl's
/// own and the launchers' that [`crate::bootstrap::LaunchEnv`] reads.
const PREFIXES: [&str; 5] = ["SNCL_", "OMPI_", "SLURM_", "TORCHELASTIC_", "PMIX_"];
/// Other variables it captures (torchrun's, `HOME` for `~/.sncl.conf` and
/// the kernel cache, and where CUDA is installed for the device layer).
const NAMES: [&str; 11] = [
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
];

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The process environment (or pairs given to [`Environment::from_pairs`]).
    Environment,
    /// A settings file, at this line (1-based).
    File {
        /// The file.
        path: PathBuf,
        /// The line.
        line: usize,
    },
}

/// A snapshot of the settings a process runs with: the `SNCL_*` and
/// launcher variables of its environment, overlaid on a settings file.
///
/// The file is the first of these that applies: the file named by
/// `SNCL_CONF_FILE` (which must exist), else `$HOME/.sncl.conf`, else
/// `/etc/sncl.conf` (a missing default file is skipped). It holds lines
/// `NAME=value` (spaces around both are trimmed); blank lines and lines
/// starting with `#` are ignored. A line naming no declared setting (see
/// [`super::SETTINGS`]), a line without `=`, and a file that exists but
/// cannot be read (permissions) are errors naming the file and line. A
/// variable set in the environment wins over the file.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, (String, Origin)>,
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Environment {
    /// Names only: values may hold the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .field("file", &self.file)
            .finish()
    }
}

impl Environment {
    /// Captures the process environment and overlays the settings file on
    /// it (see [`Environment`]). The one place sncl reads its environment.
    pub fn from_process() -> Result<Environment> {
        Environment::process_variables().with_conf_file(Path::new(SYSTEM_CONF_FILE))
    }

    /// The process environment alone, without a settings file; for callers
    /// that cannot report an error (logging set-up), falling back to it when
    /// [`Environment::from_process`] fails.
    pub fn process_variables() -> Environment {
        let pairs = std::env::vars_os().filter_map(|(k, v)| {
            let (k, v) = (k.into_string().ok()?, v.into_string().ok()?);
            let wanted = PREFIXES.iter().any(|p| k.starts_with(p)) || NAMES.contains(&k.as_str());
            wanted.then_some((k, v))
        });
        Environment::from_pairs(pairs)
    }

    /// An environment holding `pairs` as process variables (tests, and
    /// programs that configure sncl without touching their environment).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Environment {
        Environment {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), (v.into(), Origin::Environment)))
                .collect(),
            file: None,
        }
    }

    /// Overlays the settings file that applies (see [`Environment`]), with
    /// `system` in place of `/etc/sncl.conf`.
    pub fn with_conf_file(mut self, system: &Path) -> Result<Environment> {
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

    /// Overlays settings-file `text` (read from `path`): its values apply
    /// where the environment has none.
    pub fn overlay_conf(&mut self, path: &Path, text: &str) -> Result<()> {
        let mut from_file = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let at = || format!("{}:{line_no}", path.display());
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (name, value) = l.split_once('=').ok_or_else(|| {
                Error::Config(format!(
                    "{}: expected NAME=value (e.g. SNCL_TIMEOUT_MS=60000), got {l:?}",
                    at()
                ))
            })?;
            let name = name.trim();
            if lookup(name).is_none() {
                return Err(Error::Config(format!(
                    "{}: unknown setting {name:?}; `commbench --help-env` lists them",
                    at()
                )));
            }
            if name == "SNCL_CONF_FILE" {
                return Err(Error::Config(format!(
                    "{}: SNCL_CONF_FILE cannot be set in a settings file; set it in the \
                     environment",
                    at()
                )));
            }
            from_file.push((name.to_owned(), value.trim().to_owned(), line_no));
        }
        for (name, value, line) in from_file {
            let origin = Origin::File {
                path: path.to_path_buf(),
                line,
            };
            match self.vars.get(&name) {
                Some((_, Origin::Environment)) => {}
                _ => {
                    self.vars.insert(name, (value, origin));
                }
            }
        }
        self.file = Some(path.to_path_buf());
        Ok(())
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(|(v, _)| v.as_str())
    }

    /// Where the value of `name` came from, if set.
    pub fn origin(&self, name: &str) -> Option<&Origin> {
        self.vars.get(name).map(|(_, o)| o)
    }

    /// The settings file that was read, if any.
    pub fn conf_file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// [`Environment::get`] as the owned-value lookup the parsers take.
    pub fn getter(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |k| self.get(k).map(str::to_owned)
    }

    /// Adds where `name`'s value came from to an error about it, when that
    /// was a settings file.
    pub fn annotate(&self, name: &str, e: Error) -> Error {
        match (self.origin(name), e) {
            (Some(Origin::File { path, line }), Error::Config(m)) => {
                Error::Config(format!("{m} (set at {}:{line})", path.display()))
            }
            (_, e) => e,
        }
    }
}
