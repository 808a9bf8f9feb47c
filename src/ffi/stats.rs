//! `ringfeed_loader_stats`, which fills `ringfeed_stats`: the engine's
//! [`Counts`], declared once in `crate::engine::counters` (the header names
//! it `ringfeed_stats`); the JSON form with the setup notes is
//! `ringfeed_loader_stats_json` in `loader.rs`.

use super::boundary::{boundary, check, invalid, lookup};
use super::status::RINGFEED_OK;
use super::types::ringfeed_loader;
use crate::engine::Counts;

/// Writes a snapshot of the loader's counters to `*out`. Set `out->size`
/// to `sizeof(ringfeed_stats)` first: at most that many bytes are written,
/// and `out->size` is then the bytes written (fewer when the library is
/// older than the header the caller was built with: the fields past it
/// are left as they were).
///
/// # Safety
/// `out` must be NULL or point to `out->size` writable bytes, at least 8.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_stats(
    loader: *mut ringfeed_loader,
    out: *mut Counts,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        // SAFETY: checked non-NULL and aligned; `size` is its first field.
        let size = unsafe { out.cast::<u64>().read() };
        if size < std::mem::size_of::<u64>() as u64 {
            return Err(invalid(format!(
                "`out->size` is {size}: set it to sizeof(ringfeed_stats) before the call"
            )));
        }
        let (_, mut v) = lookup(loader)?.stats()?;
        let n = (size as usize).min(std::mem::size_of::<Counts>());
        v.size = n as u64;
        // SAFETY: the caller says `out` has `size` writable bytes, and `n`
        // is at most that and at most the struct's; they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), out.cast::<u8>(), n);
        }
        Ok(RINGFEED_OK)
    })
}
