//! Where the model's cdylib and NVIDIA's wheels (NVRTC, `cuda.h`) are,
//! for tests that run programs on the model. Shared by the test files that
//! include it with `#[path]`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Makes `dir` (fresh) hold `libcuda.so` and `libcuda.so.1`, links to the
/// model's cdylib: a directory to put first on `LD_LIBRARY_PATH`.
pub fn model_lib_dir(dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the library directory");
    let lib = model_library();
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(name)).expect("link the model as libcuda");
    }
    dir.to_path_buf()
}

/// The crate's directory.
pub fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Says why a test skips, on the process's stderr itself: the test
/// harness captures `eprintln!` of a passing test, and a skip must be seen
/// in the test command's output.
pub fn say_skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// The directory holding `cuda.h`, from `scripts/cuda-wheels.sh`.
pub fn cuda_include() -> Result<PathBuf, String> {
    wheel_dir("CUDA_INCLUDE", "cuda.h")
}

/// The directory `scripts/cuda-wheels.sh` prints as `key=`, checked to
/// hold `file`.
pub fn wheel_dir(key: &str, file: &str) -> Result<PathBuf, String> {
    let script = manifest_dir().join("../scripts/cuda-wheels.sh");
    let o = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !o.status.success() {
        return Err(format!("{} failed: {}", script.display(), o.status));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let dir = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(PathBuf::from)
        .ok_or_else(|| format!("{} printed no {key}=", script.display()))?;
    if !dir.join(file).exists() {
        return Err(format!("no {file} in {}", dir.display()));
    }
    Ok(dir)
}

/// The model's cdylib: the newer of `target/<profile>/libcuda_model.so` and its copy
/// in `deps/`, found from this test binary's path,
/// `target/<profile>/deps/NAME-HASH`.
pub fn model_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let profile = deps.parent().expect("the target profile directory");
    let candidates = [
        profile.join("libcuda_model.so"),
        deps.join("libcuda_model.so"),
    ];
    // The newest: `cargo test` builds the cdylib in deps/ and does not
    // always refresh the copy beside them, which an older `cargo build`
    // left there (a stale model runs stale host kernels).
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| {
            panic!(
                "the model's cdylib is missing (looked for {:?}); build it with \
                 `cargo build -p cuda-model`",
                candidates
            )
        })
}
