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
//! - [`Spool`] (`spool.rs`): the thread that writes fills in the
//!   background, off the reading thread's path, from memory the caller
//!   keeps alive until then, and the spare fills' admission.
//!
//! The engine (`engine::worker`) decides what to cache (whole remote shards
//! read from their start to their end) and reads hits like local files.

pub mod entry;
pub mod private;
mod spool;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub use entry::{Bad, Entry, Identity};
pub use spool::{FillMode, Held, Spool, SpoolFill, hooks};

use crate::error::Result;
use crate::sync::Locked;

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
    writer: entry::EntryWriter,
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
            let c = private::clean_stale(&opts.dir, entry::SUFFIX);
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
        let first = self.first_skip.locked().clone()?;
        let n = self.stats.uncached.load(Ordering::Relaxed);
        Some(format!(
            "cache {dir}: {n} shard read(s) not cached (first: {first})"
        ))
    }

    fn off(&self) -> Option<String> {
        self.writes_off.locked().clone()
    }

    fn turn_off(&self, why: String) {
        let mut off = self.writes_off.locked();
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
            // A hit, not a miss: the lookup before this counted a miss, and
            // nothing is read from the network (counted once either way).
            bump(&self.stats.hits, 1);
            // Relaxed: a statistic; never below zero (a fill without a
            // lookup before it).
            let _ = self
                .stats
                .misses
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1));
            return Fill::Hit(e);
        }
        if let Err(why) = self.make_room(id.len) {
            return self.uncached(why);
        }
        match entry::EntryWriter::create(&self.opts.dir, id, &tmp) {
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
        let mut first = self.first_skip.locked();
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
