//! `ringfeed_loader_stats`, which fills `ringfeed_stats`: the engine's
//! [`Counts`], declared once in `crate::engine::counters` (the header names
//! it `ringfeed_stats`); the JSON form with the setup notes is
//! `ringfeed_loader_stats_json` in `loader.rs`.

use super::boundary::{boundary, check, lookup};
use super::status::RINGFEED_OK;
use super::types::ringfeed_loader;
use crate::engine::Counts;

/// Writes a snapshot of the loader's counters to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `ringfeed_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_stats(
    loader: *mut ringfeed_loader,
    out: *mut Counts,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        let (_, v) = lookup(loader)?.stats()?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(v) };
        Ok(RINGFEED_OK)
    })
}
