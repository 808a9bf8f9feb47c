//! What `fork()` does to the handle tables (`boundary.rs`). The child of a
//! process with open loaders gets a copy of their tables but none of their
//! threads: a loader there would hand out the batches its queues held at the
//! fork (which the parent hands out too), wait for ever for workers that do
//! not exist, and panic joining them at close. So every table entry records
//! the process that made it, and a call from another process is refused with
//! `RINGFEED_ERR_INVALID_HANDLE` before the loader or batch is touched; the
//! entry stays in the child's table, never dropped there (dropping would
//! close a loader whose threads are the parent's).
//!
//! The fork may also come while another thread of the parent holds a table's
//! lock, which the child would inherit locked, and hang on. `pthread_atfork`
//! handlers take both locks before the fork and let go of them after it, in
//! the parent and in the child, so the child's copies are always unlocked.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{MutexGuard, Once};

use super::boundary::{BATCHES, HeldBatch, LOADERS, OBJECTS, OpenLoader, OpenWriter, WRITERS};
use crate::object::ObjectBuf;
use crate::sync::Locked;

type TableGuards = (
    MutexGuard<'static, HashMap<usize, OpenLoader>>,
    MutexGuard<'static, HashMap<u64, HeldBatch>>,
    MutexGuard<'static, HashMap<usize, std::sync::Arc<ObjectBuf>>>,
    MutexGuard<'static, HashMap<usize, OpenWriter>>,
);

thread_local! {
    /// The table locks the forking thread holds from `before_fork` to
    /// `after_fork` (the three handlers run on the thread calling fork).
    static HELD_ACROSS_FORK: RefCell<Option<TableGuards>> = const { RefCell::new(None) };
}

/// `pthread_atfork`'s prepare handler: every table lock, in one order (no
/// entry point holds one while taking another, so any order is safe).
extern "C" fn before_fork() {
    let guards = (
        LOADERS.locked(),
        BATCHES.locked(),
        OBJECTS.locked(),
        WRITERS.locked(),
    );
    HELD_ACROSS_FORK.with(|h| *h.borrow_mut() = Some(guards));
}

/// The parent and child handler: lets go of the locks `before_fork` took.
extern "C" fn after_fork() {
    HELD_ACROSS_FORK.with(|h| drop(h.borrow_mut().take()));
}

/// Installs the fork handlers, once per process; called before the first
/// entry goes into a table.
pub(super) fn install_handlers() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions that live as long
        // as the library, take only the table locks and never unwind
        // (`lock` ignores poisoning; the `RefCell` is borrowed by nothing else).
        // Only ENOMEM can fail it: then a child might inherit a locked
        // table, as before these handlers; the pid check still refuses
        // every entry the child finds.
        let _ =
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    });
}
