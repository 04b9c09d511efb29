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

/// The subsystems of `SNCL_DEBUG_SUBSYS` and the `tracing` targets (module
/// paths, matched as prefixes) each covers.
#[cfg(any(feature = "log-init", test))]
pub(crate) const SUBSYSTEMS: &[(&str, &[&str])] = &[
    (
        "INIT",
        &[
            "sncl::setup",
            "sncl_bootstrap",
            "sncl::shrink",
            "sncl::agree",
            "sncl::split",
        ],
    ),
    ("COLL", &["sncl::comm", "sncl_runtime", "sncl::work"]),
    ("P2P", &["sncl::comm::tagged", "transport_nvlink"]),
    ("SHM", &["transport_shm"]),
    (
        "NET",
        &[
            "transport_tcp",
            "transport_rdma",
            "sncl_bootstrap::tcpstore",
        ],
    ),
    (
        "GRAPH",
        &[
            "comm_core::topo",
            "comm_core::topofile",
            "transport_rdma::topo",
        ],
    ),
    (
        "TUNING",
        &["comm_core::tune", "sncl::comm::plan", "sncl::calibrate"],
    ),
    ("ENV", &["comm_core::settings", "sncl_environment"]),
    ("ALLOC", &["device", "sncl::device"]),
];

/// The `tracing` filter directives for `SNCL_DEBUG` = `level` (already
/// lower case: `warn`, `info`, …) and `SNCL_DEBUG_SUBSYS` = `subsys`:
/// warnings and errors from everywhere, and `level` for the targets of the
/// subsystems listed (all but them with a leading `^`). An unknown
/// subsystem name is an error naming the known ones.
#[cfg(any(feature = "log-init", test))]
pub(crate) fn filter_directives(level: &str, subsys: Option<&str>) -> Result<String, String> {
    let Some(spec) = subsys.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(level.to_string());
    };
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let mut targets: Vec<&str> = Vec::new();
    let mut all = false;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let upper = name.to_ascii_uppercase();
        if upper == "ALL" {
            all = true;
            continue;
        }
        let Some((_, t)) = SUBSYSTEMS.iter().find(|(n, _)| *n == upper) else {
            let known: Vec<&str> = SUBSYSTEMS.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "SNCL_DEBUG_SUBSYS: unknown subsystem {name:?}; expected a comma-separated list \
                 of {}, ALL, optionally after ^",
                known.join(", ")
            ));
        };
        targets.extend_from_slice(t);
    }
    // Below WARN there is nothing to narrow.
    let quiet = matches!(level, "warn" | "error" | "off");
    Ok(match (exclude, all, quiet) {
        (_, _, true) | (false, true, _) => level.to_string(),
        (true, true, false) => "warn".to_string(),
        (false, false, false) => std::iter::once("warn".to_string())
            .chain(targets.iter().map(|t| format!("{t}={level}")))
            .collect::<Vec<_>>()
            .join(","),
        (true, false, false) => std::iter::once(level.to_string())
            .chain(targets.iter().map(|t| format!("{t}=warn")))
            .collect::<Vec<_>>()
            .join(","),
    })
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
    // A broken settings file is reported by the configuration that
    // follows; logging falls back to the environment alone.
    let env = comm_core::settings::Environment::from_process()
        .unwrap_or_else(|_| comm_core::settings::Environment::process_variables());
    let level = match env
        .get("SNCL_DEBUG")
        .unwrap_or_default()
        .to_ascii_uppercase()
        .as_str()
    {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "ERROR" => "error",
        "OFF" | "NONE" => "off",
        _ => "warn",
    };
    let mut problems = Vec::new();
    let sncl_filter = || {
        filter_directives(level, env.get("SNCL_DEBUG_SUBSYS"))
            .and_then(|d| EnvFilter::try_new(d).map_err(|e| e.to_string()))
    };
    let filter = match env.get("RUST_LOG").filter(|v| !v.trim().is_empty()) {
        Some(spec) => EnvFilter::try_new(spec).or_else(|e| {
            problems.push(format!("RUST_LOG={spec:?}: {e}; using SNCL_DEBUG"));
            sncl_filter()
        }),
        None => sncl_filter(),
    }
    .unwrap_or_else(|e| {
        problems.push(e);
        EnvFilter::new(level)
    });
    let file = env
        .get("SNCL_DEBUG_FILE")
        .filter(|p| !p.trim().is_empty())
        .and_then(|pattern| {
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

    #[test]
    fn subsystems_narrow_the_messages_above_warn() {
        assert_eq!(filter_directives("info", None).unwrap(), "info");
        assert_eq!(filter_directives("info", Some("ALL")).unwrap(), "info");
        assert_eq!(
            filter_directives("info", Some("init,shm")).unwrap(),
            "warn,sncl::setup=info,sncl_bootstrap=info,sncl::shrink=info,sncl::agree=info,\
             sncl::split=info,transport_shm=info"
        );
        assert_eq!(
            filter_directives("debug", Some("^SHM")).unwrap(),
            "debug,transport_shm=warn"
        );
        // Nothing to narrow at WARN.
        assert_eq!(filter_directives("warn", Some("NET")).unwrap(), "warn");
        let e = filter_directives("info", Some("INIT,NETT")).unwrap_err();
        assert!(e.contains("\"NETT\"") && e.contains("TUNING"), "{e}");
        // Every subsystem's directives parse as a tracing filter.
        for (name, _) in SUBSYSTEMS {
            let d = filter_directives("trace", Some(name)).unwrap();
            assert!(d.starts_with("warn,") && d.contains("=trace"), "{d}");
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
