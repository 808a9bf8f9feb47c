//! The entry points for whole objects (`crate::object`): read one into the
//! library's memory (`ringfeed_object_read`, a handle like a batch's, whose
//! bytes stay put until `ringfeed_object_release`) or into a caller's
//! buffer, list what a URL names, and write one from a buffer or, piece by
//! piece, through a writer handle. The configuration is the loader's JSON
//! keys without `urls` (NULL: the defaults).
//!
//! Object and writer handles are numbers looked up in their own tables
//! (`boundary.rs`, beside the loaders' and batches'), as loader handles are. An object's bytes are the process's own memory, so
//! a child of `fork()` may read and release its copy; a writer's upload
//! threads are its parent's, so a child's calls on it are refused.

use std::ffi::c_char;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::boundary::{
    Fail, NEXT_HANDLE, OBJECTS, OpenWriter, WRITERS, boundary, check, check_owner, invalid, text,
    write_text,
};
use super::fork;
use super::status::{RINGFEED_ERR_BUFFER_TOO_SMALL, RINGFEED_ERR_INVALID_HANDLE, RINGFEED_OK};
use crate::config::Config;
use crate::fetch::NetOptions;
use crate::object::{self, ObjectBuf, ObjectWriter};
use crate::sync::Locked;

/// An object read whole into the library's memory. Opaque.
pub struct ringfeed_object {
    _private: [u8; 0],
}

/// An object being written. Opaque.
pub struct ringfeed_writer {
    _private: [u8; 0],
}

/// A fresh handle value: odd, 16-spaced, never a real object's address
/// (`tag` tells the tables apart in a message, not in the lookup).
fn new_handle(tag: usize) -> usize {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) as usize * 16 + tag
}

/// The configuration of an object call: NULL is the defaults.
///
/// # Safety
/// `json` must be NULL or NUL-terminated.
unsafe fn config(json: *const c_char) -> Result<Config, Fail> {
    if json.is_null() {
        return Ok(Config::for_objects("{}")?);
    }
    // SAFETY: as this function's contract.
    let t = unsafe { text(json, "config_json") }?;
    Ok(Config::for_objects(t)?)
}

/// Reads the whole object at `url` (`s3://bucket/key`, `http(s)://...`, a
/// local path or `file://` URL) into memory of the library's, with
/// `parts_in_flight` ranged reads of `part_size` in flight (auto: from 8,
/// climbing for a remote object as its reads' times show room). On success
/// writes a handle to `*out`; its bytes (`ringfeed_object_data`) stay valid
/// until `ringfeed_object_release`. On failure writes NULL. `config_json`
/// holds the loader's keys without `urls` (S3 endpoint and credentials,
/// retries, `io_backend`, `memory_kind`, `part_size`, `parts_in_flight`),
/// or is NULL for the defaults. A URL that names several objects (a
/// directory, a prefix, braces) is `RINGFEED_ERR_DATASET`: list them with
/// `ringfeed_object_list`.
///
/// # Safety
/// `url` must be a NUL-terminated string; `config_json` NULL or one; `out`
/// NULL or writable for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_read(
    url: *const c_char,
    config_json: *const c_char,
    out: *mut *mut ringfeed_object,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        let buf = object::read(url, &cfg, None)?;
        fork::install_handlers();
        let id = new_handle(9);
        OBJECTS.locked().insert(id, Arc::new(buf));
        // SAFETY: as above.
        unsafe { out.write(std::ptr::without_provenance_mut(id)) };
        Ok(RINGFEED_OK)
    })
}

fn object_of(handle: *const ringfeed_object) -> Result<Arc<ObjectBuf>, Fail> {
    if handle.is_null() {
        return Err(invalid("argument `object` is NULL"));
    }
    OBJECTS
        .locked()
        .get(&handle.addr())
        .cloned()
        .ok_or_else(|| {
            Fail(
                RINGFEED_ERR_INVALID_HANDLE,
                "unknown object handle: it was released or never read".into(),
            )
        })
}

/// Writes the object's bytes and length to `*data` and `*len` (`*data` is
/// never NULL, even for an empty object). They stay valid until
/// `ringfeed_object_release`.
///
/// # Safety
/// `data` and `len` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_data(
    object: *const ringfeed_object,
    data: *mut *const u8,
    len: *mut u64,
) -> i32 {
    boundary(|| {
        check(data, "data")?;
        check(len, "len")?;
        let o = object_of(object)?;
        // SAFETY: checked non-NULL and aligned; the caller says they are writable.
        unsafe {
            data.write(o.as_ptr());
            len.write(o.len() as u64);
        }
        Ok(RINGFEED_OK)
    })
}

/// Frees an object's memory; its pointers are invalid after. Releasing a
/// handle twice, or one never read, is `RINGFEED_ERR_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_object_release(object: *mut ringfeed_object) -> i32 {
    boundary(|| {
        if object.is_null() {
            return Err(invalid("argument `object` is NULL"));
        }
        let gone = OBJECTS.locked().remove(&object.addr());
        match gone {
            // Dropped outside the table's lock: unmapping may take a while.
            Some(o) => {
                drop(o);
                Ok(RINGFEED_OK)
            }
            None => Err(Fail(
                RINGFEED_ERR_INVALID_HANDLE,
                "unknown object handle: it was released or never read".into(),
            )),
        }
    })
}

/// Reads the whole object at `url` into `buf` (`len` bytes). Writes its
/// size to `*size` (when `size` is not NULL) as soon as it is known; a
/// buffer smaller than the object is `RINGFEED_ERR_BUFFER_TOO_SMALL`
/// before any byte is read, so a caller can size its buffer and call again.
/// `config_json` as for `ringfeed_object_read`.
///
/// # Safety
/// `url` must be NUL-terminated; `config_json` NULL or NUL-terminated;
/// `buf` NULL (with `len` 0) or writable for `len` bytes; `size` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_read_into(
    url: *const c_char,
    config_json: *const c_char,
    buf: *mut u8,
    len: u64,
    size: *mut u64,
) -> i32 {
    boundary(|| {
        if !size.is_null() {
            check(size, "size")?;
        }
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        let net = NetOptions::for_config(&cfg);
        let shard = object::one(url, &cfg, &net)?;
        let n = object::read::shard_size(&shard)?;
        if !size.is_null() {
            // SAFETY: checked above.
            unsafe { size.write(n) };
        }
        if n > len {
            return Err(Fail(
                RINGFEED_ERR_BUFFER_TOO_SMALL,
                format!("`{}` is {n} bytes, the buffer has {len}", shard.name),
            ));
        }
        let dst: &mut [u8] = if n == 0 {
            &mut []
        } else {
            check(buf, "buf")?;
            let l = usize::try_from(len).map_err(|_| invalid("`len` exceeds the address space"))?;
            // SAFETY: the caller says `buf` is writable for `len` bytes.
            unsafe { std::slice::from_raw_parts_mut(buf, l) }
        };
        object::read::read_shard_into(&shard, &cfg, &net, dst, None)?;
        Ok(RINGFEED_OK)
    })
}

/// Lists the objects `url` names, with their sizes, as a JSON array
/// (`[{"url": "...", "size": 123}, ...]`, NUL-terminated) into `buf`: one
/// object, or every file of a directory or object under an
/// `s3://bucket/prefix/` (one level), with brace expansion. `needed` (when
/// not NULL) gets the text's length; a short buffer is
/// `RINGFEED_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `url` must be NUL-terminated; `config_json` NULL or NUL-terminated;
/// `buf` NULL or writable for `len` bytes; `needed` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_list(
    url: *const c_char,
    config_json: *const c_char,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> i32 {
    boundary(|| {
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        let found = object::list(&[url.to_string()], &cfg)?;
        let items: Vec<serde_json::Value> = found
            .iter()
            .map(|s| serde_json::json!({"url": s.name, "size": s.size}))
            .collect();
        let json = serde_json::Value::Array(items).to_string();
        // SAFETY: the caller's contract on `buf`, `len` and `needed`.
        unsafe { write_text(&json, "the listing", buf, len, needed) }
    })
}

/// Whether the object at `url` (`s3://bucket/key`, a local path or
/// `file://` URL) exists: `*exists` gets 1 or 0. Absent (0) only when S3
/// answers 404 `NoSuchKey` or the file is not there; any other answer
/// (`AccessDenied`, `ExpiredToken`, `NoSuchBucket`, a 5xx past its
/// retries) is an error status whose message names S3's code.
///
/// # Safety
/// `url` must be NUL-terminated; `config_json` NULL or NUL-terminated;
/// `exists` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_exists(
    url: *const c_char,
    config_json: *const c_char,
    exists: *mut i32,
) -> i32 {
    boundary(|| {
        check(exists, "exists")?;
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        let there = object::exists(url, &cfg)?;
        // SAFETY: checked above; the caller says it is writable.
        unsafe { exists.write(i32::from(there)) };
        Ok(RINGFEED_OK)
    })
}

/// Writes `data` (`len` bytes) as the object at `url` (`s3://bucket/key`,
/// a local path or `file://` URL), visible only once whole: to S3 with one
/// conditional `PutObject`, or a multipart upload of `part_size` parts,
/// `parts_in_flight` at a time, each carrying `checksum`; locally through a
/// temporary file renamed into place. An existing object is
/// `RINGFEED_ERR_EXISTS` unless `overwrite` is true. On any error nothing
/// is left: no object, no upload's parts.
///
/// # Safety
/// `url` must be NUL-terminated; `config_json` NULL or NUL-terminated;
/// `data` NULL (with `len` 0) or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_object_write(
    url: *const c_char,
    config_json: *const c_char,
    data: *const u8,
    len: u64,
) -> i32 {
    boundary(|| {
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        // SAFETY: the caller says `data` is readable for `len` bytes.
        let bytes = unsafe { input(data, len)? };
        object::write(url, bytes, &cfg, None)?;
        Ok(RINGFEED_OK)
    })
}

/// `len` bytes at `data` (NULL allowed when `len` is 0).
///
/// # Safety
/// `data` must be readable for `len` bytes when `len` > 0.
unsafe fn input<'a>(data: *const u8, len: u64) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    check(data, "data")?;
    let l = usize::try_from(len).map_err(|_| invalid("`len` exceeds the address space"))?;
    // SAFETY: as this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(data, l) })
}

/// Starts an object at `url`, written piece by piece with
/// `ringfeed_writer_write` and made visible by `ringfeed_writer_finish`
/// (see `ringfeed_object_write` for where and how). An existing object
/// fails here already with `RINGFEED_ERR_EXISTS` (and again at finish, if
/// another writer got there first) unless `overwrite` is true. On success
/// writes the handle to `*out`, else NULL.
///
/// # Safety
/// `url` must be NUL-terminated; `config_json` NULL or NUL-terminated;
/// `out` NULL or writable for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_writer_open(
    url: *const c_char,
    config_json: *const c_char,
    out: *mut *mut ringfeed_writer,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller passes NUL-terminated strings or NULL.
        let (url, cfg) = unsafe { (text(url, "url")?, config(config_json)?) };
        let w = ObjectWriter::open(url, &cfg, None)?;
        fork::install_handlers();
        let id = new_handle(13);
        let open = OpenWriter {
            writer: Arc::new(Mutex::new(w)),
            pid: std::process::id(),
        };
        WRITERS.locked().insert(id, open);
        // SAFETY: as above.
        unsafe { out.write(std::ptr::without_provenance_mut(id)) };
        Ok(RINGFEED_OK)
    })
}

fn writer_of(handle: *const ringfeed_writer, take: bool) -> Result<Arc<Mutex<ObjectWriter>>, Fail> {
    if handle.is_null() {
        return Err(invalid("argument `writer` is NULL"));
    }
    let mut writers = WRITERS.locked();
    let unknown = || {
        Fail(
            RINGFEED_ERR_INVALID_HANDLE,
            "unknown writer handle: it was finished, aborted or never opened".into(),
        )
    };
    let open = writers.get(&handle.addr()).ok_or_else(unknown)?;
    check_owner("writer handle", open.pid)?;
    if take {
        let open = writers.remove(&handle.addr()).ok_or_else(unknown)?;
        return Ok(open.writer);
    }
    Ok(Arc::clone(&open.writer))
}

/// Appends `len` bytes at `data` to the object. Parts are uploaded while
/// the caller goes on; a call waits when `parts_in_flight` parts are
/// queued. An error (a part that failed for good) aborts the write:
/// nothing is kept, later calls return the same error, and the handle must
/// still be ended with `ringfeed_writer_abort` or `ringfeed_writer_finish`.
///
/// # Safety
/// `data` must be NULL (with `len` 0) or readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_writer_write(
    writer: *mut ringfeed_writer,
    data: *const u8,
    len: u64,
) -> i32 {
    boundary(|| {
        let w = writer_of(writer, false)?;
        // SAFETY: the caller says `data` is readable for `len` bytes.
        let bytes = unsafe { input(data, len)? };
        w.locked().write(bytes)?;
        Ok(RINGFEED_OK)
    })
}

/// Sends what is left and makes the object visible, whole. The handle is
/// gone after this call, whatever it returns; on error nothing is kept.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_writer_finish(writer: *mut ringfeed_writer) -> i32 {
    boundary(|| {
        let w = writer_of(writer, true)?;
        w.locked().finish()?;
        Ok(RINGFEED_OK)
    })
}

/// Drops what was written (an S3 upload is aborted, a temporary file
/// removed); the handle is gone after this call.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_writer_abort(writer: *mut ringfeed_writer) -> i32 {
    boundary(|| {
        let w = writer_of(writer, true)?;
        w.locked().abort()?;
        Ok(RINGFEED_OK)
    })
}
