//! Every `SNCL_*` setting, declared once (in the spirit of NCCL's
//! `NCCL_PARAM`).
//!
//! [`SETTINGS`] names each variable with its values, default, scope and a
//! one-line description. Parsing ([`crate::Config::from_environment`]),
//! validation ([`crate::Config::validate`]), the cross-rank agreement digest
//! ([`crate::Config::shared_digest`]), `commbench --help-env`
//! ([`render_help`]) and the README's table ([`render_markdown`]) all come
//! from it.
//!
//! The process environment is read in exactly one place,
//! `sncl_bootstrap::ReadEnvironment::from_process`: it captures the
//! `SNCL_*` variables (plus the launcher variables `sncl_bootstrap::LaunchEnv`
//! needs) once and
//! overlays a settings file (see [`Environment`]); everything else receives
//! values from an [`Environment`].

mod apply;
mod row;
mod table;
mod values;

pub use row::{DefaultValue, IntRange, Scope, Setting, Values};
pub(crate) use table::by_digest_key;
pub use table::{lookup, nearest, SETTINGS, TEST_PREFIX};
pub use values::{Environment, Origin};

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The settings table as Markdown (the README's "Environment" table).
pub fn render_markdown() -> String {
    let mut out =
        String::from("| variable | values | default | scope | meaning |\n|---|---|---|---|---|\n");
    for s in SETTINGS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            s.name,
            cell(&s.values.describe()),
            cell(s.default.describe()),
            s.scope.label(),
            cell(s.doc)
        ));
    }
    out
}

/// The settings table as plain text (`commbench --help-env`).
pub fn render_help() -> String {
    let mut out = String::from(
        "sncl settings: environment variables, else the settings file ($SNCL_CONF_FILE, else \
         ~/.sncl.conf, else /etc/sncl.conf; lines NAME=value, # comments).\n\
         Scope: \"all ranks\" settings take rank 0's value on every rank; \"launch\" ones come \
         from the launcher.\n\n",
    );
    for s in SETTINGS {
        out.push_str(&format!(
            "{}\n    {}\n    values: {}\n    default: {}\n    scope: {}\n",
            s.name,
            s.doc,
            s.values.describe(),
            s.default.describe(),
            s.scope.label()
        ));
    }
    out
}

#[cfg(test)]
mod tests;
