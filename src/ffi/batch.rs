//! The entry points on a batch: release it, say which shard a sample came
//! from, and copy field ranges out of batch memory (`ringfeed_gather`). A
//! batch is found by its `handle` in the batch table (`boundary.rs`); its
//! other fields are never trusted.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};

use super::boundary::{
    BATCHES, Fail, HeldBatch, boundary, check, check_owner, invalid, write_text,
};
use super::status::{RINGFEED_ERR_INVALID_HANDLE, RINGFEED_OK};
use super::types::ringfeed_batch;
use crate::sync::Locked;

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
            let mut batches = BATCHES.locked();
            match batches.get(&handle) {
                // Left in the table: a child of fork() must not drop its
                // parent's batch (give its chunks back to the parent's pool).
                Some(held) => check_owner("batch", held.pid)?,
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
        // The table's lock is held only to find the batch: a node engine's
        // batch asks its engine for the name, a round trip that must not
        // hold up every other batch call of the process (nor a fork, whose
        // handler takes this lock).
        let asked = {
            let batches = BATCHES.locked();
            // SAFETY: forwarded from this function's contract.
            let held = unsafe { held_batch(&batches, batch) }?;
            let b = &held.batch;
            if sample >= b.len() {
                return Err(invalid(format!(
                    "sample {sample} is past the batch's {} samples",
                    b.len()
                )));
            }
            b.source(sample)
        };
        let name = asked.name()?;
        let name = name.unwrap_or_default();
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
    check_owner("batch", held.pid)?;
    Ok(held)
}

fn not_held(handle: u64) -> Fail {
    Fail(
        RINGFEED_ERR_INVALID_HANDLE,
        format!("batch handle {handle} is not held: released, or not from ringfeed_loader_next"),
    )
}

/// Writes the key of a node engine's batch into `buf` (NUL-terminated
/// text; same buffer convention as `ringfeed_loader_state`): the engine's
/// socket and identity, the batch's number and its capability, a random
/// number drawn for it. Another process that reads the batch through the
/// engine's arena shows the key to keep the batch for itself
/// (`ringfeed_node_claim`, `ringfeed_node_keep`) and frees it
/// (`ringfeed_node_release`); a key of another engine, of a batch gone or
/// with another capability is refused by name. The batch stays this
/// consumer's: its own release frees it unless a process kept it by then.
/// To hand a batch to another process use `ringfeed_batch_ship`. A batch of
/// a loader in this process has no key (`RINGFEED_ERR_INVALID_ARGUMENT`):
/// its memory file outlives the loader, and no engine reuses it once the
/// loader is gone.
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
    // SAFETY: forwarded from this function's contract.
    unsafe { write_key(batch, false, buf, len, needed) }
}

/// The key of `batch` into `buf`, marking the batch shipped with `ship`.
///
/// # Safety
/// As `ringfeed_batch_node_key`.
unsafe fn write_key(
    batch: *const ringfeed_batch,
    ship: bool,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let batches = BATCHES.locked();
        // SAFETY: forwarded from the caller's contract.
        let held = unsafe { held_batch(&batches, batch) }?;
        let key = if ship {
            held.batch.ship()
        } else {
            held.batch.node_key()
        };
        let key = key.ok_or_else(|| {
            invalid(
                "the batch is not from a node engine: its memory outlives its loader, and needs \
                 no key",
            )
        })?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { write_text(&key, "key", buf, len, needed) }
    })
}

/// As `ringfeed_batch_node_key`, for a batch this consumer hands to another
/// process (a DataLoader worker's batch, pickled for the main process):
/// once this consumer releases it, the engine keeps it in transit — for a
/// receiver to keep with the key — until this consumer's process exits,
/// instead of freeing it. So the receiver may keep it after this process
/// let go of it; if this process exits first, a receiver that had not kept
/// it yet is refused, by name, and reads none of its bytes.
///
/// # Safety
/// As `ringfeed_batch_node_key`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_batch_ship(
    batch: *const ringfeed_batch,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    // SAFETY: forwarded from this function's contract.
    unsafe { write_key(batch, true, buf, len, needed) }
}

/// The key passed to the `ringfeed_node_*` calls, as text.
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

/// Keeps the batch of `key` (from `ringfeed_batch_ship` or
/// `ringfeed_batch_node_key`) for this process, until it releases it
/// (`ringfeed_node_release`) or exits, and writes where this process maps
/// the engine's arena: `*base` its first byte, `*len` its length (either
/// may be NULL). The batch's bytes lie at the offsets they have in the
/// arena of the consumer that took it. Returns `RINGFEED_OK` once the
/// engine has it kept — only then may its bytes be read — or
/// `RINGFEED_ERR_NODE` naming why not: the engine cannot be reached, the
/// key is of another engine, the batch is gone (every process holding it
/// let go or exited: its memory may hold other batches), or the key's
/// capability is not the batch's. The first keep of an engine links this
/// process to it (one link per process and engine).
///
/// # Safety
/// `key` must be NULL or a NUL-terminated string; `base` and `len` NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_node_claim(
    key: *const c_char,
    base: *mut *const u8,
    len: *mut u64,
) -> i32 {
    boundary(|| {
        // SAFETY: forwarded from this function's contract.
        let key = unsafe { key_text(key) }?;
        let (b, n) = crate::node::claim(key)?;
        if !base.is_null() {
            // SAFETY: the caller passes a writable pointer or NULL.
            unsafe { base.write(b) };
        }
        if !len.is_null() {
            // SAFETY: as above.
            unsafe { len.write(n as u64) };
        }
        Ok(RINGFEED_OK)
    })
}

/// `ringfeed_node_claim` for a process that maps the arena itself. `pid`
/// must be this process's id (or 0): a batch is kept by the process that
/// reads it, never on another's behalf (`RINGFEED_ERR_NODE` otherwise).
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

/// Releases one keep of the batch of `key` by this process (each keep is
/// released once; the batch is freed once nobody holds it). Returns
/// `RINGFEED_ERR_NODE` when this process keeps no such batch. Never waits
/// for the engine.
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
