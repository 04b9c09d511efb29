//! The workspace as the repository's own checks read it (tests/import_graph.rs,
//! tests/docs_drift.rs): its root, its member crates and their
//! dependencies on each other, from the Cargo.toml files.

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()))
}

/// The workspace's member directories, from its Cargo.toml.
pub fn members(root: &Path) -> Vec<PathBuf> {
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let line = toml
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("members");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect()
}

/// A crate's package name and the workspace crates it depends on (normal
/// and build dependencies).
pub fn package(dir: &Path) -> (String, Vec<String>) {
    let toml = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = String::new();
    for line in toml.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            section = l.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let key = l.split(['=', '.']).next().unwrap_or("").trim();
        if section == "package" && key == "name" {
            name = l.split('"').nth(1).unwrap_or("").to_string();
        }
        let counted = section == "dependencies" || section == "build-dependencies";
        if counted && (l.contains("path =") || l.contains("workspace = true")) && !key.is_empty() {
            deps.push(key.to_string());
        }
    }
    (name, deps)
}
