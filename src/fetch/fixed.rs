//! The arena's chunks as io_uring fixed buffers: registered by the rings
//! that read into them (a loader's workers, a node engine's I/O threads),
//! whose reads into a registered chunk are `READ_FIXED`.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::IoUring;

use crate::sync::Locked;

/// The arena's chunks as io_uring fixed buffers, shared by the rings that
/// read into them. Each ring registers the first `ready` of them once they are
/// ready: when their memory is in. Registering pins every page it names,
/// so done at open it would fault the whole arena in before the first read;
/// and an arena whose tail the reads may never touch (remote shards'
/// default, sized for a far store) has only its faulted head registered,
/// since pinning the tail would fault it all in on the reading thread
/// (1.5 GiB for a 0.5 GB epoch, the cost of a cache over HTTP). Reads
/// into a chunk past them, and reads before, are plain `READ`s.
pub struct FixedBuffers {
    iovecs: Vec<libc::iovec>,
    ready: AtomicUsize,
    /// Rings that registered them (for the tests).
    #[cfg(test)]
    rings: AtomicUsize,
    /// Why a ring could not register them, the first time one could not.
    refused: Mutex<Option<String>>,
    /// What keeps their memory mapped, when they must keep it (the rings
    /// that registered them may outlive its other owners).
    _owner: Option<Arc<dyn Any + Send + Sync>>,
    /// The bytes of the pages behind them.
    page: usize,
}

// SAFETY: the iovecs only describe arena memory; they are read, never
// written, and the arena itself is Send + Sync.
unsafe impl Send for FixedBuffers {}
// SAFETY: as above.
unsafe impl Sync for FixedBuffers {}

impl std::fmt::Debug for FixedBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedBuffers")
            .field("buffers", &self.iovecs.len())
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl FixedBuffers {
    /// The buffers `iovecs`, not yet ready.
    ///
    /// # Safety
    /// Every buffer must stay valid while any ring that registered them
    /// lives (the arena outlives the loader's readers).
    pub unsafe fn new(iovecs: Vec<libc::iovec>) -> FixedBuffers {
        FixedBuffers {
            iovecs,
            ready: AtomicUsize::new(0),
            #[cfg(test)]
            rings: AtomicUsize::new(0),
            refused: Mutex::new(None),
            _owner: None,
            page: 4096,
        }
    }

    /// The same buffers, whose memory `owner` keeps mapped for as long as
    /// they live (a ring that registered them holds them), in pages of
    /// `page` bytes.
    pub fn owned_by(self, owner: Arc<dyn Any + Send + Sync>, page: usize) -> FixedBuffers {
        FixedBuffers {
            _owner: Some(owner),
            page,
            ..self
        }
    }

    /// The bytes of the pages behind them (4 KiB unless told).
    pub fn page(&self) -> usize {
        self.page
    }

    /// Rings may register the first `count` buffers (at most all) from
    /// now on: their memory is in.
    pub fn set_ready(&self, count: usize) {
        // Release: pairs with the Acquire in `ready`; the pages were
        // populated before.
        self.ready
            .store(count.min(self.iovecs.len()), Ordering::Release);
    }

    /// The buffers rings may register, none before [`set_ready`].
    ///
    /// [`set_ready`]: FixedBuffers::set_ready
    pub fn ready(&self) -> &[libc::iovec] {
        // Acquire: pairs with the Release in `set_ready`.
        &self.iovecs[..self.ready.load(Ordering::Acquire)]
    }

    pub fn is_ready(&self) -> bool {
        !self.ready().is_empty()
    }

    /// How many buffers there are, ready or not.
    pub fn count(&self) -> usize {
        self.iovecs.len()
    }

    /// Their bytes, ready or not.
    pub fn bytes(&self) -> u64 {
        self.iovecs.iter().map(|v| v.iov_len as u64).sum()
    }

    /// How many rings have registered them so far.
    #[cfg(test)]
    pub fn rings(&self) -> usize {
        self.rings.load(Ordering::Relaxed)
    }

    /// Why a ring could not register the buffers, if one could not.
    pub fn refused(&self) -> Option<String> {
        self.refused.locked().clone()
    }

    /// Registers the ready buffers with `ring`: how many it did (none
    /// before they are ready, or on a refusal, which is kept for the
    /// stats). Plain reads in flight on the ring are not affected.
    pub fn register(&self, ring: &IoUring) -> u32 {
        let bufs = self.ready();
        if bufs.is_empty() {
            return 0;
        }
        // SAFETY: `FixedBuffers::new`'s caller keeps the buffers alive while
        // any ring that registered them lives.
        match unsafe { ring.submitter().register_buffers(bufs) } {
            Ok(()) => {
                // Relaxed: a count for the tests.
                #[cfg(test)]
                self.rings.fetch_add(1, Ordering::Relaxed);
                bufs.len() as u32
            }
            Err(e) => {
                let mut r = self.refused.locked();
                r.get_or_insert_with(|| format!("register_buffers refused ({e})"));
                0
            }
        }
    }
}
