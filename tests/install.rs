//! The install: `scripts/install.sh --prefix` into a temporary prefix, then
//! programs built against the installed files only.
//!
//! - The layout: the versioned library with its `.so.<MAJOR>` and `.so`
//!   links, the SONAME `readelf -d` shows, the static library, both
//!   headers, the CLI.
//! - A C program built with `pkg-config --cflags --libs ringfeed` records
//!   the SONAME and runs against the installed library.
//! - The C++ example of `examples/cmake/`, configured with CMake
//!   (`find_package(ringfeed CONFIG REQUIRED)`, the imported target
//!   `ringfeed::ringfeed`), streams generated shards and counts every sample
//!   and byte.
//!
//! The script runs `cargo build --release`; scripts/test.sh builds the
//! release before the tests, so there it only copies. Needs cmake,
//! pkg-config, readelf and a C and a C++ compiler: a missing one fails the
//! test, it is never skipped (scripts/test.sh installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

use ringfeed::synth::{self, GenOptions};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const MAJOR: &str = env!("CARGO_PKG_VERSION_MAJOR");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd` and returns its standard output; a tool that cannot be
/// started or that fails fails the test with its output.
fn run_ok(mut cmd: Command) -> String {
    // cargo's LD_LIBRARY_PATH names its own copies of the library: the
    // programs here must find the installed one.
    cmd.env_remove("LD_LIBRARY_PATH");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run `{program}` ({e}); scripts/test.sh installs what these tests need")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh install under a temporary prefix.
fn install() -> tempfile::TempDir {
    let prefix = tempfile::tempdir().expect("create a temporary prefix");
    let mut cmd = Command::new(root().join("scripts/install.sh"));
    cmd.arg("--prefix").arg(prefix.path());
    // The script runs as from a shell, without what cargo sets for this
    // test: ring's build script reruns when CARGO_MANIFEST_DIR changes, so
    // with it the script's release build would rebuild ring and all above
    // it, and the next plain `cargo build --release` all of it again.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || matches!(
                &*key,
                "CARGO_MANIFEST_DIR" | "CARGO_MANIFEST_PATH" | "CARGO_CRATE_NAME" | "OUT_DIR"
            )
        {
            cmd.env_remove(&*key);
        }
    }
    run_ok(cmd);
    prefix
}

/// `readelf -d` of `file`.
fn dynamic_section(file: &Path) -> String {
    let mut cmd = Command::new("readelf");
    cmd.arg("-d").arg(file);
    run_ok(cmd)
}

#[test]
fn the_install_has_every_file_and_a_pkg_config_program_runs() {
    let prefix = install();
    let p = prefix.path();
    let lib = p.join("lib");
    let soname = format!("libringfeed.so.{MAJOR}");
    let real = format!("libringfeed.so.{VERSION}");
    let link = |name: &str| std::fs::read_link(lib.join(name)).expect("a symbolic link");
    assert_eq!(link(&soname), PathBuf::from(&real));
    assert_eq!(link("libringfeed.so"), PathBuf::from(&soname));
    let dynamic = dynamic_section(&lib.join(&real));
    assert!(
        dynamic.contains(&format!("Library soname: [{soname}]")),
        "{real} has no SONAME {soname}:\n{dynamic}"
    );
    for file in [
        "lib/libringfeed.a",
        "include/ringfeed.h",
        "include/ringfeed.hpp",
        "lib/pkgconfig/ringfeed.pc",
        "lib/cmake/ringfeed/ringfeedConfig.cmake",
        "lib/cmake/ringfeed/ringfeedConfigVersion.cmake",
    ] {
        assert!(p.join(file).is_file(), "{file} is not installed");
    }
    let mut cli = Command::new(p.join("bin/ringfeed"));
    cli.arg("--version");
    assert!(run_ok(cli).contains(VERSION));

    let pkg_config = |args: &[&str]| {
        let mut pc = Command::new("pkg-config");
        pc.args(args)
            .arg("ringfeed")
            .env("PKG_CONFIG_PATH", lib.join("pkgconfig"));
        run_ok(pc)
    };
    assert_eq!(pkg_config(&["--modversion"]).trim(), VERSION);
    let flags = pkg_config(&["--cflags", "--libs"]);

    let src = p.join("version.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <ringfeed.h>\n\
         int main(void) { printf(\"%s\\n\", ringfeed_version()); return 0; }\n",
    )
    .expect("write the C program");
    let exe = p.join("version");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", lib.display()));
    run_ok(cc);
    assert_eq!(run_ok(Command::new(&exe)).trim(), VERSION);
    let dynamic = dynamic_section(&exe);
    assert!(
        dynamic.contains(&format!("Shared library: [{soname}]")),
        "the program does not need {soname}:\n{dynamic}"
    );
}

#[test]
fn the_cmake_example_streams_every_sample_against_the_install() {
    let prefix = install();
    let shards = tempfile::tempdir().expect("create a temporary directory");
    let opts = GenOptions {
        shards: 2,
        shard_bytes: 1 << 20,
        sample_bytes: 10_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed: 3,
    };
    let report = synth::generate(shards.path(), &opts, |_| {}).expect("generate test shards");

    let build = prefix.path().join("build");
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(root().join("examples/cmake"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.path().display()));
    run_ok(configure);
    let mut make = Command::new("cmake");
    make.arg("--build").arg(&build);
    run_ok(make);

    let exe = build.join("count_samples");
    let dynamic = dynamic_section(&exe);
    assert!(
        dynamic.contains(&format!("Shared library: [libringfeed.so.{MAJOR}]")),
        "count_samples does not need the SONAME:\n{dynamic}"
    );
    let mut count = Command::new(&exe);
    count.args(&report.paths);
    let out = run_ok(count);
    let expected = format!(
        "ringfeed {VERSION}: samples={} bytes={} ",
        report.samples, report.payload_bytes
    );
    assert!(
        out.starts_with(&expected),
        "expected `{expected}...`, got `{out}`"
    );
}
