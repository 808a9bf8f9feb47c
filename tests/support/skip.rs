//! A test that cannot run here says so, and the suite counts it.
//!
//! Rust's test harness has no runtime skip: a test that returns early passes,
//! and a check that never ran reads as a check that held. So a test that finds
//! what it needs missing (io_uring, O_DIRECT, a second CPU) calls `skip!`,
//! which:
//! - under `RINGFEED_EXPECT_INSTALLED=1` (set by `scripts/test.sh`, whose
//!   machine has everything the suite needs) fails the test, naming what is
//!   missing;
//! - elsewhere appends `SKIPPED <test>: <reason>` to `skipped-tests.txt` in
//!   the target's temporary folder, which `scripts/test.sh` prints at the end,
//!   and lets the caller return (or go on with what it can still check).
//!
//! Tests call it as `skip!(reason)` (`support::skip!` in the root crate's
//! tests, which have this file from the support crate; `crate::skip!` in
//! `cli/tests`, which include it by path). A macro, because the folder is
//! the calling test's `CARGO_TARGET_TMPDIR`, which cargo gives to tests and
//! not to the support crate: `env!` is read where the macro expands.

use std::io::Write;
use std::path::Path;

/// `skip!(reason)`: [`skip_in`] the calling test's `CARGO_TARGET_TMPDIR`.
#[macro_export]
macro_rules! skip {
    ($reason:expr $(,)?) => {
        $crate::skip::skip_in(::std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), $reason)
    };
}

/// Records that the calling test skips (all or part of itself) for `reason`
/// in `tmp`'s `skipped-tests.txt`; panics where the suite expects everything
/// installed.
pub fn skip_in(tmp: &Path, reason: &str) {
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
    let path = tmp.join("skipped-tests.txt");
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
