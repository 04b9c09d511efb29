//! The model's settings, read once from the environment at first use.

use std::sync::OnceLock;
use std::time::Duration;

/// How modules load (`CUDA_MODULE_LOADING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loading {
    /// Functions load on first lookup (the default of CUDA 12.2+ drivers).
    Lazy,
    /// Everything loads in `cuModuleLoadData`.
    Eager,
}

/// The model's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Devices the model shows (`CUDA_MODEL_DEVICES`, default 1, at most 16).
    pub devices: usize,
    /// Streaming multiprocessors per device (`CUDA_MODEL_SMS`, default 132).
    pub sms: u32,
    /// Whether kernels of different processes may overlap (`CUDA_MODEL_MPS=1`).
    pub mps: bool,
    /// The module loading mode (`CUDA_MODULE_LOADING`, default LAZY).
    pub loading: Loading,
    /// No progress for this long while work waits: `cuda-model: stall`.
    pub stall: Duration,
    /// A synchronising call waiting this long on a stream parked on a
    /// host-released wait, with nothing released: `cuda-model: deadlock`.
    pub deadlock: Duration,
    /// Where the counters go at exit (`CUDA_MODEL_REPORT`).
    pub report: Option<std::path::PathBuf>,
    /// Log every refused call and every unsupported symbol (`CUDA_MODEL_LOG`).
    pub log: bool,
}

fn seconds(name: &str, default: f64) -> Duration {
    let v = std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(v)
}

fn number(name: &str, default: u64, max: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|v| (1..=max).contains(v))
        .unwrap_or(default)
}

impl Config {
    fn from_environment() -> Config {
        let loading = match std::env::var("CUDA_MODULE_LOADING").as_deref() {
            Ok("EAGER") => Loading::Eager,
            _ => Loading::Lazy,
        };
        Config {
            devices: number("CUDA_MODEL_DEVICES", 1, 16) as usize,
            sms: number("CUDA_MODEL_SMS", 132, 1024) as u32,
            mps: std::env::var("CUDA_MODEL_MPS").as_deref() == Ok("1"),
            loading,
            stall: seconds("CUDA_MODEL_STALL_S", 20.0),
            deadlock: seconds("CUDA_MODEL_DEADLOCK_S", 5.0),
            report: std::env::var_os("CUDA_MODEL_REPORT")
                .filter(|p| !p.is_empty())
                .map(Into::into),
            log: std::env::var_os("CUDA_MODEL_LOG").is_some(),
        }
    }
}

/// The configuration (read on first call).
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_environment)
}
