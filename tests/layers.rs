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
    ("error", 0),
    ("queue", 0),
    ("topology", 0),
    ("net", 1),
    ("plan", 1),
    ("tar", 1),
    ("memory", 1),
    ("serve", 1),
    ("config", 2),
    ("synth", 2),
    ("fetch", 3),
    ("dataset", 4),
    ("engine", 5),
    ("ffi", 6),
];

/// The engine's files, in the order of its module doc's chain.
const ENGINE: &[(&str, u32)] = &[
    ("counters", 0),
    ("shared", 1),
    ("shuffler", 2),
    ("assemble", 3),
    ("worker", 4),
    ("sequencer", 5),
    ("threads", 6),
    ("loader", 7),
    ("open", 8),
    ("stats", 8),
    ("script", 8),
    ("tests", 9),
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

/// The `crate::a::b` paths a file names in code (comments left out).
fn crate_paths(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let ident = |s: &str| -> String {
                s.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            };
            let first = ident(after);
            let second = after[first.len()..]
                .strip_prefix("::")
                .map(ident)
                .unwrap_or_default();
            found.push((first, second));
            rest = &after[1..];
        }
    }
    found
}

#[test]
fn no_file_imports_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let engine: BTreeMap<&str, u32> = ENGINE.iter().copied().collect();
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
        for (to, sub) in crate_paths(&text) {
            if to == part {
                // Inside the engine, file by file.
                if let Some(from) = &file_in_engine
                    && from != "mod"
                {
                    let (Some(&a), Some(&b)) =
                        (engine.get(from.as_str()), engine.get(sub.as_str()))
                    else {
                        wrong.push(format!(
                            "{}: names `crate::engine::{sub}`: engine files name each other by file",
                            rel.display()
                        ));
                        continue;
                    };
                    if b >= a && from != &sub {
                        wrong.push(format!(
                            "{}: imports engine/{sub}.rs, which comes after it in the chain",
                            rel.display()
                        ));
                    }
                }
                continue;
            }
            match ranks.get(to.as_str()) {
                Some(&r) if r < rank => {}
                Some(_) => wrong.push(format!(
                    "{}: `{part}` imports `{to}`, which is not below it",
                    rel.display()
                )),
                // Crate-root re-exports (`crate::Config`) name a part through lib.rs.
                None if to.chars().next().is_some_and(|c| c.is_ascii_uppercase()) => {}
                None => wrong.push(format!("{}: unknown part `crate::{to}`", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}
