//! A test that cannot run here says so, and the suite counts it.
//!
//! Rust's test harness has no runtime skip: a test that returns early passes,
//! and a check that never ran reads as a check that held. So a test that finds
//! what it needs missing (io_uring, O_DIRECT, a second CPU) calls `skip`,
//! which:
//! - under `RINGFEED_EXPECT_INSTALLED=1` (set by `scripts/test.sh`, whose
//!   machine has everything the suite needs) fails the test, naming what is
//!   missing;
//! - elsewhere appends `SKIPPED <test>: <reason>` to `skipped-tests.txt` in
//!   the target's temporary folder, which `scripts/test.sh` prints at the end,
//!   and lets the caller return (or go on with what it can still check).
//!
//! `cli/tests` includes this file by path; the root crate's tests have it
//! from the support crate (tests/support/Cargo.toml).

use std::io::Write;

/// Records that the calling test skips (all or part of itself) for `reason`;
/// panics where the suite expects everything installed.
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    if std::env::var_os("RINGFEED_EXPECT_INSTALLED").is_some_and(|v| v == "1") {
        panic!(
            "{test} would skip here ({reason}), but RINGFEED_EXPECT_INSTALLED=1 says this \
             machine has everything the suite needs: what it checks did not run"
        );
    }
    let line = format!("SKIPPED {test}: {reason}\n");
    eprint!("{line}");
    let path = target_tmp().join("skipped-tests.txt");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = appended {
        panic!(
            "{test} skips ({reason}) and cannot record it in {}: {e}",
            path.display()
        );
    }
}

/// The target's temporary folder (`target/tmp`): cargo's
/// `CARGO_TARGET_TMPDIR` where this file is compiled into a test, else
/// under the target folder above the running test binary
/// (`target/<profile>/deps/NAME-HASH`), where cargo puts it.
pub fn target_tmp() -> std::path::PathBuf {
    if let Some(dir) = option_env!("CARGO_TARGET_TMPDIR") {
        return dir.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .unwrap_or_else(|| panic!("no target folder above {}", exe.display()));
    target.join("tmp")
}
