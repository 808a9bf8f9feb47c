//! `ringfeed_set_log_callback`: where the library's log messages go
//! (`crate::log`), as rustls-ffi hands its log to a C callback.

use std::ffi::{CString, c_char, c_void};

use super::boundary::{boundary, invalid};
use super::status::RINGFEED_OK;
use crate::log::{self, Level};

/// `ringfeed_set_log_callback`'s levels: an error the library could not
/// recover from for one caller.
pub const RINGFEED_LOG_ERROR: i32 = 1;
/// A fallback that costs speed or safety (io_uring refused, memory not
/// locked, direct reads refused, a cache that stopped writing), the first
/// network retry of each kind.
pub const RINGFEED_LOG_WARN: i32 = 2;
/// A setup choice worth knowing (no reserved huge pages, no CUDA runtime,
/// workers not pinned), a shard read uncached.
pub const RINGFEED_LOG_INFO: i32 = 3;
/// Every network retry.
pub const RINGFEED_LOG_DEBUG: i32 = 4;

/// A log callback: `user` as given to `ringfeed_set_log_callback`, the
/// level (`RINGFEED_LOG_*`), and the message (UTF-8, valid only during the
/// call).
pub type ringfeed_log_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, level: i32, message: *const c_char)>;

/// The user pointer, carried to engine threads.
struct User(*mut c_void);
// SAFETY: the library never reads through it; it is handed back to the
// callback, whose owner said it may be called from any thread.
unsafe impl Send for User {}
// SAFETY: as above.
unsafe impl Sync for User {}

impl User {
    /// A method, so a closure captures the whole `User` (Send), not the
    /// pointer field (disjoint capture).
    fn ptr(&self) -> *mut c_void {
        self.0
    }
}

/// Sends the library's log messages up to `max_level` (`RINGFEED_LOG_*`) to
/// `callback`, with `user`; a NULL callback stops them. The callback may be
/// called from any thread, from several at once, and must return soon; it
/// must not call into the library. Once this function returns, the
/// previous callback is not called any more. Each fallback is logged once
/// per process, when it happens (a loader's setup notes at its open).
///
/// # Safety
/// `callback`, if not NULL, must be callable as declared from any thread
/// until it is replaced, with `user`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_set_log_callback(
    callback: ringfeed_log_callback,
    user: *mut c_void,
    max_level: i32,
) -> i32 {
    boundary(|| {
        let Some(cb) = callback else {
            log::set(None, Level::Error);
            return Ok(RINGFEED_OK);
        };
        let max = Level::from_i32(max_level).ok_or_else(|| {
            invalid(format!(
                "`max_level` is {max_level}: one of RINGFEED_LOG_ERROR (1) to RINGFEED_LOG_DEBUG (4)"
            ))
        })?;
        let user = User(user);
        log::set(
            Some(Box::new(move |level, msg| {
                let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
                // SAFETY: the caller's contract for `callback` and `user`.
                unsafe { cb(user.ptr(), level as i32, text.as_ptr()) }
            })),
            max,
        );
        Ok(RINGFEED_OK)
    })
}
