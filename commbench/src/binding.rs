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
