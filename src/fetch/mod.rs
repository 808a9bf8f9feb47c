//! The I/O backends a worker reads shards with. Both take the same read
//! requests and give the same completions, so the worker's logic does not
//! know which runs:
//! - [`uring::UringReader`]: one io_uring per worker, many reads in flight,
//!   `READ_FIXED` into registered chunks where permitted (rings made, and
//!   io_uring probed, by [`ring`]);
//! - [`threads::ThreadReader`]: plain `pread` on the worker thread, for
//!   kernels and containers (seccomp) where io_uring cannot be set up.
//!
//! Local files are read buffered or with O_DIRECT ([`direct`]); both
//! backends widen a direct read to whole blocks the same way.
//!
//! HTTP and S3 shards are read with ranged GETs by each backend in its own
//! way: with io_uring, on a network thread's ring that receives for several
//! workers ([`net_thread`], driving `uring_http.rs`, https through
//! `uring_tls.rs` and, where the kernel has TLS, `ktls.rs`), or on the
//! worker's own ring when it has no network
//! thread; with threads, on blocking sockets ([`http_sync`]). The protocol
//! itself (requests, response heads, retry policy, TLS, signing) is in
//! [`crate::net`].

pub mod direct;
pub mod fixed;
pub mod http_sync;
mod ktls;
pub mod net_thread;
pub mod ring;
pub mod threads;
mod tls_control;
pub mod uring;
mod uring_http;
mod uring_tls;

use std::io;
use std::sync::Arc;
use std::time::Duration;

pub use ktls::refused as kernel_tls_refused;

use crate::error::Error;
use crate::net::object::HttpObject;
use crate::net::retry::{Jitter, RetryPolicy};
use crate::net::version::VersionPin;

// The network settings, counters and blocking retry loop live in `net`
// (the S3 listing and the dataset resolver use them too); named here as
// well, where the readers take them.
pub use crate::net::{NetOptions, NetStats, with_retries};

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
    /// An open local file, buffered or direct.
    File(direct::LocalFd),
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
    /// The object's size is not known yet (an HTTP shard sized by its first
    /// read): the object may end inside the range, and the read returns
    /// what there is (0 bytes for an empty object) with the size in
    /// [`Completion::total`]. Only for `Target::Http`.
    pub open_end: bool,
    /// The version the read is pinned to, shared by every read of one
    /// object's read (`Target::Http`; `None`: unchecked, as a file read).
    pub pin: Option<Arc<VersionPin>>,
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
    /// arrived with the response head; for https on io_uring also each
    /// record's plaintext moved down over the record headers and tags
    /// before it, right after its decryption).
    pub copied: usize,
    /// The object's size, when the read learned it (an HTTP response's
    /// `Content-Range` total); `None` for file reads.
    pub total: Option<u64>,
    /// How long the answer took (an HTTP read on io_uring), for the
    /// in-flight count to see a far store and a paced host's reads by;
    /// `None` for file reads and the thread backend's.
    pub timing: Option<Answered>,
}

/// The times of an HTTP read's answer, from its request going out (after
/// its host's pacing: a wait, a backoff or a 503 before it say nothing of
/// the store's distance).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answered {
    /// To its head: the first-byte latency (the first such answer's when
    /// the range was retried).
    pub first_byte: std::time::Duration,
    /// To the read's last byte, from the request of the answer taken (its
    /// time on the wire: a paced host's reads wait at the pacer before).
    pub last_byte: std::time::Duration,
    /// The requests a second its host is held to as the read ends, when
    /// the host has throttled (`crate::net::Pacer`).
    pub paced: Option<f64>,
}

// The configuration's side of `NetOptions`: here rather than in `net`,
// which the configuration itself depends on (`S3Config`).
impl NetOptions {
    /// The network settings of a configuration, with fresh counters.
    pub fn for_config(cfg: &crate::config::Config) -> NetOptions {
        NetOptions {
            stall: Duration::from_millis(cfg.stall_timeout_ms),
            retry: RetryPolicy {
                max_attempts: cfg.max_attempts,
                deadline: Duration::from_secs(cfg.retry_deadline_s),
                hedge: cfg.hedge,
                ..RetryPolicy::default()
            },
            stats: Arc::new(NetStats::default()),
            pace: Arc::default(),
            tls: Arc::new(crate::net::tls::TlsSetup::new(
                cfg.ca_bundle
                    .clone()
                    .or_else(|| std::env::var_os("AWS_CA_BUNDLE").map(Into::into)),
                cfg.kernel_tls,
            )),
        }
    }
}

/// One ranged HTTP read with retries, on blocking sockets (`open_end`: see
/// [`ReadRequest::open_end`]), checked against `pin`.
#[allow(clippy::too_many_arguments)]
pub fn fetch_retrying(
    pool: &mut http_sync::HttpPool,
    obj: &HttpObject,
    start: u64,
    buf: &mut [u8],
    open_end: bool,
    pin: Option<&VersionPin>,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<http_sync::Fetched, Error> {
    with_retries(net, jitter, &obj.url, || {
        pool.fetch(obj, start, buf, open_end, pin)
    })
}

/// What a worker needs from an I/O backend.
pub trait Reader {
    /// Queues a read.
    ///
    /// # Safety
    /// `req.buf..req.buf + req.len` must stay valid and untouched by anyone
    /// else until its completion has been returned by `wait`, and a
    /// `Target::File` descriptor must stay open until then. For a direct
    /// file (`align` > 0) that holds for the read widened to whole blocks
    /// ([`direct::KernelRead`]) too: from `buf - offset % align` to the end
    /// rounded up to `align` (the chunk's slack around its data).
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()>;
    /// Starts queued reads and waits until at least `min` completions are
    /// available; appends them to `out`.
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()>;
}
