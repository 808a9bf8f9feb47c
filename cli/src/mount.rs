//! `ringfeed mount SOURCE MOUNTPOINT`: the library's file system
//! (`ringfeed::mount::Fs`) spoken over FUSE with the `fuser` crate
//! (mounted through `fusermount3`, no libfuse). The kernel's requests are
//! taken on fuser's one session thread and answered from a pool of
//! threads, so a read waiting for the store never holds up a `stat` or
//! another file's read. Runs until SIGINT, SIGTERM or SIGHUP (then
//! unmounts) or until unmounted from outside (`fusermount3 -u`); with
//! `--daemon` it returns once the file system is mounted.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow,
};
use serde_json::json;

use ringfeed::mount::{Attr, FileKind, Fs, FsResult, MountOptions};

use crate::AnyResult;
use crate::args::{MountArgs, object_config};

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run the answers that may wait on the store.
struct Pool {
    tx: Sender<Job>,
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let _ = std::thread::Builder::new()
                .name(format!("rf-mount-{i}"))
                .spawn(move || {
                    loop {
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
        }
        Pool { tx }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        let _ = self.tx.send(Box::new(job));
    }
}

struct Adapter {
    fs: Arc<Fs>,
    pool: Pool,
    ttl: Duration,
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
            FileKind::Dir => FileType::Directory,
            FileKind::File => FileType::RegularFile,
        },
        perm: a.perm,
        nlink: if a.kind == FileKind::Dir { 2 } else { 1 },
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

    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let (fs, tid) = (Arc::clone(&self.fs), req.pid());
        self.pool.run(move || {
            answer(reply, fs.open(ino, flags, tid), |reply, (fh, keep)| {
                let flags = if keep {
                    fuser::consts::FOPEN_KEEP_CACHE
                } else {
                    0
                };
                reply.opened(fh, flags)
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
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        // In the session thread: writes of one file are taken in the order
        // the kernel sends them (the upload takes them only in order); a
        // part's upload waits only when the parts in flight are full.
        answer(
            reply,
            self.fs.write(fh, offset.max(0) as u64, data),
            |reply, n| reply.written(n),
        )
    }

    fn flush(
        &mut self,
        req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _lock_owner: u64,
        reply: ReplyEmpty,
    ) {
        let (fs, tid) = (Arc::clone(&self.fs), req.pid());
        self.pool
            .run(move || answer(reply, fs.flush(fh, tid), |reply, ()| reply.ok()));
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
        self.pool
            .run(move || answer(reply, fs.fsync(fh), |reply, ()| reply.ok()));
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
        self.pool.run(move || {
            fs.release(fh);
            reply.ok();
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        reply: ReplyDirectory,
    ) {
        let fs = Arc::clone(&self.fs);
        self.pool.run(move || {
            answer(reply, fs.readdir(ino), |mut reply, entries| {
                for (i, (child, kind, name)) in
                    entries.into_iter().enumerate().skip(offset as usize)
                {
                    let kind = match kind {
                        FileKind::Dir => FileType::Directory,
                        FileKind::File => FileType::RegularFile,
                    };
                    if reply.add(child, i as i64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            })
        });
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        // An object store has no size to fill: as Mountpoint, a large
        // free count, so tools that check space before writing go on.
        let blocks = u64::MAX / (1 << 20);
        reply.statfs(blocks, blocks, blocks, 0, u64::MAX / 2, 4096, 255, 4096);
    }

    fn create(
        &mut self,
        req: &Request<'_>,
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
        let (fs, ttl, tid) = (Arc::clone(&self.fs), self.ttl, req.pid());
        self.pool.run(move || {
            answer(
                reply,
                fs.create(parent, &name, flags, tid),
                |reply, (a, fh)| reply.created(&ttl, &file_attr(&a), 0, fh, 0),
            )
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

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// Sets the kernel's read-ahead for the file system mounted on `dir`:
/// the backing device info named by the mount's device number, once that
/// mount is a FUSE one (this one, never the disk below it).
/// Written after the kernel's INIT has been answered (the `stat` below
/// waits for it): the answer lowers the read-ahead to what INIT offered,
/// 128 KiB.
fn set_kernel_read_ahead(dir: &Path, bytes: u64) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir)
        .map_err(|e| format!("stat `{}`: {e}", dir.display()))?
        .dev();
    let dev = format!("{}:{}", libc::major(dev), libc::minor(dev));
    match mount_entry(dir) {
        Some((d, kind)) if d == dev && (kind == "fuse" || kind.starts_with("fuse.")) => {}
        other => {
            return Err(format!(
                "`{}` is not this mount in /proc/self/mountinfo ({other:?}, device {dev})",
                dir.display()
            ));
        }
    }
    let file = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    let kb = bytes.div_ceil(1024);
    std::fs::write(&file, format!("{kb}\n")).map_err(|e| format!("{file}: {e}"))?;
    eprintln!("ringfeed mount: kernel read-ahead {kb} KiB ({file})");
    Ok(())
}

/// Whether `dir` is a mount point now (`/proc/self/mountinfo`).
fn mounted(dir: &Path) -> bool {
    mount_entry(dir).is_some()
}

/// The top mount on `dir` in `/proc/self/mountinfo`: its device number
/// (`major:minor`) and file system type.
fn mount_entry(dir: &Path) -> Option<(String, String)> {
    let canon = dir.canonicalize().ok()?;
    let want = canon.to_string_lossy().replace(' ', "\\040");
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&want.as_str()) {
            return None;
        }
        let kind = f.iter().skip_while(|x| **x != "-").nth(1)?;
        Some((f.get(2)?.to_string(), kind.to_string()))
    })
}

/// `--daemon`: the same command again in the background (a session of
/// its own, its log to a file), this one returning once it has mounted —
/// or with its log when it failed.
fn daemonize(a: &MountArgs) -> AnyResult<()> {
    use std::os::unix::process::CommandExt;
    let log = a.log_file.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ringfeed-mount-{}.log", std::process::id()))
    });
    let file =
        std::fs::File::create(&log).map_err(|e| format!("--log-file `{}`: {e}", log.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|x| x != "--daemon")
        .collect();
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    // SAFETY: setsid is async-signal-safe; nothing else runs in the child
    // before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // Mounted and said so: the line comes once the mount is set up
        // (its kernel read-ahead included), not when the kernel first
        // lists it.
        let said = std::fs::read_to_string(&log).is_ok_and(|t| t.contains(" mounted on "));
        if said && mounted(&a.mountpoint) {
            eprintln!(
                "ringfeed mount: {} mounted on {} (pid {}, log {})",
                a.source,
                a.mountpoint.display(),
                child.id(),
                log.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the mount exited ({status}) before mounting:\n{text}").into());
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            return Err("the mount did not come up within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn mount_cmd(a: MountArgs) -> AnyResult<()> {
    if a.daemon {
        return daemonize(&a);
    }
    if !a.metadata_ttl.is_finite() || a.metadata_ttl < 0.0 {
        return Err("--metadata-ttl must be a number of seconds, 0 or more".into());
    }
    match std::fs::metadata(&a.mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("`{}` is not a directory", a.mountpoint.display()).into()),
        Err(e) => return Err(format!("mount point `{}`: {e}", a.mountpoint.display()).into()),
    }
    if mounted(&a.mountpoint) {
        return Err(format!("`{}` is already a mount point", a.mountpoint.display()).into());
    }
    let mut more = Vec::new();
    if let Some(d) = &a.cache_dir {
        more.push(("cache_dir", json!(d.to_string_lossy())));
    }
    let cfg = object_config(&a.opts, &more)?;
    let ttl = Duration::from_secs_f64(a.metadata_ttl);
    let opts = MountOptions {
        ttl,
        allow_overwrite: a.allow_overwrite,
        readahead: a.read_ahead,
        kernel_readahead: a.kernel_read_ahead,
        memory: a.memory,
        ..MountOptions::default()
    };
    ringfeed::log::set(
        Some(Box::new(|level, msg| {
            let what = match level {
                ringfeed::log::Level::Error => "error",
                ringfeed::log::Level::Warn => "warning",
                _ => "info",
            };
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "ringfeed: {t:.3} {what}: {msg}");
        })),
        ringfeed::log::Level::Info,
    );
    let fs = Arc::new(Fs::new(&a.source, &cfg, opts)?);
    let _metrics = match a.metrics_port {
        Some(port) => {
            let f = Arc::clone(&fs);
            let ip = a
                .metrics_addr
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
            let m = ringfeed::serve::metrics::serve_on(ip, port, move || {
                let mut t = f.counts.prometheus();
                t.push_str(&format!(
                    "# TYPE ringfeed_mount_block_bytes gauge\nringfeed_mount_block_bytes {}\n",
                    f.held()
                ));
                t
            })?;
            eprintln!("ringfeed mount: metrics at http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    let mut options = vec![
        MountOption::FSName(ringfeed::redact::url(&a.source).into_owned()),
        MountOption::Subtype("ringfeed".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    if a.allow_other {
        options.push(MountOption::AllowOther);
    }
    let adapter = Adapter {
        fs: Arc::clone(&fs),
        pool: Pool::new(a.threads),
        ttl,
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let session = fuser::spawn_mount2(adapter, &a.mountpoint, &options)
        .map_err(|e| format!("cannot mount on `{}`: {e}", a.mountpoint.display()))?;
    // The kernel's default read-ahead, in force unless ours is set.
    let mut in_force = 128 << 10;
    if a.kernel_read_ahead > 0 {
        match set_kernel_read_ahead(&a.mountpoint, a.kernel_read_ahead) {
            Ok(()) => in_force = a.kernel_read_ahead,
            Err(why) => eprintln!(
                "ringfeed mount: warning: the kernel's read-ahead stays at its default \
                 (reads of at most 128 KiB, slower streams and mappings): {why}"
            ),
        }
    }
    fs.set_kernel_readahead(in_force);
    eprintln!(
        "ringfeed mount: {} mounted on {}",
        ringfeed::redact::url(&a.source),
        a.mountpoint.display()
    );
    loop {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            eprintln!("ringfeed mount: signal {sig}: unmounting");
            break;
        }
        if session.guard.is_finished() {
            eprintln!("ringfeed mount: unmounted from outside");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(session);
    if mounted(&a.mountpoint) {
        // Busy: a process still has a file open or mapped. Detached
        // now (a lazy unmount): new opens no longer see it, and what is
        // open fails once this process is gone.
        eprintln!(
            "ringfeed mount: `{}` is busy (files still open): detaching it (fusermount3 -u -z)",
            a.mountpoint.display()
        );
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&a.mountpoint)
            .status();
    }
    fs.shutdown();
    let c = fs.counts.all();
    eprintln!(
        "ringfeed mount: done: {}",
        c.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
