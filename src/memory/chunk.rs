//! The check-out handle of the chunk pool: a counted reference to a run of
//! chunks ([`ChunkRef`]). Workers read into the run, tar members and batches
//! point into it, and the run goes back to [`super::ChunkPool`] when the last
//! reference drops.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use crate::memory::ChunkPool;

/// A counted reference to a run of chunks. The bytes stay valid while any
/// reference lives.
pub struct ChunkRef {
    pub(super) pool: Arc<ChunkPool>,
    pub(super) start: u32,
    pub(super) len: u32,
}

impl ChunkRef {
    /// First byte of the run.
    pub fn ptr(&self) -> *mut u8 {
        // SAFETY: start < chunk_count, so the offset is inside the mapping.
        unsafe {
            self.pool
                .arena()
                .base()
                .add(self.start as usize * self.pool.chunk_size())
        }
    }

    /// Bytes in the run.
    pub fn len(&self) -> usize {
        self.len as usize * self.pool.chunk_size()
    }

    /// Index of the run's first chunk (the fixed-buffer index for io_uring).
    pub fn index(&self) -> u32 {
        self.start
    }

    /// Whether a chunk of this run was never taken before: its first
    /// write costs the kernel's zeroing of its pages (on a VM, the host's
    /// first fault too), a cost paid once, which a measure of the reads'
    /// time leaves out.
    pub fn first_use(&self) -> bool {
        self.pool.first_use(self.start)
    }

    /// Whether another reference to the run lives besides this one (a
    /// batch, a reader): if not, this one alone keeps the run from the
    /// pool.
    pub fn shared(&self) -> bool {
        // Relaxed: a hint for the cache writer's bound on what it holds;
        // nothing is read through it.
        self.pool.refs[self.start as usize].load(Ordering::Relaxed) > 1
    }

    pub fn same_run(&self, other: &ChunkRef) -> bool {
        self.start == other.start && Arc::ptr_eq(&self.pool, &other.pool)
    }
}

impl Clone for ChunkRef {
    fn clone(&self) -> Self {
        // Relaxed: as Arc::clone, a new reference is made from an existing
        // one, so the count cannot reach zero concurrently.
        self.pool.refs[self.start as usize].fetch_add(1, Ordering::Relaxed);
        ChunkRef {
            pool: Arc::clone(&self.pool),
            start: self.start,
            len: self.len,
        }
    }
}

impl Drop for ChunkRef {
    fn drop(&mut self) {
        // Release: our reads and writes of the run happen before the run is
        // handed out again; the Acquire fence below completes the pair.
        if self.pool.refs[self.start as usize].fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            self.pool
                .release_run(self.start as usize, self.len as usize);
        }
    }
}

impl std::fmt::Debug for ChunkRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkRef({}+{})", self.start, self.len)
    }
}
