//! Shared by the test-bed tests: whether the bed can run here, and where
//! its script lives.

use std::path::PathBuf;
use std::process::Command;

/// Why the test bed cannot run here (not root, no `ip netns`, no `tc`).
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need root".into());
    }
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| o.status.success());
    if !matches!(ok, Ok(true)) {
        return Some("`ip netns` is not available (install iproute2)".into());
    }
    if Command::new("tc").arg("-V").output().is_err() {
        return Some("`tc` is not available (install iproute2)".into());
    }
    None
}

/// The repository root (commbench/ is one level below it).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("commbench/ has a parent")
        .to_path_buf()
}
