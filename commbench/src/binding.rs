//! Binding local ranks to cores (`--bind-to core`, the default, as
//! mpirun binds up to one rank per core): `--np` gives rank r of this
//! machine the r-th core this process may run on, so that two ranks never
//! start on one core and spin for it while another core idles.
//!
//! Measured on this project's 2-core machines (docs/perf-notes/NOTEBOOK.md
//! §24): unbound, about one launch in five of a 2-rank 64 KiB all-reduce
//! ran 4–6× slower for the whole launch; bound, none did.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// Where `--bind-to` puts local ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BindTo {
    /// Each local rank on its own core while there are enough cores (none
    /// bound otherwise).
    Core,
    /// Wherever the kernel puts them.
    None,
}

/// The binding options of every command that launches local ranks
/// (`commbench --np`, `commbench calibrate --np`).
#[derive(clap::Args, Debug, Clone)]
pub struct BindArgs {
    /// With --np: `core` binds each local rank to its own core (while there
    /// are at least as many cores as ranks), as mpirun does; `none` leaves
    /// placement to the kernel.
    #[arg(long = "bind-to", value_enum, default_value_t = BindTo::Core)]
    pub bind_to: BindTo,
    /// The CPUs of this process's ranks, one per rank (set by --np for the
    /// processes it starts).
    #[arg(long = "bind-cpus", hide = true, value_parser = parse_list)]
    pub bind_cpus: Option<CpuList>,
}

impl BindArgs {
    /// The CPUs --np gave this process's ranks, if any.
    pub fn cpus(&self) -> Option<&[usize]> {
        self.bind_cpus.as_ref().map(|c| c.0.as_slice())
    }

    /// Binds the calling thread, this process's one rank, to its CPU.
    pub fn bind_single_rank(&self) {
        if let Some(&cpu) = self.cpus().and_then(|c| c.first()) {
            bind_current_thread(cpu);
        }
    }
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

/// The calling thread's CPUs as a list ("0", "0,1"), for the rank lines.
pub fn describe_current() -> String {
    let cpus = allowed_cpus();
    if cpus.is_empty() {
        return "?".into();
    }
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs for `ranks` local ranks (rank i on the i-th), or `None` when
/// binding is off or there are fewer CPUs than ranks.
pub fn plan(bind: BindTo, ranks: usize) -> Option<Vec<usize>> {
    let cpus = allowed_cpus();
    (bind == BindTo::Core && ranks <= cpus.len()).then(|| cpus[..ranks].to_vec())
}

/// Binds the calling thread (and the threads it starts later) to `cpu`; a
/// failure is reported and the rank runs unbound.
pub fn bind_current_thread(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    if let Err(e) = sched_setaffinity(None, &set) {
        eprintln!("commbench: cannot bind to CPU {cpu} ({e}); running unbound");
    }
}

/// `--bind-cpus`' list: the CPUs of a process's ranks, in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parses `--bind-cpus`' comma-separated list.
pub fn parse_list(s: &str) -> Result<CpuList, String> {
    s.split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .map_err(|e| format!("bad CPU {c:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(CpuList)
}
