//! `cargo` as a test runs it to build what it needs beside itself (an
//! example, the library's cdylib): the compiler beside this cargo, by path,
//! and none of the variables cargo set for the test's own run. Used by the
//! root crate's tests (`support::cargo`) and by the CLI's (by `#[path]`).

use std::path::Path;
use std::process::Command;

/// `cargo` (the one that built this test), ready for a subcommand.
///
/// - `RUSTC` is the compiler beside it, by path: the rustup proxy a bare
///   `rustc` runs picks its toolchain from the directory it runs in, and a
///   dependency that ships a rust-toolchain.toml of its own (cbindgen 0.29
///   names nightly) would be built by another compiler than the artifacts
///   it links against ("compiled by an incompatible version of rustc").
/// - Not the variables cargo set for this test's run (its package's
///   directory, name, version): build scripts that read them (ring's) would
///   see them changed from the test command's build and compile again,
///   with everything above them ("the env variable CARGO_MANIFEST_DIR
///   changed").
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    let rustc = Path::new(env!("CARGO")).with_file_name("rustc");
    if rustc.is_file() {
        cmd.env("RUSTC", rustc);
    }
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
            "CARGO_PRIMARY_",
            "CARGO_TARGET_TMPDIR",
        ]
        .iter()
        .any(|p| key.starts_with(p))
        {
            cmd.env_remove(key);
        }
    }
    cmd
}
