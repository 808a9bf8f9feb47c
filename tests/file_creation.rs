//! Every place the library (src/) and the CLI (cli/src/) create a file or
//! a directory, found by reading the sources: each must be made safely
//! (anew with `O_EXCL`, or with `O_NOFOLLOW`, and with an explicit mode,
//! so a symbolic link planted at the name by another user is refused, not
//! followed, and nothing private is left readable), or be listed below
//! with the reason it need not be. A new `File::create` in a shared
//! directory fails this test until it is made safely or its reason is
//! written down. Test code (`#[cfg(test)]` items, test files) is not
//! scanned: it runs in directories the tests make.

use std::path::{Path, PathBuf};

/// What starts a creation site. `OpenOptions::new()` and `File::options()`
/// are sites only when their chain asks to create (`.create(` or
/// `.create_new(`).
const SITES: &[&str] = &[
    "File::create(",
    "File::create_new(",
    "File::options()",
    "OpenOptions::new()",
    "fs::write(",
    "fs::copy(",
    "fs::create_dir(",
    "fs::create_dir_all(",
    "DirBuilder::new()",
    "fs::hard_link(",
];

/// Sites that need not be made safely: (file, text of the site's line,
/// reason). Each must match a site (a stale entry fails too).
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "src/cache/private.rs",
        "std::fs::DirBuilder::new()",
        "the cache directory: made 0700, then refused unless this user's alone (`private::check_dir`)",
    ),
    (
        "src/topology/claims.rs",
        "std::fs::DirBuilder::new()",
        "this user's runtime directory: made 0700, then refused unless this user's and written by no other",
    ),
    (
        "src/topology/claims.rs",
        "std::fs::OpenOptions::new()",
        "a CPU claim file inside this user's private runtime directory (0700, checked)",
    ),
    (
        "src/synth.rs",
        "std::fs::create_dir_all(dir)",
        "`ringfeed gen`'s output directory, named by the user",
    ),
    (
        "src/synth.rs",
        "File::create(&path)",
        "a shard `ringfeed gen` writes into the output directory the user named",
    ),
    (
        "src/object/write/local.rs",
        "std::fs::OpenOptions::new()",
        "the temporary of an object the user writes to a local path: made anew (O_EXCL: a link at the name is refused), with the umask's mode, as the object itself",
    ),
    (
        "src/object/write/local.rs",
        "std::fs::hard_link(from, to)",
        "the finished temporary linked to the object's name: link(2) neither follows nor replaces what is there (EEXIST)",
    ),
    (
        "cli/src/csi/state.rs",
        "std::fs::DirBuilder::new()",
        "the CSI driver's state directory, which only the driver (root) writes",
    ),
    (
        "src/mount/write.rs",
        "std::fs::create_dir_all(dir)",
        "a directory a writer made in the mount, under the local root the mounting user chose",
    ),
    (
        "cli/src/cache.rs",
        "std::fs::write(p, &text)",
        "`--output`: a file the user names, written as asked",
    ),
    (
        "cli/src/inspect.rs",
        "std::fs::write(p, &text)",
        "`--output`: a file the user names, written as asked",
    ),
    (
        "cli/src/get.rs",
        "std::fs::create_dir_all(p)",
        "`ringfeed get`'s destination directory, named by the user",
    ),
    (
        "cli/src/mount/mod.rs",
        "std::fs::write(&file, format!(\"{kb}\\n\"))",
        "a kernel setting (/sys/class/bdi/.../read_ahead_kb), not a file made",
    ),
    (
        "cli/src/csi/state.rs",
        "std::fs::File::create(&tmp)",
        "a record in the CSI driver's state directory, which only the driver (root) writes",
    ),
    (
        "cli/src/csi/mounts.rs",
        "std::fs::create_dir(&plan.target)",
        "the volume's target path, which kubelet names and makes the parent of",
    ),
    (
        "cli/src/csi/mounts.rs",
        "std::fs::OpenOptions::new()",
        "a mount's log in the CSI driver's state directory (root's), 0600",
    ),
    (
        "cli/src/csi/mod.rs",
        "std::fs::create_dir_all(dir)",
        "the directory of the socket kubelet names (`--endpoint`)",
    ),
];

/// One creation site: the file, its line (1-based), the line's text and
/// the method chain it starts.
#[derive(Debug)]
struct Site {
    file: String,
    line: usize,
    text: String,
    chain: String,
}

/// The lines of `src` that are not test code: every `#[cfg(test)]` item
/// (a `mod tests { ... }`, a function, a `use`) blanked.
fn without_tests(src: &str) -> Vec<String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        // The item: past further attributes, to its `;` or its closing
        // brace.
        let mut j = i + 1;
        while j < lines.len() && lines[j].trim_start().starts_with("#[") {
            j += 1;
        }
        let mut depth = 0i64;
        let mut opened = false;
        let mut k = j;
        while k < lines.len() {
            for c in lines[k].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && lines[k].trim_end().ends_with(';')) {
                break;
            }
            k += 1;
        }
        for l in out.iter_mut().take(k.min(lines.len() - 1) + 1).skip(i) {
            l.clear();
        }
        i = k + 1;
    }
    out
}

/// The creation sites of one file's source.
fn sites_in(file: &str, src: &str) -> Vec<Site> {
    let lines = without_tests(src);
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let code = l.split("//").next().unwrap_or("");
        let Some(site) = SITES.iter().find(|s| code.contains(*s)) else {
            continue;
        };
        // The site's line and the method calls chained to it (the lines
        // after it that start with `.`).
        let mut chain = format!("{l}\n");
        for next in lines.iter().skip(i + 1).take(20) {
            if !next.trim_start().starts_with('.') {
                break;
            }
            chain.push_str(next);
            chain.push('\n');
        }
        let creates = chain.contains(".create(") || chain.contains(".create_new(");
        if (site.contains("OpenOptions") || site.contains("options()")) && !creates {
            continue;
        }
        out.push(Site {
            file: file.to_string(),
            line: i + 1,
            text: l.trim().to_string(),
            chain,
        });
    }
    out
}

/// Made safely: refuses a link at the name (`O_EXCL` or `O_NOFOLLOW`)
/// and sets its mode.
fn made_safely(s: &Site) -> bool {
    (s.chain.contains("create_new(true)") || s.chain.contains("O_NOFOLLOW"))
        && s.chain.contains(".mode(")
}

/// The sites neither made safely nor allowed, and the allow-list's
/// entries that match no site.
fn judge(sites: &[Site], allowed: &[(&str, &str, &str)]) -> (Vec<String>, Vec<String>) {
    let mut used = vec![0usize; allowed.len()];
    let mut bad = Vec::new();
    for s in sites {
        if made_safely(s) {
            continue;
        }
        let hit = allowed
            .iter()
            .position(|(f, needle, _)| *f == s.file && s.text.contains(needle));
        match hit {
            Some(k) => used[k] += 1,
            None => bad.push(format!("{}:{}: {}", s.file, s.line, s.text)),
        }
    }
    let stale = allowed
        .iter()
        .zip(&used)
        .filter(|(_, n)| **n == 0)
        .map(|((f, needle, _), _)| format!("{f}: {needle}"))
        .collect();
    (bad, stale)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether a whole file is test code (`tests.rs`, `*_tests.rs`, `tests_*.rs`).
fn test_file(p: &Path) -> bool {
    let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    name == "tests" || name.ends_with("_tests") || name.starts_with("tests_")
}

#[test]
fn every_file_the_project_creates_is_made_safely_or_listed_with_its_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("cli/src"), &mut files);
    let mut sites = Vec::new();
    for f in files.iter().filter(|f| !test_file(f)) {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        sites.extend(sites_in(&rel, &std::fs::read_to_string(f).unwrap()));
    }
    let (bad, stale) = judge(&sites, ALLOWED);
    assert!(
        bad.is_empty(),
        "files created neither safely (O_EXCL or O_NOFOLLOW, and a mode) nor listed with a \
         reason in tests/file_creation.rs:\n{}",
        bad.join("\n")
    );
    assert!(
        stale.is_empty(),
        "allowed sites no longer found:\n{}",
        stale.join("\n")
    );
    // The daemon's log is among the sites made safely.
    let log = sites
        .iter()
        .find(|s| s.file == "cli/src/mount/mod.rs" && s.text.contains("OpenOptions::new()"))
        .expect("the mount daemon's log is opened with OpenOptions");
    assert!(made_safely(log), "{log:?}");
}

#[test]
fn the_scan_finds_a_plain_create_and_passes_over_test_code() {
    // Control: an unlisted `File::create` is reported; the same in a test
    // module, or made with O_EXCL and a mode, is not; a creating
    // OpenOptions chain without O_NOFOLLOW is; a stale entry is named.
    let src = r#"
fn log(p: &Path) -> File {
    std::fs::File::create(p).unwrap()
}
fn good(p: &Path) -> File {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .unwrap()
}
fn weak(p: &Path) -> File {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .open(p)
        .unwrap()
}
fn reads(p: &Path) -> File {
    std::fs::OpenOptions::new().read(true).open(p).unwrap()
}
#[cfg(test)]
mod tests {
    fn t() {
        std::fs::write("x", b"y").unwrap();
    }
}
"#;
    let sites = sites_in("src/x.rs", src);
    assert_eq!(
        sites.iter().map(|s| s.line).collect::<Vec<_>>(),
        vec![3, 6, 14],
        "{sites:?}"
    );
    let (bad, stale) = judge(&sites, &[("src/y.rs", "File::create", "elsewhere")]);
    assert_eq!(
        bad,
        vec![
            "src/x.rs:3: std::fs::File::create(p).unwrap()",
            "src/x.rs:14: std::fs::OpenOptions::new()"
        ]
    );
    assert_eq!(stale, vec!["src/y.rs: File::create"]);
    let (bad, stale) = judge(&sites, &[("src/x.rs", "File::create(p)", "a reason")]);
    assert_eq!(bad, vec!["src/x.rs:14: std::fs::OpenOptions::new()"]);
    assert!(stale.is_empty());
}
