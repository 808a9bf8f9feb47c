//! The object a reader's requests are for: an HTTP server's address (its
//! host, port and transport, every address DNS gave), the request target,
//! the signer that adds its credentials (SigV4, a bearer token), the name
//! messages give it, and what its redirects taught (where its last chain
//! ended, and whether it redirects at all: `super::hop`). Shared by the
//! reads in flight of one shard (an `Arc`), and the requests made for it
//! (a ranged `GET`, a `HEAD`); parsing their answers is `super::http`'s.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::http::{HttpFail, parse_url};
use crate::sync::Locked;

/// Adds per-request headers, e.g. an S3 SigV4 signature. Called for every
/// request, so it may refresh credentials. Must never put a secret in an
/// error message.
pub trait RequestSigner: Send + Sync + fmt::Debug {
    /// Header lines (`Name: value\r\n` each) for `method` on `obj`, with
    /// the `Range` header value (`bytes=a-b`) when there is one.
    fn sign(&self, method: &str, obj: &HttpObject, range: Option<&str>)
    -> Result<String, HttpFail>;
}

/// An object on an HTTP server, read by byte ranges.
#[derive(Debug)]
pub struct HttpObject {
    /// The URL as given, for messages, its credentials redacted
    /// (`crate::redact`): requests are made from `target`, never from it.
    pub url: String,
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// Path and query, as sent in the request line.
    pub target: String,
    /// Every address DNS gave; connections spread over them.
    pub addrs: Vec<SocketAddr>,
    next_addr: AtomicUsize,
    /// Signs each request (S3, a bearer token); `None` for plain HTTP.
    /// Never sent to another origin than this object's
    /// (`super::redirect`).
    pub signer: Option<std::sync::Arc<dyn RequestSigner>>,
    /// Where this object's last redirect chain ended: its later requests
    /// go there at once, one redirect per shard rather than per range
    /// (`super::hop`).
    route: Mutex<Option<Arc<HttpObject>>>,
    /// The object answers with redirects (it did, or its source always
    /// does, as the Hub's `resolve/` URLs): a request to it carries no
    /// `If-Match` (a validator of the target's, which a redirecting host
    /// does not know), and on io_uring a range waits for one in flight to
    /// find the target rather than ask for a redirect of its own.
    /// Relaxed: a hint; either value gives correct reads.
    redirects: AtomicBool,
}

impl HttpObject {
    /// The request for bytes `start..start + len` of the object, signed when the
    /// object has a signer; with `If-Match` when the read is pinned to a
    /// strong ETag (`VersionPin::if_match` in `crate::net::version`), so that
    /// a server that changed the object answers 412 instead of another
    /// version's bytes. The header is not signed: SigV4 signs the headers it
    /// lists, and S3 takes others.
    pub fn range_request(
        &self,
        start: u64,
        len: u64,
        if_match: Option<&str>,
    ) -> Result<Vec<u8>, HttpFail> {
        let range = format!("bytes={}-{}", start, start + len - 1);
        let extra = self.signed("GET", Some(&range))?;
        let pinned = match if_match {
            // An ETag is a quoted string without control characters (RFC 9110
            // §8.8.3); one that holds a line break would add headers.
            Some(tag) if !tag.bytes().any(|b| b < b' ' || b == 0x7f) => {
                format!("If-Match: {tag}\r\n")
            }
            _ => String::new(),
        };
        Ok(format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nRange: {range}\r\n{pinned}User-Agent: ringfeed/{}\r\n{extra}\r\n",
            self.target,
            self.host_header(),
            env!("CARGO_PKG_VERSION"),
        )
        .into_bytes())
    }

    /// A `HEAD` request, signed when the object has a signer.
    pub fn head_request(&self) -> Result<Vec<u8>, HttpFail> {
        let extra = self.signed("HEAD", None)?;
        Ok(format!(
            "HEAD {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ringfeed/{}\r\n{extra}\r\n",
            self.target,
            self.host_header(),
            env!("CARGO_PKG_VERSION"),
        )
        .into_bytes())
    }

    pub fn new(url: &str, addrs: Vec<SocketAddr>) -> Result<HttpObject, String> {
        let p = parse_url(url)?;
        Ok(HttpObject {
            url: crate::redact::url(url).into_owned(),
            host: p.host,
            port: p.port,
            tls: p.tls,
            target: p.target,
            addrs,
            next_addr: AtomicUsize::new(0),
            signer: None,
            route: Mutex::new(None),
            redirects: AtomicBool::new(false),
        })
    }

    /// The same object with requests signed by `signer`.
    pub fn with_signer(mut self, signer: std::sync::Arc<dyn RequestSigner>) -> HttpObject {
        self.signer = Some(signer);
        self
    }

    /// The same object named `name` in messages (an `hf://` URL for the
    /// Hub's `resolve/` URL it is read from); redacted as a URL is.
    pub fn with_name(mut self, name: &str) -> HttpObject {
        self.url = crate::redact::url(name).into_owned();
        self
    }

    /// The object named `name` (one path segment, not encoded) in this
    /// one's folder: the same origin, addresses and signer (a signer signs
    /// each request for its own target), no query (a presigned URL's
    /// signature is for its own path), named in messages beside this one's
    /// name. For the files a dataset keeps beside its shards (an index).
    pub fn beside(&self, name: &str) -> HttpObject {
        let folder = |s: &str| {
            let path = s.split('?').next().unwrap_or(s);
            path[..path.rfind('/').map_or(0, |i| i + 1)].to_string()
        };
        // RFC 3986's unreserved characters stay as they are.
        const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'.')
            .remove(b'_')
            .remove(b'~');
        let encoded = percent_encoding::utf8_percent_encode(name, SEGMENT).to_string();
        HttpObject {
            url: format!("{}{name}", folder(&self.url)),
            host: self.host.clone(),
            port: self.port,
            tls: self.tls,
            target: format!("{}{encoded}", folder(&self.target)),
            addrs: self.addrs.clone(),
            next_addr: AtomicUsize::new(0),
            signer: self.signer.clone(),
            route: Mutex::new(None),
            redirects: AtomicBool::new(self.expects_redirect()),
        }
    }

    /// The same object, known to answer with a redirect (see `redirects`).
    pub fn redirecting(self) -> HttpObject {
        self.redirects.store(true, Ordering::Relaxed);
        self
    }

    /// Whether the object is known to answer with redirects.
    pub fn expects_redirect(&self) -> bool {
        self.redirects.load(Ordering::Relaxed)
    }

    /// The object answered with a redirect.
    pub fn saw_redirect(&self) {
        self.redirects.store(true, Ordering::Relaxed);
    }

    /// Where the object's last redirect chain ended, if it redirected.
    pub fn route(&self) -> Option<Arc<HttpObject>> {
        self.route.locked().clone()
    }

    /// The object's requests go to `target` from now on.
    pub fn remember(&self, target: &Arc<HttpObject>) {
        *self.route.locked() = Some(Arc::clone(target));
    }

    /// `target` answered as an expired signed URL does: the object's
    /// requests go to the object itself again (and are redirected anew).
    /// Whether `target` was still the route (another request may have
    /// found a new one already).
    pub fn forget(&self, target: &Arc<HttpObject>) -> bool {
        let mut route = self.route.locked();
        if route.as_ref().is_some_and(|r| Arc::ptr_eq(r, target)) {
            *route = None;
            return true;
        }
        false
    }

    /// The URL a request to this object asks, whole (its query included):
    /// what a relative `Location` is resolved against. Holds what `target`
    /// holds (a presigned query): never for messages.
    pub fn request_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{scheme}://{host}:{}{}", self.port, self.target)
    }

    pub(super) fn signed(&self, method: &str, range: Option<&str>) -> Result<String, HttpFail> {
        match &self.signer {
            Some(s) => s.sign(method, self, range),
            None => Ok(String::new()),
        }
    }

    /// The address for the next connection: round robin over `addrs`.
    pub fn pick_addr(&self) -> Option<SocketAddr> {
        if self.addrs.is_empty() {
            return None;
        }
        // Relaxed: only spreads connections; any interleaving is fine.
        let i = self.next_addr.fetch_add(1, Ordering::Relaxed);
        Some(self.addrs[i % self.addrs.len()])
    }

    /// `Host:` header value.
    pub fn host_header(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_goes_out_only_as_a_clean_header() {
        let obj = HttpObject::new("http://h/k", Vec::new()).unwrap();
        let req = String::from_utf8(obj.range_request(0, 10, Some("\"a\"")).unwrap()).unwrap();
        assert!(req.contains("\r\nIf-Match: \"a\"\r\n"), "{req}");
        let req = String::from_utf8(obj.range_request(0, 10, None).unwrap()).unwrap();
        assert!(!req.contains("If-Match"), "{req}");
        let req =
            String::from_utf8(obj.range_request(0, 10, Some("\"a\"\r\nX-Y: 1")).unwrap()).unwrap();
        assert!(!req.contains("X-Y"), "{req}");
    }
}
