//! The one way this crate takes a lock or waits on a condition variable:
//! a lock a panicking thread left poisoned still gives its data. Every
//! thread that can panic holding one of these locks leaves the data in a
//! state the next holder can read (counters, queues, tables), and a panic
//! is already reported where it happened; failing every later thread on
//! the poison would turn one error into a hung or crashed loader.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    WaitTimeoutResult,
};
use std::time::Duration;

/// [`Mutex::lock`], a poisoned lock taken all the same.
pub(crate) trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], poisoned or not.
pub(crate) trait ReadWriteLocked<T: ?Sized> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWriteLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Condvar::wait`] and [`Condvar::wait_timeout`], poisoned or not.
pub(crate) trait Waits {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    fn wait_locked_for<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        most: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
}

impl Waits for Condvar {
    fn wait_locked<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_locked_for<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        most: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, most)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_gives_its_data() {
        let m = Arc::new(Mutex::new(1));
        let held = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 2;
            panic!("poisons the lock");
        })
        .join();
        // The control: the standard library's lock refuses it.
        assert!(m.lock().is_err());
        assert_eq!(*m.locked(), 2);
        let rw = Arc::new(RwLock::new(3));
        let held = Arc::clone(&rw);
        let _ = std::thread::spawn(move || {
            let _g = held.write().unwrap();
            panic!("poisons the lock");
        })
        .join();
        assert!(rw.read().is_err());
        assert_eq!(*rw.read_locked(), 3);
        *rw.write_locked() = 4;
        let cv = Condvar::new();
        let (g, timed_out) = cv.wait_locked_for(m.locked(), Duration::from_millis(1));
        assert!(timed_out.timed_out());
        assert_eq!(*g, 2);
    }
}
