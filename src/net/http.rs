//! HTTP/1.1 for the data plane, as pure functions: URLs, the ranged `GET`
//! request, the response head (parsed with httparse), and what each failure
//! means for a retry. The object requests are made for, and the requests
//! themselves, are `super::object`'s. The sockets live in `crate::fetch`
//! (`http_sync.rs`, `uring_http.rs`); nothing here does I/O.

use std::fmt;
use std::time::Duration;

/// The parts of an `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub target: String,
}

/// Parses `http(s)://host[:port]/path[?query]`.
pub fn parse_url(url: &str) -> Result<ParsedUrl, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err("not an http:// or https:// URL".into());
    };
    let (authority, target) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return Err("credentials in the URL are not supported; use the configuration".into());
    }
    if authority.is_empty() {
        return Err("the URL has no host".into());
    }
    // The host goes into the `Host:` header as it is written here.
    if authority.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("the host holds spaces or control characters".into());
    }
    let (host, port) = if let Some(h) = authority.strip_prefix('[') {
        // [v6]:port
        let end = h.find(']').ok_or("unclosed `[` in the host")?;
        let port = match &h[end + 1..] {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?),
        };
        (h[..end].to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    // Brackets hold an IPv6 address (it has colons), and only they do.
    if host.contains(['[', ']']) || host.contains(':') != authority.starts_with('[') {
        return Err("an IPv6 address must be in brackets, and only it: http://[::1]:8080/".into());
    }
    let port = match port {
        None => {
            if tls {
                443
            } else {
                80
            }
        }
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("bad port `{p}`"))?,
    };
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("the path holds spaces or control characters; percent-encode them".into());
    }
    Ok(ParsedUrl {
        tls,
        host,
        port,
        target: target.to_string(),
    })
}

/// What the response head says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    /// Bytes of the head, including the blank line.
    pub head_len: usize,
    pub content_length: Option<u64>,
    /// `Content-Range: bytes start-end/total`.
    pub content_range: Option<(u64, u64, Option<u64>)>,
    /// `Content-Range: bytes */total`: the object's size, sent with a `416`
    /// to a range that starts at or past its end.
    pub unsatisfied_total: Option<u64>,
    /// False when the server says `Connection: close` (or speaks HTTP/1.0).
    pub keep_alive: bool,
    pub chunked: bool,
    /// The `ETag` as sent (`"abc"`, or a weak `W/"abc"`).
    pub etag: Option<String>,
    /// `Last-Modified` as sent (printable characters, cut at 300): the
    /// validator of a server that sends no ETag (`python -m http.server`).
    pub last_modified: Option<String>,
    /// `Retry-After` in seconds (RFC 9110 §10.2.3), when given as a number;
    /// the HTTP-date form is not read (no server of ours sends it).
    pub retry_after: Option<u64>,
    /// The first 200 bytes of an error body are not here: see `error_code`.
    pub reason: String,
    /// `Location`, as sent: where a redirect points (`super::redirect`).
    pub location: Option<String>,
    /// `X-Error-Code` and `X-Error-Message`, which the Hugging Face Hub
    /// sends with its refusals (`RepoNotFound`, `GatedRepo`, ...).
    pub x_error: Option<(String, String)>,
}

/// Longest `X-Error-Message` kept: the Hub's are one sentence; a longer one
/// is cut, so a server cannot fill a message with its text.
const MAX_X_ERROR: usize = 300;

impl ResponseHead {
    /// `HTTP 404 Not Found`, with the server's `X-Error-Code` and message
    /// when it sent them: what an error names of a refusal.
    pub fn status_text(&self) -> String {
        match &self.x_error {
            Some((code, msg)) if msg.is_empty() => {
                format!("HTTP {} {} ({code})", self.status, self.reason)
            }
            Some((code, msg)) => format!("HTTP {} {} ({code}: {msg})", self.status, self.reason),
            None => format!("HTTP {} {}", self.status, self.reason),
        }
    }
}

/// A header value a server controls, made fit for a message: control
/// characters dropped, at most `MAX_X_ERROR` characters.
fn printable(v: &str) -> String {
    v.chars()
        .filter(|c| !c.is_control())
        .take(MAX_X_ERROR)
        .collect()
}

/// Largest response head accepted. S3's are under 1 KiB.
pub const MAX_HEAD: usize = 16 << 10;

/// Parses a response head from the start of `buf`; `Ok(None)` when more
/// bytes are needed.
pub fn parse_head(buf: &[u8]) -> Result<Option<ResponseHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let head_len = match r.parse(buf) {
        // The limit holds however the head arrives: in one read, or in
        // pieces that meet the `Partial` check below.
        Ok(httparse::Status::Complete(n)) if n > MAX_HEAD => {
            return Err(format!("response head longer than {MAX_HEAD} bytes"));
        }
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_HEAD {
                return Err(format!("response head longer than {MAX_HEAD} bytes"));
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("malformed HTTP response: {e}")),
    };
    let status = r.code.unwrap_or(0);
    let mut h = ResponseHead {
        status,
        head_len,
        content_length: None,
        content_range: None,
        unsatisfied_total: None,
        keep_alive: r.version == Some(1),
        chunked: false,
        etag: None,
        last_modified: None,
        retry_after: None,
        reason: r.reason.unwrap_or("").to_string(),
        location: None,
        x_error: None,
    };
    let mut x_code = None;
    let mut x_message = String::new();
    for hd in r.headers.iter() {
        let v = std::str::from_utf8(hd.value).unwrap_or("").trim();
        if hd.name.eq_ignore_ascii_case("content-length") {
            h.content_length = Some(v.parse().map_err(|_| format!("bad Content-Length `{v}`"))?);
        } else if hd.name.eq_ignore_ascii_case("content-range") {
            match v.strip_prefix("bytes */") {
                Some(t) => {
                    h.unsatisfied_total =
                        Some(t.parse().map_err(|_| format!("bad Content-Range `{v}`"))?);
                }
                None => h.content_range = Some(parse_content_range(v)?),
            }
        } else if hd.name.eq_ignore_ascii_case("connection") {
            if v.eq_ignore_ascii_case("close") {
                h.keep_alive = false;
            } else if v.eq_ignore_ascii_case("keep-alive") {
                h.keep_alive = true;
            }
        } else if hd.name.eq_ignore_ascii_case("transfer-encoding") {
            h.chunked = v.to_ascii_lowercase().contains("chunked");
        } else if hd.name.eq_ignore_ascii_case("etag") && !v.is_empty() {
            h.etag = Some(v.to_string());
        } else if hd.name.eq_ignore_ascii_case("last-modified") && !v.is_empty() {
            h.last_modified = Some(printable(v));
        } else if hd.name.eq_ignore_ascii_case("retry-after") {
            h.retry_after = v.parse().ok();
        } else if hd.name.eq_ignore_ascii_case("location") && !v.is_empty() {
            h.location = Some(v.to_string());
        } else if hd.name.eq_ignore_ascii_case("x-error-code") && !v.is_empty() {
            x_code = Some(printable(v));
        } else if hd.name.eq_ignore_ascii_case("x-error-message") {
            x_message = printable(v);
        }
    }
    h.x_error = x_code.map(|c| (c, x_message));
    Ok(Some(h))
}

fn parse_content_range(v: &str) -> Result<(u64, u64, Option<u64>), String> {
    let bad = || format!("bad Content-Range `{v}`");
    let rest = v.strip_prefix("bytes ").ok_or_else(bad)?;
    let (range, total) = rest.split_once('/').ok_or_else(bad)?;
    let (a, b) = range.split_once('-').ok_or_else(bad)?;
    let a: u64 = a.parse().map_err(|_| bad())?;
    let b: u64 = b.parse().map_err(|_| bad())?;
    let total = if total == "*" {
        None
    } else {
        Some(total.parse().map_err(|_| bad())?)
    };
    // RFC 9110 §14.4: invalid when the last byte precedes the first, or
    // is not inside the complete length.
    if b < a || total.is_some_and(|t| t <= b) {
        return Err(bad());
    }
    Ok((a, b, total))
}

pub use crate::error::FailKind;

impl FailKind {
    /// The kind of an HTTP status that is not a success.
    pub fn of_status(status: u16) -> FailKind {
        match status {
            429 | 503 => FailKind::Throttled,
            500..=599 => FailKind::ServerError,
            _ => FailKind::Client,
        }
    }

    /// The kind of a socket error.
    pub fn of_io(e: &std::io::Error) -> FailKind {
        use std::io::ErrorKind as K;
        if let Some(inner) = e.get_ref()
            && inner.downcast_ref::<rustls::Error>().is_some()
        {
            return FailKind::Tls;
        }
        match e.kind() {
            K::ConnectionRefused => FailKind::Refused,
            K::TimedOut | K::WouldBlock => FailKind::Stalled,
            K::UnexpectedEof => FailKind::Truncated,
            _ => FailKind::Reset,
        }
    }
}

/// A failed ranged read: what kind, and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpFail {
    pub kind: FailKind,
    pub message: String,
    /// S3's error code from the XML error body (`NoSuchKey`), when there was one.
    pub code: Option<String>,
    /// `FailKind::Changed`: the version the read was pinned to, and what
    /// the answer said instead.
    pub changed: Option<Box<(String, String)>>,
    /// The answer's `Retry-After`: how long the server asked to wait.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for HttpFail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.name())
    }
}

impl HttpFail {
    pub fn new(kind: FailKind, message: impl Into<String>) -> HttpFail {
        HttpFail {
            kind,
            message: message.into(),
            code: None,
            changed: None,
            retry_after: None,
        }
    }

    /// The object changed under a pinned read: `expected` the pinned
    /// version, `seen` the answer's.
    pub fn changed(url: &str, expected: String, seen: String) -> HttpFail {
        HttpFail {
            kind: FailKind::Changed,
            message: format!(
                "{url}: the object changed while it was read (pinned to {expected}, an answer was {seen})"
            ),
            code: None,
            changed: Some(Box::new((expected, seen))),
            retry_after: None,
        }
    }

    /// The error of a read that failed for good after `attempts` attempts:
    /// [`Error::Changed`] when the object changed, else [`Error::Http`].
    pub fn into_error(self, url: &str, attempts: u32) -> crate::error::Error {
        match self.changed {
            Some(versions) if self.kind == FailKind::Changed => {
                let (expected, seen) = *versions;
                crate::error::Error::Changed {
                    url: url.to_string(),
                    expected,
                    seen,
                }
            }
            _ => crate::error::Error::Http {
                url: url.to_string(),
                kind: self.kind,
                message: self.message,
                attempts,
            },
        }
    }
}

/// What a response to a ranged `GET` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeBody {
    /// Body bytes to read: the range's length, or (`open_end`) up to the
    /// object's end.
    pub len: u64,
    /// The object's size, when the response says it (`Content-Range`'s
    /// total, or a `200`'s `Content-Length`).
    pub total: Option<u64>,
}

/// Checks that a response answers `GET start..start+len` with exactly that
/// range; returns the body length to read and the object's size when the
/// response gives it.
///
/// With `open_end` the object's size is not known yet (a shard sized by its
/// first read): the range may run past the object's end, so a `206` for
/// `start..total`, a `200` with the whole object when it fits in the range,
/// and a `416` with `Content-Range: bytes */total` for a start at or past
/// the end (an empty object) are answers too; the size must be in the
/// response, else the read fails with a named protocol error.
pub fn check_range_response(
    h: &ResponseHead,
    start: u64,
    len: u64,
    open_end: bool,
) -> Result<RangeBody, HttpFail> {
    match h.status {
        206 => {}
        200 if start == 0 && h.content_length == Some(len) && !h.chunked => {
            return Ok(RangeBody {
                len,
                total: Some(len),
            });
        }
        200 if open_end
            && start == 0
            && !h.chunked
            && h.content_length.is_some_and(|n| n < len) =>
        {
            // The whole object, smaller than the range: some servers answer
            // a range that covers everything with a plain 200.
            return Ok(RangeBody {
                len: h.content_length.unwrap_or(0),
                total: h.content_length,
            });
        }
        200 => {
            return Err(HttpFail::new(
                FailKind::Protocol,
                "the server ignored the Range header (200 instead of 206)",
            ));
        }
        416 if open_end => {
            return match h.unsatisfied_total {
                Some(total) if total <= start => Ok(RangeBody {
                    len: 0,
                    total: Some(total),
                }),
                Some(total) => Err(HttpFail::new(
                    FailKind::Protocol,
                    format!("416 for bytes from {start} of a {total}-byte object"),
                )),
                None => Err(HttpFail::new(
                    FailKind::Protocol,
                    "416 without the object's size (`Content-Range: bytes */SIZE`); the size \
                     is needed to read the object: give it in a manifest",
                )),
            };
        }
        s if s >= 300 => {
            let mut f = HttpFail::new(FailKind::of_status(s), h.status_text());
            f.retry_after = h.retry_after.map(Duration::from_secs);
            return Err(f);
        }
        s => {
            return Err(HttpFail::new(
                FailKind::Protocol,
                format!("unexpected HTTP {s}"),
            ));
        }
    }
    if h.chunked {
        return Err(HttpFail::new(
            FailKind::Protocol,
            "chunked transfer encoding for a byte range is not supported",
        ));
    }
    let end = start + len - 1;
    let body = match h.content_range {
        Some((_, _, None)) if open_end => {
            return Err(HttpFail::new(
                FailKind::Protocol,
                "206 without the object's size (`Content-Range: bytes a-b/*`); the size is \
                 needed to read the object: give it in a manifest",
            ));
        }
        Some((a, b, total)) if a == start && b == end => RangeBody { len, total },
        // The object ends inside the range: what is left of it.
        Some((a, b, Some(total))) if open_end && a == start && b < end && b + 1 == total => {
            RangeBody {
                len: b - a + 1,
                total: Some(total),
            }
        }
        Some((a, b, _)) => {
            return Err(HttpFail::new(
                FailKind::Truncated,
                format!("asked bytes {start}-{end} but the server sent {a}-{b}"),
            ));
        }
        None => {
            return Err(HttpFail::new(
                FailKind::Protocol,
                "206 without Content-Range",
            ));
        }
    };
    // A length that contradicts the range is a broken answer (a proxy's, a
    // load balancer's): another attempt may get a sound one.
    if let Some(cl) = h.content_length
        && cl != body.len
    {
        return Err(HttpFail::new(
            FailKind::Truncated,
            format!(
                "Content-Length {cl} does not match the {}-byte range",
                body.len
            ),
        ));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://h:8080/a/b.tar?x=1").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.target.as_str()),
            (false, "h", 8080, "/a/b.tar?x=1")
        );
        let u = parse_url("https://[::1]/k").unwrap();
        assert_eq!((u.tls, u.host.as_str(), u.port), (true, "::1", 443));
        for bad in [
            "ftp://x",
            "http://",
            "http://h:99999/",
            "http://u:p@h/",
            "http://h/a b",
            "http://h:0/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn heads_and_ranges() {
        let r = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 5-14/100\r\n\r\nbody";
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!(h.head_len, r.len() - 4);
        assert_eq!(
            check_range_response(&h, 5, 10, false),
            Ok(RangeBody {
                len: 10,
                total: Some(100)
            })
        );
        assert_eq!(
            check_range_response(&h, 6, 10, false).unwrap_err().kind,
            FailKind::Truncated
        );
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
                .unwrap()
                .is_none()
        );
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        let h = parse_head(b"HTTP/1.1 503 Slow Down\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        assert_eq!(
            check_range_response(&h, 0, 1, false).unwrap_err().kind,
            FailKind::Throttled
        );
        let h = parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        let e = check_range_response(&h, 0, 1, false).unwrap_err();
        assert_eq!(e.kind, FailKind::Client);
        assert!(!e.kind.retryable());
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            check_range_response(&h, 0, 10, false).unwrap_err().kind,
            FailKind::Protocol
        );
        assert!(parse_head(b"HTTP/1.1 206 X\r\nContent-Range: bytes 9-1/5\r\n\r\n").is_err());
        assert!(parse_head(&[b'a'; MAX_HEAD]).is_err());
    }

    /// Reads of an object whose size is not known yet: the answer says it,
    /// however the object ends relative to the range; an answer that does
    /// not say it is a named error.
    #[test]
    fn open_ended_ranges_learn_the_size() {
        let head = |s: &str| parse_head(s.as_bytes()).unwrap().unwrap();
        let body = |h: &ResponseHead, start, len| check_range_response(h, start, len, true);
        // The object is larger than the range.
        let h =
            head("HTTP/1.1 206 P\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/500\r\n\r\n");
        assert_eq!(
            body(&h, 0, 10),
            Ok(RangeBody {
                len: 10,
                total: Some(500)
            })
        );
        // Smaller: what there is.
        let h = head("HTTP/1.1 206 P\r\nContent-Length: 4\r\nContent-Range: bytes 0-3/4\r\n\r\n");
        assert_eq!(
            body(&h, 0, 10),
            Ok(RangeBody {
                len: 4,
                total: Some(4)
            })
        );
        // ... which is a short answer when the size was known.
        assert_eq!(
            check_range_response(&h, 0, 10, false).unwrap_err().kind,
            FailKind::Truncated
        );
        // A 206 that stops before the object's end is not the object's end.
        let h = head("HTTP/1.1 206 P\r\nContent-Range: bytes 0-3/8\r\n\r\n");
        assert_eq!(body(&h, 0, 10).unwrap_err().kind, FailKind::Truncated);
        // The whole object with 200, smaller than the range.
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n");
        assert_eq!(
            body(&h, 0, 10),
            Ok(RangeBody {
                len: 7,
                total: Some(7)
            })
        );
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 70\r\n\r\n");
        assert!(
            body(&h, 0, 10)
                .unwrap_err()
                .message
                .contains("ignored the Range")
        );
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(body(&h, 0, 10).unwrap_err().kind, FailKind::Protocol);
        // An empty object.
        let h = head("HTTP/1.1 416 R\r\nContent-Range: bytes */0\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(h.unsatisfied_total, Some(0));
        assert_eq!(
            body(&h, 0, 10),
            Ok(RangeBody {
                len: 0,
                total: Some(0)
            })
        );
        assert_eq!(
            check_range_response(&h, 0, 10, false).unwrap_err().kind,
            FailKind::Client
        );
        // No size in the answer.
        let h = head("HTTP/1.1 416 R\r\nContent-Length: 0\r\n\r\n");
        assert!(body(&h, 0, 10).unwrap_err().message.contains("manifest"));
        let h = head("HTTP/1.1 416 R\r\nContent-Range: bytes */9\r\n\r\n");
        assert_eq!(body(&h, 0, 10).unwrap_err().kind, FailKind::Protocol);
        let h = head("HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/*\r\n\r\n");
        assert!(body(&h, 0, 10).unwrap_err().message.contains("manifest"));
        assert!(parse_head(b"HTTP/1.1 416 R\r\nContent-Range: bytes */x\r\n\r\n").is_err());
    }

    /// Found by the `http_response` property that a head is at most
    /// `MAX_HEAD` bytes: a longer one was refused when it came in pieces
    /// but taken when it came in one read.
    #[test]
    fn a_head_longer_than_max_head_is_refused_however_it_arrives() {
        let mut head = b"HTTP/1.1 206 P\r\nX-Pad: ".to_vec();
        head.resize(MAX_HEAD + 100, b'a');
        head.extend_from_slice(b"\r\nContent-Range: bytes 0-9/10\r\n\r\n");
        assert!(parse_head(&head[..MAX_HEAD]).is_err());
        assert!(parse_head(&head).is_err());
    }

    /// Found by fuzzing (`http_response`): `bytes 256-265/1` was read as
    /// 10 bytes of a 1-byte object; the fetcher took the body, and the
    /// object's size from it.
    #[test]
    fn a_content_range_past_the_object_size_is_refused() {
        for v in ["bytes 256-265/1", "bytes 0-9/9", "bytes 0-9/0"] {
            let head = format!("HTTP/1.1 206 P\r\nContent-Range: {v}\r\n\r\n");
            assert!(parse_head(head.as_bytes()).is_err(), "{v}");
        }
        let h = parse_head(b"HTTP/1.1 206 P\r\nContent-Range: bytes 0-9/10\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.content_range, Some((0, 9, Some(10))));
    }

    /// Found by fuzzing (`http_request`): `http://0::1]:90/k` gave the
    /// host `0::1]`, which no URL printed back gives again; an empty host
    /// before a port (`http://:80/`) was taken too.
    #[test]
    fn a_host_is_a_name_or_a_bracketed_ipv6_address() {
        for bad in [
            "http://0::1]:90/k",
            "http://a:b:80/",
            "http://::1/",
            "http://:80/",
            "http://[]:80/",
            "http://[::1]x]:80/",
            "http://[1[81]:8",
            "http://[host]:80/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let u = parse_url("http://[::1]:9000/b").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9000));
    }

    /// Found by fuzzing (`http_request`): a NUL, a space or a line break in
    /// the host went into the `Host:` header as it was (a line break there
    /// adds headers to the request).
    #[test]
    fn a_host_with_spaces_or_control_characters_is_refused() {
        for bad in [
            "https://bucket.s3.us-east-1\0.am/a",
            "http://a b/x.tar",
            "http://h\r\nX-Injected: 1/x.tar",
            "http://h\x7f:80/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }
}
