//! What every entry point of the C ABI goes through: the panic boundary
//! ([`boundary`]), the failure on its way to C ([`Fail`]: a status and a
//! message), the calling thread's last error message, the pointer check
//! ([`check`]), and the handle tables in which loaders ([`lookup`]),
//! batches, objects and writers are found by number, never by
//! dereferencing what C passed. Each entry remembers the process that made
//! it: after `fork()` the child finds the parent's entries and refuses them
//! ([`check_owner`]; `fork.rs` keeps the tables' locks across a fork).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex};

use super::types::ringfeed_loader;
use crate::consumer::{AnyBatch, Attached};
use crate::error::Error;
use crate::error::status::{
    RINGFEED_ERR_BUFFER_TOO_SMALL, RINGFEED_ERR_INVALID_ARGUMENT, RINGFEED_ERR_INVALID_HANDLE,
    RINGFEED_ERR_PANIC, RINGFEED_OK,
};
use crate::object::{ObjectBuf, ObjectWriter};
use crate::sync::Locked;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// An open loader and the process that opened it.
pub(super) struct OpenLoader {
    pub(super) loader: Arc<Attached>,
    pub(super) pid: u32,
}

pub(super) static LOADERS: LazyLock<Mutex<HashMap<usize, OpenLoader>>> =
    LazyLock::new(Default::default);

/// A batch handed out, and the process it was handed to.
pub(super) struct HeldBatch {
    pub(super) batch: AnyBatch,
    pub(super) pid: u32,
}

/// Batches handed out.
pub(super) static BATCHES: LazyLock<Mutex<HashMap<u64, HeldBatch>>> =
    LazyLock::new(Default::default);
pub(super) static OBJECTS: LazyLock<Mutex<HashMap<usize, Arc<ObjectBuf>>>> =
    LazyLock::new(Default::default);

/// A writer and the process that opened it.
pub(super) struct OpenWriter {
    pub(super) writer: Arc<Mutex<ObjectWriter>>,
    pub(super) pid: u32,
}

pub(super) static WRITERS: LazyLock<Mutex<HashMap<usize, OpenWriter>>> =
    LazyLock::new(Default::default);

/// Handle numbers; never reused within a process. Relaxed: only uniqueness matters.
pub(super) static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// An error on its way to C: a status and a message.
pub(super) struct Fail(pub(super) i32, pub(super) String);

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail(e.status(), e.to_string())
    }
}

pub(super) fn invalid(what: impl Into<String>) -> Fail {
    Fail(RINGFEED_ERR_INVALID_ARGUMENT, what.into())
}

/// Runs `f` inside the panic boundary and records its message.
pub(super) fn boundary(f: impl FnOnce() -> Result<i32, Fail>) -> i32 {
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
            // Every message the C ABI gives out, a configuration's or a
            // panic's too: no credential of a presigned URL in it.
            let msg = crate::redact::text(&msg).into_owned();
            LAST_ERROR.with(|e| *e.borrow_mut() = msg);
            code
        }
    }
}

/// The calling thread's last error message ("" when no call failed).
pub(super) fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().clone())
}

/// `s` as UTF-8; `what` names the argument.
///
/// # Safety
/// `s` must be NULL or NUL-terminated.
pub(super) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    check(s, what)?;
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|e| invalid(format!("`{what}` is not UTF-8: {e}")))
}

/// Checks that `p` is non-NULL and aligned for `T`.
pub(super) fn check<T>(p: *const T, name: &str) -> Result<(), Fail> {
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

pub(super) fn lookup(handle: *const ringfeed_loader) -> Result<Arc<Attached>, Fail> {
    if handle.is_null() {
        return Err(invalid("argument `loader` is NULL"));
    }
    let loaders = LOADERS.locked();
    let open = loaders.get(&handle.addr()).ok_or_else(|| {
        Fail(
            RINGFEED_ERR_INVALID_HANDLE,
            "unknown loader handle: it was closed or never opened".into(),
        )
    })?;
    check_owner("loader handle", open.pid)?;
    Ok(Arc::clone(&open.loader))
}

/// Writes `text` NUL-terminated into `buf` (the `*_json` / `*_state`
/// convention).
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes; `needed` NULL or writable.
pub(super) unsafe fn write_text(
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

/// Refuses an entry made by another process: the caller is a child of fork().
pub(super) fn check_owner(what: &str, owner: u32) -> Result<(), Fail> {
    let me = std::process::id();
    if owner == me {
        return Ok(());
    }
    Err(Fail(
        RINGFEED_ERR_INVALID_HANDLE,
        format!(
            "{what} belongs to process {owner}, and this is process {me} (a child of fork()): \
             loaders, batches and writers do not cross fork; open a new one in this process"
        ),
    ))
}
