//! A [`Config`] from settings: defaults overlaid with an [`Environment`]
//! (or a variable getter), each value parsed and checked by its row of
//! [`SETTINGS`]; the checks across settings; the digest of the shared
//! settings rank 0 publishes and every rank adopts.

use super::{by_digest_key, Environment, Scope, SETTINGS};
use crate::config::{Config, MAX_SHM_SEGMENT_BYTES};
use crate::error::{Error, Result};

impl Config {
    /// Defaults overlaid with the settings of `env`; an error about a value
    /// from a settings file names its file and line.
    pub fn from_environment(env: &Environment) -> Result<Config> {
        warn_unknown_names(env);
        Config::overlay(&env.getter(), env.topo_text(), &|name, e| {
            env.annotate(name, e)
        })
    }

    /// Defaults overlaid with variables from `get` (the form without file origins).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        Config::overlay(get, None, &|_, e| e)
    }

    fn overlay(
        get: &dyn Fn(&str) -> Option<String>,
        topo_text: Option<&str>,
        annotate: &dyn Fn(&str, Error) -> Error,
    ) -> Result<Config> {
        let mut c = Config::default();
        for s in SETTINGS.iter().filter(|s| s.is_config_field()) {
            if let Some(v) = get(s.name) {
                s.apply(&mut c, &v).map_err(|e| annotate(s.name, e))?;
            }
        }
        c.tiers = crate::topofile::TierSpec::from_vars(get, topo_text)?;
        // Ranges are checked above; this adds the checks across settings.
        c.validate()?;
        Ok(c)
    }

    /// Checks values set in code against the same bounds [`Config::from_vars`]
    /// applies to the environment (the `MIN_*` / `MAX_*` constants of this
    /// module, as [`SETTINGS`] declares them), plus the shared-memory
    /// segment size.
    pub fn validate(&self) -> Result<()> {
        for s in SETTINGS {
            s.check(self)?;
        }
        self.tcp.tls.files()?;
        // Both factors are bounded above, so the product cannot overflow.
        let segment = self.shm.slots * self.shm.slot_bytes;
        if segment > MAX_SHM_SEGMENT_BYTES {
            return Err(Error::Config(format!(
                "shm_slots × shm_slot_bytes ({} × {} = {segment} bytes, set by SNCL_SHM_SLOTS \
                 and SNCL_SHM_SLOT_BYTES) exceeds the largest shared-memory segment, \
                 {MAX_SHM_SEGMENT_BYTES} bytes",
                self.shm.slots, self.shm.slot_bytes
            )));
        }
        Ok(())
    }

    /// The settings every rank must share (the planner's inputs: the
    /// [`Scope::Shared`] settings of [`SETTINGS`], in table order), as text:
    /// rank 0 publishes them at init and every rank adopts them. Format:
    /// `key=value` pairs joined by `;`, e.g.
    /// `algo=;chunk=262144;slot=131072;slots=8;piece=524288;transport=auto`.
    pub fn shared_digest(&self) -> String {
        SETTINGS
            .iter()
            .filter_map(|s| match s.scope {
                Scope::Shared { digest_key } => {
                    Some(format!("{digest_key}={}", s.show(self).unwrap_or_default()))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    /// Adopts the shared settings published by rank 0.
    pub fn adopt_digest(&mut self, digest: &str) -> Result<()> {
        for part in digest.split(';') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("bad shared digest part {part:?}")))?;
            let s = by_digest_key(k)
                .ok_or_else(|| Error::Config(format!("unknown shared setting {k:?}")))?;
            s.apply_from(self, &format!("rank 0's {k}"), v)?;
        }
        self.validate()
    }
}

/// One WARN per process for each `SNCL_*` variable no setting declares,
/// with the nearest declared name ([`Environment::unknown_names`]).
fn warn_unknown_names(env: &Environment) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let unknown = env.unknown_names();
    if unknown.is_empty() {
        return;
    }
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    for (name, nearest) in unknown {
        if warned.iter().any(|w| w == name) {
            continue;
        }
        warned.push(name.to_string());
        match nearest {
            Some(n) => tracing::warn!("{name} is not an sncl setting (ignored); did you mean {n}?"),
            None => tracing::warn!(
                "{name} is not an sncl setting (ignored); `commbench --help-env` lists them"
            ),
        }
    }
}
