//! `include/ringfeed.h` is generated and committed; this test fails when the
//! committed header differs from a fresh generation.
//! `RINGFEED_BLESS=1 cargo test --test header` rewrites it.
//!
//! cbindgen reads the C ABI's module tree from `src/ffi/mod.rs` (following
//! its `mod` lines), the batch views of `src/memory/batch.rs` and the
//! counters of `src/engine/counters.rs` (`Counts`, named `ringfeed_stats`). The status
//! codes are made by a macro from one table, which cbindgen cannot see, so
//! their `#define`s are written here from that table
//! (`ringfeed::ffi::status::STATUSES`) and placed right after the includes.

use std::fmt::Write as _;
use std::path::Path;

use ringfeed::ffi::status::STATUSES;

/// The status codes as the header declares them: each doc comment in the
/// header's comment style, then its `#define`, a blank line between two.
fn status_defines() -> String {
    let mut out = String::new();
    for s in STATUSES {
        out.push('\n');
        for line in s.doc.lines() {
            writeln!(out, "//{}", line.trim_end()).unwrap();
        }
        let name = s.name.to_str().expect("status names are ASCII");
        writeln!(out, "#define {name} {}", s.code).unwrap();
    }
    out.pop(); // cbindgen ends the block with its own newline
    out
}

/// The version of the library the header comes with, as macros: a program
/// compares them with `ringfeed_version()` at run time.
fn version_defines() -> String {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split(['.', '-']);
    let mut part = || parts.next().expect("a semantic version");
    format!(
        "\n// The version of the library this header comes with; `ringfeed_version()`\n\
         // gives the loaded library's.\n\
         #define RINGFEED_VERSION_MAJOR {}\n\
         #define RINGFEED_VERSION_MINOR {}\n\
         #define RINGFEED_VERSION_PATCH {}\n\
         #define RINGFEED_VERSION_STRING \"{v}\"",
        part(),
        part(),
        part()
    )
}

#[test]
fn committed_header_matches_a_fresh_generation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(version_defines() + "\n" + &status_defines());
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .with_src(root.join("src/memory/batch.rs"))
        .with_src(root.join("src/engine/counters.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut fresh);
    let path = root.join("include/ringfeed.h");
    if std::env::var_os("RINGFEED_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/ringfeed.h");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/ringfeed.h is stale: run `RINGFEED_BLESS=1 cargo test --test header` and commit it"
    );
}
