//! The data plane's HTTP (`ringfeed::net::http`): response heads and the
//! body they frame, and the request built from a URL.
//!
//! `response` asserts: a head parsed as a socket delivers it (growing
//! prefixes, cut where the input says) is the head parsed whole, or fails
//! as it does; a head is at most `MAX_HEAD` bytes and ends where it says;
//! a range answer accepted for `start..start+len` frames a body of exactly
//! `len` bytes (less only when reading up to an object's unknown end, and
//! then ending there), inside the object's size when the answer gives one.
//!
//! `request` asserts: a URL `parse_url` accepts has a host, and the ranged
//! `GET` and the `HEAD` built for it parse back (httparse) as one request
//! with the target, `Host` and `Range` the URL and range say, and nothing
//! else; printing the parsed URL back and parsing it again gives it again.

use ringfeed::net::http::{MAX_HEAD, ResponseHead, check_range_response, parse_head, parse_url};
use ringfeed::net::object::HttpObject;

use super::{Input, segment_ends};

pub fn response(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.byte();
    let open_end = flags & 1 != 0;
    // Ranges as the fetchers ask them: a start below 2^40 and a length of
    // at least one byte, below 4 GiB.
    let start_word = u64::from(input.u32());
    let start = if flags & 2 != 0 { start_word << 8 } else { 0 };
    let len = u64::from(input.u32()).max(1);
    let cuts = input.cuts(8);
    let bytes = input.rest();

    let whole = parse_head(bytes);
    let mut incremental = Ok(None);
    for end in segment_ends(&cuts, bytes.len()) {
        incremental = parse_head(&bytes[..end]);
        if let Ok(Some(h)) = &incremental {
            assert!(h.head_len <= end, "the head ends past the bytes received");
        }
        if !matches!(incremental, Ok(None)) {
            break;
        }
    }
    match (&whole, &incremental) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the head depends on how it arrived ({cuts:?})"),
        (Err(_), Err(_)) => {}
        _ => panic!("the head depends on how it arrived ({cuts:?}): {whole:?} vs {incremental:?}"),
    }
    let Ok(Some(h)) = whole else { return };
    assert!(
        h.head_len <= MAX_HEAD,
        "a head of {} bytes was accepted",
        h.head_len
    );
    assert_eq!(parse_head(&bytes[..h.head_len]), Ok(Some(h.clone())));
    body(&h, start, len, open_end);
}

/// What a fetcher reads after the head: checked against the range asked.
fn body(h: &ResponseHead, start: u64, len: u64, open_end: bool) {
    let Ok(b) = check_range_response(h, start, len, open_end) else {
        return;
    };
    assert!(b.len <= len, "a body longer than the range: {b:?}");
    if !open_end {
        assert_eq!(b.len, len, "a short body for a range inside a known size");
    }
    match h.status {
        200 | 206 => {}
        // A start at or past the object's end: nothing to read there.
        416 => {
            assert!(open_end && b.len == 0 && b.total.is_some_and(|t| t <= start));
            return;
        }
        s => panic!("HTTP {s} accepted as a range answer"),
    }
    if b.len < len {
        // Only the object's end may shorten a range, and it must say where.
        assert_eq!(
            b.total,
            Some(start + b.len),
            "a short body that is not the object's end: {b:?} {h:?}"
        );
    }
    if let Some(total) = b.total {
        assert!(
            start + b.len <= total,
            "bytes {start}+{} of an object of {total} bytes accepted: {h:?}",
            b.len
        );
    }
}

pub fn request(data: &[u8]) {
    let mut input = Input::new(data);
    let start = u64::from(input.u32());
    let len = u64::from(input.u32()).max(1);
    let Ok(url) = std::str::from_utf8(input.rest()) else {
        return;
    };
    let Ok(p) = parse_url(url) else { return };
    assert!(!p.host.is_empty(), "`{url}` accepted without a host");
    let host = if p.host.contains(':') {
        format!("[{}]", p.host)
    } else {
        p.host.clone()
    };
    let scheme = if p.tls { "https" } else { "http" };
    let again = format!("{scheme}://{host}:{}{}", p.port, p.target);
    assert_eq!(
        parse_url(&again).as_ref(),
        Ok(&p),
        "`{url}` printed as `{again}`"
    );

    let obj = HttpObject::new(url, Vec::new()).expect("parse_url accepted it");
    let get = obj.range_request(start, len, None).expect("no signer");
    let range = format!("bytes={}-{}", start, start + len - 1);
    well_formed(&get, "GET", &obj, Some(&range));
    let head = obj.head_request().expect("no signer");
    well_formed(&head, "HEAD", &obj, None);
}

/// `req` is one whole request for `obj` with exactly the headers meant.
fn well_formed(req: &[u8], method: &str, obj: &HttpObject, range: Option<&str>) {
    let mut headers = [httparse::EMPTY_HEADER; 8];
    let mut r = httparse::Request::new(&mut headers);
    let n = match r.parse(req) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "the request for `{}` does not parse: {other:?}\n{}",
            obj.url,
            String::from_utf8_lossy(req)
        ),
    };
    let text = String::from_utf8_lossy(req);
    assert_eq!(
        n,
        req.len(),
        "bytes after the request for `{}`:\n{text}",
        obj.url
    );
    assert_eq!(r.method, Some(method));
    assert_eq!(r.path, Some(obj.target.as_str()), "{text}");
    let mut names = Vec::new();
    for h in r.headers.iter() {
        let v = std::str::from_utf8(h.value).expect("ascii header");
        match h.name {
            "Host" => assert_eq!(v, obj.host_header(), "{text}"),
            "Range" => assert_eq!(Some(v), range, "{text}"),
            "User-Agent" => {}
            other => panic!(
                "an extra header `{other}` in the request for `{}`:\n{text}",
                obj.url
            ),
        }
        names.push(h.name);
    }
    let want = if range.is_some() { 3 } else { 2 };
    assert_eq!(names.len(), want, "{text}");
}
