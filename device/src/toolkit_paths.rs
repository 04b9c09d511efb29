//! Where the CUDA toolkit and its libraries are looked for: the toolkit's
//! install roots and the process variables that name them. Read by the
//! NVRTC compiler front (include directory, cache directory) and by the
//! NVRTC library loader below it.

use std::path::PathBuf;

/// Where a CUDA toolkit may be installed, in the order sncl looks:
/// `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`.
pub(crate) fn cuda_roots() -> Vec<PathBuf> {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| process_var(v))
        .map(PathBuf::from)
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda")))
        .collect()
}

/// A non-empty variable of the process environment, read through sncl's
/// one environment reader (`sncl_environment`).
pub(crate) fn process_var(name: &str) -> Option<String> {
    use sncl_environment::ReadEnvironment;
    comm_core::settings::Environment::process_variables()
        .get(name)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}
