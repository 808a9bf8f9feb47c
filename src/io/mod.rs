//! The I/O backends a worker reads shards with. Both take the same read
//! requests and give the same completions, so the worker's logic does not
//! know which runs:
//! - [`uring::UringReader`]: one io_uring per worker, many reads in flight,
//!   `READ_FIXED` into registered chunks where permitted;
//! - [`threads::ThreadReader`]: plain `pread` on the worker thread, for
//!   kernels and containers (seccomp) where io_uring cannot be set up.

pub mod threads;
pub mod uring;

use std::io;
use std::os::fd::RawFd;

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

/// Read `len` bytes at `offset` of `fd` into `buf`.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest {
    /// Returned with the completion.
    pub id: u64,
    pub fd: RawFd,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
    /// Index of the registered buffer (chunk) holding `buf`.
    pub buf_index: u32,
}

/// A finished read: bytes read, or the error.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub result: io::Result<usize>,
}

/// What a worker needs from an I/O backend.
pub trait Reader {
    /// Queues a read.
    ///
    /// # Safety
    /// `req.buf..req.buf + req.len` must stay valid and untouched by anyone
    /// else until its completion has been returned by `wait`, and `req.fd`
    /// must stay open until then.
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()>;
    /// Starts queued reads and waits until at least `min` completions are
    /// available; appends them to `out`.
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()>;
}
