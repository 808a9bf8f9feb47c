//! Blocking on top of the lock-free [`Ring`]: `next` with a time-out for
//! consumers, and a `push` that waits while the ring is full for workers.
//! Threads park on a condition variable only when the ring is empty
//! (consumers) or full (producers), so the fast path takes no lock.

use crate::queue::Ring;
use crate::sync::{Locked, Waits};
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
            let _g = self.lock.locked();
            cv.notify_all();
        }
    }

    /// Closes the channel: blocked and later calls return `Closed`
    /// (pops still drain what is queued).
    pub fn close(&self) {
        // SeqCst: read by sleepers after they announce themselves.
        self.closed.store(true, Ordering::SeqCst);
        let _g = self.lock.locked();
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Threads asleep (or about to sleep) in `pop_until` on an empty ring.
    pub fn sleepers(&self) -> usize {
        // SeqCst: as the other accesses of the count (see the type's comment).
        self.pop_waiting.load(Ordering::SeqCst)
    }

    /// Threads asleep (or about to sleep) in `push_wait` on a full ring:
    /// the reader is behind.
    pub fn blocked_pushers(&self) -> usize {
        // SeqCst: as the other accesses of the count (see the type's comment).
        self.push_waiting.load(Ordering::SeqCst)
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
        if let Some(v) = self.try_pop() {
            return Ok(v);
        }
        if self.is_closed() {
            return Err(RecvError::Closed);
        }
        let mut g = self.lock.locked();
        self.pop_waiting.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            if let Some(v) = self.ring.pop() {
                break Ok(v);
            }
            if self.is_closed() {
                break Err(RecvError::Closed);
            }
            match deadline {
                None => g = self.not_empty.wait_locked(g),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break Err(RecvError::Timeout);
                    }
                    g = self.not_empty.wait_locked_for(g, d - now).0;
                }
            }
        };
        self.pop_waiting.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        if result.is_ok() {
            self.wake(&self.push_waiting, &self.not_full);
        }
        result
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
        let mut g = self.lock.locked();
        self.push_waiting.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            if self.is_closed() {
                break Err(value);
            }
            match self.ring.push(value) {
                Ok(()) => break Ok(()),
                Err(v) => value = v,
            }
            g = self.not_full.wait_locked(g);
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
