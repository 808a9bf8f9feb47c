//! The FUSE side of `ringfeed mount`: the kernel's requests turned into
//! calls of the library's file system (`ringfeed::mount::Fs`) and its
//! answers and errnos into replies. Requests are taken on fuser's one
//! session thread, which never waits on the store: those that may are
//! answered from a pool of threads, and a file being written has a lane
//! of its own on a second pool ([`Lanes`]): its writes, closes, syncs and
//! release run there one after another in the order the kernel sent them
//! (the upload takes bytes only in order), so a write waiting for room
//! among the parts in flight, or a completion and its retries, holds up
//! that file only — never a `stat` or another file's read.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow,
};

use ringfeed::mount::{Attr, Caching, Fs, FsResult, TreeKind};

type Job = Box<dyn FnOnce() + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Threads that run the answers that may wait on the store. A job that
/// panics is caught: its reply, dropped unsent, answers `EIO` (fuser's
/// reply does on drop), the panic is logged, and the thread takes the
/// next job — a pool never shrinks.
pub(super) struct Pool {
    tx: Sender<Job>,
}

impl Pool {
    pub(super) fn new(threads: usize, name: &str) -> Pool {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let _ = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    loop {
                        let job = lock(&rx).recv();
                        match job {
                            Ok(job) => run_caught(job),
                            Err(_) => return,
                        }
                    }
                });
        }
        Pool { tx }
    }

    pub(super) fn run(&self, job: impl FnOnce() + Send + 'static) {
        let _ = self.tx.send(Box::new(job));
    }
}

/// Runs `job`, a panic in it logged and not taken further.
fn run_caught(job: Job) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        ringfeed::log::log(ringfeed::log::Level::Error, || {
            format!("mount: a request failed (EIO) on a panic: {what}")
        });
    }
}

/// One lane's jobs, and whether a thread is running them.
#[derive(Default)]
struct Lane {
    jobs: VecDeque<Job>,
    running: bool,
}

/// The requests of each file being written (by handle), each run after
/// the one before, on a pool of their own: a lane holds one thread at a
/// time, and only while it has requests.
pub(super) struct Lanes {
    pool: Pool,
    lanes: Arc<Mutex<HashMap<u64, Arc<Mutex<Lane>>>>>,
}

impl Lanes {
    pub(super) fn new(threads: usize) -> Lanes {
        Lanes {
            pool: Pool::new(threads, "rf-mount-w"),
            lanes: Arc::default(),
        }
    }

    /// Runs `job` in `fh`'s lane, after what was put there before; the
    /// lane goes with `last` (the handle's release).
    fn run(&self, fh: u64, last: bool, job: impl FnOnce() + Send + 'static) {
        let lane = Arc::clone(lock(&self.lanes).entry(fh).or_default());
        let job: Job = if last {
            let lanes = Arc::clone(&self.lanes);
            Box::new(move || {
                job();
                lock(&lanes).remove(&fh);
            })
        } else {
            Box::new(job)
        };
        {
            let mut l = lock(&lane);
            l.jobs.push_back(job);
            if l.running {
                return;
            }
            l.running = true;
        }
        self.pool.run(move || {
            loop {
                let next = {
                    let mut l = lock(&lane);
                    match l.jobs.pop_front() {
                        Some(j) => j,
                        None => {
                            l.running = false;
                            return;
                        }
                    }
                };
                run_caught(next);
            }
        });
    }
}

pub(super) struct Adapter {
    pub(super) fs: Arc<Fs>,
    pub(super) pool: Pool,
    pub(super) lanes: Lanes,
    pub(super) ttl: Duration,
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: match a.kind {
            TreeKind::Dir => FileType::Directory,
            TreeKind::File => FileType::RegularFile,
        },
        perm: a.perm,
        nlink: if a.kind == TreeKind::Dir { 2 } else { 1 },
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 128 << 10,
        flags: 0,
    }
}

/// A reply that can carry an errno instead (every one of fuser's can).
trait Fails {
    fn fail(self, errno: i32);
}

macro_rules! fails {
    ($($t:ty),*) => {
        $(impl Fails for $t {
            fn fail(self, errno: i32) {
                self.error(errno)
            }
        })*
    };
}

fails!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyEmpty,
    ReplyEntry,
    ReplyOpen,
    ReplyWrite
);

/// The file system's answer through `ok`, or its errno.
fn answer<R: Fails, T>(reply: R, r: FsResult<T>, ok: impl FnOnce(R, T)) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => reply.fail(e.0),
    }
}

/// The kernel's flags for an open file's caching. A file being written
/// is opened for direct I/O: its writes skip the page cache, so each
/// comes from the writer itself, with the lock owner that names its
/// descriptor table (what tells its close from another process's).
fn open_flags(caching: Caching) -> u32 {
    match caching {
        Caching::Keep => fuser::consts::FOPEN_KEEP_CACHE,
        Caching::Drop => 0,
        Caching::Direct => fuser::consts::FOPEN_DIRECT_IO,
    }
}

fn name_of(name: &OsStr) -> Option<String> {
    name.to_str().map(str::to_string)
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // Locks are answered (refused) here, not kept by the kernel alone:
        // a lock that holds on one node only would lie to the others.
        let _ = config
            .add_capabilities(fuser::consts::FUSE_POSIX_LOCKS | fuser::consts::FUSE_FLOCK_LOCKS);
        // O_TRUNC given to `open` itself, not a setattr after it: an
        // overwrite (allowed by --allow-overwrite) is told by its flag.
        let _ = config.add_capabilities(fuser::consts::FUSE_ATOMIC_O_TRUNC);
        // Many reads in flight from the kernel's read-ahead and from
        // several readers at once.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name_of(name) else {
            return reply.error(libc::ENOENT);
        };
        let (fs, ttl) = (Arc::clone(&self.fs), self.ttl);
        self.pool.run(move || {
            answer(reply, fs.lookup(parent, &name), |reply, a| {
                reply.entry(&ttl, &file_attr(&a), 0)
            })
        });
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        self.fs.forget(ino, nlookup);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        answer(reply, self.fs.getattr(ino), |reply, a| {
            reply.attr(&self.ttl, &file_attr(&a))
        })
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if mode.is_some() || uid.is_some() || gid.is_some() {
            let path = self.fs.path_of(ino);
            return reply.error(self.fs.refused("chmod/chown", &path, libc::EPERM).0);
        }
        // Times are taken and not kept (an object's time is its store's).
        answer(reply, self.fs.setattr(ino, size), |reply, a| {
            reply.attr(&self.ttl, &file_attr(&a))
        })
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let Some(name) = name_of(name) else {
            return reply.error(libc::EINVAL);
        };
        let (fs, ttl) = (Arc::clone(&self.fs), self.ttl);
        self.pool.run(move || {
            answer(reply, fs.mkdir(parent, &name), |reply, a| {
                reply.entry(&ttl, &file_attr(&a), 0)
            })
        });
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let path = self.fs.child_path(parent, name);
        reply.error(self.fs.refused("unlink", &path, libc::EPERM).0);
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let path = self.fs.child_path(parent, name);
        reply.error(self.fs.refused("rmdir", &path, libc::EPERM).0);
    }

    fn symlink(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        let path = format!(
            "{}/{}",
            self.fs.path_of(parent),
            link_name.to_string_lossy()
        );
        reply.error(self.fs.refused("symlink", &path, libc::ENOSYS).0);
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _newparent: u64,
        _newname: &OsStr,
        _flags: u32,
        reply: ReplyEmpty,
    ) {
        let path = self.fs.child_path(parent, name);
        reply.error(self.fs.refused("rename", &path, libc::ENOSYS).0);
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _newparent: u64,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let path = self.fs.path_of(ino);
        // The kernel answers a link's ENOSYS as EPERM: said as it is seen.
        reply.error(self.fs.refused("link", &path, libc::EPERM).0);
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let fs = Arc::clone(&self.fs);
        self.pool.run(move || {
            answer(reply, fs.open(ino, flags), |reply, (fh, caching)| {
                reply.opened(fh, open_flags(caching))
            })
        });
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let fs = Arc::clone(&self.fs);
        self.pool.run(move || {
            answer(
                reply,
                fs.read(fh, offset.max(0) as u64, size),
                |reply, d| reply.data(d.bytes()),
            )
        });
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        // In the file's lane: taken in the order the kernel sends them
        // (the upload takes them only in order), and a write waiting for
        // room among the parts in flight holds up this file alone.
        if !self.fs.writes(fh) {
            return reply.error(libc::EBADF);
        }
        let (fs, data) = (Arc::clone(&self.fs), data.to_vec());
        self.lanes.run(fh, false, move || {
            answer(
                reply,
                fs.write(fh, offset.max(0) as u64, &data, lock_owner),
                |reply, n| reply.written(n),
            )
        });
    }

    fn flush(&mut self, req: &Request<'_>, _ino: u64, fh: u64, lock_owner: u64, reply: ReplyEmpty) {
        // The pid is the closing thread's in the mount's pid namespace (0
        // when it is not visible there); the lock owner names its
        // descriptor table, whatever the namespace.
        let (fs, pid) = (Arc::clone(&self.fs), req.pid());
        let job = move || answer(reply, fs.flush(fh, pid, lock_owner), |reply, ()| reply.ok());
        if self.fs.writes(fh) {
            self.lanes.run(fh, false, job);
        } else {
            self.pool.run(job);
        }
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        let job = move || answer(reply, fs.fsync(fh), |reply, ()| reply.ok());
        if self.fs.writes(fh) {
            self.lanes.run(fh, false, job);
        } else {
            self.pool.run(job);
        }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        let job = move || {
            fs.release(fh);
            reply.ok();
        };
        if self.fs.writes(fh) {
            self.lanes.run(fh, true, job);
        } else {
            self.pool.run(job);
        }
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        answer(reply, self.fs.opendir(ino), |reply, fh| reply.opened(fh, 0))
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        reply: ReplyDirectory,
    ) {
        let fs = Arc::clone(&self.fs);
        self.pool.run(move || {
            let from = offset.max(0) as u64;
            answer(reply, fs.readdir_at(fh, ino, from), |mut reply, entries| {
                // The page from `offset` on, cut from the pass's entries:
                // the cost of a page is its length.
                let rest = entries.get(from as usize..).unwrap_or(&[]);
                for (i, (child, kind, name)) in rest.iter().enumerate() {
                    let kind = match kind {
                        TreeKind::Dir => FileType::Directory,
                        TreeKind::File => FileType::RegularFile,
                    };
                    if reply.add(*child, from as i64 + i as i64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            })
        });
    }

    fn releasedir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh);
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        // An object store has no size to fill: as Mountpoint, a large
        // free count, so tools that check space before writing go on.
        let blocks = u64::MAX / (1 << 20);
        reply.statfs(blocks, blocks, blocks, 0, u64::MAX / 2, 4096, 255, 4096);
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Some(name) = name_of(name) else {
            return reply.error(libc::EINVAL);
        };
        let (fs, ttl) = (Arc::clone(&self.fs), self.ttl);
        self.pool.run(move || {
            answer(reply, fs.create(parent, &name, flags), |reply, (a, fh)| {
                reply.created(&ttl, &file_attr(&a), 0, fh, open_flags(Caching::Direct))
            })
        });
    }

    fn getlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _lock_owner: u64,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let path = self.fs.path_of(ino);
        reply.error(self.fs.refused("lock", &path, libc::ENOLCK).0);
    }

    fn setlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _lock_owner: u64,
        _start: u64,
        _end: u64,
        typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        // Unlocking what was never locked (a close's implicit unlock) is
        // fine; taking a lock is refused.
        if typ == libc::F_UNLCK {
            return reply.ok();
        }
        let path = self.fs.path_of(ino);
        reply.error(self.fs.refused("lock", &path, libc::ENOLCK).0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_job_that_panics_leaves_its_thread_to_take_the_next() {
        // One thread: the job after the panic runs only if that thread
        // lived on. Control: the same panic on a thread of its own ends
        // that thread.
        let pool = Pool::new(1, "rf-test");
        let (tx, rx) = sync_channel(4);
        for i in 0..3 {
            let tx = tx.clone();
            pool.run(move || {
                if i == 1 {
                    panic!("cut inside a character");
                }
                tx.send(i).unwrap();
            });
        }
        assert_eq!(rx.recv_timeout(LONG), Ok(0));
        assert_eq!(rx.recv_timeout(LONG), Ok(2));
        let bare = std::thread::spawn(|| panic!("cut inside a character"));
        assert!(bare.join().is_err(), "a panic ends a thread not caught");
    }

    #[test]
    fn a_lane_runs_its_jobs_in_order_and_a_held_lane_holds_no_other() {
        let lanes = Lanes::new(2);
        let (release, held) = sync_channel::<()>(0);
        let (tx, rx) = channel();
        // Lane 1's first job waits until released; its later jobs queue
        // behind it, while lane 2's run at once on the other thread.
        let t = tx.clone();
        lanes.run(1, false, move || {
            held.recv().unwrap();
            t.send((1, 0)).unwrap();
        });
        for i in 1..50 {
            let t = tx.clone();
            lanes.run(1, i == 49, move || t.send((1, i)).unwrap());
        }
        for i in 0..50 {
            let t = tx.clone();
            lanes.run(2, false, move || t.send((2, i)).unwrap());
        }
        let first: Vec<_> = (0..50).map(|_| rx.recv_timeout(LONG).unwrap()).collect();
        assert_eq!(first, (0..50).map(|i| (2, i)).collect::<Vec<_>>());
        release.send(()).unwrap();
        let then: Vec<_> = (0..50).map(|_| rx.recv_timeout(LONG).unwrap()).collect();
        assert_eq!(then, (0..50).map(|i| (1, i)).collect::<Vec<_>>());
        // Lane 1 went with its last job; lane 2 is still there.
        let deadline = std::time::Instant::now() + LONG;
        while lock(&lanes.lanes).contains_key(&1) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(lock(&lanes.lanes).keys().copied().collect::<Vec<_>>(), [2]);
    }
}
