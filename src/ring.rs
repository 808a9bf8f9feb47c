//! The ring: a bounded lock-free multi-producer multi-consumer queue that
//! carries ready batches from the workers to the consumer threads.
//!
//! The algorithm is Dmitry Vyukov's bounded MPMC queue, as in crossbeam's
//! `ArrayQueue`: every slot has a `stamp` that says whose turn it is. With
//! `lap = capacity.next_power_of_two()`, a position `p` names slot `p % lap`
//! in lap `p / lap`, and:
//! - a slot is free for the producer holding position `p` when `stamp == p`;
//! - it holds a value for the consumer holding position `p` when `stamp == p + 1`;
//! - after a pop at `p`, the stamp becomes `p + lap` (free in the next lap).
//!
//! `head` and `tail` sit on their own cache lines; only the thread that wins
//! the compare-exchange of a position touches the slot's value.
//!
//! [`Channel`] adds blocking with time-outs on top, parking threads on a
//! condition variable only when the ring is empty (consumers) or full
//! (producers), so the fast path takes no lock.

use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

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
    /// `cap.next_power_of_two()`: positions per lap; a slot index is `pos & (lap - 1)`.
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
        let lap = cap.next_power_of_two();
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

    pub fn capacity(&self) -> usize {
        self.cap
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
                crate::sync::fence(Ordering::SeqCst);
                // Relaxed: ordered by the SeqCst fence above.
                let head = self.head.load(Ordering::Relaxed);
                if head.wrapping_add(self.lap) == tail {
                    return Err(value);
                }
                tail = self.tail.load(Ordering::Relaxed);
            } else {
                // Another producer is mid-push here; reload and retry.
                tail = self.tail.load(Ordering::Relaxed);
                spin();
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
                crate::sync::fence(Ordering::SeqCst);
                // Relaxed: ordered by the SeqCst fence above.
                let tail = self.tail.load(Ordering::Relaxed);
                if tail == head {
                    return None;
                }
                head = self.head.load(Ordering::Relaxed);
            } else {
                head = self.head.load(Ordering::Relaxed);
                spin();
            }
        }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

#[cfg(not(feature = "loom"))]
fn spin() {
    std::hint::spin_loop();
}

#[cfg(feature = "loom")]
fn spin() {
    loom::thread::yield_now();
}

#[cfg(not(feature = "loom"))]
pub use blocking::{Channel, RecvError};

#[cfg(not(feature = "loom"))]
mod blocking {
    use super::Ring;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
    use std::sync::{Condvar, Mutex};
    use std::time::Instant;

    /// Why `Channel::pop_until` returned no value.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RecvError {
        Timeout,
        Closed,
    }

    /// A [`Ring`] with blocking `push` and `pop` that take deadlines.
    ///
    /// A thread about to sleep first announces itself in `*_waiting` (SeqCst),
    /// then looks at the ring once more under `lock`; the other side, after
    /// its own ring operation and a SeqCst fence, reads the count and, if
    /// non-zero, notifies under `lock`. Either the sleeper sees the change or
    /// the other side sees the sleeper: no wake-up is lost.
    pub struct Channel<T> {
        ring: Ring<T>,
        lock: Mutex<()>,
        not_empty: Condvar,
        not_full: Condvar,
        pop_waiting: AtomicUsize,
        push_waiting: AtomicUsize,
        closed: AtomicBool,
    }

    impl<T> Channel<T> {
        pub fn new(cap: usize) -> Self {
            Channel {
                ring: Ring::new(cap),
                lock: Mutex::new(()),
                not_empty: Condvar::new(),
                not_full: Condvar::new(),
                pop_waiting: AtomicUsize::new(0),
                push_waiting: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }
        }

        fn wake(&self, waiting: &AtomicUsize, cv: &Condvar) {
            fence(Ordering::SeqCst);
            // Relaxed: ordered by the SeqCst fence (see the type's comment).
            if waiting.load(Ordering::Relaxed) > 0 {
                let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
                cv.notify_all();
            }
        }

        /// Closes the channel: blocked and later calls return `Closed`
        /// (pops still drain what is queued).
        pub fn close(&self) {
            // SeqCst: read by sleepers after they announce themselves.
            self.closed.store(true, Ordering::SeqCst);
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.not_empty.notify_all();
            self.not_full.notify_all();
        }

        pub fn is_closed(&self) -> bool {
            self.closed.load(Ordering::SeqCst)
        }

        pub fn try_pop(&self) -> Option<T> {
            let v = self.ring.pop();
            if v.is_some() {
                self.wake(&self.push_waiting, &self.not_full);
            }
            v
        }

        /// Pops, waiting until `deadline` (`None`: forever).
        pub fn pop_until(&self, deadline: Option<Instant>) -> Result<T, RecvError> {
            loop {
                if let Some(v) = self.try_pop() {
                    return Ok(v);
                }
                if self.is_closed() {
                    return Err(RecvError::Closed);
                }
                let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
                self.pop_waiting.fetch_add(1, Ordering::SeqCst);
                let result = loop {
                    if let Some(v) = self.ring.pop() {
                        break Ok(v);
                    }
                    if self.is_closed() {
                        break Err(RecvError::Closed);
                    }
                    match deadline {
                        None => g = self.not_empty.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(d) => {
                            let now = Instant::now();
                            if now >= d {
                                break Err(RecvError::Timeout);
                            }
                            g = self
                                .not_empty
                                .wait_timeout(g, d - now)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                };
                self.pop_waiting.fetch_sub(1, Ordering::SeqCst);
                drop(g);
                if result.is_ok() {
                    self.wake(&self.push_waiting, &self.not_full);
                }
                return result;
            }
        }

        /// Pushes, waiting while the ring is full; gives the value back if the
        /// channel closes first.
        pub fn push_wait(&self, value: T) -> Result<(), T> {
            let mut value = match self.ring.push(value) {
                Ok(()) => {
                    self.wake(&self.pop_waiting, &self.not_empty);
                    return Ok(());
                }
                Err(v) => v,
            };
            let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.push_waiting.fetch_add(1, Ordering::SeqCst);
            let result = loop {
                if self.is_closed() {
                    break Err(value);
                }
                match self.ring.push(value) {
                    Ok(()) => break Ok(()),
                    Err(v) => value = v,
                }
                g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            };
            self.push_waiting.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            if result.is_ok() {
                self.wake(&self.pop_waiting, &self.not_empty);
            }
            result
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::Arc;
        use std::time::Duration;

        #[test]
        fn fifo_and_bounded() {
            let r = Ring::new(3);
            assert!(r.push(1).is_ok());
            assert!(r.push(2).is_ok());
            assert!(r.push(3).is_ok());
            assert_eq!(r.push(4), Err(4));
            assert_eq!(r.pop(), Some(1));
            assert!(r.push(4).is_ok());
            assert_eq!(
                (r.pop(), r.pop(), r.pop(), r.pop()),
                (Some(2), Some(3), Some(4), None)
            );
        }

        #[test]
        fn every_value_arrives_once_across_threads() {
            let ch = Arc::new(Channel::new(4));
            let producers: Vec<_> = (0..3)
                .map(|p| {
                    let ch = Arc::clone(&ch);
                    std::thread::spawn(move || {
                        for i in 0..2000u64 {
                            ch.push_wait(p * 10_000 + i).unwrap();
                        }
                    })
                })
                .collect();
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let ch = Arc::clone(&ch);
                    std::thread::spawn(move || {
                        let mut got = Vec::new();
                        while let Ok(v) = ch.pop_until(None) {
                            got.push(v);
                        }
                        got
                    })
                })
                .collect();
            for p in producers {
                p.join().unwrap();
            }
            ch.close();
            let mut all: Vec<u64> = consumers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect();
            all.sort();
            let want: Vec<u64> = (0..3)
                .flat_map(|p| (0..2000).map(move |i| p * 10_000 + i))
                .collect();
            assert_eq!(all, want);
        }

        #[test]
        fn pop_times_out_on_an_empty_ring_and_close_wakes_it() {
            let ch: Arc<Channel<u8>> = Arc::new(Channel::new(1));
            let t0 = Instant::now();
            assert_eq!(
                ch.pop_until(Some(t0 + Duration::from_millis(10))),
                Err(RecvError::Timeout)
            );
            let c2 = Arc::clone(&ch);
            let t = std::thread::spawn(move || c2.pop_until(None));
            std::thread::sleep(Duration::from_millis(10));
            ch.close();
            assert_eq!(t.join().unwrap(), Err(RecvError::Closed));
        }

        #[test]
        fn values_left_in_the_ring_are_dropped_with_it() {
            let v = Arc::new(());
            let r = Ring::new(2);
            r.push(Arc::clone(&v)).unwrap();
            drop(r);
            assert_eq!(Arc::strong_count(&v), 1);
        }
    }
}
