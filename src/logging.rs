//! `SNCL_DEBUG=WARN|INFO|TRACE` (like `NCCL_DEBUG`; from the environment or
//! the settings file) sets the level of sncl's
//! `tracing` output on stderr, unless the application installed its own
//! subscriber. Only with the `log-init` feature (on for the C ABI and
//! commbench); without it sncl leaves logging to the application's own
//! `tracing` subscriber.

#[cfg(feature = "log-init")]
static INIT: std::sync::Once = std::sync::Once::new();

/// Installs a stderr subscriber at the level of `SNCL_DEBUG` (default WARN).
/// Does nothing when a global subscriber already exists. Idempotent.
pub fn init_logging() {
    #[cfg(feature = "log-init")]
    INIT.call_once(|| {
        // A broken settings file is reported by the configuration that
        // follows; logging falls back to the environment alone.
        use sncl_bootstrap::ReadEnvironment;
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
        let filter = tracing_subscriber::EnvFilter::new(level);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}
