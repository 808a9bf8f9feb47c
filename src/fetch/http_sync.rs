//! Ranged HTTP reads over blocking sockets, with keep-alive connections per
//! host and the retry policy. Used by the thread backend for every HTTP range,
//! and for `HEAD` at open. Both follow redirects along the object's
//! [`Route`] (`crate::net::hop`). The response head is read into a small buffer; the
//! body bytes that arrive with it are copied into the destination (and
//! counted), the rest is received straight into it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::net::hop::{Route, Turn};
use crate::net::http::{self, FailKind, HttpFail, MAX_HEAD};
use crate::net::object::HttpObject;
use crate::net::tls::TlsSetup;
use crate::net::version::VersionPin;

/// A connection, plain or TLS (decrypted in user space by rustls).
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl Stream {
    /// Asks for quick ACKs (`crate::net::quick_ack`).
    fn quick_ack(&self) {
        use std::os::fd::AsRawFd;
        crate::net::quick_ack(match self {
            Stream::Plain(s) => s.as_raw_fd(),
            Stream::Tls(s) => s.sock.as_raw_fd(),
        });
    }
}

/// Largest error body read for its S3 error code. S3's are under 1 KiB;
/// 64 KiB bounds what a misbehaving server can make us buffer.
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// Idle connections are kept per host, port and transport.
type PoolKey = (String, u16, bool);

/// Idle keep-alive connections and the stall time-out.
pub struct HttpPool {
    idle: HashMap<PoolKey, Vec<Stream>>,
    stall: Duration,
    head_buf: Vec<u8>,
    tls: Arc<TlsSetup>,
}

/// Result of one fetch.
pub struct Fetched {
    /// Body bytes copied from the head buffer.
    pub copied: usize,
    /// Body bytes read: the buffer's length, or less when `open_end` and the
    /// object ends inside the range.
    pub len: usize,
    /// The object's size, when the response gave it.
    pub total: Option<u64>,
}

impl HttpPool {
    pub fn new(stall: Duration, tls: Arc<TlsSetup>) -> HttpPool {
        HttpPool {
            idle: HashMap::new(),
            stall,
            head_buf: vec![0; MAX_HEAD],
            tls,
        }
    }

    fn key(obj: &HttpObject) -> PoolKey {
        (obj.host.clone(), obj.port, obj.tls)
    }

    fn connect(&mut self, obj: &HttpObject) -> Result<(Stream, bool), HttpFail> {
        if let Some(c) = self.idle.get_mut(&Self::key(obj)).and_then(Vec::pop) {
            return Ok((c, true));
        }
        let addr = obj.pick_addr().ok_or_else(|| {
            HttpFail::new(FailKind::Dns, format!("`{}` has no address", obj.host))
        })?;
        let s = TcpStream::connect_timeout(&addr, self.stall)
            .map_err(|e| HttpFail::new(FailKind::of_io(&e), format!("connect to {addr}: {e}")))?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(self.stall))
            .and_then(|()| s.set_write_timeout(Some(self.stall)))
            .map_err(|e| HttpFail::new(FailKind::Reset, format!("socket options: {e}")))?;
        if !obj.tls {
            return Ok((Stream::Plain(s), false));
        }
        let config = self
            .tls
            .config()
            .map_err(|e| HttpFail::new(FailKind::Tls, e))?;
        let name = ServerName::try_from(obj.host.clone())
            .map_err(|e| HttpFail::new(FailKind::Tls, format!("`{}`: {e}", obj.host)))?;
        let conn = rustls::ClientConnection::new(config, name)
            .map_err(|e| HttpFail::new(FailKind::Tls, format!("TLS: {e}")))?;
        // Records opened in user space (rustls's stream).
        self.tls
            .sessions_user
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((
            Stream::Tls(Box::new(rustls::StreamOwned::new(conn, s))),
            false,
        ))
    }

    /// Sends `req` and reads the response head; returns the stream, the head,
    /// and how many bytes after the head are already in `head_buf`.
    fn exchange(
        &mut self,
        obj: &HttpObject,
        req: &[u8],
    ) -> Result<(Stream, http::ResponseHead, usize), HttpFail> {
        // A reused keep-alive connection may have been closed by the server
        // meanwhile: one immediate retry on a fresh one is not a failure.
        for fresh_try in 0..2 {
            let (mut s, reused) = self.connect(obj)?;
            let io = |e: std::io::Error| HttpFail::new(FailKind::of_io(&e), format!("{e}"));
            let mut got = 0;
            let result = (|| {
                s.write_all(req).map_err(io)?;
                s.quick_ack();
                loop {
                    let n = s.read(&mut self.head_buf[got..]).map_err(io)?;
                    s.quick_ack();
                    if n == 0 {
                        return Err(HttpFail::new(
                            if got == 0 {
                                FailKind::Reset
                            } else {
                                FailKind::Truncated
                            },
                            "the connection closed before the response head ended",
                        ));
                    }
                    got += n;
                    match http::parse_head(&self.head_buf[..got]) {
                        Ok(Some(h)) => return Ok(h),
                        Ok(None) => {}
                        Err(e) => return Err(HttpFail::new(FailKind::Protocol, e)),
                    }
                }
            })();
            match result {
                Ok(h) => {
                    let extra = got - h.head_len;
                    return Ok((s, h, extra));
                }
                Err(f) if reused && got == 0 && fresh_try == 0 && f.kind != FailKind::Stalled => {
                    continue;
                }
                Err(f) => return Err(f),
            }
        }
        unreachable!("the loop returns on its second pass")
    }

    fn put_back(&mut self, obj: &HttpObject, s: Stream) {
        self.idle.entry(Self::key(obj)).or_default().push(s);
    }

    /// Reads bytes `start..start + buf.len()` of `obj` into `buf`, once;
    /// with `open_end` (the object's size not known yet) up to the object's
    /// end when that comes first (see `http::check_range_response`). With
    /// a `pin`, the request carries its `If-Match` and the answer is checked
    /// against it before any body byte is taken.
    pub fn fetch(
        &mut self,
        obj: &HttpObject,
        start: u64,
        buf: &mut [u8],
        open_end: bool,
        pin: Option<&VersionPin>,
    ) -> Result<Fetched, HttpFail> {
        let len = buf.len() as u64;
        let mut route = Route::new(obj);
        let (s, h, extra) = loop {
            let at = route.at(obj);
            let req = at.range_request(start, len, route.if_match(obj, pin))?;
            let (s, h, extra) = self.exchange(at, &req)?;
            let key = Self::key(at);
            match route.answered(obj, &h)? {
                Turn::Final => break (s, h, extra),
                Turn::Again => self.discard(key, s, &h, extra, false),
            }
        };
        let got = self.take_range(route.at(obj), obj, start, buf, open_end, pin, (s, h, extra))?;
        route.arrived(obj);
        Ok(got)
    }

    /// The answer `(s, h, extra)` to a ranged GET of `obj` at its target
    /// `at`, read into `buf` (see `fetch`).
    #[allow(clippy::too_many_arguments)]
    fn take_range(
        &mut self,
        at: &HttpObject,
        obj: &HttpObject,
        start: u64,
        buf: &mut [u8],
        open_end: bool,
        pin: Option<&VersionPin>,
        (mut s, h, extra): (Stream, http::ResponseHead, usize),
    ) -> Result<Fetched, HttpFail> {
        let len = buf.len() as u64;
        // The connection is not reused after a changed answer: its body
        // was not read.
        if let Some(p) = pin {
            p.check(&obj.url, &h)?;
        }
        let body = match http::check_range_response(&h, start, len, open_end) {
            Ok(b) => b,
            Err(mut f) => {
                if h.status >= 300
                    && let Some(code) = self.error_code(at, s, &h, extra)
                {
                    f.message = format!("{}, S3 error code {code}", f.message);
                    if crate::net::retry::is_throttling_code(&code) {
                        f.kind = FailKind::Throttled;
                    }
                    f.code = Some(code);
                }
                f.message = format!("{}: {}", obj.url, f.message);
                return Err(f);
            }
        };
        if h.status == 416 {
            // An empty object (`open_end`): nothing to read; the connection
            // is reused only when no error body follows.
            if h.keep_alive && h.content_length == Some(0) && extra == 0 {
                self.put_back(at, s);
            }
            return Ok(Fetched {
                copied: 0,
                len: 0,
                total: body.total,
            });
        }
        // `body.len` <= `len`: the range, or less of it when it runs past
        // the object's end.
        let buf = &mut buf[..body.len as usize];
        let len = body.len;
        let from_head = extra.min(buf.len());
        buf[..from_head].copy_from_slice(&self.head_buf[h.head_len..h.head_len + from_head]);
        if extra > buf.len() {
            return Err(HttpFail::new(
                FailKind::Protocol,
                "the server sent more than the range",
            ));
        }
        let mut got = from_head;
        while got < buf.len() {
            match s.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(HttpFail::new(
                        FailKind::Truncated,
                        format!("{}: the body ended after {got} of {len} bytes", obj.url),
                    ));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(HttpFail::new(
                        FailKind::of_io(&e),
                        format!("{}: after {got} of {len} bytes: {e}", obj.url),
                    ));
                }
            }
        }
        if h.keep_alive {
            self.put_back(at, s);
        }
        Ok(Fetched {
            copied: from_head,
            len: buf.len(),
            total: body.total,
        })
    }

    /// Reads an error response's body, when it is small and has a length,
    /// and returns S3's `<Code>` from it. The rest of the body (which for
    /// SignatureDoesNotMatch echoes the access key id and the string to
    /// sign) is dropped. The connection goes back to the pool only when the
    /// whole body was read.
    fn error_code(
        &mut self,
        obj: &HttpObject,
        mut s: Stream,
        h: &http::ResponseHead,
        extra: usize,
    ) -> Option<String> {
        let n = usize::try_from(h.content_length?).ok()?;
        if h.chunked || n > MAX_ERROR_BODY || extra > n {
            return None;
        }
        let mut body = self.head_buf[h.head_len..h.head_len + extra].to_vec();
        body.resize(n, 0);
        s.read_exact(&mut body[extra..]).ok()?;
        if h.keep_alive {
            self.put_back(obj, s);
        }
        crate::net::s3::error_code(&body)
    }

    /// The object's size, from a `HEAD` request, once.
    pub fn head(&mut self, obj: &HttpObject) -> Result<u64, HttpFail> {
        self.head_version(obj).map(|(size, _)| size)
    }

    /// `HEAD`: the object's size and its `ETag` as sent (`None` when the
    /// server gives none), at the end of its redirects (which becomes the
    /// object's route).
    pub fn head_version(&mut self, obj: &HttpObject) -> Result<(u64, Option<String>), HttpFail> {
        self.head_validators(obj)
            .map(|(size, etag, _)| (size, etag))
    }

    /// [`HttpPool::head_version`] with the object's `Last-Modified` too.
    pub fn head_validators(
        &mut self,
        obj: &HttpObject,
    ) -> Result<(u64, Option<String>, Option<String>), HttpFail> {
        let mut route = Route::new(obj);
        let (s, h) = loop {
            let at = route.at(obj);
            let req = at.head_request()?;
            let (s, h, extra) = self.exchange(at, &req)?;
            let key = Self::key(at);
            match route.answered(obj, &h)? {
                Turn::Final => break (s, h),
                Turn::Again => self.discard(key, s, &h, extra, true),
            }
        };
        if h.status >= 300 {
            let mut f = HttpFail::new(
                FailKind::of_status(h.status),
                format!("{}: {}", obj.url, h.status_text()),
            );
            f.retry_after = h.retry_after.map(Duration::from_secs);
            return Err(f);
        }
        let size = h.content_length.ok_or_else(|| {
            HttpFail::new(
                FailKind::Protocol,
                format!("{}: HEAD gave no Content-Length", obj.url),
            )
        })?;
        if h.keep_alive {
            self.put_back(route.at(obj), s);
        }
        route.arrived(obj);
        Ok((size, h.etag, h.last_modified))
    }

    /// An answer not wanted (a redirect's, an expired target's): its
    /// connection goes back to the pool when its body is read to its end
    /// (small, with a length; a `HEAD`'s has none), else it is closed.
    fn discard(
        &mut self,
        key: PoolKey,
        mut s: Stream,
        h: &http::ResponseHead,
        extra: usize,
        head: bool,
    ) {
        if !h.keep_alive {
            return;
        }
        if head {
            if extra == 0 {
                self.idle.entry(key).or_default().push(s);
            }
            return;
        }
        let Some(n) = h.content_length.and_then(|n| usize::try_from(n).ok()) else {
            return;
        };
        if h.chunked || n > MAX_ERROR_BODY || extra > n {
            return;
        }
        let mut rest = vec![0; n - extra];
        if s.read_exact(&mut rest).is_ok() {
            self.idle.entry(key).or_default().push(s);
        }
    }
}
