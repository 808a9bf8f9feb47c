//! The library's version, for a caller to check which build it loaded.

use std::ffi::{CStr, c_char};

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
