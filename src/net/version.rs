//! One version per read: the [`VersionPin`] that every request of a read
//! spanning several requests (a shard's ranged GETs, a whole object's
//! parts, a cache fill) carries and every answer is checked against, what
//! makes an ETag a strong validator, and the switch that turns the checks
//! off for the test that shows what they prevent. Pure: the readers
//! (`crate::fetch`) send `If-Match` and call [`VersionPin::check`] on each
//! response head (`super::http`).

#[cfg(feature = "test-hooks")]
use std::sync::atomic::Ordering;

use super::http::{HttpFail, ResponseHead};

/// Whether reads check their answers against their [`VersionPin`]: always,
/// except in the test that shows what the check prevents
/// (`tests/versions_unpinned.rs`, built with the `test-hooks` feature).
/// Relaxed: a flag set once before the reads it governs start.
#[cfg(feature = "test-hooks")]
static VERSION_CHECKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the version checks of every read in the process off (no
/// `If-Match` sent, answers' ETags and sizes not compared, fills cached
/// whatever their pieces were). Only for the test that shows the splice
/// the checks prevent: only in a build with the `test-hooks` feature,
/// which no program ships.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub fn set_version_checks(on: bool) {
    VERSION_CHECKS.store(on, Ordering::Relaxed);
}

#[cfg(feature = "test-hooks")]
fn version_checks() -> bool {
    VERSION_CHECKS.load(Ordering::Relaxed)
}

#[cfg(not(feature = "test-hooks"))]
fn version_checks() -> bool {
    true
}

/// Whether an `ETag` is a strong validator: not `W/` (RFC 9110 §8.8.1: a
/// weak tag may stay the same when the bytes change, and `If-Match` never
/// matches one).
pub fn is_strong(etag: &str) -> bool {
    !etag.starts_with("W/") && etag.len() >= 2 && etag.starts_with('"') && etag.ends_with('"')
}

/// The one version a read that spans several requests is pinned to (a
/// shard's ranged GETs, a whole object's parts, a cache fill): set by what
/// planned the read (a `HEAD`'s ETag and size, a listing's or manifest's
/// size) or else by the first answer, and checked against every answer.
/// Every GET carries `If-Match` with the pinned ETag when it is strong, so
/// a server that changed the object answers 412; an answer with another
/// ETag, or another object size in `Content-Range`, is
/// `FailKind::Changed` all the same (a server that ignores `If-Match`).
/// Shared by the reads of one object in flight at once, so the first
/// answer of several sets it and the others compare.
#[derive(Debug, Default)]
pub struct VersionPin {
    /// The pinned ETag as sent; `None` inside when the first answer had
    /// none (the server gives none: nothing to compare, and not cached).
    etag: std::sync::OnceLock<Option<String>>,
    /// The object's size the read was planned for, or the first answer's.
    size: std::sync::OnceLock<u64>,
    /// The `Last-Modified` planned for or first answered, compared while
    /// no strong ETag is pinned: the one validator a server without ETags
    /// (`python -m http.server`) gives. One second of resolution: a
    /// rewrite of the same size within the same second goes unseen.
    modified: std::sync::OnceLock<Option<String>>,
}

impl VersionPin {
    /// Pinned by what planned the read: the ETag a `HEAD` gave (strong or
    /// not) and the size, where known; the rest by the first answer.
    pub fn planned(etag: Option<String>, size: Option<u64>) -> VersionPin {
        let pin = VersionPin::default();
        if let Some(tag) = etag {
            let _ = pin.etag.set(Some(tag));
        }
        if let Some(n) = size {
            let _ = pin.size.set(n);
        }
        pin
    }

    /// Pinned to `Last-Modified` too, as the listing's `HEAD` gave it.
    pub fn with_modified(self, modified: Option<String>) -> VersionPin {
        if modified.is_some() {
            let _ = self.modified.set(modified);
        }
        self
    }

    /// The `If-Match` value for the next request: the pinned ETag when it
    /// is strong.
    pub fn if_match(&self) -> Option<&str> {
        if !version_checks() {
            return None;
        }
        match self.etag.get() {
            Some(Some(tag)) if is_strong(tag) => Some(tag),
            _ => None,
        }
    }

    /// The strong ETag every answer so far carried: what may key a cache
    /// entry. `None` when the server gave none, or a weak one.
    pub fn strong(&self) -> Option<&str> {
        match self.etag.get() {
            Some(Some(tag)) if is_strong(tag) => Some(tag),
            _ => None,
        }
    }

    /// Checks the answer `h` to a request of this read (the first answer
    /// sets what is not pinned yet); a change is `FailKind::Changed`,
    /// which is never retried.
    pub fn check(&self, url: &str, h: &ResponseHead) -> Result<(), HttpFail> {
        if !version_checks() {
            return Ok(());
        }
        let named = |tag: &Option<String>| match tag {
            Some(t) => format!("ETag {t}"),
            None => "no ETag".to_string(),
        };
        if h.status == 412 {
            let pinned = self.etag.get().cloned().flatten();
            return Err(HttpFail::changed(
                url,
                named(&pinned),
                "412 Precondition Failed to If-Match".into(),
            ));
        }
        // The object's size as the answer gives it: a `Content-Range`
        // total, a 416's size, or a whole object's length.
        let total = match h.status {
            206 => h.content_range.and_then(|(_, _, t)| t),
            416 => h.unsatisfied_total,
            200 if !h.chunked => h.content_length,
            _ => return Ok(()),
        };
        if let Some(t) = total {
            let planned = *self.size.get_or_init(|| t);
            if planned != t {
                return Err(HttpFail::changed(
                    url,
                    format!("{planned} bytes (the size the read was planned for)"),
                    format!("{t} bytes"),
                ));
            }
        }
        // A 416 sends no representation, so no validator to compare.
        if h.status != 416 {
            let pinned = self.etag.get_or_init(|| h.etag.clone());
            if *pinned != h.etag {
                return Err(HttpFail::changed(url, named(pinned), named(&h.etag)));
            }
            // No strong ETag: `Last-Modified` is what is left to tell two
            // versions of one size apart (compared where both have one).
            let strong = pinned.as_deref().is_some_and(is_strong);
            let modified = self.modified.get_or_init(|| h.last_modified.clone());
            if !strong
                && let (Some(was), Some(now)) = (modified, &h.last_modified)
                && was != now
            {
                return Err(HttpFail::changed(
                    url,
                    format!("Last-Modified {was}"),
                    format!("Last-Modified {now}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, FailKind};
    use crate::net::http::parse_head;

    /// Without ETags, `Last-Modified` tells two versions of one size
    /// apart; with a strong ETag it is not looked at (the ETag decides).
    #[test]
    fn without_an_etag_last_modified_is_the_version() {
        let head = |s: &str| parse_head(s.as_bytes()).unwrap().unwrap();
        let at = |t: &str, tag: &str| {
            head(&format!(
                "HTTP/1.1 206 P\r\n{tag}Last-Modified: {t}\r\nContent-Range: bytes 0-9/100\r\n\r\n"
            ))
        };
        let (t1, t2) = (
            "Sun, 06 Dec 2026 10:00:00 GMT",
            "Sun, 06 Dec 2026 10:00:01 GMT",
        );
        let pin = VersionPin::default();
        pin.check("u", &at(t1, "")).unwrap();
        pin.check("u", &at(t1, "")).unwrap();
        let f = pin.check("u", &at(t2, "")).unwrap_err();
        assert_eq!(f.kind, FailKind::Changed);
        assert_eq!(
            f.changed.as_deref(),
            Some(&(format!("Last-Modified {t1}"), format!("Last-Modified {t2}")))
        );
        // Planned by the listing's HEAD: the first GET is held to it.
        let planned = VersionPin::planned(None, Some(100)).with_modified(Some(t1.into()));
        assert_eq!(
            planned.check("u", &at(t2, "")).unwrap_err().kind,
            FailKind::Changed
        );
        // An answer without the header has nothing to compare.
        let bare = head("HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/100\r\n\r\n");
        VersionPin::planned(None, Some(100))
            .with_modified(Some(t1.into()))
            .check("u", &bare)
            .unwrap();
        // Control: a strong ETag decides alone.
        let tagged = VersionPin::default();
        tagged.check("u", &at(t1, "ETag: \"a\"\r\n")).unwrap();
        tagged.check("u", &at(t2, "ETag: \"a\"\r\n")).unwrap();
    }

    /// One read, one version: the first answer (or the plan) pins the
    /// ETag and size, every later answer is compared, a 412 is a change,
    /// and only a strong ETag goes into `If-Match` or keys a cache entry.
    #[test]
    fn a_pin_takes_one_version_and_names_any_other() {
        let head = |s: &str| parse_head(s.as_bytes()).unwrap().unwrap();
        let a = head("HTTP/1.1 206 P\r\nETag: \"a\"\r\nContent-Range: bytes 0-9/100\r\n\r\n");
        let pin = VersionPin::default();
        assert_eq!(pin.if_match(), None);
        pin.check("u", &a).unwrap();
        assert_eq!(
            (pin.if_match(), pin.strong()),
            (Some("\"a\""), Some("\"a\""))
        );
        pin.check("u", &a).unwrap();
        let b = head("HTTP/1.1 206 P\r\nETag: \"b\"\r\nContent-Range: bytes 10-19/100\r\n\r\n");
        let f = pin.check("u", &b).unwrap_err();
        assert_eq!(f.kind, FailKind::Changed);
        assert!(!f.kind.retryable());
        assert_eq!(
            f.changed.as_deref(),
            Some(&("ETag \"a\"".to_string(), "ETag \"b\"".to_string()))
        );
        match f.into_error("s3://b/k", 1) {
            Error::Changed {
                url,
                expected,
                seen,
            } => assert_eq!(
                (url.as_str(), expected.as_str(), seen.as_str()),
                ("s3://b/k", "ETag \"a\"", "ETag \"b\"")
            ),
            e => panic!("{e}"),
        }
        // The same ETag with another size is another version too.
        let longer = head("HTTP/1.1 206 P\r\nETag: \"a\"\r\nContent-Range: bytes 0-9/101\r\n\r\n");
        assert_eq!(pin.check("u", &longer).unwrap_err().kind, FailKind::Changed);
        let gone = head("HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n");
        let f = pin.check("u", &gone).unwrap_err();
        assert!(f.message.contains("412"), "{f}");
        // Planned by a HEAD: the first GET is already held to it.
        let planned = VersionPin::planned(Some("\"b\"".into()), Some(100));
        assert_eq!(planned.if_match(), Some("\"b\""));
        assert_eq!(planned.check("u", &a).unwrap_err().kind, FailKind::Changed);
        // A 416 carries no representation: only its size is compared.
        let past = head("HTTP/1.1 416 R\r\nContent-Range: bytes */100\r\n\r\n");
        planned.check("u", &past).unwrap();
        let shrunk = head("HTTP/1.1 416 R\r\nContent-Range: bytes */50\r\n\r\n");
        assert_eq!(
            planned.check("u", &shrunk).unwrap_err().kind,
            FailKind::Changed
        );
        // Weak or absent: compared, but never sent nor cached by.
        let weak = head("HTTP/1.1 206 P\r\nETag: W/\"w\"\r\nContent-Range: bytes 0-9/100\r\n\r\n");
        let pin = VersionPin::default();
        pin.check("u", &weak).unwrap();
        assert_eq!((pin.if_match(), pin.strong()), (None, None));
        assert_eq!(pin.check("u", &a).unwrap_err().kind, FailKind::Changed);
        let bare = head("HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/100\r\n\r\n");
        let pin = VersionPin::default();
        pin.check("u", &bare).unwrap();
        pin.check("u", &bare).unwrap();
        assert_eq!((pin.if_match(), pin.strong()), (None, None));
        assert_eq!(pin.check("u", &a).unwrap_err().kind, FailKind::Changed);
    }
}
