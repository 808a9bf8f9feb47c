//! The spool: the one thread that writes a cache's fills in the
//! background, off the reading threads' path, from memory the readers keep
//! alive until it is written (a chunk's clone), through a queue; and the
//! spare fills' admission and shedding (`FillMode::Spare`).
//!
//! A spare fill never makes a read wait, and is given up only when it
//! costs the reads memory. A consumer slower than the network reads in
//! bursts: the readers fill the memory the consumer released at network
//! speed, then wait for it again. The pieces of a burst are held by the
//! batches they went into as well as by the spool, so queueing them costs
//! nothing; the disk writes them while the consumer works. Only the bytes
//! the spool alone keeps alive (the consumer released their batches, the
//! disk has not written them) are memory the reads go without: while they
//! stay under [`Spool::hold_at_most`]'s bound, every fill goes on; past
//! it, the fills holding most of them are given up (a later read fills
//! those shards) and the admission limit halves.
//!
//! Each piece's block checksums are taken as the reader queues it, before
//! the reader makes a view of the bytes for anyone, and they are the
//! entry's table: a consumer that writes into a batch before the spool
//! writes it leaves an entry whose changed block fails its checksum on the
//! first read, which drops it (the bytes are fetched again) — never served.
//! The writer takes no sums of its own: one pass over the bytes, not two
//! (a second pass, over memory gone cold, cost as much CPU as the first:
//! 8% of an epoch's over HTTP on loopback).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};

use super::entry::BlockSums;
use super::{Cache, Filler};
use crate::sync::{Locked, Waits};

/// What keeps a piece's bytes alive and unwritten until the spool has
/// written them.
pub trait Held: Send {
    /// Whether anyone besides the spool still holds the bytes: while so,
    /// the spool's hold costs its owner no memory.
    fn shared(&self) -> bool;
}

impl Held for () {
    fn shared(&self) -> bool {
        false
    }
}

impl<T: Send + Sync> Held for Arc<T> {
    fn shared(&self) -> bool {
        Arc::strong_count(self) > 1
    }
}

/// Bytes the spool is to write, kept alive (and unchanged) by `hold`
/// until written.
struct Piece {
    ptr: *const u8,
    len: usize,
    hold: Box<dyn Held>,
}

// SAFETY: the bytes are only read, and `hold` keeps them alive and
// unwritten (the caller's promise in `SpoolFill::append`).
unsafe impl Send for Piece {}

enum Job {
    Append(Arc<FillSlot>, Piece),
    /// The fill's end: its sample count and the checksums its reader took.
    Finish(Arc<FillSlot>, Option<u64>, Option<Vec<u32>>),
    /// Answered once every job before it is done.
    Flush(mpsc::SyncSender<()>),
}

/// One fill as the spool sees it: its filler until finished or failed.
struct FillSlot {
    filler: Mutex<Option<Box<Filler>>>,
    len: u64,
    /// Given up (it held memory the reads needed, or the spool is gone):
    /// its queued pieces are dropped and its filler with them.
    abandoned: AtomicBool,
}

/// Whether filling may hold the reads up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillMode {
    /// Only with the disk's spare bandwidth over the epoch: the reads
    /// never wait for the disk, and a fill is given up only when the
    /// memory the spool alone holds for its writes passes the bound (a
    /// later read fills that shard).
    Spare,
    /// Every shard read whole is written: a reader ahead of the disk waits
    /// for it.
    Always,
}

/// The queue between the readers and the spool's thread.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Pieces queued (what bounds `Always` fills).
    pieces: usize,
    /// Their bytes.
    bytes: u64,
    closed: bool,
}

struct Line {
    q: Mutex<Queue>,
    /// Signalled when a job is queued or the line closes.
    work: Condvar,
    /// Signalled when a piece leaves the queue.
    room: Condvar,
    /// Bytes the spool's thread wrote, and the time it spent writing them
    /// (its pace: what the disk takes). Relaxed: figures for an estimate.
    wrote: AtomicU64,
    busy_ns: AtomicU64,
}

impl Line {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.locked()
    }

    /// Queues `job`; false once the spool is gone.
    fn push(&self, q: &mut Queue, job: Job) -> bool {
        if q.closed {
            return false;
        }
        if let Job::Append(_, p) = &job {
            q.pieces += 1;
            q.bytes += p.len as u64;
        }
        q.jobs.push_back(job);
        self.work.notify_one();
        true
    }
}

/// The background writer of a cache's fills: one thread, fed through a
/// queue whose pieces hold the readers' memory (bounded: see the module
/// comment, and [`DEPTH`] for `Always` fills).
pub struct Spool {
    cache: Arc<Cache>,
    mode: FillMode,
    /// Fills under way, and how many may be (see [`Spool::admits`]).
    fills: Arc<FillCount>,
    line: Arc<Line>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Whether fills take their checksums as their pieces are queued (the
    /// protection; off only by [`hooks::set_sums_at_write`]).
    sums_at_read: bool,
}

/// Pieces queued for an `Always` fill before its reader waits: 8 chunks of
/// 8 MiB is 64 MiB, some tens of milliseconds of a fast NVMe drive's
/// writes.
const DEPTH: usize = 8;

/// A reader's close waits for the spare fills' queued writes for at most
/// a twentieth of the time it read (then it gives the rest up): room under
/// the share of uncached speed `benches/cache.sh` checks the first epoch
/// against, with room for the writes' own CPU.
const CLOSE_SHARE: u128 = 20;

/// The bytes the spool may keep alive alone before spare fills are given
/// up, unless the owner of the memory sets its own
/// ([`Spool::hold_at_most`]): 64 MiB, what [`DEPTH`] pieces of 8 MiB hold,
/// as the queue held before it took pieces the batches still hold. Memory
/// the spool holds is memory the reads take fresh chunks for, and on a VM
/// that backs pages at first touch fresh chunks cost the first epoch
/// (measured: docs/decisions.md, "Defaults and the figures behind them").
/// A burst of reads the batches still hold is not counted, whatever its
/// size.
const HOLD: u64 = 64 << 20;

/// A fill handed to the spool: append pieces in order, then finish;
/// dropped unfinished, the entry is abandoned (nothing is left behind).
pub struct SpoolFill {
    slot: Arc<FillSlot>,
    line: Arc<Line>,
    mode: FillMode,
    fills: Arc<FillCount>,
    written: u64,
    /// The block checksums of the pieces queued, taken as each was.
    sums: Option<BlockSums>,
}

/// The spare fills' admission: how many are under way, and the limit,
/// which starts at [`MAX_FILLS`], grows by one with each fill completed
/// and halves when one is given up (so it settles near what the disk
/// keeps up with); and the bytes the spool may hold alone.
#[derive(Debug)]
struct FillCount {
    under_way: AtomicUsize,
    limit: AtomicUsize,
    hold: AtomicU64,
}

impl FillCount {
    fn given_up(&self) {
        // Relaxed: admission hints.
        let _ = self
            .limit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some((n / 2).max(1))
            });
    }
}

/// The most spare fills under way at once, and the first limit: more than
/// the streams of a loader or two (4 each by default), so on a disk that
/// keeps up every shard read whole is filled, the first ones too. (A limit
/// that started at one admitted the first stream's shard alone: the other
/// streams start their first reads just after it, while that fill is still
/// under way, and their shards were left uncached, for a later run.)
const MAX_FILLS: usize = 16;

impl Spool {
    pub fn start(cache: Arc<Cache>, mode: FillMode) -> std::io::Result<Spool> {
        let line = Arc::new(Line {
            q: Mutex::new(Queue::default()),
            work: Condvar::new(),
            room: Condvar::new(),
            wrote: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
        });
        let (c, l) = (Arc::clone(&cache), Arc::clone(&line));
        let pace = hooks::write_pace();
        let thread = std::thread::Builder::new()
            .name("ringfeed-cache".into())
            .spawn(move || spool_main(&c, &l, pace))?;
        Ok(Spool {
            cache,
            mode,
            fills: Arc::new(FillCount {
                under_way: AtomicUsize::new(0),
                limit: AtomicUsize::new(MAX_FILLS),
                hold: AtomicU64::new(HOLD),
            }),
            line,
            thread: Some(thread),
            sums_at_read: hooks::sums_at_read(),
        })
    }

    /// Sets the bytes the spool may keep alive alone (memory its readers
    /// released and it has not written yet) before spare fills are given
    /// up (the owner of that memory knows how much of it the reads can
    /// spare).
    pub fn hold_at_most(&self, bytes: u64) {
        // Relaxed: a bound read by the readers as they queue.
        self.fills.hold.store(bytes, Ordering::Relaxed);
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Waits until everything queued so far is written (and the memory it
    /// held let go).
    pub fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        let queued = {
            let mut q = self.line.lock();
            self.line.push(&mut q, Job::Flush(done))
        };
        if queued {
            let _ = wait.recv();
        }
    }

    /// Gives up the spare fills that would hold up the reader's close: it
    /// waits for what is queued, so while the queued pieces are more than
    /// the disk writes in [`CLOSE_SHARE`] of the reading (`elapsed`), and
    /// more than the bytes the writer may hold alone ([`HOLD`]), the fill
    /// with the most queued goes; the rest are written. On a disk that kept up over the epoch little is left and
    /// every fill completes; on one slower than the reads, the epoch does
    /// not wait for it. Nothing under [`FillMode::Always`].
    pub fn close_spare(&self, elapsed: std::time::Duration) {
        if self.mode != FillMode::Spare {
            return;
        }
        // Relaxed: figures for an estimate.
        let wrote = self.line.wrote.load(Ordering::Relaxed);
        let busy = self.line.busy_ns.load(Ordering::Relaxed).max(1);
        // What the disk writes in the share of the reading's time (none,
        // before it wrote anything), and at least the bytes the writer may
        // hold alone during the reading (the reads could wait on no more
        // then either).
        let share = (wrote as u128 * elapsed.as_nanos() / busy as u128 / CLOSE_SHARE) as u64;
        // Relaxed: a bound set once by the memory's owner.
        let budget = share.max(self.fills.hold.load(Ordering::Relaxed));
        let mut shed = Vec::new();
        {
            let mut q = self.line.lock();
            shed_where(&mut q, budget, &self.fills, &mut shed, |_| true);
        }
        drop(shed);
    }

    /// Whether a new fill may start: always under [`FillMode::Always`];
    /// under [`FillMode::Spare`] while fewer are under way than the limit,
    /// which starts at [`MAX_FILLS`] (a disk is taken to keep up until it
    /// first falls behind), grows by one with each fill completed and
    /// halves when a fill is given up. The reads never wait.
    pub fn admits(&self) -> bool {
        // Relaxed: a hint; the bound on held memory is what holds.
        self.mode == FillMode::Always
            || self.fills.under_way.load(Ordering::Relaxed)
                < self.fills.limit.load(Ordering::Relaxed)
    }

    /// Hands a fill to the spool.
    pub fn take(&self, mut filler: Box<Filler>, len: u64) -> Option<SpoolFill> {
        if self.line.lock().closed {
            return None;
        }
        if self.sums_at_read {
            filler.writer.sums_given();
        }
        // Relaxed: admission counts, hints only.
        self.fills.under_way.fetch_add(1, Ordering::Relaxed);
        Some(SpoolFill {
            slot: Arc::new(FillSlot {
                filler: Mutex::new(Some(filler)),
                len,
                abandoned: AtomicBool::new(false),
            }),
            line: Arc::clone(&self.line),
            mode: self.mode,
            fills: Arc::clone(&self.fills),
            written: 0,
            sums: self.sums_at_read.then(|| BlockSums::new(len)),
        })
    }
}

impl SpoolFill {
    /// Queues the next `len` bytes at `ptr`, their checksums taken now (so
    /// call it before anyone else may write them). False when the fill is
    /// given up: under [`FillMode::Spare`] the spool held more of its
    /// readers' memory alone than it may, and this fill's pieces were
    /// among the most of it; or the spool is gone. `hold` is dropped then.
    /// Never waits under [`FillMode::Spare`].
    ///
    /// # Safety
    /// `hold` keeps `ptr..ptr + len` alive and unwritten by the caller
    /// until it is dropped.
    pub unsafe fn append(&mut self, ptr: *const u8, len: usize, hold: Box<dyn Held>) -> bool {
        // Relaxed: set under the queue's lock, read here as a hint (the
        // lock below decides).
        if self.slot.abandoned.load(Ordering::Relaxed) {
            return false;
        }
        if let Some(sums) = &mut self.sums {
            // SAFETY: the caller's promise: the bytes are alive and no one
            // has written them since they were read.
            sums.update(unsafe { std::slice::from_raw_parts(ptr, len) });
        }
        let piece = Piece { ptr, len, hold };
        let job = Job::Append(Arc::clone(&self.slot), piece);
        let mut shed = Vec::new();
        let sent = {
            let mut q = self.line.lock();
            if self.mode == FillMode::Always {
                while q.pieces >= DEPTH && !q.closed {
                    q = self.line.room.wait_locked(q);
                }
            }
            // Relaxed: written under this lock.
            let sent = !self.slot.abandoned.load(Ordering::Relaxed) && self.line.push(&mut q, job);
            if sent && self.mode == FillMode::Spare {
                // Relaxed: a bound set once by the memory's owner.
                let hold = self.fills.hold.load(Ordering::Relaxed);
                shed_over(&mut q, hold, &self.fills, &mut shed);
            }
            sent && !self.slot.abandoned.load(Ordering::Relaxed)
        };
        // The memory of the pieces given up goes back outside the lock.
        drop(shed);
        if sent {
            self.written += len as u64;
        } else {
            // Relaxed: under no lock, the spool reads it under the queue's.
            self.slot.abandoned.store(true, Ordering::Relaxed);
        }
        sent
    }

    /// Bytes queued so far.
    pub fn queued(&self) -> u64 {
        self.written
    }

    /// Completes the entry with its sample count, once its pieces are
    /// written (and kept only if they are the bytes that were read).
    pub fn finish(mut self, samples: Option<u64>) {
        let sums = self.sums.take().map(BlockSums::finish);
        let job = Job::Finish(Arc::clone(&self.slot), samples, sums);
        let _ = {
            let mut q = self.line.lock();
            self.line.push(&mut q, job)
        };
        // Relaxed: admission hints.
        if !self.slot.abandoned.load(Ordering::Relaxed) {
            let l = &self.fills.limit;
            let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some((n + 1).min(MAX_FILLS))
            });
        }
    }
}

/// Gives up spare fills while the pieces queued that the spool alone keeps
/// alive (their readers' memory, which the reads go without) pass `hold`
/// bytes: the fill holding the most of them first. Their pieces leave the
/// queue into `shed` (dropped by the caller, outside the lock).
fn shed_over(q: &mut Queue, hold: u64, fills: &FillCount, shed: &mut Vec<Job>) {
    shed_where(q, hold, fills, shed, |p| !p.hold.shared());
}

/// Gives up fills while the queued pieces that `counts` pass `limit`
/// bytes, the fill with the most of them first (see `shed_over`).
fn shed_where(
    q: &mut Queue,
    limit: u64,
    fills: &FillCount,
    shed: &mut Vec<Job>,
    counts: impl Fn(&Piece) -> bool,
) {
    // Under the bound, even if every piece counted.
    if q.bytes <= limit {
        return;
    }
    loop {
        let mut alone: HashMap<*const FillSlot, u64> = HashMap::new();
        let mut total = 0;
        for job in &q.jobs {
            if let Job::Append(slot, p) = job
                && counts(p)
            {
                *alone.entry(Arc::as_ptr(slot)).or_default() += p.len as u64;
                total += p.len as u64;
            }
        }
        if total <= limit {
            return;
        }
        let Some((&worst, _)) = alone.iter().max_by_key(|(_, b)| **b) else {
            return;
        };
        fills.given_up();
        let jobs = std::mem::take(&mut q.jobs);
        for job in jobs {
            match job {
                Job::Append(slot, p) if Arc::as_ptr(&slot) == worst => {
                    // Relaxed: read under this lock.
                    slot.abandoned.store(true, Ordering::Relaxed);
                    q.pieces -= 1;
                    q.bytes -= p.len as u64;
                    shed.push(Job::Append(slot, p));
                }
                other => q.jobs.push_back(other),
            }
        }
    }
}

impl Drop for SpoolFill {
    fn drop(&mut self) {
        // Relaxed: admission hints.
        self.fills.under_way.fetch_sub(1, Ordering::Relaxed);
        // Finished or not, the slot's filler goes with the last job; an
        // unfinished one is dropped there (its temporary file removed).
        // Pieces already queued are skipped once the slot is empty.
        if Arc::strong_count(&self.slot) == 1 {
            self.slot.filler.locked().take();
        }
    }
}

/// The spool's thread: writes the jobs in order; `pace` (bytes a second,
/// 0 for none) is a test's slow disk.
fn spool_main(cache: &Cache, line: &Line, pace: u64) {
    loop {
        let job = {
            let mut q = line.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    if let Job::Append(_, p) = &job {
                        q.pieces -= 1;
                        q.bytes -= p.len as u64;
                        line.room.notify_all();
                    }
                    break job;
                }
                if q.closed {
                    return;
                }
                q = line.work.wait_locked(q);
            }
        };
        match job {
            Job::Append(slot, piece) => {
                let mut f = slot.filler.locked();
                // Relaxed: set under the queue's lock, which this thread
                // took after it was (the job was queued before).
                if slot.abandoned.load(Ordering::Relaxed) {
                    f.take();
                }
                let Some(filler) = f.as_mut() else {
                    continue;
                };
                let t0 = std::time::Instant::now();
                hooks::pace(pace, piece.len);
                // SAFETY: `piece.hold` keeps the bytes alive and unwritten
                // by their reader.
                let bytes = unsafe { std::slice::from_raw_parts(piece.ptr, piece.len) };
                if let Err(e) = filler.writer.append(bytes) {
                    f.take();
                    cache.write_failed(&e);
                }
                // Relaxed: figures for an estimate.
                line.wrote.fetch_add(piece.len as u64, Ordering::Relaxed);
                line.busy_ns
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
            Job::Finish(slot, samples, sums) => {
                let taken = slot.filler.locked().take();
                // Relaxed: as above.
                let given_up = slot.abandoned.load(Ordering::Relaxed);
                match taken {
                    Some(filler) if !given_up => {
                        let Filler { writer, _lock } = *filler;
                        let done = match sums {
                            Some(taken) => writer.finish_as(samples, taken),
                            None => writer.finish(samples),
                        };
                        cache.filled(done, slot.len);
                        // The lock goes after the rename: a reader waiting
                        // for it finds the entry.
                        drop(_lock);
                    }
                    _ => cache.not_cached(
                        "a shard's fill was given up: the disk could not write it without \
                         holding the reads up (`cache_fill` \"spare\"); a later read fills it",
                    ),
                }
            }
        }
    }
}

impl Drop for Spool {
    /// Waits until every queued piece is written (fills still open when
    /// their readers drop them are abandoned).
    fn drop(&mut self) {
        {
            let mut q = self.line.lock();
            q.closed = true;
            self.line.work.notify_all();
            self.line.room.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Switches for tests (the `test-hooks` feature): a disk slower than the
/// network (the writer paced), and the checksums taken at write time, as
/// they were before (the control of the tests of a consumer writing into
/// its batches). Without the feature, neither exists.
pub mod hooks {
    #[cfg(any(test, feature = "test-hooks"))]
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[cfg(any(test, feature = "test-hooks"))]
    static PACE: AtomicU64 = AtomicU64::new(0);
    #[cfg(any(test, feature = "test-hooks"))]
    static SUMS_AT_WRITE: AtomicBool = AtomicBool::new(false);

    /// Paces every spool of this process to `bytes_per_s` of writes (0:
    /// unpaced).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn set_write_pace(bytes_per_s: u64) {
        // Relaxed: a test's setting, made before the loader it times.
        PACE.store(bytes_per_s, Ordering::Relaxed);
    }

    /// Takes a fill's checksums as the spool writes its bytes (the
    /// protection off), or as its reader queues them (`false`: on, the
    /// default).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn set_sums_at_write(on: bool) {
        // Relaxed: as above.
        SUMS_AT_WRITE.store(on, Ordering::Relaxed);
    }

    pub(super) fn sums_at_read() -> bool {
        #[cfg(any(test, feature = "test-hooks"))]
        {
            // Relaxed: as above.
            !SUMS_AT_WRITE.load(Ordering::Relaxed)
        }
        #[cfg(not(any(test, feature = "test-hooks")))]
        true
    }

    /// The pace a spool started now writes at (0: unpaced).
    pub(super) fn write_pace() -> u64 {
        #[cfg(any(test, feature = "test-hooks"))]
        {
            // Relaxed: as above.
            PACE.load(Ordering::Relaxed)
        }
        #[cfg(not(any(test, feature = "test-hooks")))]
        0
    }

    /// Sleeps as long as `len` bytes take at `rate` bytes a second.
    pub(super) fn pace(rate: u64, len: usize) {
        if rate > 0 {
            let ns = len as u128 * 1_000_000_000 / rate as u128;
            std::thread::sleep(std::time::Duration::from_nanos(ns as u64));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::cache::{CacheOptions, Fill, Identity, MinFree};

    fn cache(dir: &Path) -> Arc<Cache> {
        Arc::new(
            Cache::open(CacheOptions {
                dir: dir.to_path_buf(),
                size: 1 << 30,
                min_free: MinFree::Bytes(0),
            })
            .unwrap(),
        )
    }

    fn id(object: &str, len: u64) -> Identity {
        Identity {
            endpoint: "http://127.0.0.1:1".into(),
            object: object.into(),
            version: "etag \"v\"".into(),
            offset: 0,
            len,
        }
    }

    /// A hold whose bytes someone else (a batch) still uses while `other`
    /// lives.
    struct BatchHold(Arc<()>);

    impl Held for BatchHold {
        fn shared(&self) -> bool {
            Arc::strong_count(&self.0) > 1
        }
    }

    #[test]
    fn a_spare_fill_gives_up_when_the_writer_holds_too_much_alone_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        let spool = Spool::start(Arc::clone(&c), FillMode::Spare).unwrap();
        let piece = vec![5u8; 4096];
        spool
            .fills
            .hold
            .store(4096 * DEPTH as u64, Ordering::Relaxed);
        assert!(spool.admits());
        let Fill::Write(f) = c.fill(&id("a", 4096 * 40), Duration::from_secs(1)) else {
            panic!("no fill");
        };
        let mut fill = spool.take(f, 4096 * 40).unwrap();
        // Every fill is admitted until the disk first falls behind.
        assert!(spool.admits());
        // The writer stalls on this fill's first piece (as on a slow disk):
        // its lock is held here.
        let slot = Arc::clone(&fill.slot);
        let stall = slot.filler.lock().unwrap();
        let mut queued = 0;
        let gave_up = loop {
            // SAFETY: `piece` outlives the spool (flushed below).
            if !unsafe { fill.append(piece.as_ptr(), piece.len(), Box::new(())) } {
                break queued;
            }
            queued += 1;
            assert!(queued <= DEPTH + 1, "the bound never bit");
        };
        // The bound, and the piece the writer holds, and no more: the
        // reader never waited.
        assert!((DEPTH..=DEPTH + 1).contains(&gave_up), "{gave_up}");
        drop(stall);
        drop(slot);
        drop(fill);
        spool.flush();
        assert!(spool.admits());
        assert_eq!(spool.fills.limit.load(Ordering::Relaxed), MAX_FILLS / 2);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| !n.ends_with(".lock") && n != ".evict")
            .collect();
        assert!(names.is_empty(), "{names:?}");
        // The next fill of the same shard is given again.
        assert!(matches!(
            c.fill(&id("a", 4096 * 40), Duration::from_secs(1)),
            Fill::Write(_)
        ));
    }

    /// A burst of reads far larger than the bound, all of it still held by
    /// the batches it went into (a consumer slower than the network), is
    /// queued whole while the writer is stalled, and stored once it goes
    /// on: the fill is not given up. The control is the same burst with
    /// the batches released before the writer went on: the spool alone
    /// holds it, and the fill is given up at the bound.
    #[test]
    fn a_burst_the_batches_still_hold_is_queued_whole_and_filled() {
        for batches_held in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let c = cache(dir.path());
            let spool = Spool::start(Arc::clone(&c), FillMode::Spare).unwrap();
            spool
                .fills
                .hold
                .store(4096 * DEPTH as u64, Ordering::Relaxed);
            let n = 8 * DEPTH;
            let piece = vec![7u8; 4096];
            let k = id("burst", (4096 * n) as u64);
            let Fill::Write(f) = c.fill(&k, Duration::from_secs(1)) else {
                panic!("no fill");
            };
            let mut fill = spool.take(f, k.len).unwrap();
            let slot = Arc::clone(&fill.slot);
            let stall = slot.filler.lock().unwrap();
            let mut batches = Vec::new();
            let mut all_queued = true;
            for _ in 0..n {
                let batch = Arc::new(());
                let hold = BatchHold(Arc::clone(&batch));
                if batches_held {
                    batches.push(batch);
                }
                // SAFETY: `piece` outlives the spool (flushed below).
                if !unsafe { fill.append(piece.as_ptr(), piece.len(), Box::new(hold)) } {
                    all_queued = false;
                    break;
                }
            }
            drop(stall);
            drop(slot);
            if all_queued {
                fill.finish(Some(2));
            } else {
                drop(fill);
            }
            // The consumer releases its batches after the writer went on.
            drop(batches);
            spool.flush();
            if batches_held {
                assert!(all_queued, "a burst the batches hold was given up");
                assert_eq!(c.count(&k), Some(2));
                let e = c.lookup(&k).expect("the entry");
                assert_eq!(e.read_all().unwrap().unwrap(), vec![7u8; 4096 * n]);
                assert_eq!(spool.fills.limit.load(Ordering::Relaxed), MAX_FILLS);
            } else {
                assert!(
                    !all_queued,
                    "the control: the spool alone held past the bound"
                );
                assert!(c.lookup(&k).is_none());
            }
        }
    }

    /// A reader's close gives up the spare fills whose queued writes the
    /// disk, at the pace it wrote so far, would take longer than a
    /// twentieth of the reading to finish, and keeps (and completes) them
    /// when it would not: the same queue, closed after a short read and
    /// after a long one.
    #[test]
    fn a_close_waits_only_for_what_the_disk_writes_in_a_share_of_the_read() {
        for (read_ms, kept) in [(20u64, false), (1000, true)] {
            let dir = tempfile::tempdir().unwrap();
            let c = cache(dir.path());
            let spool = Spool::start(Arc::clone(&c), FillMode::Spare).unwrap();
            spool.fills.hold.store(4096, Ordering::Relaxed);
            // The disk so far: 4096 bytes a millisecond.
            spool.line.wrote.store(4096, Ordering::Relaxed);
            spool.line.busy_ns.store(1_000_000, Ordering::Relaxed);
            let piece = vec![4u8; 4096];
            let k = id("close", 4096 * 8);
            let Fill::Write(f) = c.fill(&k, Duration::from_secs(1)) else {
                panic!("no fill");
            };
            let mut fill = spool.take(f, k.len).unwrap();
            let slot = Arc::clone(&fill.slot);
            let stall = slot.filler.lock().unwrap();
            let batch = Arc::new(());
            for _ in 0..8 {
                let hold = Box::new(BatchHold(Arc::clone(&batch)));
                // SAFETY: `piece` outlives the spool (flushed below).
                assert!(unsafe { fill.append(piece.as_ptr(), piece.len(), hold) });
            }
            fill.finish(Some(1));
            // 20 ms of reading: 4 KiB may wait; 7 pieces are queued (the
            // writer holds the first). 1 s: 200 KiB may.
            spool.close_spare(Duration::from_millis(read_ms));
            drop(stall);
            drop(slot);
            spool.flush();
            assert_eq!(c.lookup(&k).is_some(), kept, "after {read_ms} ms");
            assert_eq!(c.stats.snapshot().uncached, u64::from(!kept));
        }
    }

    /// A consumer writes into a batch (`x.div_(255)` in place) after the
    /// reader queued the piece and before the writer stored it: the entry
    /// is not kept, and a later read finds the source bytes or none. The
    /// control takes the checksums as the writer writes (the protection
    /// off): the changed bytes are stored with valid checksums and read
    /// back as if they were the shard's.
    #[test]
    fn bytes_changed_after_their_read_are_never_served() {
        for protected in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let c = cache(dir.path());
            let mut spool = Spool::start(Arc::clone(&c), FillMode::Always).unwrap();
            spool.sums_at_read = protected;
            let source: Vec<u8> = (0..4 * 65536).map(|i| (i % 251) as u8).collect();
            let mut batch = source.clone();
            let k = id("poison", source.len() as u64);
            let Fill::Write(f) = c.fill(&k, Duration::from_secs(1)) else {
                panic!("no fill");
            };
            let mut fill = spool.take(f, k.len).unwrap();
            let slot = Arc::clone(&fill.slot);
            let stall = slot.filler.lock().unwrap();
            // SAFETY: `batch` outlives the spool's write (flushed below).
            assert!(unsafe { fill.append(batch.as_ptr(), batch.len(), Box::new(())) });
            fill.finish(Some(1));
            // The consumer's in-place op, before the writer runs.
            for b in &mut batch[70000..80000] {
                *b /= 3;
            }
            drop(stall);
            drop(slot);
            spool.flush();
            let entry = c.lookup(&k).expect("the fill completed");
            if protected {
                // Stored under the sums of what was read: its first read
                // finds the changed block (70000 / 65536 = 1).
                match entry.read_all().unwrap() {
                    Err(super::super::entry::Bad::Corrupt(why)) => {
                        assert!(why.contains("block 1 "), "{why}")
                    }
                    other => panic!("changed bytes were served: {other:?}"),
                }
            } else {
                let stored = entry.read_all().unwrap().ok();
                assert_eq!(
                    stored.as_deref(),
                    Some(&batch[..]),
                    "the control stored them"
                );
                assert_ne!(stored.as_deref(), Some(&source[..]));
            }
        }
    }

    #[test]
    fn an_always_fill_waits_for_the_writer_and_completes() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        let spool = Spool::start(Arc::clone(&c), FillMode::Always).unwrap();
        let n = 4 * DEPTH;
        let piece = vec![9u8; 4096];
        let k = id("b", (4096 * n) as u64);
        let Fill::Write(f) = c.fill(&k, Duration::from_secs(1)) else {
            panic!("no fill");
        };
        let mut fill = spool.take(f, k.len).unwrap();
        for _ in 0..n {
            // SAFETY: `piece` outlives the spool (flushed below).
            assert!(unsafe { fill.append(piece.as_ptr(), piece.len(), Box::new(())) });
        }
        fill.finish(Some(3));
        spool.flush();
        assert_eq!(spool.fills.limit.load(Ordering::Relaxed), MAX_FILLS);
        assert_eq!(c.count(&k), Some(3));
        assert_eq!(c.stats.snapshot().written, 1);
        let e = c.lookup(&k).expect("the entry");
        assert_eq!(e.read_all().unwrap().unwrap(), vec![9u8; 4096 * n]);
    }

    /// Streams that start their shards one just after another, each
    /// while the fills before it are under way (as a loader's streams
    /// do), all fill on a writer that keeps up: the second run finds
    /// every shard. The control is the first limit of one this replaced:
    /// the second stream's shard is not admitted.
    #[test]
    fn streams_starting_together_all_fill_on_a_disk_that_keeps_up() {
        for first_limit in [MAX_FILLS, 1] {
            let dir = tempfile::tempdir().unwrap();
            let c = cache(dir.path());
            let spool = Spool::start(Arc::clone(&c), FillMode::Spare).unwrap();
            spool.fills.limit.store(first_limit, Ordering::Relaxed);
            let piece = vec![3u8; 4096];
            let mut fills = Vec::new();
            for s in 0..4 {
                let k = id(&format!("s{s}"), 4096 * 4);
                if !spool.admits() {
                    continue;
                }
                let Fill::Write(f) = c.fill(&k, Duration::from_secs(1)) else {
                    panic!("no fill");
                };
                let mut fill = spool.take(f, k.len).unwrap();
                // SAFETY: `piece` outlives the spool (flushed below).
                assert!(unsafe { fill.append(piece.as_ptr(), piece.len(), Box::new(())) });
                fills.push((k, fill));
            }
            let admitted = fills.len();
            for _ in 1..4 {
                // A writer that keeps up: the queue is empty before each
                // round of one piece a stream (fewer than `DEPTH`).
                spool.flush();
                for (_, fill) in &mut fills {
                    // SAFETY: as above.
                    assert!(unsafe { fill.append(piece.as_ptr(), piece.len(), Box::new(())) });
                }
            }
            let keys: Vec<_> = fills.iter().map(|(k, _)| k.clone()).collect();
            for (_, fill) in fills {
                fill.finish(Some(1));
            }
            spool.flush();
            for k in &keys {
                assert_eq!(c.count(k), Some(1), "{k:?} not stored");
            }
            if first_limit == 1 {
                assert_eq!(admitted, 1, "the control admitted more than one");
            } else {
                assert_eq!(admitted, 4, "a stream's shard was not admitted");
                assert_eq!(c.stats.snapshot().written, 4);
            }
        }
    }
}
