//! The PyTorch backend ("sncl" for torch.distributed, python/): runs
//! `scripts/test-torch.sh`, which installs torch into a cached virtualenv
//! (target/torch-venv, or `TORCH_VENV`), builds the C++ backend against it
//! and runs the torchrun tests (every op against gloo, DDP parity, FSDP2,
//! communication hooks, world size 1, clean exit).
//!
//! Skipped, with the reason printed, when torch is not installed and cannot
//! be (pip cannot reach the package index, or there is no Python 3.10+ with
//! venv: the script exits 77), or when `SNCL_SKIP_TORCH_TESTS` is set. Otherwise it runs for real and fails when
//! any torch test fails.
//!
//! The backend links the `libsncl.a` that cargo built beside this test (the
//! same profile, already up to date: cargo builds the package's library
//! before its tests), so the test does not build a second, release libsncl
//! (minutes on a fresh machine). `SNCL_LIB_DIR` set by the caller wins.

use std::path::{Path, PathBuf};
use std::process::Command;

const SKIP: i32 = 77;

#[test]
fn torch_backend() {
    if let Some(v) = std::env::var_os("SNCL_SKIP_TORCH_TESTS") {
        eprintln!("torch_backend: skipped (SNCL_SKIP_TORCH_TESTS={v:?})");
        return;
    }
    // The workspace root (this crate is capi/ in it).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sncl-capi is a workspace member");
    let script = root.join("scripts/test-torch.sh");
    assert!(script.exists(), "{} is missing", script.display());
    let mut command = Command::new("bash");
    command.arg(&script).current_dir(root);
    if std::env::var_os("SNCL_LIB_DIR").is_none() {
        if let Some(dir) = profile_dir_with_libsncl() {
            eprintln!("torch_backend: linking {}/libsncl.a", dir.display());
            command.env("SNCL_LIB_DIR", dir);
        }
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    match status.code() {
        Some(0) => {}
        Some(SKIP) => eprintln!(
            "torch_backend: skipped: torch is not installed and cannot be (the script's \
             SKIP message above says why)"
        ),
        Some(c) => {
            panic!("scripts/test-torch.sh failed with exit status {c} (logs in target/test-torch/)")
        }
        None => panic!("scripts/test-torch.sh was killed by a signal"),
    }
}

/// The profile directory this test binary was built into
/// (`target/<profile>/deps/torch_backend-*` → `target/<profile>`), if cargo
/// left a `libsncl.a` there.
fn profile_dir_with_libsncl() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    dir.join("libsncl.a").is_file().then(|| dir.to_path_buf())
}
