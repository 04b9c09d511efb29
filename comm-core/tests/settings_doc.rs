//! The settings table is the one source: the README's table is rendered
//! from it, every quoted `"SNCL_*"` name in the sources is declared in it,
//! and only `comm_core::settings` reads the process environment.
//!
//! Regenerate the README's table with
//! `cargo test -p comm-core --test settings_doc -- --ignored regenerate_readme`.

use std::path::{Path, PathBuf};

use comm_core::settings::{lookup, render_markdown};

const BEGIN: &str = "<!-- settings table: generated from comm-core/src/settings/table.rs; \
regenerate with `cargo test -p comm-core --test settings_doc -- --ignored regenerate_readme` -->\n";
const END: &str = "<!-- end of settings table -->\n";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn readme() -> (PathBuf, String) {
    let p = root().join("README.md");
    let text = std::fs::read_to_string(&p).expect("README.md");
    (p, text)
}

fn generated() -> String {
    format!("{BEGIN}{}{END}", render_markdown())
}

#[test]
fn readme_table_is_current() {
    let (_, text) = readme();
    assert!(
        text.contains(&generated()),
        "README.md's settings table is stale (comm-core/src/settings/table.rs changed); \
         regenerate it with\n  cargo test -p comm-core --test settings_doc -- --ignored \
         regenerate_readme\nand commit the result"
    );
}

#[test]
#[ignore = "writes README.md; run it after changing the settings table"]
fn regenerate_readme() {
    let (path, text) = readme();
    let start = text
        .find(BEGIN)
        .expect("README.md has the settings table's begin marker");
    let end = text[start..]
        .find(END)
        .map(|e| start + e + END.len())
        .expect("README.md has the settings table's end marker");
    let new = format!("{}{}{}", &text[..start], generated(), &text[end..]);
    std::fs::write(path, new).expect("writing README.md");
}

/// The non-test sources of the crates and the C++ backend.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "tests") {
                    walk(&p, out);
                }
            } else if p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| ["rs", "c", "cc", "cpp", "h", "hpp"].contains(&x))
                && p.file_name().is_some_and(|n| n != "tests.rs")
            {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut dirs = vec![
        root.join("src"),
        root.join("comm-core/src"),
        root.join("bootstrap/src"),
        root.join("environment/src"),
        root.join("runtime/src"),
        root.join("capi/src"),
        root.join("commbench/src"),
        root.join("python/csrc"),
        root.join("kernels/src"),
        root.join("device/src"),
        root.join("compress/src"),
    ];
    for e in std::fs::read_dir(&root).expect("workspace root").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("transport-") {
            dirs.push(e.path().join("src"));
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        walk(&d, &mut out);
    }
    assert!(out.len() > 20, "found only {out:?}");
    out
}

/// The code of a source file before its unit tests, without comment lines.
fn code(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).expect("source file");
    let rust = path.extension().is_some_and(|x| x == "rs");
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if rust && t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") || t.starts_with("/*") || t.starts_with('*') {
            continue;
        }
        out.push((i + 1, line.to_owned()));
    }
    out
}

#[test]
fn only_the_settings_module_reads_the_environment() {
    let allowed = root().join("environment/src/lib.rs");
    let mut bad = Vec::new();
    for path in sources() {
        if path == allowed {
            continue;
        }
        for (n, line) in code(&path) {
            if [
                "env::var",
                "getenv",
                "var_os",
                "std::env::{",
                "use std::env;",
            ]
            .iter()
            .any(|p| line.contains(p))
            {
                bad.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "read settings through comm_core::settings::Environment (filled by \
         sncl_bootstrap::ReadEnvironment) (or snclGetSetting from C/C++), \
         not the process environment:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_named_setting_is_declared() {
    let mut bad = Vec::new();
    for path in sources() {
        for (n, line) in code(&path) {
            let mut rest = line.as_str();
            while let Some(i) = rest.find("\"SNCL_") {
                let name: String = rest[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let after = &rest[i + 1 + name.len()..];
                // A prefix ("SNCL_") is not a name.
                let prefix = name.ends_with('_');
                if after.starts_with('"') && !prefix && lookup(&name).is_none() {
                    bad.push(format!("{}:{n}: {name}", path.display()));
                }
                rest = after;
            }
        }
    }
    assert!(
        bad.is_empty(),
        "declare these in comm-core/src/settings/table.rs:\n{}",
        bad.join("\n")
    );
}
