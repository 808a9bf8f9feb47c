//! The spool: the one thread that writes a cache's fills in the
//! background, off the reading threads' path, from memory the readers keep
//! alive until it is written (a chunk's clone), through a bounded queue;
//! and the spare fills' admission (`FillMode::Spare`: fills that find the
//! queue full are given up, never waited for).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use super::{Cache, Filler};

/// Bytes the spool is to write, kept alive (and unchanged) by `hold`
/// until written.
struct Piece {
    ptr: *const u8,
    len: usize,
    _hold: Box<dyn Send>,
}

// SAFETY: the bytes are only read, and `_hold` keeps them alive and
// unwritten (the caller's promise in `Spool::append`).
unsafe impl Send for Piece {}

enum Job {
    Append(Arc<FillSlot>, Piece),
    Finish(Arc<FillSlot>, Option<u64>),
    /// Answered once every job before it is done.
    Flush(mpsc::SyncSender<()>),
}

/// One fill as the spool sees it: its filler until finished or failed.
struct FillSlot {
    filler: Mutex<Option<Box<Filler>>>,
    len: u64,
    /// The reader gave up on it (the spool was behind): its queued pieces
    /// are skipped and its filler dropped.
    abandoned: std::sync::atomic::AtomicBool,
}

/// Whether filling may hold the reads up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillMode {
    /// Only with the disk's spare bandwidth: a piece that finds the
    /// spool's queue full abandons its shard's fill (a later read fills
    /// it), so the reads never wait for the disk.
    Spare,
    /// Every shard read whole is written: a reader ahead of the disk waits
    /// for it.
    Always,
}

/// The background writer of a cache's fills: one thread, fed through a
/// bounded queue of `DEPTH` pieces (what it holds of the readers' memory
/// stays bounded).
pub struct Spool {
    cache: Arc<Cache>,
    mode: FillMode,
    /// Fills under way, and how many may be (see [`Spool::admits`]).
    fills: Arc<FillCount>,
    tx: Option<mpsc::SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Pieces queued for the spool: 8 chunks of 8 MiB is 64 MiB, about 25 ms
/// of a fast NVMe drive's writes.
const DEPTH: usize = 8;

/// A fill handed to the spool: append pieces in order, then finish;
/// dropped unfinished, the entry is abandoned (nothing is left behind).
pub struct SpoolFill {
    slot: Arc<FillSlot>,
    tx: mpsc::SyncSender<Job>,
    mode: FillMode,
    fills: Arc<FillCount>,
    written: u64,
}

/// The spare fills' admission: how many are under way, and the limit,
/// which starts at [`MAX_FILLS`], grows by one with each fill completed
/// and halves when one is given up (so it settles near what the disk
/// keeps up with).
#[derive(Debug)]
struct FillCount {
    under_way: AtomicUsize,
    limit: AtomicUsize,
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
        let (tx, rx) = mpsc::sync_channel::<Job>(DEPTH);
        let c = Arc::clone(&cache);
        let thread = std::thread::Builder::new()
            .name("ringfeed-cache".into())
            .spawn(move || spool_main(&c, rx))?;
        Ok(Spool {
            cache,
            mode,
            fills: Arc::new(FillCount {
                under_way: AtomicUsize::new(0),
                limit: AtomicUsize::new(MAX_FILLS),
            }),
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Waits until everything queued so far is written (and the memory it
    /// held let go).
    pub fn flush(&self) {
        let Some(tx) = &self.tx else {
            return;
        };
        let (done, wait) = mpsc::sync_channel(1);
        if tx.send(Job::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Whether a new fill may start: always under [`FillMode::Always`];
    /// under [`FillMode::Spare`] while fewer are under way than the limit,
    /// which starts at [`MAX_FILLS`] (a disk is taken to keep up until it
    /// first falls behind), grows by one with each fill completed and
    /// halves when a fill is given up (its pieces found the queue full).
    /// Readers each fill one shard at their own pace, so on a disk slower
    /// than the reads the limit soon settles near the number of readers
    /// whose pace it keeps up with, and few fills are given up midway
    /// (each wastes the writes made for it); the reads never wait.
    pub fn admits(&self) -> bool {
        // Relaxed: a hint; the queue's own bound is what holds.
        self.mode == FillMode::Always
            || self.fills.under_way.load(Ordering::Relaxed)
                < self.fills.limit.load(Ordering::Relaxed)
    }

    /// Hands a fill to the spool.
    pub fn take(&self, filler: Box<Filler>, len: u64) -> Option<SpoolFill> {
        let tx = self.tx.clone()?;
        // Relaxed: admission counts, hints only.
        self.fills.under_way.fetch_add(1, Ordering::Relaxed);
        Some(SpoolFill {
            slot: Arc::new(FillSlot {
                filler: Mutex::new(Some(filler)),
                len,
                abandoned: std::sync::atomic::AtomicBool::new(false),
            }),
            tx,
            mode: self.mode,
            fills: Arc::clone(&self.fills),
            written: 0,
        })
    }
}

impl SpoolFill {
    /// Queues the next `len` bytes at `ptr`. False when the fill is
    /// abandoned: under [`FillMode::Spare`] the queue was full (the disk is
    /// behind the reads), or the spool is gone; `hold` is dropped then.
    ///
    /// # Safety
    /// `hold` keeps `ptr..ptr + len` alive and unwritten until it is
    /// dropped.
    pub unsafe fn append(&mut self, ptr: *const u8, len: usize, hold: Box<dyn Send>) -> bool {
        let piece = Piece {
            ptr,
            len,
            _hold: hold,
        };
        let job = Job::Append(Arc::clone(&self.slot), piece);
        let sent = match self.mode {
            FillMode::Always => self.tx.send(job).is_ok(),
            FillMode::Spare => self.tx.try_send(job).is_ok(),
        };
        if sent {
            self.written += len as u64;
        } else {
            // Relaxed: admission hints.
            let l = &self.fills.limit;
            let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some((n / 2).max(1))
            });
            // Relaxed: the spool only skips work by it.
            self.slot.abandoned.store(true, Ordering::Relaxed);
        }
        sent
    }

    /// Bytes queued so far.
    pub fn queued(&self) -> u64 {
        self.written
    }

    /// Completes the entry with its sample count, once its pieces are
    /// written.
    pub fn finish(self, samples: Option<u64>) {
        let _ = self.tx.send(Job::Finish(Arc::clone(&self.slot), samples));
        // Relaxed: admission hints.
        let l = &self.fills.limit;
        let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some((n + 1).min(MAX_FILLS))
        });
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
            self.slot
                .filler
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
        }
    }
}

fn spool_main(cache: &Cache, rx: mpsc::Receiver<Job>) {
    for job in rx {
        match job {
            Job::Append(slot, piece) => {
                let mut f = slot.filler.lock().unwrap_or_else(|p| p.into_inner());
                if slot.abandoned.load(Ordering::Relaxed) {
                    f.take();
                }
                let Some(filler) = f.as_mut() else {
                    continue;
                };
                // SAFETY: `piece._hold` keeps the bytes alive and unwritten.
                let bytes = unsafe { std::slice::from_raw_parts(piece.ptr, piece.len) };
                if let Err(e) = filler.writer.append(bytes) {
                    f.take();
                    cache.write_failed(&e);
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
            Job::Finish(slot, samples) => {
                let taken = slot.filler.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(filler) = taken {
                    let Filler { writer, _lock } = *filler;
                    cache.filled(writer.finish(samples), slot.len);
                    // The lock goes after the rename: a reader waiting for
                    // it finds the entry.
                    drop(_lock);
                }
            }
        }
    }
}

impl Drop for Spool {
    /// Waits until every queued piece is written (fills still open when
    /// their readers drop them are abandoned).
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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

    #[test]
    fn a_spare_fill_gives_up_when_the_writer_is_behind_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        let spool = Spool::start(Arc::clone(&c), FillMode::Spare).unwrap();
        let piece = vec![5u8; 4096];
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
            assert!(queued <= DEPTH + 1, "the queue never filled");
        };
        // The queue, and the piece the writer holds, and no more: the
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
