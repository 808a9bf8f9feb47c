//! The decisions of the file server, as pure functions: what a request head
//! asks for, which file a request target names (or why it names none), which
//! bytes a `Range` header selects, and the response head that says so. No
//! sockets here; `server.rs` and `connection.rs` are the shell that reads
//! and writes.

use std::path::{Path, PathBuf};

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: Method,
    /// The request target as sent (`/a/b.tar?x=1`).
    pub target: String,
    /// The `Range` header value, when there is one.
    pub range: Option<String>,
    /// The `If-Match` header value, when there is one.
    pub if_match: Option<String>,
    /// Whether the client wants the connection kept open after the response.
    pub keep_alive: bool,
    /// Bytes of the head, blank line included.
    pub head_len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    /// Any other method: answered 405.
    Other,
}

/// Why a request head cannot be served; each maps to a status and closes
/// the connection, since the rest of the stream can no longer be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Not HTTP/1.x, or a head httparse rejects.
    Malformed(String),
    /// The head is longer than the limit.
    TooLarge,
    /// The request carries a body (`Content-Length` > 0 or
    /// `Transfer-Encoding`): a file server has no use for one, and skipping
    /// it safely would need a body parser.
    HasBody,
}

impl HeadError {
    pub fn status(&self) -> u16 {
        match self {
            HeadError::Malformed(_) | HeadError::HasBody => 400,
            HeadError::TooLarge => 431,
        }
    }

    pub fn message(&self) -> String {
        match self {
            HeadError::Malformed(m) => format!("malformed request: {m}"),
            HeadError::TooLarge => "request head too large".into(),
            HeadError::HasBody => "request bodies are not accepted".into(),
        }
    }
}

/// Most header lines in one request. curl sends 3–5, S3 SDKs about 10.
const MAX_HEADERS: usize = 64;

/// Parses a request head at the start of `buf`. `Ok(None)`: more bytes are
/// needed (and `buf` is still under `max_head`).
pub fn parse_request(buf: &[u8], max_head: usize) -> Result<Option<HttpRequest>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Request::new(&mut headers);
    let head_len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n > max_head => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let method = match r.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => Method::Other,
    };
    let version = r.version.unwrap_or(0);
    // HTTP/1.1 keeps the connection by default, HTTP/1.0 only when asked.
    let mut keep_alive = version == 1;
    let mut range = None;
    let mut if_match = None;
    for h in r.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| HeadError::Malformed(format!("header `{}` is not UTF-8", h.name)))?
            .trim();
        let name = h.name;
        if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("range") {
            range = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("if-match") {
            if_match = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && value != "0")
        {
            return Err(HeadError::HasBody);
        }
    }
    Ok(Some(HttpRequest {
        method,
        target: r.path.unwrap_or("").to_string(),
        range,
        if_match,
        keep_alive,
        head_len,
    }))
}

/// Why a target names no servable file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// Not an origin-form path, or a bad percent escape: 400.
    Bad(String),
    /// A `..` segment (after percent-decoding), or a NUL byte: refused, 403.
    Traversal,
}

/// Maps a request target to a path under `root`. The target is
/// percent-decoded *before* it is split into segments, so `%2e%2e` and
/// `..%2f` are seen as the `..` they are. Any `..` is refused rather than
/// normalised: a client has no honest reason to send one, and refusing
/// leaves nothing to get wrong. Empty and `.` segments are skipped.
///
/// Symbolic links under the root are followed, as nginx does by default:
/// whoever can place a link in the served directory already chose what it
/// serves (datasets are often directories of links into a cache).
pub fn file_path(root: &Path, target: &str) -> Result<PathBuf, TargetError> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(TargetError::Bad(format!(
            "the target `{}` is not an absolute path",
            printable(target)
        )));
    }
    let bytes = percent_decode(path).ok_or_else(|| {
        TargetError::Bad(format!("bad percent escape in `{}`", printable(target)))
    })?;
    if bytes.contains(&0) {
        return Err(TargetError::Traversal);
    }
    let mut out = root.to_path_buf();
    for seg in bytes.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => return Err(TargetError::Traversal),
            s => {
                use std::os::unix::ffi::OsStrExt;
                out.push(std::ffi::OsStr::from_bytes(s));
            }
        }
    }
    Ok(out)
}

/// `%XX` decoding; `None` on a truncated or non-hex escape.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A target shortened and stripped of control characters, for messages.
pub fn printable(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// What a `Range` header selects from a file of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeChoice {
    /// No header, or one RFC 9110 says to ignore (not `bytes=`, malformed,
    /// several ranges): the whole file, 200.
    Full,
    /// Bytes `start..=end`, 206.
    Part { start: u64, end: u64 },
    /// A well-formed range that selects nothing: 416.
    Unsatisfiable,
}

/// Interprets `Range: bytes=a-b`, `bytes=a-` and `bytes=-n` (the last n
/// bytes) against `size`, as RFC 9110 §14: an end past the file is clamped
/// to it, a start at or past it is unsatisfiable. Several ranges are served
/// as the whole file (allowed by the RFC; multipart bodies are a lot of code
/// no data loader needs).
pub fn choose_range(header: Option<&str>, size: u64) -> RangeChoice {
    let Some(h) = header else {
        return RangeChoice::Full;
    };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return RangeChoice::Full;
    };
    if spec.contains(',') {
        return RangeChoice::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeChoice::Full;
    };
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match (a.trim(), b.trim()) {
        ("", n) => match num(n) {
            None => RangeChoice::Full,
            Some(0) => RangeChoice::Unsatisfiable,
            Some(_) if size == 0 => RangeChoice::Unsatisfiable,
            Some(n) => RangeChoice::Part {
                start: size.saturating_sub(n),
                end: size - 1,
            },
        },
        (a, "") => match num(a) {
            None => RangeChoice::Full,
            Some(a) if a >= size => RangeChoice::Unsatisfiable,
            Some(a) => RangeChoice::Part {
                start: a,
                end: size - 1,
            },
        },
        (a, b) => match (num(a), num(b)) {
            (Some(a), Some(b)) if a <= b => {
                if a >= size {
                    RangeChoice::Unsatisfiable
                } else {
                    RangeChoice::Part {
                        start: a,
                        end: b.min(size - 1),
                    }
                }
            }
            _ => RangeChoice::Full,
        },
    }
}

/// Whether an `If-Match` header value holds for a file whose current ETag
/// is `etag` (RFC 9110 §13.1.1): `*`, or a list holding that ETag, compared
/// strongly (a weak `W/` tag in the list never matches). A client that
/// read part of a file pinned to its ETag is answered 412 once the file
/// changed, instead of bytes of the new version.
pub fn if_match_holds(header: &str, etag: &str) -> bool {
    let header = header.trim();
    header == "*"
        || header
            .split(',')
            .map(str::trim)
            .any(|t| !t.starts_with("W/") && t == etag)
}

/// The reason phrase of the statuses this server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        412 => "Precondition Failed",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A response head. `extra` holds whole header lines (`Name: v\r\n`).
pub fn response_head(
    status: u16,
    content_length: u64,
    extra: &str,
    keep_alive: bool,
    now_unix: u64,
) -> String {
    format!(
        "HTTP/1.1 {status} {}\r\nServer: ringfeed/{}\r\nDate: {}\r\nContent-Length: {content_length}\r\n\
         {extra}Connection: {}\r\n\r\n",
        reason(status),
        env!("CARGO_PKG_VERSION"),
        http_date(now_unix),
        if keep_alive { "keep-alive" } else { "close" },
    )
}

/// `Content-Type` for a file name: tar shards are the point of this server.
pub fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("tar") => "application/x-tar",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), which HTTP/1.1 asks an
/// origin server with a clock to send in `Date`.
pub fn http_date(unix: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = unix / 86_400;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads() {
        let r = parse_request(
            b"GET /a.tar HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\nX",
            8192,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.target, "/a.tar");
        assert_eq!(r.range.as_deref(), Some("bytes=0-9"));
        assert!(r.keep_alive);
        assert_eq!(r.head_len, 50);
        let r = parse_request(b"HEAD / HTTP/1.0\r\n\r\n", 8192)
            .unwrap()
            .unwrap();
        assert_eq!((r.method, r.keep_alive), (Method::Head, false));
        let r = parse_request(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 8192)
            .unwrap()
            .unwrap();
        assert!(r.keep_alive);
        let r = parse_request(b"GET / HTTP/1.1\r\nConnection: TE, close\r\n\r\n", 8192)
            .unwrap()
            .unwrap();
        assert!(!r.keep_alive);
        let r = parse_request(b"DELETE / HTTP/1.1\r\n\r\n", 8192)
            .unwrap()
            .unwrap();
        assert_eq!(r.method, Method::Other);
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHost:", 8192), Ok(None));
        let r = parse_request(b"GET / HTTP/1.1\r\nIf-Match: \"a-1\"\r\n\r\n", 8192)
            .unwrap()
            .unwrap();
        assert_eq!(r.if_match.as_deref(), Some("\"a-1\""));
    }

    #[test]
    fn if_match_compares_strongly() {
        assert!(if_match_holds("\"a-1\"", "\"a-1\""));
        assert!(if_match_holds("*", "\"a-1\""));
        assert!(if_match_holds("\"x\", \"a-1\"", "\"a-1\""));
        assert!(!if_match_holds("\"a-2\"", "\"a-1\""));
        assert!(!if_match_holds("W/\"a-1\"", "\"a-1\""));
        assert!(!if_match_holds("", "\"a-1\""));
    }

    #[test]
    fn bad_heads() {
        assert!(matches!(
            parse_request(b"\x16\x03\x01garbage\r\n\r\n", 8192),
            Err(HeadError::Malformed(_))
        ));
        assert!(matches!(
            parse_request(b"GET / HTTP/2.0\r\n\r\n", 8192),
            Err(HeadError::Malformed(_))
        ));
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(100));
        assert_eq!(parse_request(long.as_bytes(), 64), Err(HeadError::TooLarge));
        let whole = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(100));
        assert_eq!(
            parse_request(whole.as_bytes(), 64),
            Err(HeadError::TooLarge)
        );
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(100));
        assert_eq!(
            parse_request(many.as_bytes(), 8192),
            Err(HeadError::TooLarge)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 8192),
            Err(HeadError::HasBody)
        );
        assert_eq!(
            parse_request(
                b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                8192
            ),
            Err(HeadError::HasBody)
        );
    }

    #[test]
    fn targets_stay_under_the_root() {
        let root = Path::new("/srv/data");
        assert_eq!(
            file_path(root, "/a/b.tar?x=1").unwrap(),
            PathBuf::from("/srv/data/a/b.tar")
        );
        assert_eq!(
            file_path(root, "//./a%20b.tar").unwrap(),
            PathBuf::from("/srv/data/a b.tar")
        );
        for t in [
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/%2E%2E%2Fetc%2Fpasswd",
            "/a/..%2f..%2fetc",
            "/a%00.tar",
            "/..",
        ] {
            assert_eq!(file_path(root, t), Err(TargetError::Traversal), "{t}");
        }
        for t in ["etc/passwd", "http://x/a", "/a%2", "/a%zz", "*"] {
            assert!(
                matches!(file_path(root, t), Err(TargetError::Bad(_))),
                "{t}"
            );
        }
        // A segment merely starting with dots is a name, not a traversal.
        assert_eq!(
            file_path(root, "/...x/..y").unwrap(),
            PathBuf::from("/srv/data/...x/..y")
        );
    }

    #[test]
    fn ranges_follow_rfc_9110() {
        use RangeChoice::*;
        let c = |h: &str, size| choose_range(Some(h), size);
        assert_eq!(choose_range(None, 10), Full);
        assert_eq!(c("bytes=0-9", 10), Part { start: 0, end: 9 });
        assert_eq!(c("bytes=2-4", 10), Part { start: 2, end: 4 });
        assert_eq!(c("bytes=5-100", 10), Part { start: 5, end: 9 });
        assert_eq!(c("bytes=5-", 10), Part { start: 5, end: 9 });
        assert_eq!(c("bytes=-3", 10), Part { start: 7, end: 9 });
        assert_eq!(c("bytes=-30", 10), Part { start: 0, end: 9 });
        assert_eq!(c("bytes=10-20", 10), Unsatisfiable);
        assert_eq!(c("bytes=10-", 10), Unsatisfiable);
        assert_eq!(c("bytes=-0", 10), Unsatisfiable);
        assert_eq!(c("bytes=0-0", 0), Unsatisfiable);
        assert_eq!(c("bytes=-5", 0), Unsatisfiable);
        // Ignored, so the whole file.
        for h in [
            "items=0-1",
            "bytes=4-2",
            "bytes=a-b",
            "bytes=0-1,3-4",
            "bytes=+1-2",
            "bytes=-",
            "bytes=5",
        ] {
            assert_eq!(c(h, 10), Full, "{h}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(
            buf in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            max in 16usize..700,
        ) {
            if let Ok(Some(r)) = parse_request(&buf, max) {
                proptest::prop_assert!(r.head_len <= max && r.head_len <= buf.len());
            }
        }

        #[test]
        fn no_target_resolves_outside_the_root(
            segs in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("..".to_string()),
                    proptest::strategy::Just("%2e%2e".to_string()),
                    proptest::strategy::Just("%2E.".to_string()),
                    proptest::strategy::Just(".".to_string()),
                    proptest::strategy::Just("%2f".to_string()),
                    proptest::strategy::Just("".to_string()),
                    "[a-z.%0-9]{1,6}",
                ],
                0..8,
            ),
        ) {
            let root = Path::new("/srv/root");
            let target = format!("/{}", segs.join("/"));
            if let Ok(p) = file_path(root, &target) {
                proptest::prop_assert!(p.starts_with(root), "{target} -> {p:?}");
                proptest::prop_assert!(
                    p.components().all(|c| c != std::path::Component::ParentDir),
                    "{target} -> {p:?}"
                );
            }
        }

        #[test]
        fn chosen_ranges_lie_inside_the_file(
            a in proptest::option::of(0u64..2000),
            b in proptest::option::of(0u64..2000),
            size in 0u64..1500,
        ) {
            let h = format!(
                "bytes={}-{}",
                a.map(|v| v.to_string()).unwrap_or_default(),
                b.map(|v| v.to_string()).unwrap_or_default()
            );
            if let RangeChoice::Part { start, end } = choose_range(Some(&h), size) {
                proptest::prop_assert!(start <= end && end < size, "{h} on {size}");
            }
        }
    }

    #[test]
    fn dates_are_imf_fixdate() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(http_date(1_798_761_599), "Thu, 31 Dec 2026 23:59:59 GMT");
    }
}
