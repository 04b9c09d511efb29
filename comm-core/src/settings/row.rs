//! One row of the settings table ([`Setting`]): the variable's name, who
//! must agree on it ([`Scope`]), the values it takes ([`Values`]), its
//! default, its description, and how it reads into and shows from a
//! [`Config`] field ([`Field`]).

use crate::config::Config;
use crate::error::{Error, Result};

/// Who must agree on a setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every rank must use the same value: rank 0 publishes its value at
    /// init (under `digest_key` in [`Config::shared_digest`]) and every rank
    /// adopts it.
    Shared {
        /// Key of the setting in the agreement digest (wire format).
        digest_key: &'static str,
    },
    /// Each process may use its own value.
    Process,
    /// Set by (or instead of) a launcher, different on every rank: rank,
    /// world size, root address, secret.
    Launch,
}

impl Scope {
    /// The scope's name in tables.
    pub fn label(&self) -> &'static str {
        match self {
            Scope::Shared { .. } => "all ranks (rank 0's)",
            Scope::Process => "per process",
            Scope::Launch => "launch",
        }
    }
}

/// The allowed values of an integer setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntRange {
    /// Smallest value.
    pub min: usize,
    /// Largest value.
    pub max: usize,
    /// Values set in code must be multiples of this; the environment's are
    /// rounded down to one.
    pub multiple: usize,
    /// Unit, for documentation (`bytes`, `ms`, ...).
    pub unit: &'static str,
}

impl IntRange {
    /// `allowed: MIN..=MAX[, a multiple of M]`, as error messages say it.
    pub fn allowed(&self) -> String {
        let m = if self.multiple > 1 {
            format!(", a multiple of {}", self.multiple)
        } else {
            String::new()
        };
        format!("allowed: {}..={}{m}", self.min, self.max)
    }

    /// Parses a value from `source` (a variable name, or rank 0's shared
    /// settings) and rounds it down to the multiple.
    pub fn parse(&self, source: &str, raw: &str) -> Result<usize> {
        // Byte counts take the workspace's suffixes (64K, 4M, 1G).
        let parsed = if self.unit == "bytes" {
            crate::units::parse_bytes(raw)
        } else {
            raw.trim().parse().ok()
        };
        let n: usize = parsed.ok_or_else(|| {
            Error::Config(format!(
                "{source}={raw:?} is not an integer in range ({})",
                self.allowed()
            ))
        })?;
        if n < self.min || n > self.max {
            return Err(Error::Config(format!(
                "{source}={n} is out of range ({})",
                self.allowed()
            )));
        }
        Ok(n / self.multiple * self.multiple)
    }

    /// Checks a value set in code for `field` (variable `var`).
    pub fn check(&self, field: &str, var: &str, v: usize) -> Result<()> {
        if v < self.min || v > self.max || !v.is_multiple_of(self.multiple) {
            return Err(Error::Config(format!(
                "{field} = {v} ({var}) is out of range ({})",
                self.allowed()
            )));
        }
        Ok(())
    }
}

/// What values a setting takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// An integer in a range.
    Int(IntRange),
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Free text in this format.
    Text(&'static str),
}

impl Values {
    /// One-line description for tables.
    pub fn describe(&self) -> String {
        match self {
            Values::Int(r) => {
                let mut s = format!("{}..={} {}", r.min, r.max, r.unit);
                if r.unit == "bytes" {
                    s.push_str(" (K, M, G suffixes)");
                }
                if r.multiple > 1 {
                    s.push_str(&format!(" (rounded down to a multiple of {})", r.multiple));
                }
                s
            }
            Values::Choice(words) => words.join(", "),
            Values::Text(t) => (*t).to_string(),
        }
    }
}

/// A setting's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultValue {
    /// This value (valid input; for a [`Config`] field it equals
    /// `Config::default()`'s, which a test checks).
    Value(&'static str),
    /// What applies when the variable is unset.
    Unset(&'static str),
}

impl DefaultValue {
    pub(super) fn describe(&self) -> &'static str {
        match self {
            DefaultValue::Value("") => "empty",
            DefaultValue::Value(v) | DefaultValue::Unset(v) => v,
        }
    }
}

/// How a setting maps onto [`Config`].
#[derive(Clone, Copy)]
pub(crate) enum Field {
    /// Not a [`Config`] field: read by another module from an
    /// [`Environment`] (the launcher's, logging, the topology file, the
    /// PyTorch backend).
    Elsewhere,
    /// An integer field, parsed and checked with the setting's [`IntRange`].
    Int {
        /// The field's name, in error messages.
        name: &'static str,
        get: fn(&Config) -> usize,
        put: fn(&mut Config, usize),
    },
    /// Any other field: `put` parses (and reports errors naming the
    /// variable), `show` writes the value for the digest.
    Text {
        put: fn(&mut Config, &str) -> Result<()>,
        show: fn(&Config) -> String,
    },
    /// A file or directory: an empty (or blank) value unsets it.
    Path {
        put: fn(&mut Config, Option<std::path::PathBuf>),
        get: fn(&Config) -> &Option<std::path::PathBuf>,
    },
}

/// One setting.
#[derive(Clone, Copy)]
pub struct Setting {
    /// The environment variable (and settings-file key).
    pub name: &'static str,
    /// Who must agree on it.
    pub scope: Scope,
    /// Its values.
    pub values: Values,
    /// Its default.
    pub default: DefaultValue,
    /// One line of documentation.
    pub doc: &'static str,
    pub(crate) field: Field,
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setting")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("values", &self.values)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl Setting {
    /// Parses `raw`, the value of this setting's variable, into `config`
    /// (nothing for settings other modules read).
    pub(crate) fn apply(&self, config: &mut Config, raw: &str) -> Result<()> {
        self.apply_from(config, self.name, raw)
    }

    /// [`Setting::apply`] naming `source` in range errors.
    pub(crate) fn apply_from(&self, config: &mut Config, source: &str, raw: &str) -> Result<()> {
        match (self.field, self.values) {
            (Field::Int { put, .. }, Values::Int(range)) => put(config, range.parse(source, raw)?),
            (Field::Text { put, .. }, _) => put(config, raw)?,
            (Field::Path { put, .. }, _) => put(
                config,
                Some(std::path::PathBuf::from(raw)).filter(|_| !raw.trim().is_empty()),
            ),
            _ => {}
        }
        Ok(())
    }

    /// Checks the value of `config` against this setting's range.
    pub(crate) fn check(&self, config: &Config) -> Result<()> {
        match (self.field, self.values) {
            (Field::Int { name, get, .. }, Values::Int(range)) => {
                range.check(name, self.name, get(config))
            }
            _ => Ok(()),
        }
    }

    /// The value of `config` as the digest writes it.
    pub(crate) fn show(&self, config: &Config) -> Option<String> {
        match self.field {
            Field::Int { get, .. } => Some(get(config).to_string()),
            Field::Text { show, .. } => Some(show(config)),
            Field::Path { get, .. } => Some(
                get(config)
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            Field::Elsewhere => None,
        }
    }

    /// Whether this is a [`Config`] field.
    pub(crate) fn is_config_field(&self) -> bool {
        !matches!(self.field, Field::Elsewhere)
    }
}
