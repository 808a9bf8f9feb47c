//! The layering of `src/`, checked: every folder (or top-level file) of the
//! library has a rank, and a file may only name (`crate::x`) what ranks
//! below its own folder, so the folders cannot import each other in a
//! circle and lower layers never reach up. Inside `src/engine/` the same
//! rule holds file by file, along the chain its module doc gives.
//! `docs/architecture.md` draws the same table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Rank of each part of the library: what a part may import ranks lower.
const RANKS: &[(&str, u32)] = &[
    ("redact", 0),
    ("sync", 0),
    ("error", 1),
    ("log", 1),
    ("queue", 1),
    ("topology", 1),
    ("net", 2),
    ("cache", 2),
    ("plan", 2),
    ("tar", 2),
    ("image", 2),
    ("memory", 2),
    ("serve", 2),
    ("config", 3),
    ("synth", 3),
    ("fetch", 4),
    ("dataset", 5),
    ("engine", 6),
    ("object", 6),
    ("node", 7),
    ("mount", 7),
    ("ffi", 8),
    // Re-exports for the fuzz targets (docs/fuzzing.md); nothing imports it.
    ("fuzzing", 9),
];

/// The engine's files, in the order of its module doc's chain.
const ENGINE: &[(&str, u32)] = &[
    ("counters", 0),
    ("transform", 0),
    ("shared", 1),
    ("shuffler", 2),
    ("assemble", 3),
    ("tier", 3),
    ("reading", 4),
    ("worker", 5),
    ("sequencer", 6),
    ("threads", 7),
    ("loader", 8),
    ("setup", 9),
    ("planning", 9),
    ("stats", 9),
    ("script", 9),
    ("open", 10),
    ("tests", 11),
    ("tests_cuda", 12),
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A line's code: string and char literals blanked, comments cut.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                _ => {}
            }
            out.push(' ');
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push(' ');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The `prefix a::b` paths a file names in code, as (a, b).
fn paths(text: &str, prefix: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = code_of(line);
        let mut rest = code.as_str();
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            let after = &rest[i + prefix.len()..];
            rest = after;
            // `super::` inside `super::super::` or a longer name is not ours.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let first = ident(after);
            let second = after[first.len()..]
                .strip_prefix("::")
                .map(ident)
                .unwrap_or_default();
            found.push((first, second));
        }
    }
    found
}

/// The names `src/lib.rs` re-exports at the crate root, by the part they
/// come from (`crate::Config` is `config`'s).
fn root_exports(root: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (part, items) = rest.split_once("::").unwrap();
        for item in items
            .trim_end_matches(';')
            .trim_matches(['{', '}'])
            .split(',')
        {
            names.insert(item.trim().to_string(), part.to_string());
        }
    }
    names
}

#[test]
fn no_file_imports_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let engine: BTreeMap<&str, u32> = ENGINE.iter().copied().collect();
    let exports = root_exports(&root);
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let mut parts = rel.iter().map(|p| p.to_str().unwrap());
        let first = parts.next().unwrap();
        let part = first.trim_end_matches(".rs");
        if part == "lib" {
            continue;
        }
        let Some(&rank) = ranks.get(part) else {
            wrong.push(format!("{}: `{part}` has no rank in RANKS", rel.display()));
            continue;
        };
        let file_in_engine = (part == "engine").then(|| {
            let stem = rel.file_stem().unwrap().to_str().unwrap();
            stem.to_string()
        });
        let text = std::fs::read_to_string(f).unwrap();
        // Inside the engine, file by file: `super::x` and `crate::engine::x`
        // name engine files, which must come before this one.
        if let Some(from) = file_in_engine.as_deref().filter(|f| *f != "mod") {
            let a = engine[from];
            let named = paths(&text, "super::").into_iter().map(|(x, _)| x).chain(
                paths(&text, "crate::")
                    .into_iter()
                    .filter(|(to, _)| to == "engine")
                    .map(|(_, x)| x),
            );
            for x in named {
                match engine.get(x.as_str()) {
                    Some(&b) if b < a || x == from => {}
                    Some(_) => wrong.push(format!(
                        "{}: imports engine/{x}.rs, which comes after it in the chain",
                        rel.display()
                    )),
                    // `super::*` and items of an inline module's parent.
                    None if x.is_empty() || x.starts_with(|c: char| c.is_ascii_uppercase()) => {}
                    None if from == "tests" || from == "script" => {}
                    None => wrong.push(format!(
                        "{}: names `engine::{x}`: engine files name each other by file",
                        rel.display()
                    )),
                }
            }
        }
        for (to, _) in paths(&text, "crate::") {
            let to = exports.get(&to).cloned().unwrap_or(to);
            if to == part {
                continue;
            }
            match ranks.get(to.as_str()) {
                Some(&r) if r < rank => {}
                Some(_) => wrong.push(format!(
                    "{}: `{part}` imports `{to}`, which is not below it",
                    rel.display()
                )),
                None => wrong.push(format!("{}: unknown part `crate::{to}`", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}
