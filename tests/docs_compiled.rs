//! Every markdown file of docs/ (and the README) is part of the doctests:
//! `src/lib.rs` includes each one, so its Rust blocks are compiled.

#[test]
fn every_doc_file_is_a_doctest() {
    let root = env!("CARGO_MANIFEST_DIR");
    let lib = std::fs::read_to_string(format!("{root}/src/lib.rs")).unwrap();
    let mut files = vec!["README.md".to_string()];
    for e in std::fs::read_dir(format!("{root}/docs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    for f in files {
        let include = format!("#[doc = include_str!(\"../{f}\")]");
        assert!(
            lib.contains(&include),
            "src/lib.rs does not include {f} as a doctest: add `{include}`"
        );
        // Untagged fences would be compiled as Rust; shell and text must say so.
        let text = std::fs::read_to_string(format!("{root}/{f}")).unwrap();
        let mut open = false;
        let mut previous_blank = true;
        for (n, line) in text.lines().enumerate() {
            // An indented block after a blank line is a code block too
            // (compiled as Rust): fence it with its language instead.
            assert!(
                open || !(previous_blank && line.starts_with("    ") && !line.trim().is_empty()),
                "{f}:{}: an indented code block; use a fenced block with a language",
                n + 1
            );
            previous_blank = line.trim().is_empty();
            if line.starts_with("```") {
                if !open {
                    assert!(
                        line.trim() != "```",
                        "{f}:{}: a code block without a language",
                        n + 1
                    );
                }
                open = !open;
            }
        }
    }
}
