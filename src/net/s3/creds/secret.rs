//! A secret kept out of core dumps: its bytes live in pages of their own,
//! marked `MADV_DONTDUMP`, and are zeroed before the pages go back.
//!
//! A core dump of a training process (a crash, `gcore`, a debugger) is
//! often copied off the machine for analysis; the credentials it held must
//! not go with it. `Credentials` keeps its secret key and session token
//! here. The copies a signature needs while it is computed, and a request's
//! `X-Amz-Security-Token` header, live on the heap for that request only:
//! those are not covered, and docs/observability.md says so.

use std::fmt;

use memmap2::{Advice, MmapMut};

/// UTF-8 text in anonymous pages excluded from core dumps.
pub struct SecretText(Storage);

enum Storage {
    /// Whole pages of their own; the text is the first `len` bytes.
    Pages { map: MmapMut, len: usize },
    /// No pages could be mapped (address space exhausted): kept on the heap
    /// rather than lost, and said once, since that is a weaker guarantee.
    Heap(String),
}

impl SecretText {
    pub fn new(text: &str) -> SecretText {
        // `map_anon` of 0 bytes is refused; an empty secret needs no pages.
        if text.is_empty() {
            return SecretText(Storage::Heap(String::new()));
        }
        match MmapMut::map_anon(text.len()) {
            Ok(mut map) => {
                if let Err(e) = map.advise(Advice::DontDump) {
                    crate::log::once("secret-dontdump", crate::log::Level::Warn, || {
                        format!(
                            "madvise(MADV_DONTDUMP) refused ({e}): credentials may appear in core dumps"
                        )
                    });
                }
                map[..text.len()].copy_from_slice(text.as_bytes());
                SecretText(Storage::Pages {
                    map,
                    len: text.len(),
                })
            }
            Err(e) => {
                crate::log::once("secret-map", crate::log::Level::Warn, || {
                    format!("no pages for credentials ({e}): they may appear in core dumps")
                });
                SecretText(Storage::Heap(text.to_string()))
            }
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Copied from a `&str` and never written again but to zero it
            // in `drop`: always UTF-8.
            Storage::Pages { map, len } => std::str::from_utf8(&map[..*len]).unwrap_or(""),
            Storage::Heap(s) => s,
        }
    }

    /// Whether the text is in pages excluded from dumps (the test that reads
    /// the pages' flags checks this one).
    pub fn in_own_pages(&self) -> bool {
        matches!(self.0, Storage::Pages { .. })
    }
}

impl Clone for SecretText {
    fn clone(&self) -> SecretText {
        SecretText::new(self.as_str())
    }
}

impl PartialEq for SecretText {
    fn eq(&self, other: &SecretText) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SecretText {}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for SecretText {
    fn drop(&mut self) {
        if let Storage::Pages { map, .. } = &mut self.0 {
            // Volatile, so the zeroing of memory about to be unmapped is not
            // optimized away.
            for b in map.iter_mut() {
                // SAFETY: `b` is a valid, aligned byte of the mapping.
                unsafe { std::ptr::write_volatile(b, 0) };
            }
        }
    }
}
