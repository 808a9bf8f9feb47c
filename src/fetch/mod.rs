//! The I/O backends a worker reads shards with. Both take the same read
//! requests and give the same completions, so the worker's logic does not
//! know which runs:
//! - [`uring::UringReader`]: one io_uring per worker, many reads in flight,
//!   `READ_FIXED` into registered chunks where permitted;
//! - [`threads::ThreadReader`]: plain `pread` on the worker thread, for
//!   kernels and containers (seccomp) where io_uring cannot be set up.

pub mod http_sync;
pub mod threads;
pub mod uring;
mod uring_http;

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Error;
use crate::net::http::{FailKind, HttpObject};
use crate::net::retry::{Jitter, RetryPolicy};

/// Which backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    IoUring,
    Threads,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::IoUring => "io_uring",
            BackendKind::Threads => "threads",
        }
    }
}

/// What a read reads from.
#[derive(Debug, Clone)]
pub enum Target {
    /// An open local file.
    File(RawFd),
    /// An object on an HTTP server, read with ranged GETs.
    Http(Arc<HttpObject>),
}

/// Read `len` bytes at `offset` of `target` into `buf`.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// Returned with the completion.
    pub id: u64,
    pub target: Target,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
    /// Index of the registered buffer (chunk) holding `buf`.
    pub buf_index: u32,
}

/// Why a read failed.
#[derive(Debug)]
pub enum ReadFail {
    /// A local read failed; the worker names the file.
    Io(io::Error),
    /// A network read failed after its retries; the error names the object.
    Net(Error),
}

/// A finished read: bytes read, or the error.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub result: Result<usize, ReadFail>,
    /// Bytes of the read that were copied on the way (HTTP body bytes that
    /// arrived with the response head).
    pub copied: usize,
}

/// Network counters shared by a loader's readers. Relaxed: statistics.
#[derive(Debug, Default)]
pub struct NetStats {
    pub requests: AtomicU64,
    /// Retries, indexed by `FailKind::index`.
    pub retries: [AtomicU64; 10],
}

impl NetStats {
    pub fn retries_by_kind(&self) -> Vec<(&'static str, u64)> {
        FailKind::ALL
            .iter()
            .map(|k| (k.name(), self.retries[k.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

/// What a reader needs for network reads.
#[derive(Debug, Clone)]
pub struct NetOptions {
    pub stall: Duration,
    pub retry: RetryPolicy,
    pub stats: Arc<NetStats>,
    pub tls: Arc<crate::net::tls::TlsSetup>,
}

/// Runs `op` until it succeeds, fails with an error retrying cannot fix, or
/// runs out of attempts; sleeps the policy's backoff between attempts and
/// counts each retry by kind.
pub fn with_retries<T>(
    net: &NetOptions,
    jitter: &mut Jitter,
    url: &str,
    mut op: impl FnMut() -> Result<T, crate::net::http::Fail>,
) -> Result<T, Error> {
    let mut attempt = 0;
    loop {
        net.stats.requests.fetch_add(1, Ordering::Relaxed);
        match op() {
            Ok(v) => return Ok(v),
            Err(f) => match net.retry.next_delay(attempt, f.kind, jitter.draw()) {
                Some(d) => {
                    net.stats.retries[f.kind.index()].fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(d);
                    attempt += 1;
                }
                None => {
                    return Err(Error::Http {
                        url: url.to_string(),
                        kind: f.kind,
                        message: f.message,
                        attempts: attempt + 1,
                    });
                }
            },
        }
    }
}

impl NetOptions {
    /// The network settings of a configuration, with fresh counters.
    pub fn for_config(cfg: &crate::config::Config) -> NetOptions {
        NetOptions {
            stall: Duration::from_millis(cfg.stall_timeout_ms),
            retry: RetryPolicy {
                max_attempts: cfg.max_attempts,
                ..RetryPolicy::default()
            },
            stats: Arc::new(NetStats::default()),
            tls: Arc::new(crate::net::tls::TlsSetup::new(
                cfg.ca_bundle
                    .clone()
                    .or_else(|| std::env::var_os("AWS_CA_BUNDLE").map(Into::into)),
            )),
        }
    }
}

/// One ranged HTTP read with retries, on blocking sockets. Returns the bytes
/// copied from response heads.
pub fn fetch_retrying(
    pool: &mut http_sync::HttpPool,
    obj: &HttpObject,
    start: u64,
    buf: &mut [u8],
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<usize, Error> {
    with_retries(net, jitter, &obj.url, || {
        pool.fetch(obj, start, buf).map(|f| f.copied)
    })
}

/// What a worker needs from an I/O backend.
pub trait Reader {
    /// Queues a read.
    ///
    /// # Safety
    /// `req.buf..req.buf + req.len` must stay valid and untouched by anyone
    /// else until its completion has been returned by `wait`, and a
    /// `Target::File` descriptor must stay open until then.
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()>;
    /// Starts queued reads and waits until at least `min` completions are
    /// available; appends them to `out`.
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()>;
}
