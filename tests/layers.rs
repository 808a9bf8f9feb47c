//! The layering of `src/`, checked: every folder (or top-level file) of the
//! library has a rank, and a file may only name (`crate::x`) what ranks
//! below its own folder, so the folders cannot import each other in a
//! circle and lower layers never reach up. Inside `src/engine/` the same
//! rule holds file by file, along the chain its module doc gives. And no
//! two files anywhere import each other in a circle (a folder's `mod.rs`
//! aside). `docs/architecture.md` draws the same table.

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
    ("consumer", 8),
    ("ffi", 9),
    // Re-exports for the fuzz targets (docs/fuzzing.md); nothing imports it.
    ("fuzzing", 10),
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
    ("start_plan", 10),
    ("open", 11),
    ("tests", 12),
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
        // An engine file by its name: `engine/x.rs`, or `x` for the files
        // of its own folder (`engine/tests/mod.rs`, `engine/tests/cuda.rs`).
        let file_in_engine = (part == "engine").then(|| {
            let name = rel.iter().nth(1).unwrap().to_str().unwrap();
            name.trim_end_matches(".rs").to_string()
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

/// A line's code with char literals of braces blanked too (`b'{'`), so
/// braces count blocks.
fn block_code(line: &str) -> String {
    code_of(line).replace("'{'", "   ").replace("'}'", "   ")
}

/// The module path of a file under `src/`: `a/b.rs` is `[a, b]`,
/// `a/mod.rs` and `a.rs` are `[a]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut m: Vec<String> = rel
        .iter()
        .map(|p| p.to_str().unwrap().trim_end_matches(".rs").to_string())
        .collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// The module paths a file names in code (`crate::a::b`, `super::c`,
/// `self::d`, one level of `{a, b::c}` groups), resolved against the
/// module the code is in: the file's, or an inline `mod x { ... }` of it.
fn named_modules(text: &str, file: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // Brace depths at which inline modules opened.
    let mut inline: Vec<i64> = Vec::new();
    let mut depth: i64 = 0;
    for line in text.lines() {
        let code = block_code(line);
        let mut here: Vec<String> = file.to_vec();
        here.extend(inline.iter().map(|_| "<inline>".to_string()));
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let boundary = i == 0 || {
                let c = bytes[i - 1] as char;
                !(c.is_ascii_alphanumeric() || c == '_' || c == ':')
            };
            let start = ["crate::", "super::", "self::"]
                .into_iter()
                .find(|p| boundary && rest.starts_with(p));
            let Some(start) = start else {
                i += rest.chars().next().unwrap().len_utf8();
                continue;
            };
            // The base module, then the named segments.
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let mut after = &rest[start.len()..];
            while let Some(r) = after.strip_prefix("super::") {
                base.pop();
                after = r;
            }
            let mut segs = Vec::new();
            loop {
                let id = ident(after);
                if id.is_empty() {
                    break;
                }
                after = &after[id.len()..];
                segs.push(id);
                match after.strip_prefix("::") {
                    Some(r) => after = r,
                    None => break,
                }
            }
            if let Some(group) = after.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                for entry in group.split(',') {
                    let mut full = base.clone();
                    full.extend(segs.iter().cloned());
                    full.extend(
                        entry
                            .trim()
                            .split("::")
                            .map(ident)
                            .filter(|s| !s.is_empty()),
                    );
                    out.push(full);
                }
            } else {
                let mut full = base;
                full.extend(segs);
                out.push(full);
            }
            i = code.len() - after.len();
        }
        let t = code.trim_start();
        let opens_mod = t.strip_prefix("pub ").unwrap_or(t).starts_with("mod ") && t.ends_with('{');
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
        if opens_mod {
            inline.push(depth - 1);
        }
    }
    out
}

/// The circles among `files` (name, module path, text): each reported
/// once, by the set of its files and one way round it.
fn circles(files: &[(String, Vec<String>, String)]) -> Vec<String> {
    let by_module: BTreeMap<&Vec<String>, &String> = files.iter().map(|(n, m, _)| (m, n)).collect();
    let mut edges: BTreeMap<&String, std::collections::BTreeSet<&String>> = BTreeMap::new();
    for (name, module, text) in files {
        let out = edges.entry(name).or_default();
        for mut path in named_modules(text, module) {
            // The longest prefix of the path that is a file: what it names.
            path.retain(|s| s != "<inline>");
            while !path.is_empty() {
                if let Some(&target) = by_module.get(&path) {
                    if target != name {
                        out.insert(target);
                    }
                    break;
                }
                path.pop();
            }
        }
    }
    let mut by_set = BTreeMap::new();
    for &start in edges.keys() {
        let mut stack = vec![(start, vec![start.clone()])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for &next in &edges[at] {
                if next == start {
                    let mut set = trail.clone();
                    set.sort();
                    by_set
                        .entry(set.join(" ↔ "))
                        .or_insert_with(|| trail.join(" → "));
                } else if seen.insert(next) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next, t));
                }
            }
        }
    }
    by_set
        .into_iter()
        .map(|(set, way)| format!("{set} (from {way})"))
        .collect()
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rs_files(&root, &mut paths);
    paths.sort();
    // A folder's mod.rs stands for its interface and declares its files: it
    // is left out, as is lib.rs.
    let files: Vec<_> = paths
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap())
        .filter(|rel| rel.file_name().unwrap() != "mod.rs" && rel.to_str() != Some("lib.rs"))
        .map(|rel| {
            let text = std::fs::read_to_string(root.join(rel)).unwrap();
            (rel.display().to_string(), module_of(rel), text)
        })
        .collect();
    assert!(files.len() > 100, "the files of src/ were not found");
    let found = circles(&files);
    assert!(
        found.is_empty(),
        "files that import each other in a circle (move what both need into a file of its own):\n{}",
        found.join("\n")
    );
}

/// The control: circles the check must find, and imports it must not take
/// for one.
#[test]
fn the_circle_check_finds_circles_and_only_those() {
    let file = |name: &str, text: &str| {
        let rel = Path::new(name);
        (name.to_string(), module_of(rel), text.to_string())
    };
    // Two files, each naming the other: by `super::` and by `crate::`.
    let pair = [
        file("p/a.rs", "use super::b::X;\npub struct Y;"),
        file(
            "p/b.rs",
            "pub struct X;\nfn f() -> crate::p::a::Y { todo!() }",
        ),
    ];
    assert_eq!(circles(&pair), ["p/a.rs ↔ p/b.rs (from p/a.rs → p/b.rs)"]);
    // Three, through a group, and one across folders.
    let three = [
        file("p/a.rs", "use super::{b::X, c};"),
        file("p/b.rs", "use crate::q::d::Z;"),
        file("q/d.rs", "use crate::p::a;"),
        file("p/c.rs", ""),
    ];
    assert_eq!(circles(&three).len(), 1, "{:?}", circles(&three));
    // Not circles: a test module's `super::` is its own file; a string or a
    // comment names nothing; one way only.
    let none = [
        file(
            "p/a.rs",
            "use super::b::X;\n#[cfg(test)]\nmod tests {\n    use super::b;\n}",
        ),
        file(
            "p/b.rs",
            "// super::a::Y\nconst S: &str = \"crate::p::a\";\nmod tests {\n    use super::*;\n}",
        ),
    ];
    assert!(circles(&none).is_empty(), "{:?}", circles(&none));
}

/// The parts every part may use, which docs/architecture.md's "uses"
/// column leaves out: the error type, the log, the lock helper and the
/// redaction of URLs.
const BASE: &[&str] = &["error", "log", "sync", "redact"];

/// Each part of `src/` and the parts its files name (`crate::x`, or a
/// name `lib.rs` re-exports from `x`), its unit tests included.
fn imports_by_part(root: &Path) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let exports = root_exports(root);
    let mut files = Vec::new();
    rs_files(root, &mut files);
    let mut by_part: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap();
        let part = rel.iter().next().unwrap().to_str().unwrap();
        let part = part.trim_end_matches(".rs").to_string();
        if part == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let named = by_part.entry(part.clone()).or_default();
        for (to, _) in paths(&text, "crate::") {
            let to = exports.get(&to).cloned().unwrap_or(to);
            if to != part {
                named.insert(to);
            }
        }
    }
    by_part
}

/// docs/architecture.md's table of parts: (rank, part, uses) of each row
/// that names a part of `src/`; `uses` as written, `—` read as none.
fn table_rows(doc: &str) -> Vec<(u32, String, Vec<String>)> {
    let mut rows = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 6 || !cells[0].is_empty() {
            continue;
        }
        let (Ok(rank), Some(path)) = (
            cells[1].parse::<u32>(),
            cells[2].trim_matches('`').strip_prefix("src/"),
        ) else {
            continue;
        };
        let part = path
            .trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_string();
        let uses = match cells[4] {
            "—" => Vec::new(),
            list => list.split(',').map(|u| u.trim().to_string()).collect(),
        };
        rows.push((rank, part, uses));
    }
    rows
}

/// What the table's `rows` say wrong against the parts' `imports`: a
/// rank other than RANKS', a use the code lacks, a use (beyond [`BASE`])
/// the row lacks, a ranked part without a row.
fn stale(
    rows: &[(u32, String, Vec<String>)],
    imports: &BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<String> {
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (rank, part, uses) in rows {
        if ranks.get(part.as_str()) != Some(rank) {
            wrong.push(format!(
                "`{part}`: rank {rank} in the doc, {:?} in RANKS",
                ranks.get(part.as_str())
            ));
        }
        let actual = imports.get(part).cloned().unwrap_or_default();
        for u in uses {
            if !actual.contains(u) {
                wrong.push(format!("`{part}`: the doc says it uses `{u}`; it does not"));
            }
        }
        for a in actual.iter().filter(|a| !BASE.contains(&a.as_str())) {
            if !uses.contains(a) {
                wrong.push(format!("`{part}`: uses `{a}`, which the doc does not say"));
            }
        }
    }
    // Every ranked part has its row (the fuzzing re-exports aside).
    for (part, _) in RANKS.iter().filter(|(p, _)| *p != "fuzzing") {
        if !rows.iter().any(|(_, p, _)| p == part) {
            wrong.push(format!(
                "`{part}` has no row in docs/architecture.md's table"
            ));
        }
    }
    wrong
}

#[test]
fn the_architecture_table_says_each_part_s_rank_and_what_it_uses() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(here.join("docs/architecture.md")).unwrap();
    let wrong = stale(&table_rows(&doc), &imports_by_part(&here.join("src")));
    assert!(
        wrong.is_empty(),
        "docs/architecture.md's table is stale:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_table_check_reads_rows_and_finds_a_stale_one() {
    // Control: a row whose uses are wrong is read as written, and named.
    let doc = "| rank | part | what | uses |\n| --- | --- | --- | --- |\n\
               | 2 | `src/memory/` | the arena | error, net |\n\
               | 0 | `src/sync.rs` | locks | — |\n| — | `cli/` | the command | the library |\n";
    let rows = table_rows(doc);
    assert_eq!(
        rows,
        vec![
            (
                2,
                "memory".to_string(),
                vec!["error".to_string(), "net".to_string()]
            ),
            (0, "sync".to_string(), vec![]),
        ]
    );
    let imports = imports_by_part(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let wrong = stale(&rows, &imports);
    assert!(
        wrong.contains(&"`memory`: the doc says it uses `net`; it does not".to_string()),
        "{wrong:?}"
    );
    // The parts without a row are named too; memory's and sync's are not.
    assert!(wrong.contains(&"`engine` has no row in docs/architecture.md's table".to_string()));
    assert!(!wrong.iter().any(|w| w.starts_with("`sync`")), "{wrong:?}");
}
