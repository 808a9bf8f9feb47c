//! The plan asked ahead: what one consumer's epoch holds (how it is split,
//! its samples and batches), worked out without opening a loader.

use std::ffi::{CStr, c_char};

use super::boundary::{boundary, check, invalid, write_text};
use crate::config::Config;

/// Writes into `buf`, NUL-terminated, what the consumer that
/// `config_json` describes gets in the epoch `"epoch"` names, as JSON:
/// `{"split": "samples" | "shards" | "none", "consumers": C, "samples": N
/// or null, "batches": B or null, "shards": S, "nominal": text or null}`.
/// `"shards"` is a nominal epoch (no sample counts known: the shards split
/// whole, every consumer the same `batches`). It resolves the dataset as
/// `ringfeed_loader_open` does (listing, `HEAD`s, the shards' first bytes
/// when it must estimate) and reads no more. Sizes as
/// `ringfeed_loader_stats_json`: 4 KiB is always enough.
///
/// # Safety
/// `config_json` must be NULL or a NUL-terminated string; `buf` NULL or
/// `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_plan_json(
    config_json: *const c_char,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        check(config_json, "config_json")?;
        // SAFETY: the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(config_json) }
            .to_str()
            .map_err(|e| invalid(format!("`config_json` is not UTF-8: {e}")))?;
        let summary = crate::engine::plan_summary(&Config::from_json(text)?)?;
        let json = serde_json::to_string(&summary).map_err(|e| {
            crate::error::Error::internal(
                crate::error::Fault::Json,
                format!("the plan as JSON: {e}"),
            )
        })?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&json, "plan", buf, len, needed) }
    })
}
