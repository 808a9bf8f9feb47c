//! The synchronization primitives the ring uses. `tests/ring_loom.rs`
//! provides a module of the same shape over loom's types and compiles
//! `src/queue/ring.rs` against it, so the model checker runs the same code.

pub(crate) use std::sync::atomic::{AtomicUsize, Ordering, fence};

/// `UnsafeCell` with loom's closure API, so both builds share one ring.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

impl<T> UnsafeCell<T> {
    pub(crate) fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Backs off while another thread finishes its half of an operation.
pub(crate) fn spin() {
    std::hint::spin_loop();
}
