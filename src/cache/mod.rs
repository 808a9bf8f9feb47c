//! The local cache tier: remote shards kept in a directory on local disk
//! (NVMe), so later epochs — of this job, of a restarted job, of another
//! process on the node — read them from disk instead of the network.
//!
//! - [`entry`]: one entry on disk (identity, checksums, the atomic store,
//!   the checked read).
//! - [`private`]: what keeps the directory this user's alone (made 0700,
//!   owner and mode checked at open, files 0600 made without following
//!   links, temporary files of dead fills removed), and why that, not a
//!   MAC, is what keeps entries from being forged.
//! - [`Cache`]: the directory. Looks entries up (a stale or corrupt one is
//!   dropped and counted), decides who fills a missing one (one process per
//!   entry, by a file lock; the others wait for it while it makes
//!   progress), keeps the directory under its size limit and above its
//!   free-space floor by evicting the least recently used entries, and
//!   stops writing — the job goes on uncached, and says so — when the
//!   directory is read-only or the disk fills.
//! - [`Spool`]: the thread that writes fills in the background, off the
//!   reading thread's path, from memory the caller keeps alive until then.
//!
//! The engine (`engine::worker`) decides what to cache (whole remote shards
//! read from their start to their end) and reads hits like local files.

pub mod entry;
pub mod private;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

pub use entry::{Bad, Entry, Identity};

use crate::error::Result;

/// How a fill's temporary file is named: `.{entry}.tmp`.
const TMP_SUFFIX: &str = ".tmp";

/// The temporary file of the entry named `entry`.
fn tmp_name(entry: &str) -> String {
    format!(".{entry}{TMP_SUFFIX}")
}

/// The fill lock of the entry named `entry`.
fn lock_name(entry: &str) -> String {
    format!(".{entry}.lock")
}

/// The free space to keep on the cache's file system.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinFree {
    Bytes(u64),
    /// A fraction (0..1) of the file system's size.
    Fraction(f64),
}

/// Where the cache is and how much it may hold.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// The most bytes its entries may take.
    pub size: u64,
    pub min_free: MinFree,
}

/// What a cache counts (all processes' use of the directory is not
/// summed: each counts its own).
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Entries found whole and current.
    pub hits: AtomicU64,
    /// Entries looked up and not found (or dropped).
    pub misses: AtomicU64,
    /// Data bytes read from entries.
    pub bytes_hit: AtomicU64,
    /// Entries written, and their data bytes.
    pub written: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Entries removed to stay under the limit or above the floor.
    pub evictions: AtomicU64,
    /// Entries dropped as corrupt (torn, truncated, failed checksums).
    pub corrupt: AtomicU64,
    /// Entries dropped because the object changed (another version).
    pub stale: AtomicU64,
    /// Shards read uncached: no room, a stalled filler elsewhere, an
    /// object without a version, a write that failed, writes turned off.
    pub uncached: AtomicU64,
    /// Lookups that waited for another reader's fill.
    pub waited: AtomicU64,
}

/// A snapshot of [`CacheStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub bytes_hit: u64,
    pub written: u64,
    pub bytes_written: u64,
    pub evictions: u64,
    pub corrupt: u64,
    pub stale: u64,
    pub uncached: u64,
    pub waited: u64,
}

impl CacheStats {
    pub fn snapshot(&self) -> CacheCounts {
        // Relaxed: a report.
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheCounts {
            hits: l(&self.hits),
            misses: l(&self.misses),
            bytes_hit: l(&self.bytes_hit),
            written: l(&self.written),
            bytes_written: l(&self.bytes_written),
            evictions: l(&self.evictions),
            corrupt: l(&self.corrupt),
            stale: l(&self.stale),
            uncached: l(&self.uncached),
            waited: l(&self.waited),
        }
    }
}

fn bump(a: &AtomicU64, n: u64) {
    // Relaxed: a statistic.
    a.fetch_add(n, Ordering::Relaxed);
}

/// How a fill starts.
pub enum Fill {
    /// The entry is there (another reader filled it meanwhile).
    Hit(Entry),
    /// This reader writes it: append the data in order, then finish.
    Write(Box<Filler>),
    /// Read it uncached; the reason is counted (and, when writing stopped
    /// for good, in [`Cache::note`]).
    Uncached(String),
}

/// The right to write one entry: its writer and the lock that makes this
/// reader the only one writing it (released when dropped).
pub struct Filler {
    writer: entry::Writer,
    _lock: File,
}

/// A cache directory.
pub struct Cache {
    opts: CacheOptions,
    pub stats: CacheStats,
    /// Why this process stopped writing entries (read-only, disk full);
    /// `None` while it writes.
    writes_off: Mutex<Option<String>>,
    /// Why the first shard read uncached was, while writing goes on.
    first_skip: Mutex<Option<String>>,
}

impl Cache {
    /// Opens (and creates, mode 0700) the directory, and removes the
    /// temporary files of fills that died there. Fails only for a
    /// directory that is not this user's alone ([`private::check_dir`]:
    /// another user's, or one others may write into): a directory that
    /// cannot be made or written is used for reading what it holds, and
    /// [`Cache::note`] says why nothing is written.
    pub fn open(opts: CacheOptions) -> Result<Cache> {
        let made = private::create_dir(&opts.dir);
        private::check_dir(&opts.dir)?;
        let off = match made {
            Err(e) => Some(format!("cannot create it ({e})")),
            Ok(()) => probe_write(&opts.dir)
                .err()
                .map(|e| format!("not writable ({e})")),
        };
        if off.is_none() {
            let c = private::clean_stale(&opts.dir);
            if c != private::Cleaned::default() {
                let dir = opts.dir.display();
                crate::log::log(crate::log::Level::Info, || {
                    format!(
                        "cache {dir}: removed {} temporary file(s) of fills that died; made {} \
                         entries readable by this user only",
                        c.temps, c.modes
                    )
                });
            }
        }
        Ok(Cache {
            opts,
            stats: CacheStats::default(),
            writes_off: Mutex::new(off),
            first_skip: Mutex::new(None),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    /// Says, when this process writes no more entries, why; else, when
    /// shards were read uncached, how many and why the first was.
    pub fn note(&self) -> Option<String> {
        let dir = self.opts.dir.display();
        if let Some(why) = self.off() {
            return Some(format!(
                "cache {dir}: {why}; reading without caching new shards"
            ));
        }
        let first = self
            .first_skip
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let n = self.stats.uncached.load(Ordering::Relaxed);
        Some(format!(
            "cache {dir}: {n} shard read(s) not cached (first: {first})"
        ))
    }

    fn off(&self) -> Option<String> {
        self.writes_off
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn turn_off(&self, why: String) {
        let mut off = self.writes_off.lock().unwrap_or_else(|p| p.into_inner());
        if off.is_none() {
            *off = Some(why);
            drop(off);
            if let Some(n) = self.note() {
                crate::log::log(crate::log::Level::Warn, || n);
            }
        }
    }

    /// The entry for `id`, whole and current, or `None` (a file there that
    /// is not is dropped and counted). A hit is marked used (LRU).
    pub fn lookup(&self, id: &Identity) -> Option<Entry> {
        let found = self.peek(id);
        match &found {
            Some(e) => {
                bump(&self.stats.hits, 1);
                // The file's mtime is its last use: eviction goes by it.
                let _ = e.file.set_modified(SystemTime::now());
            }
            None => bump(&self.stats.misses, 1),
        }
        found
    }

    /// The entry for `id` without counting or marking it used.
    fn peek(&self, id: &Identity) -> Option<Entry> {
        let text = id.text().ok()?;
        let path = self.opts.dir.join(id.file_name());
        let why = match Entry::open(&path) {
            Ok(Ok(e)) if e.header.identity == text => return Some(e),
            Ok(Ok(_)) => Bad::OtherIdentity,
            Ok(Err(bad)) => bad,
            Err(_) => return None,
        };
        self.drop_entry(&path, &why);
        None
    }

    /// Counts `n` data bytes read from an entry and checked.
    pub fn hit_bytes(&self, n: u64) {
        bump(&self.stats.bytes_hit, n);
    }

    /// Counts a shard read uncached for want of a version, a `HEAD` or an
    /// entry that opens, or because its fill was abandoned (`why`).
    pub fn not_cached(&self, why: &str) {
        self.skipped(why);
    }

    /// Removes an entry found bad, and counts it.
    pub fn drop_entry(&self, path: &Path, why: &Bad) {
        match why {
            Bad::OtherIdentity => bump(&self.stats.stale, 1),
            _ => bump(&self.stats.corrupt, 1),
        }
        // Read-only: it stays, and is refused again next time.
        let _ = std::fs::remove_file(path);
    }

    /// The entry for `id` dropped because a block read from it failed its
    /// checksum.
    pub fn drop_corrupt(&self, id: &Identity, why: &Bad) {
        self.drop_entry(&self.opts.dir.join(id.file_name()), why);
    }

    /// The samples counted in the entry for `id`, when it is current.
    pub fn count(&self, id: &Identity) -> Option<u64> {
        self.peek(id)?.header.samples
    }

    /// Starts filling the entry for `id` after a miss. One reader of all
    /// processes fills an entry: the others wait for it as long as its
    /// temporary file grows at least once every `stall`, then use its
    /// entry; a filler that stalls (or a lock that cannot be taken) leaves
    /// them reading uncached.
    pub fn fill(&self, id: &Identity, stall: Duration) -> Fill {
        if let Some(why) = self.off() {
            return self.uncached(why);
        }
        let name = id.file_name();
        let lock_path = self.opts.dir.join(lock_name(&name));
        let tmp = tmp_name(&name);
        let (mut seen, mut since, mut waited) = (None, Instant::now(), false);
        let mut lock = match private::open_lock(&lock_path) {
            Ok(f) => f,
            Err(e) => return self.lock_failed(&name, &e),
        };
        loop {
            match flock(&lock, libc::LOCK_EX | libc::LOCK_NB) {
                // The lock file may have been removed (an eviction) while
                // this waited for it: the lock is the file at the name now.
                Ok(true) if private::same_file(&lock, &lock_path) => break,
                Ok(true) => {
                    lock = match private::open_lock(&lock_path) {
                        Ok(f) => f,
                        Err(e) => return self.lock_failed(&name, &e),
                    };
                    continue;
                }
                Ok(false) => {}
                Err(e) => return self.uncached(format!("cannot lock {name} ({e})")),
            }
            if !waited {
                bump(&self.stats.waited, 1);
                waited = true;
            }
            let size = std::fs::metadata(self.opts.dir.join(&tmp))
                .map(|m| m.len())
                .ok();
            if size != seen {
                (seen, since) = (size, Instant::now());
            } else if since.elapsed() > stall {
                return self.uncached(format!(
                    "another reader is filling {name} and made no progress for {stall:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Filled by the one that held the lock?
        if waited && let Some(e) = self.peek(id) {
            bump(&self.stats.hits, 1);
            return Fill::Hit(e);
        }
        if let Err(why) = self.make_room(id.len) {
            return self.uncached(why);
        }
        match entry::Writer::create(&self.opts.dir, id, &tmp) {
            Ok(writer) => Fill::Write(Box::new(Filler {
                writer,
                _lock: lock,
            })),
            Err(e) => self.write_failed(&e),
        }
    }

    /// The fill lock could not be opened: an I/O failure as any write's,
    /// or a file there that is not this user's (a link, another's file),
    /// which costs that entry only.
    fn lock_failed(&self, name: &str, e: &std::io::Error) -> Fill {
        match e.raw_os_error() {
            Some(libc::ELOOP) | None => self.uncached(format!(
                "the fill lock of {name} is not this user's file ({e})"
            )),
            _ => self.write_failed(e),
        }
    }

    fn uncached(&self, why: String) -> Fill {
        self.skipped(&why);
        Fill::Uncached(why)
    }

    fn skipped(&self, why: &str) {
        bump(&self.stats.uncached, 1);
        let mut first = self.first_skip.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| why.to_string());
        let dir = self.opts.dir.display();
        crate::log::log(crate::log::Level::Info, || {
            format!("cache {dir}: a shard read uncached: {why}")
        });
    }

    /// A write into the directory failed: a full disk or a read-only
    /// directory stops writing for the rest of this process's run; any
    /// other failure costs that one entry.
    fn write_failed(&self, e: &std::io::Error) -> Fill {
        let why = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!("the disk is full ({e})"),
            Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM) => {
                format!("not writable ({e})")
            }
            _ => return self.uncached(format!("cannot write an entry ({e})")),
        };
        self.turn_off(why.clone());
        self.uncached(why)
    }

    /// Evicts least recently used entries until one of `bytes` fits under
    /// the size limit and above the free-space floor. Processes sharing
    /// the directory evict one at a time (a lock on `.evict`).
    fn make_room(&self, bytes: u64) -> Result<(), String> {
        let bytes = bytes + entry::DATA_ALIGN as u64;
        if bytes > self.opts.size {
            return Err(format!(
                "a shard of {bytes} bytes is larger than `cache_size` ({})",
                self.opts.size
            ));
        }
        let lock = private::open_lock(&self.opts.dir.join(".evict"))
            .map_err(|e| format!("cannot open the eviction lock ({e})"))?;
        flock(&lock, libc::LOCK_EX).map_err(|e| format!("cannot lock for eviction ({e})"))?;
        let mut entries = self.entries();
        // Oldest use first.
        entries.sort_by_key(|e| std::cmp::Reverse(e.used));
        let mut total: u64 = entries.iter().map(|e| e.size).sum();
        loop {
            let (avail, fs_size) = free_space(&self.opts.dir)
                .map_err(|e| format!("cannot read the file system's free space ({e})"))?;
            let floor = match self.opts.min_free {
                MinFree::Bytes(b) => b,
                MinFree::Fraction(f) => (fs_size as f64 * f) as u64,
            };
            let fits = total + bytes <= self.opts.size && avail >= floor.saturating_add(bytes);
            if fits {
                return Ok(());
            }
            let Some(victim) = entries.pop() else {
                return Err(format!(
                    "no room for a shard of {bytes} bytes: {avail} bytes free, {floor} to keep \
                     free (`cache_min_free`)"
                ));
            };
            if std::fs::remove_file(&victim.path).is_ok() {
                bump(&self.stats.evictions, 1);
                // Its fill lock goes too, when no one holds it, and while
                // this holds it: a fill that waited for the old file sees
                // it gone and takes the new one.
                let lock_path = self.opts.dir.join(lock_name(
                    &victim
                        .path
                        .file_name()
                        .unwrap_or_default()
                        .to_string_lossy(),
                ));
                if let Ok(l) = private::open_lock(&lock_path)
                    && flock(&l, libc::LOCK_EX | libc::LOCK_NB).unwrap_or(false)
                {
                    let _ = std::fs::remove_file(&lock_path);
                }
            }
            total -= victim.size;
        }
    }

    /// The entries in the directory: path, size on disk, last use.
    fn entries(&self) -> Vec<Listed> {
        entries_in(&self.opts.dir)
    }

    /// What the directory `dir` holds: each whole entry's identity and
    /// sample count (entries that do not open are left out), in name
    /// order. Only reads the directory.
    pub fn contents(dir: &Path) -> Vec<(Identity, Option<u64>)> {
        let mut listed = entries_in(dir);
        listed.sort_by(|a, b| a.path.cmp(&b.path));
        listed
            .into_iter()
            .filter_map(|l| {
                let e = Entry::open(&l.path).ok()?.ok()?;
                Some((Identity::parse(&e.header.identity)?, e.header.samples))
            })
            .collect()
    }

    /// A whole fill's outcome, from the spool.
    fn filled(&self, result: std::io::Result<(PathBuf, u64)>, len: u64) {
        match result {
            Ok(_) => {
                bump(&self.stats.written, 1);
                bump(&self.stats.bytes_written, len);
            }
            Err(e) => {
                self.write_failed(&e);
            }
        }
    }
}

struct Listed {
    path: PathBuf,
    size: u64,
    used: SystemTime,
}

/// The entries in `dir`: path, size on disk, last use.
fn entries_in(dir: &Path) -> Vec<Listed> {
    let Ok(dir) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    dir.filter_map(|d| {
        let d = d.ok()?;
        let name = d.file_name();
        let name = name.to_str()?;
        if name.starts_with('.') || !name.ends_with(entry::SUFFIX) {
            return None;
        }
        let m = d.metadata().ok()?;
        Some(Listed {
            path: d.path(),
            size: m.len(),
            used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        })
    })
    .collect()
}

/// `flock`: `Ok(false)` when a non-blocking lock is held elsewhere.
fn flock(f: &File, op: i32) -> std::io::Result<bool> {
    loop {
        // SAFETY: a valid descriptor owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Bytes available to an unprivileged writer, and the file system's size.
fn free_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: statvfs fills the struct; zeroed is a valid start.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

fn probe_write(dir: &Path) -> std::io::Result<()> {
    let p = dir.join(format!(".probe-{}", std::process::id()));
    if let Err(e) = private::create_new(&p) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e);
        }
        // A process of this pid died probing: its file goes.
        std::fs::remove_file(&p)?;
        private::create_new(&p)?;
    }
    std::fs::remove_file(&p)
}

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
    use super::*;

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
