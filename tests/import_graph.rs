//! The house's structure, checked from the code: between crates no circle
//! (counting build-dependencies; a crate's floor is the length of its
//! longest dependency chain), and within every crate no circle of imports
//! between files beyond the ones [`KNOWN_CIRCLES`] lists — a list that may
//! only shrink: a new circle, or a known one that grew, fails; one that
//! shrank or vanished fails until the list says so. A file's imports are the items
//! it names through `use` and through paths in its code (`crate::…`,
//! `super::…`, a child module's or an imported module's name; `use
//! child::item`; inside an inline `mod name { … }`, relative to it), each
//! resolved to the file that defines the item — through `pub use`
//! re-exports — so a parent that only declares its children is not tied to
//! them. Test-only modules (`#[cfg(test)]`) and test, bench and example
//! targets are not part of the house. Comments and string literals are not
//! read. docs/ARCHITECTURE.md shows the floors; `cargo test --test
//! import_graph -- --nocapture` prints them and any circle with the names
//! that tie each arrow.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

mod workspace;
use workspace::{members, package, workspace};

/// One token of Rust source with comments and literals removed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens of `src`: identifiers, `::` and single punctuation; comments,
/// strings, chars, lifetimes and numbers dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(b.get(i + 1), Some('"') | Some('#')) && raw_string_at(&b, i)
        {
            i = skip_raw_string(&b, i);
        } else if c == 'b' && b.get(i + 1) == Some(&'"') {
            i = skip_string(&b, i + 1);
        } else if c == '"' {
            i = skip_string(&b, i);
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if b.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let word: String = b[s..i].iter().collect();
            out.push(Tok::Ident(word.trim_start_matches("r#").to_string()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                i += 1;
            }
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

fn raw_string_at(b: &[char], i: usize) -> bool {
    let mut j = i + 1;
    while b.get(j) == Some(&'#') {
        j += 1;
    }
    b.get(j) == Some(&'"') && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
}

fn skip_raw_string(b: &[char], i: usize) -> usize {
    let mut j = i + 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    j += 1;
    while j < b.len() {
        if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
            return j + 1 + hashes;
        }
        j += 1;
    }
    j
}

fn skip_string(b: &[char], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && b[j] != '"' {
        if b[j] == '\\' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// Drops `#[cfg(test)]` items (a test module inline or declared) and
/// `#[path]` is returned with the following `mod` for [`modules`].
fn without_test_items(toks: &[Tok]) -> Vec<Tok> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let is_cfg_test = toks[i] == Tok::Punct('#')
            && toks.get(i + 1) == Some(&Tok::Punct('['))
            && ident(toks.get(i + 2)) == Some("cfg")
            && toks.get(i + 3) == Some(&Tok::Punct('('))
            && ident(toks.get(i + 4)) == Some("test")
            && toks.get(i + 5) == Some(&Tok::Punct(')'));
        if !is_cfg_test {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        // Skip the attribute, further attributes, then the item: up to its
        // `;` at depth 0 or its closing brace.
        i += 7;
        let mut depth = 0i32;
        while i < toks.len() {
            match toks[i] {
                Tok::Punct('{') | Tok::Punct('[') | Tok::Punct('(') => depth += 1,
                Tok::Punct('}') | Tok::Punct(']') | Tok::Punct(')') => {
                    depth -= 1;
                    if depth == 0 && toks[i] == Tok::Punct('}') {
                        i += 1;
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// A source file of a crate's module tree.
struct File {
    path: PathBuf,
    module: Vec<String>,
    toks: Vec<Tok>,
    /// Names of items defined here (fn, struct, ...; child modules apart).
    defined: BTreeSet<String>,
    /// Child modules declared here: name → module path.
    children: BTreeSet<String>,
    /// `use` bindings: local name → absolute path (a glob as name `*`).
    uses: Vec<(String, Vec<String>, bool)>,
    /// Per token, the inline modules it sits in ([`inline_modules`]).
    inline: Vec<Vec<String>>,
}

/// The files of the module tree rooted at `root` (lib.rs or main.rs).
fn module_tree(root: &Path) -> Vec<File> {
    let mut files = Vec::new();
    let mut todo = vec![(root.to_path_buf(), Vec::<String>::new())];
    while let Some((path, module)) = todo.pop() {
        let Ok(src) = std::fs::read_to_string(&path) else {
            continue;
        };
        let toks = without_test_items(&tokens(&src));
        let dir = match path.file_name().and_then(|f| f.to_str()) {
            Some("mod.rs") | Some("lib.rs") | Some("main.rs") => {
                path.parent().unwrap().to_path_buf()
            }
            _ => path.with_extension(""),
        };
        let mut children = BTreeSet::new();
        let mut defined = BTreeSet::new();
        let mut explicit_path: Option<String> = None;
        for (k, t) in toks.iter().enumerate() {
            // #[path = "x.rs"] is dropped with the literals; read it raw.
            if ident(Some(t)) == Some("path") && k > 0 && toks[k - 1] == Tok::Punct('[') {
                explicit_path = path_attribute(&src);
            }
            let Some(word) = ident(Some(t)) else { continue };
            let next = ident(toks.get(k + 1));
            match (word, next) {
                ("mod", Some(name)) => {
                    let inline = toks.get(k + 2) == Some(&Tok::Punct('{'));
                    children.insert(name.to_string());
                    if !inline {
                        let file = match explicit_path.take() {
                            Some(p) => path.parent().unwrap().join(p),
                            None => {
                                let a = dir.join(format!("{name}.rs"));
                                if a.exists() {
                                    a
                                } else {
                                    dir.join(name).join("mod.rs")
                                }
                            }
                        };
                        let mut m = module.clone();
                        m.push(name.to_string());
                        todo.push((file, m));
                    }
                }
                (
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union",
                    Some(n),
                ) => {
                    defined.insert(n.to_string());
                }
                ("macro_rules", _) => {
                    if let Some(n) = ident(toks.get(k + 2)) {
                        defined.insert(n.to_string());
                    }
                }
                _ => {}
            }
        }
        let inline = inline_modules(&toks);
        let uses = use_bindings(&toks, &inline, &module, &children);
        files.push(File {
            path,
            module,
            toks,
            defined,
            children,
            uses,
            inline,
        });
    }
    files
}

fn path_attribute(src: &str) -> Option<String> {
    let at = src.find("#[path")?;
    let rest = &src[at..];
    let q1 = rest.find('"')?;
    let q2 = rest[q1 + 1..].find('"')?;
    Some(rest[q1 + 1..q1 + 1 + q2].to_string())
}

/// For each token of a file, the inline modules (`mod name { … }`) it sits
/// in, outermost first: `super::` and `self::` inside them are relative to
/// them, not to the file's module.
fn inline_modules(toks: &[Tok]) -> Vec<Vec<String>> {
    let mut out = Vec::with_capacity(toks.len());
    let mut stack: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    for (k, t) in toks.iter().enumerate() {
        match t {
            Tok::Punct('{') => {
                depth += 1;
                if k >= 2 && ident(toks.get(k - 2)) == Some("mod") {
                    if let Some(name) = ident(toks.get(k - 1)) {
                        stack.push((name.to_string(), depth));
                    }
                }
            }
            Tok::Punct('}') => {
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
        out.push(stack.iter().map(|(n, _)| n.clone()).collect());
    }
    out
}

/// Every `use` of a file, expanded: (local name, absolute path, is_pub).
/// Paths start with the crate (`crate`), or with an external crate's name.
fn use_bindings(
    toks: &[Tok],
    inline: &[Vec<String>],
    module: &[String],
    children: &BTreeSet<String>,
) -> Vec<(String, Vec<String>, bool)> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        if ident(toks.get(k)) != Some("use") {
            k += 1;
            continue;
        }
        // `pub use`, `pub(crate) use`, ...
        let is_pub = k >= 1
            && (ident(toks.get(k - 1)) == Some("pub") || toks.get(k - 1) == Some(&Tok::Punct(')')));
        let start = k + 1;
        let mut end = start;
        while end < toks.len() && toks[end] != Tok::Punct(';') {
            end += 1;
        }
        let within = [module, &inline[k][..]].concat();
        let mut found = Vec::new();
        expand(
            &toks[start..end],
            &mut Vec::new(),
            &within,
            is_pub,
            &mut found,
        );
        // `use child::item` names a child module of this file's module
        // (paths relative to the module, as in the 2018 edition).
        for (_, path, _) in &mut found {
            let first = path.first().map(String::as_str).unwrap_or("");
            if first != "crate" && inline[k].is_empty() && children.contains(first) {
                *path = [vec!["crate".to_string()], within.clone(), path.clone()].concat();
            }
        }
        out.extend(found);
        k = end;
    }
    out
}

/// Expands one use tree with `prefix` before it.
fn expand(
    toks: &[Tok],
    prefix: &mut Vec<String>,
    module: &[String],
    is_pub: bool,
    out: &mut Vec<(String, Vec<String>, bool)>,
) {
    let depth0 = prefix.len();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(w) if w == "as" => {
                if let Some(alias) = ident(toks.get(i + 1)) {
                    if let Some(last) = out.last_mut() {
                        last.0 = alias.to_string();
                    }
                }
                i += 2;
                continue;
            }
            Tok::Ident(w) => {
                prefix.push(w.clone());
                let next = toks.get(i + 1);
                if next != Some(&Tok::PathSep) {
                    let name = if w == "self" {
                        prefix[prefix.len() - 2].clone()
                    } else {
                        w.clone()
                    };
                    let mut p = prefix.clone();
                    if w == "self" {
                        p.pop();
                    }
                    out.push((name, absolute(&p, module), is_pub));
                    prefix.pop();
                }
            }
            Tok::PathSep => {}
            Tok::Punct('*') => {
                out.push(("*".into(), absolute(prefix, module), is_pub));
            }
            Tok::Punct('{') => {
                // Find the matching brace; expand each comma part.
                let mut depth = 0;
                let mut j = i;
                let mut part_start = i + 1;
                while j < toks.len() {
                    match toks[j] {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                expand(&toks[part_start..j], prefix, module, is_pub, out);
                                break;
                            }
                        }
                        Tok::Punct(',') if depth == 1 => {
                            expand(&toks[part_start..j], prefix, module, is_pub, out);
                            part_start = j + 1;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    prefix.truncate(depth0);
}

/// `crate::a`, `super::a`, `self::a` made absolute (`crate` first);
/// others (external crates, or a name in scope) returned as written.
fn absolute(p: &[String], module: &[String]) -> Vec<String> {
    let mut base: Vec<String> = module.to_vec();
    let mut rest = p;
    match p.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &p[1..];
        }
        Some("self") => rest = &p[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => return p.to_vec(),
    }
    let mut out = vec!["crate".to_string()];
    out.extend(base);
    out.extend(rest.iter().cloned());
    out
}

/// One crate's files and the arrows between them.
struct Crate {
    files: Vec<File>,
    by_module: HashMap<Vec<String>, usize>,
}

impl Crate {
    fn new(files: Vec<File>) -> Crate {
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        Crate { files, by_module }
    }

    /// The file that defines the item `path` names (absolute, `crate`
    /// first), following re-exports; None for modules and unknown names.
    fn resolve(&self, path: &[String], depth: usize) -> Option<usize> {
        if depth > 8 || path.first().map(String::as_str) != Some("crate") {
            return None;
        }
        let segs = &path[1..];
        // The longest prefix that is a file module.
        let mut m = segs.len();
        while m > 0 && !self.by_module.contains_key(&segs[..m]) {
            m -= 1;
        }
        let file = self.by_module[&segs[..m]];
        let Some(name) = segs.get(m) else {
            return None; // a module itself
        };
        let f = &self.files[file];
        if f.defined.contains(name) {
            return Some(file);
        }
        if f.children.contains(name) {
            return None; // an inline module's item: count the file
        }
        for (local, target, _) in &f.uses {
            if local == name {
                let mut t = target.clone();
                t.extend(segs[m + 1..].iter().cloned());
                return self.resolve(&t, depth + 1).or(Some(file));
            }
        }
        for (local, target, _) in &f.uses {
            if local == "*" {
                let mut t = target.clone();
                t.extend(segs[m..].iter().cloned());
                if let Some(found) = self.resolve(&t, depth + 1) {
                    return Some(found);
                }
            }
        }
        Some(file)
    }

    /// Arrows: file → file, with the names that tie them.
    fn arrows(&self) -> BTreeMap<(usize, usize), BTreeSet<String>> {
        let mut arrows: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
        for (i, f) in self.files.iter().enumerate() {
            let mut add = |path: Vec<String>| {
                if let Some(j) = self.resolve(&path, 0) {
                    // The crate root (module path empty) is the crate's
                    // front door: it declares, re-exports and holds the
                    // crate's own items; arrows to or from it are not kept.
                    let root = |x: usize| self.files[x].module.is_empty();
                    if j != i && !root(i) && !root(j) {
                        let name = path.last().cloned().unwrap_or_default();
                        arrows.entry((i, j)).or_default().insert(name);
                    }
                }
            };
            // Names bound by `use` (a module bound is followed below).
            for (_, target, _) in &f.uses {
                add(target.clone());
            }
            // Paths in the code: crate::, super::, self::, or through a
            // child module or a module bound by `use`.
            let toks = &f.toks;
            let inline = &f.inline;
            let mut k = 0;
            while k < toks.len() {
                let starts_path = toks.get(k + 1) == Some(&Tok::PathSep)
                    && (k == 0 || toks[k - 1] != Tok::PathSep);
                let Some(first) = ident(toks.get(k)).filter(|_| starts_path) else {
                    k += 1;
                    continue;
                };
                let mut segs = vec![first.to_string()];
                let mut j = k + 1;
                while toks.get(j) == Some(&Tok::PathSep) {
                    match ident(toks.get(j + 1)) {
                        Some(s) => segs.push(s.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                let head = match first {
                    "crate" | "super" | "self" => {
                        Some(absolute(&segs, &[&f.module[..], &inline[k][..]].concat()))
                    }
                    _ if f.children.contains(first) => {
                        let mut m = f.module.clone();
                        m.extend(segs.iter().cloned());
                        Some(absolute(&[vec!["crate".into()], m].concat(), &[]))
                    }
                    _ => f
                        .uses
                        .iter()
                        .find(|(local, _, _)| local == first)
                        .map(|(_, target, _)| [target.clone(), segs[1..].to_vec()].concat()),
                };
                if let Some(p) = head {
                    add(p);
                }
                k = j;
            }
        }
        arrows
    }
}

/// Strongly connected components of more than one node (Tarjan).
fn circles(n: usize, arrows: &BTreeMap<(usize, usize), BTreeSet<String>>) -> Vec<Vec<usize>> {
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in arrows.keys() {
        next[a].push(b);
    }
    struct T<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        count: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.count);
        t.low[v] = t.count;
        t.count += 1;
        t.stack.push(v);
        t.on[v] = true;
        for &w in &t.next[v] {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        next: &next,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        count: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The circles between files that remain to be broken (docs/ARCHITECTURE.md,
/// "Circles"), each as its files, sorted.
const KNOWN_CIRCLES: &[&[&str]] = &[];

#[test]
fn no_circles_between_files_or_crates() {
    let root = workspace();
    let mut problems = Vec::new();
    // Crates: floors from the longest dependency chain; a circle is an error.
    let dirs = members(&root);
    let pkgs: Vec<(String, Vec<String>, PathBuf)> = dirs
        .iter()
        .map(|d| {
            let (n, deps) = package(d);
            (n, deps, d.clone())
        })
        .collect();
    let names: BTreeSet<&str> = pkgs.iter().map(|p| p.0.as_str()).collect();
    let mut floor: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..=pkgs.len() {
        for (n, deps, _) in &pkgs {
            let f = deps
                .iter()
                .filter(|d| names.contains(d.as_str()))
                .map(|d| floor.get(d.as_str()).copied().unwrap_or(0) + 1)
                .max()
                .unwrap_or(1);
            floor.insert(n.as_str(), f);
        }
    }
    for (n, deps, _) in &pkgs {
        for d in deps.iter().filter(|d| names.contains(d.as_str())) {
            if floor[d.as_str()] >= floor[n.as_str()] {
                problems.push(format!(
                    "crate {n} depends on {d}, on its floor or above (a circle)"
                ));
            }
        }
    }
    let mut by_floor: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (n, f) in &floor {
        by_floor.entry(*f).or_default().push(n);
    }
    for (f, ns) in by_floor.iter().rev() {
        eprintln!("floor {f}: {}", ns.join(", "));
    }
    // Files: every crate's library and binary module trees.
    let mut files_seen = 0;
    let mut found: Vec<(Vec<String>, String)> = Vec::new();
    for (name, _, dir) in &pkgs {
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let path = dir.join(root_file);
            if !path.exists() {
                continue;
            }
            let krate = Crate::new(module_tree(&path));
            files_seen += krate.files.len();
            let arrows = krate.arrows();
            for circle in circles(krate.files.len(), &arrows) {
                let rel = |i: usize| {
                    krate.files[i]
                        .path
                        .strip_prefix(&root)
                        .unwrap_or(&krate.files[i].path)
                        .display()
                        .to_string()
                };
                let mut files: Vec<String> = circle.iter().map(|&i| rel(i)).collect();
                files.sort();
                let mut text = format!(
                    "{name}: a circle of {} files: {}",
                    circle.len(),
                    circle
                        .iter()
                        .map(|&i| rel(i))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                for ((a, b), names) in &arrows {
                    if circle.contains(a) && circle.contains(b) {
                        let names: Vec<&str> = names.iter().map(String::as_str).take(6).collect();
                        text += &format!("\n    {} -> {}: {}", rel(*a), rel(*b), names.join(", "));
                    }
                }
                found.push((files, text));
            }
        }
    }
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|f| f.to_string()).collect())
        .collect();
    for (files, text) in &found {
        if known.contains(files) {
            eprintln!("known (to be broken): {text}");
        } else if known.iter().any(|k| files.iter().all(|f| k.contains(f))) {
            problems.push(format!(
                "a known circle shrank: put its new files in KNOWN_CIRCLES: {text}"
            ));
        } else {
            problems.push(format!(
                "a new circle (or a known one grew): break it: {text}"
            ));
        }
    }
    for k in &known {
        if !found
            .iter()
            .any(|(files, _)| files.iter().all(|f| k.contains(f)))
        {
            problems.push(format!(
                "a known circle is gone: remove it from KNOWN_CIRCLES: {k:?}"
            ));
        }
    }
    eprintln!("{} crates, {files_seen} files read", pkgs.len());
    assert!(files_seen > 200, "too few files read: {files_seen}");
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
