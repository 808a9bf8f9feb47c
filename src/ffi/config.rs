//! The configuration keys the library accepts, for bindings that check
//! keyword arguments before they build the JSON (Python's `config_keys`).

use std::ffi::{CString, c_char};
use std::sync::LazyLock;

/// The configuration keys this library accepts, comma-separated without
/// spaces, in the order the library declares them (`"urls,batch_size,..."`).
/// A static string.
#[unsafe(no_mangle)]
pub extern "C" fn ringfeed_config_keys() -> *const c_char {
    static KEYS: LazyLock<CString> = LazyLock::new(|| {
        // Keys are ASCII identifiers: no NUL inside.
        CString::new(crate::config::KEYS.join(",")).unwrap_or_default()
    });
    KEYS.as_ptr()
}
