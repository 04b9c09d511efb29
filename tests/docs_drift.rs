//! Docs that cannot drift from the house: every workspace crate is named in
//! the README's Layout and in docs/ARCHITECTURE.md's crate diagram, and
//! every document under docs/ is linked from the README. (The settings
//! table is checked by comm-core/tests/settings_doc.rs, the C header by
//! capi/tests/c_abi.rs, the docs' code by tests/docs_compiled.rs.)

use std::path::Path;

mod workspace;
use workspace::{members, package, workspace};

/// The text of `file`'s section that starts with the heading `heading`
/// (up to the next heading of the same or a higher level).
fn section(file: &Path, heading: &str) -> String {
    let text = std::fs::read_to_string(file).expect("the document");
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut out = String::new();
    let mut inside = false;
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let is_heading = !fenced && hashes > 0 && line[hashes..].starts_with(' ');
        if is_heading && line.trim_end() == heading {
            inside = true;
            continue;
        }
        if inside && is_heading && hashes <= level {
            break;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        !out.is_empty(),
        "{} has no section {heading:?}",
        file.display()
    );
    out
}

/// Whether `text` names the crate in `dir` (its directory as `dir/`, or its
/// package name as a word).
fn names_crate(text: &str, root: &Path, dir: &Path, name: &str) -> bool {
    let rel = dir.strip_prefix(root).unwrap_or(dir).display().to_string();
    let word = |w: &str| {
        text.match_indices(w).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + w.len()..].chars().next();
            let edge =
                |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'));
            edge(before) && edge(after)
        })
    };
    (!rel.is_empty() && text.contains(&format!("{rel}/"))) || word(name)
}

#[test]
fn every_crate_is_on_the_maps_and_every_doc_is_linked() {
    let root = workspace();
    let layout = section(&root.join("README.md"), "## Layout");
    let crates = section(&root.join("docs/ARCHITECTURE.md"), "## Crates");
    let mut missing = Vec::new();
    let dirs = members(&root);
    assert!(dirs.len() > 10, "too few workspace members: {dirs:?}");
    for dir in &dirs {
        let (name, _) = package(dir);
        if !names_crate(&layout, &root, dir, &name) {
            missing.push(format!(
                "README.md, Layout: crate {name} ({})",
                dir.display()
            ));
        }
        if !names_crate(&crates, &root, dir, &name) {
            missing.push(format!(
                "docs/ARCHITECTURE.md, Crates: crate {name} ({})",
                dir.display()
            ));
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty());
    for doc in docs {
        if !readme.contains(&format!("docs/{doc}")) {
            missing.push(format!("README.md: no link to docs/{doc}"));
        }
    }
    assert!(
        missing.is_empty(),
        "the docs miss what the workspace has:\n{}",
        missing.join("\n")
    );
}

/// The check itself fails when a crate leaves the map.
#[test]
fn a_crate_missing_from_the_text_is_seen() {
    let root = workspace();
    let dir = root.join("transport-rdma");
    assert!(names_crate(
        "`transport-rdma` (RDMA verbs)",
        &root,
        &dir,
        "transport-rdma"
    ));
    assert!(names_crate(
        " transport-rdma/    verbs",
        &root,
        &dir,
        "transport-rdma"
    ));
    assert!(!names_crate(
        "`transport-rdma-x`, `transport-tcp`",
        &root,
        &dir,
        "transport-rdma"
    ));
}

/// Every `#[ignore]`d test says why, in one of the known kinds: a child
/// process's entry point (its parent runs it), a generator that rewrites a
/// checked-in file, or a measurement of the long suite, and each of those
/// is listed in `scripts/test.sh --long` (so no test is ignored and
/// forgotten).
#[test]
fn every_ignored_test_is_a_child_a_generator_or_in_the_long_suite() {
    let root = workspace();
    let script = std::fs::read_to_string(root.join("scripts/test.sh")).expect("scripts/test.sh");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                dirs.push(p);
            } else if name.ends_with(".rs") {
                files.push(p);
            }
        }
    }
    let mut bad = Vec::new();
    let mut long = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(reason) = l.trim().strip_prefix("#[ignore = \"") else {
                continue;
            };
            let at = format!(
                "{}:{}",
                f.strip_prefix(&root).unwrap_or(&f).display(),
                i + 1
            );
            let name = lines[i + 1..]
                .iter()
                .find_map(|l| l.trim().strip_prefix("fn "))
                .and_then(|l| l.split('(').next())
                .unwrap_or("");
            if reason.contains("scripts/test.sh --long") {
                long += 1;
                if !script
                    .lines()
                    .any(|s| s.trim().trim_matches('"').ends_with(&format!(" {name}")))
                {
                    bad.push(format!(
                        "{at}: {name} is not in scripts/test.sh's long list"
                    ));
                }
            } else if !(reason.contains("child process") || reason.starts_with("writes ")) {
                bad.push(format!(
                    "{at}: {name}: ignored for another reason: {reason}"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // Every entry of the script's long list is an ignored test found here.
    let listed = script
        .split_once("long=(")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map_or(0, |(list, _)| {
            list.lines().filter(|l| l.trim().starts_with('"')).count()
        });
    assert!(
        listed > 0 && long == listed,
        "the long suite lists {listed} tests, {long} were found ignored for it"
    );
}
