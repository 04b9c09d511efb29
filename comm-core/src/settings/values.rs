//! [`Environment`]: the values of the settings a process runs with, as a
//! value. Reading them (the process environment, the settings file) is the
//! `sncl-environment` crate's; this module holds no
//! I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::table::{lookup, nearest, TEST_PREFIX};
use crate::error::{Error, Result};

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
    /// The text of the topology file `SNCL_TOPO_FILE` names, once the
    /// reader of the environment has read it (comm-core reads no files).
    topo_text: Option<String>,
}

impl std::fmt::Debug for Environment {
    /// Names only: values may hold the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .field("file", &self.file)
            .field("topo_text", &self.topo_text.as_ref().map(String::len))
            .finish()
    }
}

impl Environment {
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
            topo_text: None,
        }
    }

    /// Variables of the environment (not of a settings file, which refuses
    /// unknown names itself) with the `SNCL_` prefix that no setting
    /// declares, each with the nearest declared name: typos such as
    /// `SNCL_ALOG`, which would otherwise be ignored without a word.
    /// Test harness variables (`SNCL_TEST_*`) are not settings and not
    /// listed.
    pub fn unknown_names(&self) -> Vec<(&str, Option<&'static str>)> {
        self.vars
            .iter()
            .filter(|(k, (_, origin))| {
                matches!(origin, Origin::Environment)
                    && k.starts_with("SNCL_")
                    && !k.starts_with(TEST_PREFIX)
                    && lookup(k).is_none()
            })
            .map(|(k, _)| (k.as_str(), nearest(k)))
            .collect()
    }

    /// Attaches the text of the topology file that `SNCL_TOPO_FILE` names
    /// (read by the caller: `sncl_bootstrap::ReadEnvironment` does it). The
    /// settings then parse it with the `SNCL_*_BW` / `_LAT` variables on top.
    pub fn set_topo_text(&mut self, text: String) {
        self.topo_text = Some(text);
    }

    /// The attached topology-file text, if any (see
    /// [`Environment::set_topo_text`]).
    pub fn topo_text(&self) -> Option<&str> {
        self.topo_text.as_deref()
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
