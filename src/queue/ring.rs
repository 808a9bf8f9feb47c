//! The ring: a bounded lock-free multi-producer multi-consumer queue that
//! carries ready batches from the workers to the consumer threads.
//!
//! The algorithm is Dmitry Vyukov's bounded MPMC queue, as in crossbeam's
//! `ArrayQueue`: every slot has a `stamp` that says whose turn it is. With
//! `lap = (capacity + 1).next_power_of_two()`, a position `p` names slot `p % lap`
//! in lap `p / lap`, and:
//! - a slot is free for the producer holding position `p` when `stamp == p`;
//! - it holds a value for the consumer holding position `p` when `stamp == p + 1`;
//! - after a pop at `p`, the stamp becomes `p + lap` (free in the next lap).
//!
//! `lap` is larger than the capacity, so the stamp of a slot emptied at `p`
//! (`p + lap`) can never read as "full" to a consumer at any position.
//!
//! `head` and `tail` sit on their own cache lines; only the thread that wins
//! the compare-exchange of a position touches the slot's value.
//!
//! `crate::queue::Channel` adds blocking with time-outs on top.
//!
//! This file has no other dependency than `super::sync`, so
//! `tests/ring_loom.rs` compiles it against loom's atomics and explores the
//! interleavings of pushes and pops.

use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;

use super::sync::{AtomicUsize, Ordering, UnsafeCell, spin};

struct Slot<T> {
    /// Turn of this slot, in positions (see the module comment).
    stamp: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// Bounded lock-free MPMC queue.
pub struct Ring<T> {
    /// Next position to pop. Only moved forward by a consumer's CAS.
    head: CachePadded<AtomicUsize>,
    /// Next position to push. Only moved forward by a producer's CAS.
    tail: CachePadded<AtomicUsize>,
    slots: Box<[Slot<T>]>,
    cap: usize,
    /// `(cap + 1).next_power_of_two()`: positions per lap; a slot index is `pos & (lap - 1)`.
    lap: usize,
}

// SAFETY: values move between threads through the queue, hence `T: Send`;
// each slot's value is touched only by the thread that won its position.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    /// A ring holding at most `cap` values (`cap >= 1`).
    pub fn new(cap: usize) -> Self {
        assert!(cap >= 1, "ring capacity must be at least 1");
        let lap = (cap + 1).next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot {
                stamp: AtomicUsize::new(i),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        Ring {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            slots,
            cap,
            lap,
        }
    }

    /// Position after `pos`: the next index, or the start of the next lap.
    fn advance(&self, pos: usize) -> usize {
        let index = pos & (self.lap - 1);
        if index + 1 < self.cap {
            pos + 1
        } else {
            (pos & !(self.lap - 1)).wrapping_add(self.lap)
        }
    }

    /// Pushes `value`, or gives it back when the ring is full.
    pub fn push(&self, value: T) -> Result<(), T> {
        // Relaxed: the position is only a guess; the stamp check decides.
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[tail & (self.lap - 1)];
            // Acquire: pairs with the Release stamp store of the consumer that
            // emptied this slot, so its read of the old value is done.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == tail {
                let next = self.advance(tail);
                // Relaxed on both: winning the CAS only reserves the slot; the
                // value is published by the Release stamp store below.
                match self.tail.compare_exchange_weak(
                    tail,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: winning the CAS at `tail` while `stamp ==
                        // tail` gives this thread sole access to the slot.
                        slot.value
                            .with_mut(|p| unsafe { p.write(MaybeUninit::new(value)) });
                        // Release: publishes the value to the consumer whose
                        // Acquire stamp load sees `tail + 1`.
                        slot.stamp.store(tail + 1, Ordering::Release);
                        return Ok(());
                    }
                    Err(t) => tail = t,
                }
            } else if stamp.wrapping_add(self.lap) == tail + 1 {
                // The slot still holds last lap's value: full, unless a
                // consumer has moved head since.
                super::sync::fence(Ordering::SeqCst);
                // Relaxed: ordered by the SeqCst fence above.
                let head = self.head.load(Ordering::Relaxed);
                if head.wrapping_add(self.lap) == tail {
                    return Err(value);
                }
                // A consumer is mid-pop of this slot: let it finish.
                spin();
                tail = latest(&self.tail);
            } else {
                // Another producer is mid-push here, or `tail` was stale.
                spin();
                tail = latest(&self.tail);
            }
        }
    }

    /// Pops the oldest value, if any.
    pub fn pop(&self) -> Option<T> {
        // Relaxed: a guess, checked against the slot's stamp.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[head & (self.lap - 1)];
            // Acquire: pairs with the producer's Release stamp store, making
            // the written value visible.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == head + 1 {
                let next = self.advance(head);
                // Relaxed: the slot's value is already visible (Acquire above).
                match self.head.compare_exchange_weak(
                    head,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: winning the CAS at `head` while `stamp ==
                        // head + 1` gives sole access to an initialised value.
                        let value = slot.value.with_mut(|p| unsafe { p.read().assume_init() });
                        // Release: tells the producer of the next lap that
                        // the read above is finished.
                        slot.stamp
                            .store(head.wrapping_add(self.lap), Ordering::Release);
                        return Some(value);
                    }
                    Err(h) => head = h,
                }
            } else if stamp == head {
                // Empty slot: empty ring, unless a producer moved tail since.
                super::sync::fence(Ordering::SeqCst);
                // Relaxed: ordered by the SeqCst fence above.
                let tail = self.tail.load(Ordering::Relaxed);
                if tail == head {
                    return None;
                }
                // A producer took this position and is mid-write: let it finish.
                spin();
                head = latest(&self.head);
            } else {
                // Another consumer is mid-pop here, or `head` was stale.
                spin();
                head = latest(&self.head);
            }
        }
    }
}

/// The newest value of a position. A read-modify-write always reads the
/// latest value in the modification order; a plain load may keep returning a
/// stale one (allowed by the memory model, and explored by loom), which would
/// let a waiting thread spin on a slot it already lost. Only the slow paths,
/// after a failed attempt, use it.
fn latest(a: &AtomicUsize) -> usize {
    // Relaxed: the value is a guess validated by the slot's stamp.
    a.fetch_add(0, Ordering::Relaxed)
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}
