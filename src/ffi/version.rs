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

/// The version of the C ABI this library implements. It changes only when
/// an existing function, struct field or constant changes meaning or place;
/// new functions, status codes and fields at the end of a sized struct
/// keep it. A program compares it with the header's `RINGFEED_ABI_VERSION`.
pub const RINGFEED_ABI_VERSION: u32 = 1;

/// The library's `RINGFEED_ABI_VERSION`: a program built against another
/// ABI's header must not use this library.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_abi_version() -> u32 {
    RINGFEED_ABI_VERSION
}
