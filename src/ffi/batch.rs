//! The entry points on a batch: release it, say which shard a sample came
//! from, and copy field ranges out of batch memory (`ringfeed_gather`). A
//! batch is found by its `handle` in the batch table (`boundary.rs`); its
//! other fields are never trusted.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};

use super::boundary::{BATCHES, Fail, HeldBatch, boundary, check, invalid, lock, write_text};
use super::fork;
use super::status::{RINGFEED_ERR_INVALID_HANDLE, RINGFEED_OK};
use super::types::ringfeed_batch;

/// Releases a batch: its chunks may be reused, and every pointer it held
/// becomes invalid. Zeroes `*batch`. Releasing a batch twice, or a batch that
/// `ringfeed_loader_next` did not fill, returns `RINGFEED_ERR_INVALID_HANDLE`.
/// Batches may be released after their loader was closed.
///
/// # Safety
/// `batch` must be NULL or point to a readable and writable `ringfeed_batch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_batch_release(batch: *mut ringfeed_batch) -> i32 {
    boundary(|| {
        check(batch, "batch")?;
        // SAFETY: checked non-NULL and aligned; only the integer is read.
        let handle = unsafe { std::ptr::addr_of!((*batch).handle).read() };
        let taken = {
            let mut batches = lock(&BATCHES);
            match batches.get(&handle) {
                // Left in the table: a child of fork() must not drop its
                // parent's batch (give its chunks back to the parent's pool).
                Some(held) => fork::check_owner("batch", held.pid)?,
                None => {
                    return Err(Fail(
                        RINGFEED_ERR_INVALID_HANDLE,
                        format!(
                            "batch handle {handle} is not held: released twice, or not from \
                             ringfeed_loader_next"
                        ),
                    ));
                }
            }
            batches.remove(&handle)
        };
        drop(taken);
        // SAFETY: as above; the caller says it is writable.
        unsafe { batch.write(ringfeed_batch::EMPTY) };
        Ok(RINGFEED_OK)
    })
}

/// Writes the name (path or URL, as the configuration gave it) of the shard
/// that sample `sample` of `batch` came from into `buf`, NUL-terminated, to
/// say where a sample that fails to decode lives. Same buffer convention as
/// `ringfeed_loader_state`. A sample index past the batch gives
/// `RINGFEED_ERR_INVALID_ARGUMENT`; a released batch
/// `RINGFEED_ERR_INVALID_HANDLE`.
///
/// # Safety
/// `batch` must be NULL or point to a readable `ringfeed_batch`; `buf` NULL
/// or `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_batch_sample_source(
    batch: *const ringfeed_batch,
    sample: usize,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let batches = lock(&BATCHES);
        // SAFETY: forwarded from this function's contract.
        let held = unsafe { held_batch(&batches, batch) }?;
        let (b, l) = (&held.batch, &held.loader);
        if sample >= b.len() {
            return Err(invalid(format!(
                "sample {sample} is past the batch's {} samples",
                b.len()
            )));
        }
        let name = l.source(b, sample)?.unwrap_or_default();
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&name, "source", buf, len, needed) }
    })
}

/// The batch `batch` names, made by this process.
///
/// # Safety
/// `batch` must be NULL or point to a readable `ringfeed_batch`.
unsafe fn held_batch(
    batches: &HashMap<u64, HeldBatch>,
    batch: *const ringfeed_batch,
) -> Result<&HeldBatch, Fail> {
    check(batch, "batch")?;
    // SAFETY: checked non-NULL and aligned; only the integer is read.
    let handle = unsafe { std::ptr::addr_of!((*batch).handle).read() };
    let held = batches.get(&handle).ok_or_else(|| not_held(handle))?;
    fork::check_owner("batch", held.pid)?;
    Ok(held)
}

fn not_held(handle: u64) -> Fail {
    Fail(
        RINGFEED_ERR_INVALID_HANDLE,
        format!("batch handle {handle} is not held: released, or not from ringfeed_loader_next"),
    )
}

/// Writes the key of a node engine's batch into `buf` (NUL-terminated
/// text; same buffer convention as `ringfeed_loader_state`), for a process
/// that reads the batch through the engine's arena after this consumer
/// handed it on — a PyTorch DataLoader's main process reading its worker's
/// batches. With the key, that process asks the engine to keep the batch
/// past this consumer's release or exit (`ringfeed_node_keep`) and frees it
/// (`ringfeed_node_release`). A batch of a loader in this process has no
/// key (`RINGFEED_ERR_INVALID_ARGUMENT`): its memory file outlives the
/// loader, and no engine reuses it once the loader is gone.
///
/// # Safety
/// `batch` must be NULL or point to a readable `ringfeed_batch`; `buf` NULL
/// or `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_batch_node_key(
    batch: *const ringfeed_batch,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let batches = lock(&BATCHES);
        // SAFETY: forwarded from this function's contract.
        let held = unsafe { held_batch(&batches, batch) }?;
        let key = held.batch.node_key().ok_or_else(|| {
            invalid(
                "the batch is not from a node engine: its memory outlives its loader, and \
                     needs no key",
            )
        })?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&key, "key", buf, len, needed) }
    })
}

/// The key passed to `ringfeed_node_keep` and `ringfeed_node_release`, as text.
///
/// # Safety
/// `key` must be NULL or a NUL-terminated string.
unsafe fn key_text<'a>(key: *const c_char) -> Result<&'a str, Fail> {
    check(key, "key")?;
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(key) }
        .to_str()
        .map_err(|e| invalid(format!("`key` is not UTF-8: {e}")))
}

/// Asks the node engine to keep the batch of `key` (from
/// `ringfeed_batch_node_key`) for process `pid` — one that maps the batch's
/// bytes, usually the caller — after its consumer releases it or exits:
/// until `ringfeed_node_release(key)` or `pid`'s exit. The batch must
/// still be held by its consumer (or kept already); otherwise, or when the
/// engine cannot be reached, returns `RINGFEED_ERR_NODE` and the batch's
/// bytes may be reused. Works in any process of the engine's user; waits
/// at most 10 s for the engine.
///
/// # Safety
/// `key` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_node_keep(key: *const c_char, pid: i32) -> i32 {
    boundary(|| {
        // SAFETY: forwarded from this function's contract.
        let key = unsafe { key_text(key) }?;
        crate::node::keep(key, pid)?;
        Ok(RINGFEED_OK)
    })
}

/// Frees a batch kept by `ringfeed_node_keep`. Returns `RINGFEED_OK` also
/// when the batch was not kept or is already free (a second release does
/// nothing), `RINGFEED_ERR_NODE` when the engine cannot be reached (an
/// engine gone has freed everything).
///
/// # Safety
/// `key` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_node_release(key: *const c_char) -> i32 {
    boundary(|| {
        // SAFETY: forwarded from this function's contract.
        let key = unsafe { key_text(key) }?;
        crate::node::release(key)?;
        Ok(RINGFEED_OK)
    })
}

/// Copies `count` ranges of `src` one after the other into `dst`: range i
/// is `lengths[i]` bytes from `src + starts[i]`. The library's own memcpy
/// loop for a caller that packs the fields of a batch (a view of `src_len`
/// bytes) into one contiguous buffer (`dst_len` bytes), without a call per
/// sample. Every range must lie inside `src_len` and their total inside
/// `dst_len`; otherwise returns `RINGFEED_ERR_INVALID_ARGUMENT` and copies
/// nothing. `src` and `dst` must not overlap.
///
/// # Safety
/// `src` must be NULL or point to `src_len` readable bytes, `dst` NULL or
/// `dst_len` writable bytes, `starts` and `lengths` NULL or `count` readable
/// values each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_gather(
    src: *const u8,
    src_len: usize,
    starts: *const i64,
    lengths: *const i64,
    count: usize,
    dst: *mut u8,
    dst_len: usize,
) -> i32 {
    boundary(|| {
        if count == 0 {
            return Ok(RINGFEED_OK);
        }
        check(src, "src")?;
        check(starts, "starts")?;
        check(lengths, "lengths")?;
        check(dst, "dst")?;
        // SAFETY: checked non-NULL and aligned; the caller gives `count` values.
        let (starts, lengths) = unsafe {
            (
                std::slice::from_raw_parts(starts, count),
                std::slice::from_raw_parts(lengths, count),
            )
        };
        let mut total = 0usize;
        for (i, (&s, &n)) in starts.iter().zip(lengths).enumerate() {
            let end = (s >= 0 && n >= 0).then(|| s.checked_add(n)).flatten();
            if end.is_none_or(|e| e as u64 > src_len as u64) {
                return Err(invalid(format!(
                    "range {i} ({n} bytes at {s}) is not inside the {src_len}-byte source"
                )));
            }
            total = total.saturating_add(n as usize);
        }
        if total > dst_len {
            return Err(invalid(format!(
                "the ranges hold {total} bytes, the destination has {dst_len}"
            )));
        }
        let (src_end, dst_end) = (src.addr() + src_len, dst.addr() + dst_len);
        if src.addr() < dst_end && dst.addr() < src_end {
            return Err(invalid("`src` and `dst` overlap"));
        }
        let mut at = 0usize;
        for (&s, &n) in starts.iter().zip(lengths) {
            // SAFETY: every range was checked inside `src`, the total inside
            // `dst`, and the two buffers do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(s as usize), dst.add(at), n as usize);
            }
            at += n as usize;
        }
        Ok(RINGFEED_OK)
    })
}
