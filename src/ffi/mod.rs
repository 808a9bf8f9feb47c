//! The C ABI. Every `extern "C"` function here is a thin shell: it checks its
//! pointers and handles, runs the Rust API inside a panic boundary, and maps
//! the result to a status code, leaving a message for `ringfeed_last_error`.
//! The conventions are written once, at the top of `include/ringfeed.h`
//! (from `cbindgen.toml`).
//!
//! Handles are not pointers to Rust memory: a loader handle is a number
//! looked up in a registry, and a batch is found by its `handle` field. So a
//! closed loader, a released batch, or garbage gives an error, never a read of
//! freed memory.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use crate::engine::{Loader, Next};
use crate::error::Error;
use crate::memory::{Batch, RawField, RawSample};

/// Success; for `ringfeed_loader_next`, a batch was written.
pub const RINGFEED_OK: i32 = 0;
/// `ringfeed_loader_next`: every batch of the current epoch was handed out.
pub const RINGFEED_END_OF_EPOCH: i32 = 1;
/// `ringfeed_loader_next`: no batch arrived within the time-out.
pub const RINGFEED_TIMEOUT: i32 = 2;
/// `ringfeed_loader_next`: every epoch is over; no batch will come.
pub const RINGFEED_FINISHED: i32 = 3;
/// A pointer argument is NULL or misaligned, or a string is not UTF-8.
pub const RINGFEED_ERR_INVALID_ARGUMENT: i32 = -1;
/// The loader handle is unknown or closed, or the batch was already released.
pub const RINGFEED_ERR_INVALID_HANDLE: i32 = -2;
/// The configuration is malformed, or a key is unknown or has a bad value,
/// or no AWS credentials could be found for `s3://` URLs.
pub const RINGFEED_ERR_CONFIG: i32 = -3;
/// A dataset URL is malformed, unsupported, or names nothing, or the server
/// refused it for good (HTTP 4xx; S3 NoSuchKey, NoSuchBucket, AccessDenied).
pub const RINGFEED_ERR_DATASET: i32 = -4;
/// Reading a shard failed.
pub const RINGFEED_ERR_IO: i32 = -5;
/// A shard is not a valid WebDataset tar (corrupt, truncated, duplicate field).
pub const RINGFEED_ERR_FORMAT: i32 = -6;
/// Memory could not be set up as configured, or the budget is too small.
pub const RINGFEED_ERR_MEMORY: i32 = -7;
/// The caller's buffer is too small; the needed size was written.
pub const RINGFEED_ERR_BUFFER_TOO_SMALL: i32 = -8;
/// The loader was closed while the call waited.
pub const RINGFEED_ERR_CLOSED: i32 = -9;
/// An internal error: a Rust panic caught at the boundary or in an engine
/// thread, or a thread that could not be started.
pub const RINGFEED_ERR_PANIC: i32 = -10;
/// io_uring was required by the configuration but is not available.
pub const RINGFEED_ERR_IO_URING: i32 = -11;

/// A network read failed after its retries (throttling, 5xx, resets,
/// truncation, stalls, refused connections).
pub const RINGFEED_ERR_NETWORK: i32 = -12;
/// A resume state (well formed: a malformed one is `RINGFEED_ERR_CONFIG`)
/// does not fit this dataset, its epoch settings or its layout, or an
/// elastic resume lacks an old consumer's state; or a shard's samples do not
/// match the plan (a manifest's sample count is wrong).
pub const RINGFEED_ERR_STATE: i32 = -13;

/// `ringfeed_stats.memory_kind`: explicit huge pages (MAP_HUGETLB).
pub const RINGFEED_MEMORY_HUGETLB: i32 = 1;
/// `ringfeed_stats.memory_kind`: transparent huge pages (MADV_HUGEPAGE).
pub const RINGFEED_MEMORY_THP: i32 = 2;
/// `ringfeed_stats.memory_kind`: normal pages.
pub const RINGFEED_MEMORY_NORMAL: i32 = 3;
/// `ringfeed_stats.io_backend`: io_uring.
pub const RINGFEED_BACKEND_IO_URING: i32 = 1;
/// `ringfeed_stats.io_backend`: plain threads with pread.
pub const RINGFEED_BACKEND_THREADS: i32 = 2;

/// An open loader. Opaque: only ever used through a pointer.
pub struct ringfeed_loader {
    _private: [u8; 0],
}

/// A batch handed out by `ringfeed_loader_next`. Every pointer in it stays
/// valid until `ringfeed_batch_release` is called with it.
///
/// Two layout rules let a consumer read a batch with array operations: the
/// samples' keys lie one after the other in sample order, each
/// NUL-terminated (`samples[i + 1].key == samples[i].key +
/// strlen(samples[i].key) + 1`), and the fields of one name share one
/// `name` pointer within the batch (compare pointers, not strings).
#[repr(C)]
pub struct ringfeed_batch {
    /// Identifies the batch to `ringfeed_batch_release`; 0 when empty.
    pub handle: u64,
    /// Epoch the batch belongs to, from 0.
    pub epoch: u64,
    /// Sequence number of the batch in the loader's output, from 0: the
    /// order in which `ringfeed_loader_next` handed batches out.
    pub index: u64,
    /// Payload bytes in all fields.
    pub bytes: u64,
    pub sample_count: usize,
    /// `sample_count` samples.
    pub samples: *const RawSample,
    pub field_count: usize,
    /// Every field of every sample, in sample order (`samples[i].fields`
    /// points into this array).
    pub fields: *const RawField,
}

/// A snapshot of a loader's counters and setup.
#[repr(C)]
#[derive(Default)]
pub struct ringfeed_stats {
    pub bytes_delivered: u64,
    pub samples_delivered: u64,
    pub batches_delivered: u64,
    pub bytes_read: u64,
    /// Payload bytes the engine copied (members split across chunks).
    pub bytes_copied: u64,
    pub reads: u64,
    pub members: u64,
    /// Members skipped because their name has no field part.
    pub members_skipped: u64,
    /// Tar entries that are not regular files (directories, links, ...).
    pub entries_skipped: u64,
    /// Samples of a short last batch dropped by `drop_last`.
    pub samples_dropped: u64,
    pub shards_total: u64,
    /// Shards walked to their end, counted over all epochs.
    pub shards_done: u64,
    pub epochs_done: u64,
    pub chunk_size: u64,
    pub chunk_count: u64,
    pub chunks_in_use: u64,
    pub chunks_peak: u64,
    pub arena_bytes: u64,
    pub consumer_wait_ns: u64,
    pub time_to_first_batch_ns: u64,
    pub elapsed_ns: u64,
    /// Network requests sent (ranged GETs and HEADs, retries included).
    pub http_requests: u64,
    /// Network ranges retried, all kinds (the JSON stats give each kind).
    pub retries: u64,
    /// Samples repeated to even out an epoch across consumers (`remainder: "pad"`).
    pub samples_padded: u64,
    /// Batches and samples replayed and not handed out to resume a state.
    pub batches_skipped: u64,
    pub samples_skipped: u64,
    /// Payload bytes the shuffle buffers copied out of sparse chunks (also in
    /// `bytes_copied`).
    pub shuffle_copied: u64,
    /// The epoch `ringfeed_loader_next` is in.
    pub epoch: u64,
    /// Consumers of the dataset (`world_size` × `loader_workers`), and this
    /// loader's index among them.
    pub consumers: u64,
    pub consumer: u64,
    pub workers: u32,
    /// One of `RINGFEED_MEMORY_*`.
    pub memory_kind: i32,
    /// One of `RINGFEED_BACKEND_*`.
    pub io_backend: i32,
    /// 1 when the arena is locked in memory (mlock).
    pub memory_locked: u32,
    /// 1 when the chunks are registered with io_uring as fixed buffers.
    pub buffers_registered: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

static LOADERS: LazyLock<Mutex<HashMap<usize, Arc<Loader>>>> = LazyLock::new(Default::default);
static BATCHES: LazyLock<Mutex<HashMap<u64, Batch>>> = LazyLock::new(Default::default);
/// Handle numbers; never reused within a process. Relaxed: only uniqueness matters.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error on its way to C: a status and a message.
struct Fail(i32, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::Config(_) => RINGFEED_ERR_CONFIG,
            Error::Url { .. } => RINGFEED_ERR_DATASET,
            Error::Io { op, .. } if *op == "open" || *op == "list" || *op == "stat" => {
                RINGFEED_ERR_DATASET
            }
            Error::Io { .. } => RINGFEED_ERR_IO,
            Error::Tar { .. } | Error::DuplicateField { .. } => RINGFEED_ERR_FORMAT,
            Error::Memory(_) | Error::BudgetTooSmall { .. } => RINGFEED_ERR_MEMORY,
            Error::IoUring(_) => RINGFEED_ERR_IO_URING,
            Error::Closed => RINGFEED_ERR_CLOSED,
            Error::Internal(_) => RINGFEED_ERR_PANIC,
            Error::Http { kind, .. }
                if !kind.retryable() && *kind != crate::net::http::FailKind::Protocol =>
            {
                RINGFEED_ERR_DATASET
            }
            Error::Http { .. } => RINGFEED_ERR_NETWORK,
            // Missing or denied objects and buckets are the dataset's fault;
            // S3's 5xx codes (InternalError, SlowDown) are the network's.
            Error::S3 { status, .. } if *status < 500 => RINGFEED_ERR_DATASET,
            Error::S3 { .. } => RINGFEED_ERR_NETWORK,
            Error::Credentials(_) => RINGFEED_ERR_CONFIG,
            Error::State(_) | Error::Plan { .. } => RINGFEED_ERR_STATE,
        };
        Fail(code, e.to_string())
    }
}

fn invalid(what: impl Into<String>) -> Fail {
    Fail(RINGFEED_ERR_INVALID_ARGUMENT, what.into())
}

/// Runs `f` inside the panic boundary and records its message.
fn boundary(f: impl FnOnce() -> Result<i32, Fail>) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(Fail(RINGFEED_ERR_PANIC, format!("internal error: {msg}")))
    });
    match result {
        Ok(code) => code,
        Err(Fail(code, msg)) => {
            LAST_ERROR.with(|e| *e.borrow_mut() = msg);
            code
        }
    }
}

/// Checks that `p` is non-NULL and aligned for `T`.
fn check<T>(p: *const T, name: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(invalid(format!("argument `{name}` is NULL")));
    }
    if !p.is_aligned() {
        return Err(invalid(format!(
            "argument `{name}` is not aligned for its type"
        )));
    }
    Ok(())
}

fn lookup(handle: *const ringfeed_loader) -> Result<Arc<Loader>, Fail> {
    if handle.is_null() {
        return Err(invalid("argument `loader` is NULL"));
    }
    lock(&LOADERS).get(&handle.addr()).cloned().ok_or_else(|| {
        Fail(
            RINGFEED_ERR_INVALID_HANDLE,
            "unknown loader handle: it was closed or never opened".into(),
        )
    })
}

/// Opens a loader from a JSON configuration (see the README's reference).
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
        let loader = Loader::open_json(text)?;
        // Odd, 16-spaced numbers: never the address of a real object.
        let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) as usize * 16 + 5;
        lock(&LOADERS).insert(id, Arc::new(loader));
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
        let empty = ringfeed_batch {
            handle: 0,
            epoch: 0,
            index: 0,
            bytes: 0,
            sample_count: 0,
            samples: std::ptr::null(),
            field_count: 0,
            fields: std::ptr::null(),
        };
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(empty) };
        let l = lookup(loader)?;
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        match l.next(timeout)? {
            Next::Batch(b) => {
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
                lock(&BATCHES).insert(handle, b);
                // SAFETY: as above.
                unsafe { out.write(view) };
                Ok(RINGFEED_OK)
            }
            Next::EndOfEpoch(_) => Ok(RINGFEED_END_OF_EPOCH),
            Next::Timeout => Ok(RINGFEED_TIMEOUT),
            Next::Finished => Ok(RINGFEED_FINISHED),
        }
    })
}

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
        let taken = lock(&BATCHES).remove(&handle);
        let Some(b) = taken else {
            return Err(Fail(
                RINGFEED_ERR_INVALID_HANDLE,
                format!(
                    "batch handle {handle} is not held: released twice, or not from ringfeed_loader_next"
                ),
            ));
        };
        drop(b);
        // SAFETY: as above; the caller says it is writable.
        unsafe {
            batch.write(ringfeed_batch {
                handle: 0,
                epoch: 0,
                index: 0,
                bytes: 0,
                sample_count: 0,
                samples: std::ptr::null(),
                field_count: 0,
                fields: std::ptr::null(),
            })
        };
        Ok(RINGFEED_OK)
    })
}

/// Writes a snapshot of the loader's counters to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `ringfeed_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_stats(
    loader: *mut ringfeed_loader,
    out: *mut ringfeed_stats,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        let s = lookup(loader)?.stats();
        let v = ringfeed_stats {
            bytes_delivered: s.bytes_delivered,
            samples_delivered: s.samples_delivered,
            batches_delivered: s.batches_delivered,
            bytes_read: s.bytes_read,
            bytes_copied: s.bytes_copied,
            reads: s.reads,
            members: s.members,
            members_skipped: s.members_skipped,
            entries_skipped: s.entries_skipped,
            samples_dropped: s.samples_dropped,
            shards_total: s.shards_total,
            shards_done: s.shards_done,
            epochs_done: s.epochs_done,
            chunk_size: s.chunk_size,
            chunk_count: s.chunk_count,
            chunks_in_use: s.chunks_in_use,
            chunks_peak: s.chunks_peak,
            arena_bytes: s.arena_bytes,
            consumer_wait_ns: s.consumer_wait_ns,
            time_to_first_batch_ns: s.time_to_first_batch_ns,
            elapsed_ns: s.elapsed_ns,
            http_requests: s.http_requests,
            retries: s.retries.values().sum(),
            samples_padded: s.samples_padded,
            batches_skipped: s.batches_skipped,
            samples_skipped: s.samples_skipped,
            shuffle_copied: s.shuffle_copied,
            epoch: s.epoch,
            consumers: s.consumers,
            consumer: s.consumer,
            workers: s.workers,
            memory_kind: match s.memory_kind {
                "hugetlb" => RINGFEED_MEMORY_HUGETLB,
                "thp" => RINGFEED_MEMORY_THP,
                _ => RINGFEED_MEMORY_NORMAL,
            },
            io_backend: match s.io_backend {
                "io_uring" => RINGFEED_BACKEND_IO_URING,
                _ => RINGFEED_BACKEND_THREADS,
            },
            memory_locked: u32::from(s.memory_locked),
            buffers_registered: u32::from(s.buffers_registered),
        };
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(v) };
        Ok(RINGFEED_OK)
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
        let s = lookup(loader)?.stats();
        let text = serde_json::to_string(&s).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&text, "stats", buf, len, needed) }
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
        let text = lookup(loader)?.state().to_hex();
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(&text, "state", buf, len, needed) }
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
        check(batch, "batch")?;
        // SAFETY: checked non-NULL and aligned; only the integer is read.
        let handle = unsafe { std::ptr::addr_of!((*batch).handle).read() };
        let batches = lock(&BATCHES);
        let b = batches.get(&handle).ok_or_else(|| {
            Fail(
                RINGFEED_ERR_INVALID_HANDLE,
                format!(
                    "batch handle {handle} is not held: released, or not from ringfeed_loader_next"
                ),
            )
        })?;
        if sample >= b.len() {
            return Err(invalid(format!(
                "sample {sample} is past the batch's {} samples",
                b.len()
            )));
        }
        let name = b.source(sample).unwrap_or("");
        // SAFETY: forwarded from this function's contract.
        unsafe { write_text(name, "source", buf, len, needed) }
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
        let arena = l.arena();
        let Some(file) = arena.shared_fd() else {
            return Err(Fail(
                RINGFEED_ERR_CONFIG,
                "the loader's arena is private: open it with \"shared_arena\": true to map it elsewhere"
                    .into(),
            ));
        };
        // SAFETY: each checked non-NULL and aligned; the caller says writable.
        unsafe {
            fd.write(file);
            base.write(arena.base());
            len.write(arena.len() as u64);
        }
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

/// Writes `text` NUL-terminated into `buf` (the `*_json` / `*_state`
/// convention).
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes; `needed` NULL or writable.
unsafe fn write_text(
    text: &str,
    what: &str,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> Result<i32, Fail> {
    if !needed.is_null() {
        check(needed, "needed")?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { needed.write(text.len()) };
    }
    if len <= text.len() {
        return Err(Fail(
            RINGFEED_ERR_BUFFER_TOO_SMALL,
            format!(
                "{what} needs {} bytes, the buffer has {len}",
                text.len() + 1
            ),
        ));
    }
    check(buf, "buf")?;
    // SAFETY: `buf` has `len` > text.len() writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(RINGFEED_OK)
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
        let l = lock(&LOADERS).remove(&loader.addr());
        match l {
            Some(l) => {
                l.close();
                Ok(RINGFEED_OK)
            }
            None => Err(Fail(
                RINGFEED_ERR_INVALID_HANDLE,
                "unknown loader handle: already closed, or never opened".into(),
            )),
        }
    })
}

/// Copies the calling thread's last error message into `buf` (truncated to
/// `len - 1` bytes, always NUL-terminated when `len > 0`). Returns the full
/// message length without the NUL, so a caller can size its buffer; 0 when no
/// call on this thread has failed.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_last_error(buf: *mut c_char, len: usize) -> usize {
    let msg = LAST_ERROR.with(|e| e.borrow().clone());
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: `buf` has `len` > n writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast(), n);
            buf.add(n).write(0);
        }
    }
    msg.len()
}

/// The name of a status code (`"RINGFEED_ERR_CONFIG"`), a static string.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_status_name(status: i32) -> *const c_char {
    let s: &'static CStr = match status {
        RINGFEED_OK => c"RINGFEED_OK",
        RINGFEED_END_OF_EPOCH => c"RINGFEED_END_OF_EPOCH",
        RINGFEED_TIMEOUT => c"RINGFEED_TIMEOUT",
        RINGFEED_FINISHED => c"RINGFEED_FINISHED",
        RINGFEED_ERR_INVALID_ARGUMENT => c"RINGFEED_ERR_INVALID_ARGUMENT",
        RINGFEED_ERR_INVALID_HANDLE => c"RINGFEED_ERR_INVALID_HANDLE",
        RINGFEED_ERR_CONFIG => c"RINGFEED_ERR_CONFIG",
        RINGFEED_ERR_DATASET => c"RINGFEED_ERR_DATASET",
        RINGFEED_ERR_IO => c"RINGFEED_ERR_IO",
        RINGFEED_ERR_FORMAT => c"RINGFEED_ERR_FORMAT",
        RINGFEED_ERR_MEMORY => c"RINGFEED_ERR_MEMORY",
        RINGFEED_ERR_BUFFER_TOO_SMALL => c"RINGFEED_ERR_BUFFER_TOO_SMALL",
        RINGFEED_ERR_CLOSED => c"RINGFEED_ERR_CLOSED",
        RINGFEED_ERR_PANIC => c"RINGFEED_ERR_PANIC",
        RINGFEED_ERR_IO_URING => c"RINGFEED_ERR_IO_URING",
        RINGFEED_ERR_NETWORK => c"RINGFEED_ERR_NETWORK",
        RINGFEED_ERR_STATE => c"RINGFEED_ERR_STATE",
        _ => c"RINGFEED_UNKNOWN_STATUS",
    };
    s.as_ptr()
}

/// The library version, a static string such as `"0.1.0"`.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::http::FailKind;

    #[test]
    fn s3_errors_map_to_dataset_network_and_config() {
        let s3 = |status, code: &str| Error::S3 {
            bucket: "b".into(),
            key: "k".into(),
            status,
            code: code.into(),
            explain: None,
        };
        assert_eq!(Fail::from(s3(404, "NoSuchKey")).0, RINGFEED_ERR_DATASET);
        assert_eq!(Fail::from(s3(404, "NoSuchBucket")).0, RINGFEED_ERR_DATASET);
        assert_eq!(Fail::from(s3(403, "AccessDenied")).0, RINGFEED_ERR_DATASET);
        assert_eq!(Fail::from(s3(503, "SlowDown")).0, RINGFEED_ERR_NETWORK);
        assert_eq!(
            Fail::from(Error::Credentials("none".into())).0,
            RINGFEED_ERR_CONFIG
        );
        let http = Error::Http {
            url: "s3://b/k".into(),
            kind: FailKind::Client,
            message: "HTTP 403".into(),
            attempts: 1,
        };
        assert_eq!(Fail::from(http).0, RINGFEED_ERR_DATASET);
    }
}
