//! The entry points on a loader: open it from a JSON configuration, take
//! its batches (`ringfeed_loader_next`), read its stats as JSON, its resume
//! state and its shared arena, and close it. Each looks the loader up in the
//! handle table (`boundary.rs`) and calls [`Loader`].

use std::ffi::{CStr, c_char};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::boundary::{
    BATCHES, Fail, HeldBatch, LOADERS, NEXT_HANDLE, OpenLoader, boundary, check, check_owner,
    invalid, lookup, write_text,
};
use super::fork;
use super::status::{
    RINGFEED_END_OF_EPOCH, RINGFEED_ERR_CONFIG, RINGFEED_ERR_INVALID_HANDLE, RINGFEED_FINISHED,
    RINGFEED_OK, RINGFEED_TIMEOUT,
};
use super::types::{ringfeed_batch, ringfeed_loader};
use crate::consumer::{AnyNext, Attached};
use crate::sync::Locked;

/// Opens a loader from a JSON configuration (see docs/configuration.md).
/// On success writes the handle to `*out` and returns `RINGFEED_OK`; on
/// failure writes NULL and returns an error status.
///
/// # Safety
/// `config_json` must be NULL or a NUL-terminated string; `out` must be NULL
/// or point to writable memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_open(
    config_json: *const c_char,
    out: *mut *mut ringfeed_loader,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        check(config_json, "config_json")?;
        // SAFETY: the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(config_json) }
            .to_str()
            .map_err(|e| invalid(format!("`config_json` is not UTF-8: {e}")))?;
        let loader = Attached::open_json(text)?;
        fork::install_handlers();
        // Odd, 16-spaced numbers: never the address of a real object.
        let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) as usize * 16 + 5;
        let open = OpenLoader {
            loader: Arc::new(loader),
            pid: std::process::id(),
        };
        LOADERS.locked().insert(id, open);
        // SAFETY: as above.
        unsafe { out.write(std::ptr::without_provenance_mut(id)) };
        Ok(RINGFEED_OK)
    })
}

/// Waits up to `timeout_ms` milliseconds (negative: for ever; 0: do not wait)
/// for the next batch. Returns `RINGFEED_OK` with the batch written to `*out`,
/// or `RINGFEED_END_OF_EPOCH`, `RINGFEED_TIMEOUT`, `RINGFEED_FINISHED` with
/// `*out` zeroed, or an error status (a worker's error is returned to every
/// call after the batches read before it).
/// Several threads may call it at once on one loader.
///
/// # Safety
/// `out` must be NULL or point to a writable `ringfeed_batch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_next(
    loader: *mut ringfeed_loader,
    timeout_ms: i64,
    out: *mut ringfeed_batch,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(ringfeed_batch::EMPTY) };
        let l = lookup(loader)?;
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        match l.next(timeout)? {
            AnyNext::Batch(b) => {
                let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
                let view = ringfeed_batch {
                    handle,
                    epoch: b.epoch(),
                    index: b.index(),
                    bytes: b.bytes(),
                    sample_count: b.len(),
                    samples: b.raw_samples().as_ptr(),
                    field_count: b.raw_fields().len(),
                    fields: b.raw_fields().as_ptr(),
                };
                // The arrays live in the batch's heap vectors: moving the
                // batch into the table does not move them.
                let held = HeldBatch {
                    batch: b,
                    pid: std::process::id(),
                };
                BATCHES.locked().insert(handle, held);
                // SAFETY: as above.
                unsafe { out.write(view) };
                Ok(RINGFEED_OK)
            }
            AnyNext::EndOfEpoch(_) => Ok(RINGFEED_END_OF_EPOCH),
            AnyNext::Timeout => Ok(RINGFEED_TIMEOUT),
            AnyNext::Finished => Ok(RINGFEED_FINISHED),
        }
    })
}

/// Writes the stats as a JSON object (with the setup notes: why huge pages,
/// mlock or io_uring were not obtained) into `buf`, NUL-terminated. The
/// length without the NUL goes to `*needed` (if not NULL); when `len` is too
/// small, returns `RINGFEED_ERR_BUFFER_TOO_SMALL` and writes nothing else.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_stats_json(
    loader: *mut ringfeed_loader,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let (text, _) = lookup(loader)?.stats()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&text, "stats", buf, len, needed) }
    })
}

/// Writes the loader's stats as metrics in the Prometheus text format
/// (version 0.0.4: counters named `ringfeed_*_total`, gauges, retries by
/// kind, `ringfeed_info`) into `buf`, NUL-terminated, for a scrape
/// endpoint of the program's own. Sizes as `ringfeed_loader_stats_json`.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_metrics(
    loader: *mut ringfeed_loader,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let (json, _) = lookup(loader)?.stats()?;
        let text = crate::engine::prometheus(&json)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&text, "metrics", buf, len, needed) }
    })
}

/// Writes the loader's resume state into `buf` as a NUL-terminated ASCII
/// string: the position after the batches handed out so far. Give it back
/// as the configuration's `"resume"` value (or one of an array of them, for
/// an elastic resume) to continue the epoch where it stopped. It is about
/// 150 bytes, plus 16 per consumer of an earlier layout for each elastic
/// resume within the epoch; the length without the NUL goes to `*needed`
/// (if not NULL); when `len` is too small, returns
/// `RINGFEED_ERR_BUFFER_TOO_SMALL` and writes nothing else.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_state(
    loader: *mut ringfeed_loader,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        let text = lookup(loader)?.state_hex();
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&text, "state", buf, len, needed) }
    })
}

/// The memory a loader's batches live in, for a consumer in another
/// process: when the loader was opened with `"shared_arena": true`, writes
/// the descriptor of its memory file to `*fd` (owned by the loader, open
/// until the loader is closed and its last batch released: `dup` it or
/// open `/proc/<pid>/fd/<fd>` to keep it), the arena's first byte in this
/// process to `*base` and its length to `*len`. Mapping the file
/// (`MAP_SHARED`, offset 0, `len` bytes) shows every batch's bytes at
/// `data - base` from the mapping's start. Without `shared_arena`, returns
/// `RINGFEED_ERR_CONFIG`.
///
/// # Safety
/// `fd`, `base` and `len` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_arena(
    loader: *mut ringfeed_loader,
    fd: *mut i32,
    base: *mut *const u8,
    len: *mut u64,
) -> i32 {
    boundary(|| {
        check(fd, "fd")?;
        check(base, "base")?;
        check(len, "len")?;
        let l = lookup(loader)?;
        let Some((file, first, bytes)) = l.arena() else {
            return Err(Fail(
                RINGFEED_ERR_CONFIG,
                "the loader's arena is private: open it with \"shared_arena\": true to map it elsewhere"
                    .into(),
            ));
        };
        // SAFETY: each checked non-NULL and aligned; the caller says writable.
        unsafe {
            fd.write(file);
            base.write(first);
            len.write(bytes as u64);
        }
        Ok(RINGFEED_OK)
    })
}

/// Closes a loader: stops its workers and invalidates the handle. Threads
/// waiting in `ringfeed_loader_next` return `RINGFEED_ERR_CLOSED`. Batches
/// not yet released stay valid until released. Closing NULL does nothing;
/// closing twice returns `RINGFEED_ERR_INVALID_HANDLE`.
///
/// # Safety
/// None beyond passing a handle value; it is looked up, never dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_close(loader: *mut ringfeed_loader) -> i32 {
    boundary(|| {
        if loader.is_null() {
            return Ok(RINGFEED_OK);
        }
        let l = {
            let mut loaders = LOADERS.locked();
            match loaders.get(&loader.addr()) {
                // Left in the table: a child of fork() must not close (join
                // the threads of) its parent's loader.
                Some(open) => check_owner("loader handle", open.pid)?,
                None => {
                    return Err(Fail(
                        RINGFEED_ERR_INVALID_HANDLE,
                        "unknown loader handle: already closed, or never opened".into(),
                    ));
                }
            }
            loaders.remove(&loader.addr())
        };
        if let Some(open) = l {
            open.loader.close();
        }
        Ok(RINGFEED_OK)
    })
}
