//! sncl's log, as NCCL's: `SNCL_DEBUG=WARN|INFO|DEBUG|TRACE` (like
//! `NCCL_DEBUG`; from the environment or the settings file) sets the level,
//! `SNCL_DEBUG_SUBSYS` (like `NCCL_DEBUG_SUBSYS`) limits the messages above
//! WARN to some subsystems, and `SNCL_DEBUG_FILE` (like `NCCL_DEBUG_FILE`,
//! `%h` host name, `%p` process id) sends the log to a file instead of
//! stderr. `RUST_LOG`, when set, is `tracing`'s own filter and wins over
//! `SNCL_DEBUG` and `SNCL_DEBUG_SUBSYS`.
//!
//! A subscriber is installed only with the `log-init` feature (on for the C
//! ABI and commbench), and only where the program has none: without the
//! feature sncl leaves logging to the application's own `tracing`
//! subscriber, which sees sncl's events under their module targets
//! (`sncl::setup`, `transport_tcp`, …).

/// The `tracing` targets (module paths, matched as prefixes) each of
/// `SNCL_DEBUG_SUBSYS`'s subsystems ([`comm_core::config::LOG_SUBSYSTEMS`])
/// covers.
#[cfg(any(feature = "log-init", test))]
pub(crate) fn subsystem_targets(name: &str) -> &'static [&'static str] {
    match name {
        "INIT" => &[
            "sncl::setup",
            "sncl_bootstrap",
            "sncl::shrink",
            "sncl::agree",
            "sncl::split",
        ],
        "COLL" => &["sncl::comm", "sncl_runtime", "sncl::work"],
        "P2P" => &["sncl::comm::tagged", "transport_nvlink"],
        "SHM" => &["transport_shm"],
        "NET" => &[
            "transport_tcp",
            "transport_rdma",
            "sncl_bootstrap::tcpstore",
        ],
        "GRAPH" => &[
            "comm_core::topo",
            "comm_core::topofile",
            "transport_rdma::topo",
        ],
        "TUNING" => &[
            "comm_core::tune",
            "sncl::comm::plan",
            "sncl::calibrate",
            "sncl::compressed",
        ],
        "ENV" => &["comm_core::settings", "sncl_environment"],
        "ALLOC" => &["device", "sncl::device"],
        _ => &[],
    }
}

/// The `tracing` filter directives for the log's settings: warnings and
/// errors from everywhere, and the level for the targets of the subsystems
/// shown.
#[cfg(any(feature = "log-init", test))]
pub(crate) fn filter_directives(log: &LogSettings) -> String {
    let level = log.level.directive();
    let targets = |names: &[&str]| -> Vec<&'static str> {
        names
            .iter()
            .flat_map(|n| subsystem_targets(n).iter().copied())
            .collect()
    };
    // At WARN and below there is nothing to narrow.
    if matches!(log.level, LogLevel::Warn | LogLevel::Error | LogLevel::Off) {
        return level.to_string();
    }
    match &log.subsystems {
        SubsystemFilter::All => level.to_string(),
        SubsystemFilter::Only(names) => std::iter::once("warn".to_string())
            .chain(targets(names).iter().map(|t| format!("{t}={level}")))
            .collect::<Vec<_>>()
            .join(","),
        SubsystemFilter::Except(names) => std::iter::once(level.to_string())
            .chain(targets(names).iter().map(|t| format!("{t}=warn")))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// `SNCL_DEBUG_FILE`'s path with `%h` (host name) and `%p` (process id)
/// filled in.
#[cfg(any(feature = "log-init", test))]
pub(crate) fn log_file_path(pattern: &str, host: &str, pid: u32) -> std::path::PathBuf {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('%', Some('h')) => {
                out.push_str(host);
                chars.next();
            }
            ('%', Some('p')) => {
                out.push_str(&pid.to_string());
                chars.next();
            }
            _ => out.push(c),
        }
    }
    std::path::PathBuf::from(out)
}

#[cfg(feature = "log-init")]
static INIT: std::sync::Once = std::sync::Once::new();

#[cfg(any(feature = "log-init", test))]
use comm_core::config::{LogLevel, LogSettings, SubsystemFilter};

/// Installs a subscriber for sncl's log as the module documentation says
/// (default: WARN on stderr). Does nothing when a global subscriber already
/// exists. Idempotent. A bad `SNCL_DEBUG_SUBSYS` or `RUST_LOG`, or a log
/// file that cannot be opened, is reported on stderr and the log falls
/// back to `SNCL_DEBUG`'s level on stderr.
pub fn init_logging() {
    #[cfg(feature = "log-init")]
    INIT.call_once(install);
}

#[cfg(feature = "log-init")]
fn install() {
    use std::io::Write as _;

    use sncl_bootstrap::ReadEnvironment;
    use tracing_subscriber::EnvFilter;
    let mut problems = Vec::new();
    // A broken settings file or setting is reported by the configuration
    // that follows too; logging falls back to its defaults.
    let env = comm_core::settings::Environment::from_process()
        .unwrap_or_else(|_| comm_core::settings::Environment::process_variables());
    let log = comm_core::Config::from_environment(&env)
        .map(|c| c.log)
        .unwrap_or_else(|e| {
            problems.push(format!("{e}; logging at WARN"));
            LogSettings::default()
        });
    let sncl_filter = || EnvFilter::try_new(filter_directives(&log)).map_err(|e| e.to_string());
    let filter = match env.get("RUST_LOG").filter(|v| !v.trim().is_empty()) {
        Some(spec) => EnvFilter::try_new(spec).or_else(|e| {
            problems.push(format!("RUST_LOG={spec:?}: {e}; using SNCL_DEBUG"));
            sncl_filter()
        }),
        None => sncl_filter(),
    }
    .unwrap_or_else(|e| {
        problems.push(e);
        EnvFilter::new(log.level.directive())
    });
    let file = log.file.as_deref().and_then(|pattern| {
        let path = log_file_path(pattern, &crate::setup::host_name(), std::process::id());
        let mut opts = std::fs::OpenOptions::new();
        opts.create(true).append(true);
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        opts.open(&path)
            .map_err(|e| problems.push(format!("SNCL_DEBUG_FILE: {}: {e}", path.display())))
            .ok()
    });
    for p in &problems {
        // No subscriber yet: the one place sncl writes to stderr itself.
        let _ = writeln!(std::io::stderr(), "sncl: logging: {p}");
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match file {
        Some(f) => builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(f))
            .try_init(),
        None => builder
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directives(level: &str, subsys: &str) -> comm_core::Result<String> {
        Ok(filter_directives(&LogSettings {
            level: LogLevel::parse(level)?,
            subsystems: SubsystemFilter::parse(subsys)?,
            file: None,
        }))
    }

    #[test]
    fn subsystems_narrow_the_messages_above_warn() {
        assert_eq!(directives("info", "").unwrap(), "info");
        assert_eq!(directives("INFO", "ALL").unwrap(), "info");
        assert_eq!(
            directives("info", "init,shm").unwrap(),
            "warn,sncl::setup=info,sncl_bootstrap=info,sncl::shrink=info,sncl::agree=info,\
             sncl::split=info,transport_shm=info"
        );
        assert_eq!(
            directives("debug", "^SHM").unwrap(),
            "debug,transport_shm=warn"
        );
        assert_eq!(directives("debug", "^ALL").unwrap(), "warn");
        // Nothing to narrow at WARN.
        assert_eq!(directives("warn", "NET").unwrap(), "warn");
        assert_eq!(directives("VERSION", "").unwrap(), "warn");
        let e = directives("info", "INIT,NETT").unwrap_err().to_string();
        assert!(e.contains("\"NETT\"") && e.contains("TUNING"), "{e}");
        let e = directives("LOUD", "").unwrap_err().to_string();
        assert!(
            e.contains("SNCL_DEBUG=\"LOUD\"") && e.contains("TRACE"),
            "{e}"
        );
        // Every subsystem covers targets, and its directives parse as a
        // tracing filter.
        for name in comm_core::config::LOG_SUBSYSTEMS {
            assert!(!subsystem_targets(name).is_empty(), "{name}");
            let d = directives("trace", name).unwrap();
            assert!(d.starts_with("warn,") && d.contains("=trace"), "{d}");
            #[cfg(feature = "log-init")]
            tracing_subscriber::EnvFilter::try_new(&d).unwrap();
        }
    }

    #[test]
    fn file_pattern_names_host_and_process() {
        assert_eq!(
            log_file_path("/tmp/sncl.%h.%p.log", "node7", 4242),
            std::path::PathBuf::from("/tmp/sncl.node7.4242.log")
        );
        assert_eq!(
            log_file_path("a%%b%", "h", 1),
            std::path::PathBuf::from("a%%b%")
        );
    }
}
