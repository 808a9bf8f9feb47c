//! The status codes as the C ABI exports them: the table and the mapping
//! from errors live beside `Error` (`crate::error::status`); here are the
//! entry points that explain a status (`ringfeed_status_name`,
//! `ringfeed_last_error`), and `ringfeed_redact`, which takes credentials
//! out of a text a binding builds a message from (a URL it was given).

use std::ffi::c_char;

use super::boundary::last_error;
pub use crate::error::status::*;

/// Copies the calling thread's last error message into `buf` (truncated to
/// `len - 1` bytes, always NUL-terminated when `len > 0`). Returns the full
/// message length without the NUL, so a caller can size its buffer; 0 when no
/// call on this thread has failed.
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_last_error(buf: *mut c_char, len: usize) -> usize {
    let msg = last_error();
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

/// Copies `text` into `buf` with every credential a URL in it carries (the
/// signature, key id and token of a presigned URL, a SAS `sig`, a password
/// before the host) replaced by `REDACTED`, as the library's own messages
/// are: for a binding's messages that quote a URL its caller gave.
/// Truncated and NUL-terminated as `ringfeed_last_error`; returns the full
/// length without the NUL. A NULL `text`, or one that is not UTF-8, gives
/// `""` (the latter: nothing of it can be shown safely).
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string; `buf` must be NULL or
/// point to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_redact(
    text: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> usize {
    let given = if text.is_null() {
        ""
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_str()
            .unwrap_or("")
    };
    let out = crate::redact::text(given);
    if !buf.is_null() && len > 0 {
        let n = out.len().min(len - 1);
        // SAFETY: `buf` has `len` > n writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), buf.cast(), n);
            buf.add(n).write(0);
        }
    }
    out.len()
}

/// The name of a status code (`"RINGFEED_ERR_CONFIG"`), a static string.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_status_name(status: i32) -> *const c_char {
    STATUSES
        .iter()
        .find(|s| s.code == status)
        .map_or(c"RINGFEED_UNKNOWN_STATUS", |s| s.name)
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    #[test]
    fn every_status_name_comes_back_from_its_code() {
        for s in STATUSES {
            // SAFETY: ringfeed_status_name returns a static NUL-terminated string.
            let back = unsafe { CStr::from_ptr(ringfeed_status_name(s.code)) };
            assert_eq!(back, s.name);
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(ringfeed_status_name(1000)) };
        assert_eq!(unknown, c"RINGFEED_UNKNOWN_STATUS");
    }
}
