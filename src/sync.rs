//! The few synchronization primitives the ring uses, from `std` normally and
//! from `loom` when the `loom` feature is on, so `tests/ring_loom.rs` can
//! explore every interleaving of the same code.

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering, fence};

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering, fence};

/// `UnsafeCell` with loom's closure API, so both builds share one ring.
#[cfg(not(feature = "loom"))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(feature = "loom"))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(feature = "loom")]
pub(crate) use loom::cell::UnsafeCell;
