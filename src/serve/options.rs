//! What the file server is told and what it tells: its tunables
//! ([`ServeOptions`], each default with its reason), why it could not start
//! ([`ServeError`]), and what it has done ([`ServeStats`]).

use std::path::PathBuf;
use std::time::Duration;

/// Tunables of the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections served at once, each on its own thread.
    pub max_connections: usize,
    /// Longest request head, in bytes.
    pub max_head: usize,
    /// A request head must be complete this long after its first byte.
    pub head_timeout: Duration,
    /// An idle keep-alive connection is closed after this long.
    pub idle_timeout: Duration,
    /// A client that accepts no byte of a response for this long is dropped.
    pub write_timeout: Duration,
    /// Print one line per request on stderr.
    pub access_log: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            // ringfeed opens at most workers (≤ 8 by default) × reads in
            // flight (4) connections: 32. Twice that leaves room for a
            // second client; each idle thread costs a small stack.
            max_connections: 64,
            // Apache's LimitRequestLine and one of nginx's 8 KiB large
            // header buffers. ringfeed's and curl's requests are under 200
            // bytes; a SigV4-signed one about 1.5 KiB.
            max_head: 8 << 10,
            // Against clients that trickle a head byte by byte to hold a
            // slot (slowloris); an honest head arrives in one packet.
            head_timeout: Duration::from_secs(10),
            // S3 closes idle connections after 20 s, and ringfeed's client
            // already handles a server closing an idle connection.
            idle_timeout: Duration::from_secs(20),
            // ringfeed's own stall time-out is 10 s; a reader that takes
            // 30 s for one socket buffer is gone.
            write_timeout: Duration::from_secs(30),
            access_log: false,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serve: `{}` is not a readable directory: {message}", root.display())]
    Root { root: PathBuf, message: String },
    #[error("serve: cannot listen on {addr}: {message}")]
    Bind { addr: String, message: String },
}

/// What the server has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeStats {
    /// Connections accepted and served.
    pub connections: u64,
    /// Requests answered (any status).
    pub requests: u64,
    /// Response body bytes sent.
    pub body_bytes: u64,
    /// Connections answered 503 because every slot was taken.
    pub refused_busy: u64,
    /// CPU time the connection threads spent answering requests (not
    /// waiting for them), so an in-process client such as `demo` can tell
    /// its own cost from the server's.
    pub cpu_ns: u64,
}
