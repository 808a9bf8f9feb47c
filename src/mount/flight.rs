//! One listing of a directory at a time: lookups and `readdir`s that find
//! a directory's listing too old while another thread is taking it wait
//! for that one and use what it brings, instead of each listing the same
//! directory again (a job's ranks and workers starting at once, each
//! opening its files, would otherwise list one directory as many times).

use crate::sync::{Locked, Waits};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};

/// The keys (directories' inodes) being worked on now.
#[derive(Default)]
pub struct Flights {
    busy: Mutex<HashSet<u64>>,
    done: Condvar,
    /// Callers waiting for another's work now (read by the tests).
    waiting: std::sync::atomic::AtomicUsize,
}

/// Takes a key out of the busy set when the work ends, however it ends
/// (an error or a panic too), and wakes the waiters.
struct Landing<'a> {
    flights: &'a Flights,
    key: u64,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.flights.busy.locked().remove(&self.key);
        self.flights.done.notify_all();
    }
}

impl Flights {
    /// Runs `work` for `key`, unless another thread is running work for
    /// the same key: then waits until that ends and answers `None` (the
    /// caller looks again at what that work left, and calls again if it
    /// is still not what it needs).
    pub fn run<T>(&self, key: u64, work: impl FnOnce() -> T) -> Option<T> {
        let mut busy = self.busy.locked();
        if busy.contains(&key) {
            // Relaxed: a count the tests read, ordered by `busy`'s lock.
            self.waiting.fetch_add(1, Ordering::Relaxed);
            while busy.contains(&key) {
                busy = self.done.wait_locked(busy);
            }
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        busy.insert(key);
        drop(busy);
        let _landing = Landing { flights: self, key };
        Some(work())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Barrier};

    #[test]
    fn callers_at_once_share_one_run_per_key() {
        // Eight threads ask for key 7 while the first run is held until
        // all eight have asked; one more asks for key 8. Key 7 runs once:
        // the seven others wait and get `None`. Control: asked one after
        // another, each call runs.
        let f = Arc::new(Flights::default());
        let runs = Arc::new(AtomicU64::new(0));
        let (go, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let first = {
            let (f, runs, go, release) = (f.clone(), runs.clone(), go.clone(), release.clone());
            std::thread::spawn(move || {
                f.run(7, || {
                    runs.fetch_add(1, Ordering::Relaxed);
                    go.wait();
                    release.wait();
                })
            })
        };
        go.wait();
        let others: Vec<_> = (0..7)
            .map(|_| {
                let (f, runs) = (f.clone(), runs.clone());
                std::thread::spawn(move || f.run(7, || runs.fetch_add(1, Ordering::Relaxed)))
            })
            .collect();
        assert_eq!(f.run(8, || 42), Some(42), "another key is not held up");
        // All seven wait (the lock they wait under is the one the count is
        // read under), then the run ends.
        while f.waiting.load(Ordering::Relaxed) != 7 {
            std::thread::yield_now();
        }
        release.wait();
        assert_eq!(first.join().unwrap(), Some(()));
        for o in others {
            assert_eq!(o.join().unwrap(), None);
        }
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        // Asked one after another, each call runs.
        for _ in 0..3 {
            assert!(f.run(7, || runs.fetch_add(1, Ordering::Relaxed)).is_some());
        }
        assert_eq!(runs.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_run_that_panics_lets_the_next_one_run() {
        let f = Flights::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f.run(1, || panic!("listing failed"))
        }));
        assert!(r.is_err());
        assert_eq!(f.run(1, || 5), Some(5));
    }
}
