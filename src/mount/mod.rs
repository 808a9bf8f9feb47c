//! A file system over a dataset's source, for code that only knows paths
//! (`from_pretrained(dir)`, `torch.load(path)`, `ImageFolder`, a
//! WebDataset file pattern): `ringfeed mount SOURCE MOUNTPOINT` speaks
//! the FUSE protocol (the CLI, `cli/src/mount/`) and answers with
//! what [`Fs`] says. Sources are an `s3://bucket/prefix/`, an `http(s)://`
//! directory whose server gives a listing page, and a local directory.
//!
//! - [`tree`]: inodes, one per path for the mount's life, and each
//!   directory's children from its last listing, kept for `ttl`.
//! - [`source`]: what a source lists, one directory at a time, and the
//!   object behind a path.
//! - [`beneath`]: a local source's files and directories opened from
//!   its root's descriptor, never through a symbolic link.
//! - `read.rs`: opening to read and answering reads (local files, cache
//!   entries, a remote file's blocks); `write.rs`: new files written,
//!   completed, aborted. Both are `impl Fs` blocks; the directory
//!   operations, handles and counters stay here.
//! - `options.rs`: what a mount is told beyond the engine's configuration
//!   ([`MountOptions`]) and what it counts ([`MountCounts`]).
//! - [`readahead`]: how far ahead of a handle's reads its blocks are
//!   fetched (a stream's window is twice what it has read, up to the
//!   most; random reads fetch only what they cover) — pure.
//! - [`blocks`]: a remote file's blocks of `part_size`, fetched with the
//!   engine's ranged reads on io_uring network threads, shared by every
//!   handle and process, held in a memory budget; the node's cache
//!   entries (`cache_dir`) read and filled.
//! - [`upload`]: new files as one upload each, visible once their writer
//!   is known to have finished them (its close seen to be a close, or an
//!   `fsync`), aborted otherwise; [`closer`]: who closed a file, as the
//!   mount's `/proc` shows the thread the kernel names (or why it cannot
//!   tell a close from a kill: another pid namespace, `hidepid`).
//!
//! What is refused, and with which errno (as Mountpoint for Amazon S3
//! answers, so its users' expectations hold), each with a log line
//! saying why: opening an existing file for writing (`EPERM`; allowed,
//! with `O_TRUNC`, under `allow_overwrite`), a write anywhere but at the
//! end (`EINVAL`), truncating, deleting, renaming, links (`EPERM`,
//! `ENOSYS`), locks (`ENOLCK`), writing to an `http(s)://` source
//! (`EROFS`).

pub mod beneath;
pub mod blocks;
pub mod closer;
pub mod flight;
pub mod leftovers;
mod options;
mod read;
pub mod readahead;
pub mod source;
pub mod tree;
pub mod upload;
mod write;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::config::Config;
use crate::error::Result;
use crate::fetch::NetOptions;
use crate::log::{Level, log};
use crate::net::retry::Jitter;
use blocks::{Block, RemoteFile, Store};
use readahead::ReadAhead;
use source::MountSource;
use tree::{ROOT, Tree};
use upload::{Closes, MountUpload};

use crate::sync::Locked;
use options::WRITE_BITS;
pub use options::{MountCounts, MountOptions};
pub use tree::TreeKind;

/// Small files fetched ahead of a reader walking a directory in name order.
pub const DIR_AHEAD: usize = 32;

/// An error for the kernel: an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

pub type FsResult<T> = std::result::Result<T, Errno>;

/// What `getattr` and `lookup` answer.
#[derive(Debug, Clone)]
pub struct Attr {
    pub ino: u64,
    pub kind: TreeKind,
    pub size: u64,
    pub mtime: SystemTime,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`dir_mode` or `file_mode`, 0755 and 0644 unless
    /// set; no write bits on a source that takes no writes or a read-only
    /// mount).
    pub perm: u16,
}

/// What the kernel may keep of an open file's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caching {
    /// A version of a file the kernel holds pages of: kept.
    Keep,
    /// Pages of an earlier version dropped.
    Drop,
    /// A file being written: no page cache (FUSE's direct I/O), so each
    /// `write` reaches the mount as its writer's request, naming the
    /// writer's descriptor table (`upload::Closes`).
    Direct,
}

/// A read's bytes: a slice of one block (no copy), or gathered.
pub enum Data {
    Block(Arc<Block>, std::ops::Range<usize>),
    Owned(Vec<u8>),
}

impl Data {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Data::Block(b, r) => &b.bytes()[r.clone()],
            Data::Owned(v) => v,
        }
    }
}

enum Reading {
    Local(std::fs::File),
    Remote(Arc<RemoteFile>),
}

struct ReadHandle {
    ino: u64,
    reading: Reading,
    ahead: Mutex<ReadAhead>,
}

struct WriteHandle {
    ino: u64,
    parent: u64,
    name: String,
    url: String,
    upload: Mutex<MountUpload>,
    /// The bytes taken so far (the object's size once complete): what
    /// `getattr` shows, read without `upload`'s lock, which a write
    /// waiting for a part's room or a completion and its retries hold
    /// for as long as the store takes. Relaxed: a size for `stat`, set
    /// under `upload`'s lock and ordered with nothing else.
    size: AtomicU64,
    /// Who wrote and what closes told; locked inside `upload` when both
    /// are (never the other way round).
    closes: Mutex<Closes>,
}

/// A directory's entries as one `readdir` pass sees them.
type Entries = Arc<Vec<(u64, TreeKind, String)>>;

enum Handle {
    Read(Arc<ReadHandle>),
    Write(Arc<WriteHandle>),
    /// An open directory: the entries its pass from offset 0 took, which
    /// the later pages of that pass are cut from (each page is then as
    /// long as it is, not as long as the directory).
    Dir(Mutex<Option<Entries>>),
}

/// The file system: answers each operation, or the errno to refuse it.
pub struct Fs {
    source: MountSource,
    cfg: Config,
    net: NetOptions,
    opts: MountOptions,
    tree: Mutex<Tree>,
    store: Option<Store>,
    /// Each remote file's current version, by inode, with its open
    /// handles.
    files: Mutex<HashMap<u64, (Arc<RemoteFile>, usize)>>,
    handles: Mutex<HashMap<u64, Handle>>,
    /// The file being written at each inode (what `getattr` shows of it).
    writing: Mutex<HashMap<u64, Arc<WriteHandle>>>,
    next_fh: AtomicU64,
    jitter: Mutex<Jitter>,
    pub counts: Arc<MountCounts>,
    /// The kernel's read-ahead in force (a stream's tolerance).
    kernel_readahead: AtomicU64,
    /// The names last opened in each directory (the newest last), by
    /// which a walk in name order is seen.
    recent: Mutex<HashMap<u64, std::collections::VecDeque<String>>>,
    /// The `/proc` a close's thread is looked up in.
    proc: closer::Proc,
    /// The directories being listed now (one listing each at a time).
    flights: flight::Flights,
}

impl Fs {
    /// The file system over `source` (see [`source::MountSource::open`]),
    /// with the engine's keys in `cfg` (S3, retries, `part_size`,
    /// `cache_dir`, `overwrite` is set from `opts`).
    pub fn new(source_url: &str, cfg: &Config, opts: MountOptions) -> Result<Fs> {
        leftovers::started();
        let source = MountSource::open(source_url, cfg)?;
        let net = NetOptions::for_config(cfg);
        let counts = Arc::new(MountCounts::default());
        let store = match source {
            MountSource::Local(_) => None,
            _ => {
                let spool = match cfg.cache_options() {
                    Some(o) => {
                        let cache = Arc::new(crate::cache::Cache::open(o)?);
                        Some(
                            crate::cache::Spool::start(cache, crate::cache::FillMode::Always)
                                .map_err(|e| {
                                    crate::error::Error::internal(
                                        crate::error::Fault::Thread,
                                        format!("cache spool: {e}"),
                                    )
                                })?,
                        )
                    }
                    None => None,
                };
                Some(
                    Store::start(
                        cfg.part_size,
                        opts.memory,
                        opts.net_threads,
                        &net,
                        spool,
                        Arc::clone(&counts),
                    )
                    .map_err(|e| {
                        crate::error::Error::IoUring(format!("the mount's network thread: {e}"))
                    })?,
                )
            }
        };
        let mut cfg = cfg.clone();
        cfg.overwrite = opts.allow_overwrite;
        let opts_kernel_readahead = opts.kernel_readahead;
        let opts_ttl = opts.ttl;
        let proc = closer::Proc::probe(std::path::Path::new("/proc"));
        if let Some(why) = proc.foreign()
            && source.writable()
        {
            log(Level::Warn, || {
                format!(
                    "mount: /proc {why}: no close through this mount can be told from a \
                     writer's death, so only fsync completes a file written here"
                )
            });
        }
        Ok(Fs {
            source,
            cfg,
            net,
            opts,
            tree: Mutex::new({
                let mut t = Tree::new();
                t.ttl = opts_ttl;
                t
            }),
            store,
            files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            writing: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            jitter: Mutex::new(Jitter::new(0x6d6f756e74)),
            counts,
            recent: Mutex::new(HashMap::new()),
            kernel_readahead: AtomicU64::new(opts_kernel_readahead),
            proc,
            flights: flight::Flights::default(),
        })
    }

    /// Lists the root of `source_url` once, as a mount's first listing
    /// would: whether the source is there and may be listed (a missing
    /// bucket, a denied prefix, a server that does not answer), as the
    /// listing's error. An S3 prefix with no objects under it is there
    /// (S3 has no directories).
    pub fn probe(source_url: &str, cfg: &Config) -> Result<()> {
        let source = MountSource::open(source_url, cfg)?;
        let net = NetOptions::for_config(cfg);
        source.list("", &net, &mut Jitter::new(0x70726f6265))?;
        Ok(())
    }

    /// The kernel's read-ahead actually in force on the mount (the one
    /// asked for could not be set: the kernel's default then).
    pub fn set_kernel_readahead(&self, bytes: u64) {
        // Relaxed: a tolerance read per read, no ordering with other data.
        self.kernel_readahead.store(bytes, Ordering::Relaxed);
    }

    pub fn options(&self) -> &MountOptions {
        &self.opts
    }

    /// Stops the network threads (reads in flight finish first) and
    /// writes out the cache fills queued.
    pub fn shutdown(&self) {
        if let Some(s) = &self.store {
            s.stop();
        }
    }

    fn refuse(&self, errno: i32, what: impl FnOnce() -> String) -> Errno {
        self.counts.add(&self.counts.refused, 1);
        log(Level::Warn, what);
        Errno(errno)
    }

    fn attr_of(&self, ino: u64, n: &tree::Node) -> Attr {
        let writable = self.source.writable() && !self.opts.read_only;
        let mode = match n.kind {
            TreeKind::Dir => self.opts.dir_mode,
            TreeKind::File => self.opts.file_mode,
        };
        Attr {
            ino,
            kind: n.kind,
            size: n.size,
            mtime: n.mtime,
            uid: self.opts.uid,
            gid: self.opts.gid,
            perm: if writable { mode } else { mode & !WRITE_BITS },
        }
    }

    /// Lists `dir` again when its listing is older than the time-to-live;
    /// while another thread lists it, waits and takes that listing (one
    /// that ended after this was asked is fresh enough).
    fn fresh(&self, dir: u64) -> FsResult<()> {
        let asked = Instant::now();
        loop {
            let rel = {
                let t = self.tree.locked();
                let node = t.get(dir).ok_or(Errno(libc::ENOENT))?;
                if node.kind != TreeKind::Dir {
                    return Err(Errno(libc::ENOTDIR));
                }
                if t.listed(dir)
                    .is_some_and(|at| at.elapsed() < self.opts.ttl || at >= asked)
                {
                    return Ok(());
                }
                node.rel.clone()
            };
            if let Some(r) = self.flights.run(dir, || self.list_now(dir, &rel)) {
                return r;
            }
        }
    }

    /// Lists `dir` (at `rel`) from the source now.
    fn list_now(&self, dir: u64, rel: &str) -> FsResult<()> {
        let mut jitter = self.jitter.locked().clone();
        let listed = self.source.list(rel, &self.net, &mut jitter).map_err(|e| {
            log(Level::Warn, || {
                format!("mount: listing `{}` failed: {e}", self.source.url(rel))
            });
            Errno(match e {
                crate::error::Error::S3 { status: 403, .. } => libc::EACCES,
                crate::error::Error::Io { .. } => libc::ENOENT,
                _ => libc::EIO,
            })
        })?;
        self.counts.add(&self.counts.listings, 1);
        let dropped = {
            let mut t = self.tree.locked();
            t.set_listing(dir, &listed, Instant::now());
            t.take_dropped()
        };
        self.drop_inodes(&dropped);
        Ok(())
    }

    /// What is kept by inode for `inos`, paths no longer remembered: a
    /// remote file's version (its blocks) once no handle reads it, and a
    /// directory's recent opens.
    fn drop_inodes(&self, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let mut files = self.files.locked();
        for ino in inos {
            if files.get(ino).is_some_and(|e| e.1 == 0) {
                files.remove(ino);
            }
        }
        drop(files);
        let mut recent = self.recent.locked();
        for ino in inos {
            recent.remove(ino);
        }
    }

    /// The entry `name` in `parent`, counted as one lookup the kernel
    /// holds until it forgets it ([`Fs::forget`]).
    pub fn lookup(&self, parent: u64, name: &str) -> FsResult<Attr> {
        self.fresh(parent)?;
        let mut t = self.tree.locked();
        let ino = t.child(parent, name).ok_or(Errno(libc::ENOENT))?;
        t.looked_up(ino);
        let n = t.get(ino).ok_or(Errno(libc::ENOENT))?;
        Ok(self.attr_of(ino, n))
    }

    /// The kernel forgot `n` lookups of `ino`: a path no listing shows
    /// and the kernel no longer holds is dropped, with its file's blocks
    /// once no handle reads them.
    pub fn forget(&self, ino: u64, n: u64) {
        let dropped = {
            let mut t = self.tree.locked();
            t.forgot(ino, n);
            t.take_dropped()
        };
        self.drop_inodes(&dropped);
    }

    /// Inodes remembered now (the root included).
    pub fn inodes(&self) -> usize {
        self.tree.locked().len()
    }

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let t = self.tree.locked();
        let n = t.get(ino).ok_or(Errno(libc::ENOENT))?;
        let mut a = self.attr_of(ino, n);
        drop(t);
        // A file being written shows what was written so far, never
        // waiting on its upload.
        if let Some(w) = self.writing.locked().get(&ino) {
            // Relaxed: see `WriteHandle::size`.
            a.size = w.size.load(Ordering::Relaxed);
        }
        Ok(a)
    }

    /// `dir`'s entries: `.`, `..`, then its children in name order.
    pub fn readdir(&self, dir: u64) -> FsResult<Vec<(u64, TreeKind, String)>> {
        self.fresh(dir)?;
        let t = self.tree.locked();
        let parent = t.get(dir).map_or(ROOT, |n| n.parent);
        let mut out = vec![
            (dir, TreeKind::Dir, ".".to_string()),
            (parent, TreeKind::Dir, "..".to_string()),
        ];
        for (name, ino) in t.children(dir) {
            if let Some(n) = t.get(ino) {
                out.push((ino, n.kind, name));
            }
        }
        Ok(out)
    }

    /// Whether `fh` is a handle of a file being written (its writes,
    /// closes and syncs may wait on the store for long: the FUSE side
    /// answers them on threads of their own, in order).
    pub fn writes(&self, fh: u64) -> bool {
        matches!(self.handles.locked().get(&fh), Some(Handle::Write(_)))
    }

    /// Opens directory `dir` for `readdir` passes.
    pub fn opendir(&self, dir: u64) -> FsResult<u64> {
        match self.tree.locked().get(dir) {
            Some(n) if n.kind == TreeKind::Dir => {}
            Some(_) => return Err(Errno(libc::ENOTDIR)),
            None => return Err(Errno(libc::ENOENT)),
        }
        Ok(self.new_fh(Handle::Dir(Mutex::new(None))))
    }

    /// The entries of directory `dir` for a `readdir` at `offset` through
    /// handle `fh` (from [`Fs::opendir`]): taken anew at offset 0 (a new
    /// pass, `rewinddir`), else the ones that pass took. A handle that is
    /// not a directory's (fuser's 0 when `opendir` was not asked) takes
    /// them anew each time.
    pub fn readdir_at(&self, fh: u64, dir: u64, offset: u64) -> FsResult<Entries> {
        let h = self.handles.locked().get(&fh).and_then(|h| match h {
            Handle::Dir(e) => e.locked().clone().filter(|_| offset > 0),
            _ => None,
        });
        if let Some(e) = h {
            return Ok(e);
        }
        let e = Arc::new(self.readdir(dir)?);
        if let Some(Handle::Dir(slot)) = self.handles.locked().get(&fh) {
            *slot.locked() = Some(Arc::clone(&e));
        }
        Ok(e)
    }

    fn new_fh(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.locked().insert(fh, h);
        fh
    }

    /// A directory made here: shown until the time-to-live of its
    /// parent's listing, and for good once a file in it is written.
    pub fn mkdir(&self, parent: u64, name: &str) -> FsResult<Attr> {
        self.fresh(parent)?;
        if !self.source.writable() {
            return Err(self.refuse(libc::EROFS, || {
                format!("mount: `{name}`: an http(s):// source takes no writes (EROFS)")
            }));
        }
        let mut t = self.tree.locked();
        if t.child(parent, name).is_some() {
            return Err(Errno(libc::EEXIST));
        }
        let ino = t.add_local(parent, name, TreeKind::Dir);
        t.looked_up(ino);
        t.set_listing(ino, &[], Instant::now());
        let n = t.get(ino).cloned().ok_or(Errno(libc::EIO))?;
        Ok(self.attr_of(ino, &n))
    }

    /// The last reference to `fh` is gone.
    pub fn release(&self, fh: u64) {
        let h = self.handles.locked().remove(&fh);
        match h {
            Some(Handle::Write(w)) => {
                // Every close is a flush before this: an upload still
                // open had nothing written by a close that decided.
                self.released(&w);
                let mut writing = self.writing.locked();
                if writing.get(&w.ino).is_some_and(|x| Arc::ptr_eq(x, &w)) {
                    writing.remove(&w.ino);
                }
            }
            Some(Handle::Read(r)) => {
                if let Reading::Remote(f) = &r.reading {
                    let mut files = self.files.locked();
                    if let Some(e) = files.get_mut(&r.ino) {
                        e.1 = e.1.saturating_sub(1);
                        if e.1 == 0
                            && let Some(s) = &self.store
                        {
                            s.drop_fill(f);
                        }
                    }
                }
            }
            Some(Handle::Dir(_)) | None => {}
        }
    }

    /// Refuses an operation objects cannot do, logging why.
    pub fn refused(&self, op: &str, what: &str, errno: i32) -> Errno {
        self.refuse(errno, || {
            format!(
                "mount: {op} of `{what}` refused ({}): objects cannot be {}",
                errno_name(errno),
                match op {
                    "rename" => "renamed (S3 has no rename; copy, then delete in the store)",
                    "truncate" => "truncated or changed in place",
                    "unlink" | "rmdir" => "deleted through this mount",
                    "link" | "symlink" => "linked",
                    "lock" => "locked across the processes and nodes that read them",
                    _ => "changed so",
                }
            )
        })
    }

    /// The path of `ino` from the mount's root, for messages.
    pub fn path_of(&self, ino: u64) -> String {
        self.tree
            .locked()
            .get(ino)
            .map_or_else(|| format!("inode {ino}"), |n| n.rel.clone())
    }

    /// The path of `name` in directory `parent`, for messages.
    pub fn child_path(&self, parent: u64, name: &std::ffi::OsStr) -> String {
        match self.path_of(parent) {
            p if p.is_empty() => name.to_string_lossy().into_owned(),
            p => format!("{p}/{}", name.to_string_lossy()),
        }
    }

    /// A setattr: only a no-op size change (the size a file being
    /// written has) and times pass; a truncate is refused.
    pub fn setattr(&self, ino: u64, size: Option<u64>) -> FsResult<Attr> {
        let a = self.getattr(ino)?;
        if let Some(s) = size
            && s != a.size
        {
            return Err(self.refused("truncate", &self.path_of(ino), libc::EPERM));
        }
        Ok(a)
    }

    /// Bytes of blocks held now.
    pub fn held(&self) -> u64 {
        self.store.as_ref().map_or(0, Store::held)
    }
}

pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOSYS => "ENOSYS",
        libc::ENOLCK => "ENOLCK",
        libc::EROFS => "EROFS",
        libc::EINVAL => "EINVAL",
        libc::EXDEV => "EXDEV",
        _ => "error",
    }
}
