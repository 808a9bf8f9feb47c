//! The content host: a signed, unexpired URL's file, served by ranges,
//! every request's headers recorded.

use std::sync::atomic::Ordering;

use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use super::{Reply, State, decode, parse_range, query, repo, set, text, unix_now};

/// The content host: a signed, unexpired URL's file, by ranges.
pub(super) fn content(st: &State, req: &Request<Incoming>, path: &str) -> Response<Reply> {
    let headers: Vec<String> = req
        .headers()
        .iter()
        .map(|(k, v)| format!("{}: {}", k.as_str(), v.to_str().unwrap_or("?")).to_lowercase())
        .collect();
    st.stats.content_headers.lock().unwrap().push(headers);
    let head = req.method() == Method::HEAD;
    let n = if head {
        st.stats.content_heads.fetch_add(1, Ordering::SeqCst);
        0
    } else {
        st.stats.content_gets.fetch_add(1, Ordering::SeqCst) + 1
    };
    let q = query(req.uri().query().unwrap_or(""));
    let rel = decode(path);
    let num = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    let (Some(expires), Some(generation)) = (num("Expires"), num("Gen")) else {
        st.stats.bad_signature.fetch_add(1, Ordering::SeqCst);
        return text(
            StatusCode::FORBIDDEN,
            "Missing Key-Pair-Id query parameter or cookie value\n",
        );
    };
    if q.get("Signature") != Some(&repo::signature(&st.key, &rel, expires, generation)) {
        st.stats.bad_signature.fetch_add(1, Ordering::SeqCst);
        return text(StatusCode::FORBIDDEN, "Invalid signature\n");
    }
    let deny = st.controls.deny_after.load(Ordering::SeqCst);
    if deny > 0 && n > deny {
        st.stats.denied.fetch_add(1, Ordering::SeqCst);
        return text(StatusCode::FORBIDDEN, "Request has expired\n");
    }
    if generation != st.generation.load(Ordering::SeqCst) || unix_now() > expires {
        st.stats.expired.fetch_add(1, Ordering::SeqCst);
        return text(StatusCode::FORBIDDEN, "Request has expired\n");
    }
    let Some((data, etag)) = st.file(&st.root.join(rel.trim_start_matches('/'))) else {
        return text(StatusCode::NOT_FOUND, "no such object\n");
    };
    if n > 0 && st.controls.expire_after.load(Ordering::SeqCst) == n {
        st.generation.fetch_add(1, Ordering::SeqCst);
    }
    let size = data.len() as u64;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_range(v, size));
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, size),
        Some(Ok((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b),
        Some(Err(())) => {
            let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "");
            set(&mut r, "content-range", &format!("bytes */{size}"));
            return r;
        }
    };
    let body = if head {
        Bytes::new()
    } else {
        st.stats.served.fetch_add(1, Ordering::SeqCst);
        data.slice(start as usize..end as usize)
    };
    let mut r = text(status, body);
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    set(&mut r, "etag", &etag);
    if status == StatusCode::PARTIAL_CONTENT {
        set(
            &mut r,
            "content-range",
            &format!("bytes {start}-{}/{size}", end - 1),
        );
    }
    r
}
