//! The decode memory budget: the bytes a loader's image decodes may hold
//! at once (the `decode_memory` key), shared by its transform threads.
//!
//! Before a decode sizes a buffer from an image's header it says what the
//! decode will hold (its pixels, the JPEG decoder's coefficient buffers,
//! the resize's scratch: `decode::plan`) and reserves that much here. A
//! decode that fits the budget but not what is left of it waits for the
//! others to give theirs back (each thread holds at most one reservation,
//! so the holders always finish); one that cannot fit the whole budget,
//! even reduced, is refused with a reason that names both numbers. So
//! however many hostile or merely huge images a batch holds, the decodes
//! hold no more than the budget together, instead of one full-size buffer
//! per thread.

use crate::sync::{Locked, Waits};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// The default budget: 1 GiB. A full decode at the pixel limit
/// (`decode::MAX_PIXELS`, 179 M pixels, 537 MB as RGB) plus its resize
/// fits, so the images Pillow accepts are still decoded exactly one at a
/// time; a photo of 12 M pixels (36 MB) leaves room for some 25 decodes
/// at once, more than the threads of a 16-CPU host.
pub const DEFAULT_DECODE_MEMORY: u64 = 1 << 30;

/// The decode memory of one loader (or of one `ringfeed_image_transform`
/// call), and what it saw.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: Mutex<u64>,
    /// Signalled when a reservation is given back.
    freed: Condvar,
    /// The most bytes reserved at once.
    peak: AtomicU64,
    /// Images refused: over the budget even at their least decode.
    refused: AtomicU64,
    /// Images decoded smaller than they would have been, to fit.
    reduced: AtomicU64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(DEFAULT_DECODE_MEMORY)
    }
}

/// Bytes held by one decode; given back when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut used = self.budget.used.locked();
        *used -= self.bytes;
        self.budget.freed.notify_all();
    }
}

impl Reservation<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Budget {
    /// A budget of `limit` bytes (0 is taken as 1: every decode refused).
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit: limit.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
            peak: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reduced: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether a decode of `bytes` can ever be held.
    pub fn fits(&self, bytes: u64) -> bool {
        bytes <= self.limit
    }

    /// Reserves `bytes`, waiting while the other decodes hold too much of
    /// the budget; refused (with the reason) when `bytes` is over the
    /// whole of it.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation<'_>, String> {
        if !self.fits(bytes) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(self.over(bytes));
        }
        let mut used = self.used.locked();
        while *used + bytes > self.limit {
            used = self.freed.wait_locked(used);
        }
        *used += bytes;
        // Relaxed: a statistic; the lock orders the reservations.
        self.peak.fetch_max(*used, Ordering::Relaxed);
        Ok(Reservation {
            budget: self,
            bytes,
        })
    }

    /// The reason a decode of `bytes` is refused.
    pub fn over(&self, bytes: u64) -> String {
        format!(
            "decoding it needs {} MiB, over the decode memory budget of {} MiB \
             (`decode_memory`)",
            bytes.div_ceil(1 << 20),
            self.limit >> 20
        )
    }

    /// Notes a refusal made without reserving (the decode's least size
    /// was already over the budget).
    pub fn note_refused(&self) {
        // Relaxed: a statistic.
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes an image decoded smaller to fit.
    pub fn note_reduced(&self) {
        // Relaxed: a statistic.
        self.reduced.fetch_add(1, Ordering::Relaxed);
    }

    /// The most bytes held at once so far.
    pub fn peak(&self) -> u64 {
        // Relaxed: a statistic.
        self.peak.load(Ordering::Relaxed)
    }

    /// Images refused for the budget.
    pub fn refused(&self) -> u64 {
        // Relaxed: a statistic.
        self.refused.load(Ordering::Relaxed)
    }

    /// Images decoded smaller to fit the budget.
    pub fn reduced(&self) -> u64 {
        // Relaxed: a statistic.
        self.reduced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_decode_over_the_whole_budget_is_refused_and_counted() {
        let b = Budget::new(100 << 20);
        let e = b.reserve((100 << 20) + 1).unwrap_err();
        assert!(
            e.contains("over the decode memory budget of 100 MiB"),
            "{e}"
        );
        assert_eq!(b.refused(), 1);
        let r = b.reserve(100 << 20).unwrap();
        assert_eq!(r.bytes(), 100 << 20);
        assert_eq!(b.peak(), 100 << 20);
    }

    #[test]
    fn reservations_wait_for_room_and_never_hold_more_than_the_budget() {
        let b = Arc::new(Budget::new(10));
        let held = Arc::new(Mutex::new((0u64, 0u64)));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (b, held) = (Arc::clone(&b), Arc::clone(&held));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let r = b.reserve(3 + i % 4).unwrap();
                        {
                            let mut h = held.lock().unwrap();
                            h.0 += r.bytes();
                            h.1 = h.1.max(h.0);
                        }
                        std::thread::yield_now();
                        held.lock().unwrap().0 -= r.bytes();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let most = held.lock().unwrap().1;
        assert!(most <= 10, "{most} bytes held at once");
        assert!(b.peak() <= 10);
        assert_eq!(*b.used.lock().unwrap(), 0);
    }
}
