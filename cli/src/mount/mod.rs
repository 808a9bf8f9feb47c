//! `ringfeed mount SOURCE MOUNTPOINT`: the library's file system
//! (`ringfeed::mount::Fs`) spoken over FUSE with the `fuser` crate
//! (mounted through `fusermount3`, no libfuse). The kernel's requests are
//! taken on fuser's one session thread and answered from a pool of
//! threads, so a read waiting for the store never holds up a `stat` or
//! another file's read (`adapter.rs`: the requests turned into the file
//! system's calls and its answers into replies). This file mounts, sets
//! the kernel's read-ahead on the mount, serves the metrics, and runs
//! until SIGINT, SIGTERM or SIGHUP (then unmounts) or until unmounted
//! from outside (`fusermount3 -u`); with `--daemon` it returns once the
//! file system is mounted.

mod adapter;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::MountOption;
use serde_json::json;

use ringfeed::mount::{Fs, MountOptions};

use crate::AnyResult;
use crate::args::{MountArgs, object_config};
use adapter::{Adapter, Lanes, Pool};

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
pub(crate) fn set_kernel_read_ahead(dir: &Path, bytes: u64) -> Result<(), String> {
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
    let (log, file) = daemon_log(a.log_file.as_deref())?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|x| x != "--daemon")
        .collect();
    let mut child = spawn_detached(&args, file, None)?;
    wait_mounted(&mut child, &log, &a.mountpoint, Duration::from_secs(60))?;
    eprintln!(
        "ringfeed mount: {} mounted on {} (pid {}, log {})",
        a.source,
        a.mountpoint.display(),
        child.id(),
        log.display()
    );
    Ok(())
}

/// The daemon's log: `--log-file` (created or emptied), else
/// `mount-<pid>.log` in this user's private directory
/// (`$XDG_RUNTIME_DIR/ringfeed` or `/tmp/ringfeed-<uid>`, 0700, checked to
/// be this user's), made anew. Either way mode 0600 (the log names the
/// mount's source and errors) and never through a symbolic link: a link
/// planted at the name (in /tmp, where another user may make one) is
/// refused instead of followed to a file this user may write.
fn daemon_log(named: Option<&Path>) -> AnyResult<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let (log, fresh) = match named {
        Some(p) => (p.to_path_buf(), false),
        None => {
            let dir = ringfeed::node::runtime_dir().map_err(|e| format!("mount log: {e}"))?;
            (dir.join(format!("mount-{}.log", std::process::id())), true)
        }
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .create_new(fresh)
        .truncate(!fresh)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log)
        .map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ELOOP) => " (a symbolic link: refused, not followed)".to_string(),
                _ => String::new(),
            };
            format!("mount log `{}`: {e}{why}", log.display())
        })?;
    Ok((log, file))
}

/// This program run with `args` in a session of its own (no terminal's
/// signals reach it; it outlives the process that started it), its
/// stdout and stderr to `log`.
pub(crate) fn spawn_detached(
    args: &[String],
    log: std::fs::File,
    handed: Option<Handed>,
) -> std::io::Result<std::process::Child> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let fd = match &handed {
        Some(h) => {
            cmd.uid(h.uid).gid(h.gid);
            Some((h.fd.as_raw_fd(), h.at))
        }
        None => None,
    };
    // SAFETY: setsid, dup2 and fcntl are async-signal-safe; nothing else
    // runs in the child before exec. (`uid`/`gid` are set by the standard
    // library before this runs; supplementary groups are dropped with them.)
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if let Some((from, at)) = fd {
                // The descriptor at the number the mount is told, without
                // close-on-exec (dup2 clears it; the same number keeps it,
                // so it is cleared by hand).
                if from == at {
                    if libc::fcntl(at, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(from, at) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    // The parent's copy of the descriptor closes here (`handed` dropped):
    // the child's is the session's only one.
    drop(handed);
    child
}

/// A `/dev/fuse` descriptor a mount process is to serve (`--fuse-fd`), at
/// descriptor number `at`, run as `uid`:`gid`.
pub(crate) struct Handed {
    pub(crate) fd: std::os::fd::OwnedFd,
    pub(crate) at: i32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// Waits until `child`, a mount process writing its log to `log`, has
/// mounted on `mountpoint` and said so; its log is the error when it
/// exits first, and it is killed when `limit` passes first.
pub(crate) fn wait_mounted(
    child: &mut std::process::Child,
    log: &Path,
    mountpoint: &Path,
    limit: Duration,
) -> AnyResult<()> {
    let until = std::time::Instant::now() + limit;
    loop {
        // Mounted and said so: the line comes once the mount is set up
        // (its kernel read-ahead included), not when the kernel first
        // lists it.
        let said = std::fs::read_to_string(log).is_ok_and(|t| t.contains(" mounted on "));
        if said && mounted(mountpoint) {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("the mount exited ({status}) before mounting:\n{text}").into());
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the mount did not come up within {} s", limit.as_secs()).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The session over `/dev/fuse` descriptor `fd`, inherited from the
/// parent that mounted it (`--fuse-fd`), answering every user with
/// `allow_other` (the kernel's `default_permissions` checks the modes), or
/// the mount's user only.
fn inherited_session(
    adapter: Adapter,
    fd: i32,
    allow_other: bool,
) -> AnyResult<fuser::BackgroundSession> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    // SAFETY: F_GETFD only reads the descriptor's flags: it fails on a
    // descriptor that is not open, which is refused before it is owned.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(
            format!("--fuse-fd {fd}: not an open descriptor this process inherited").into(),
        );
    }
    // SAFETY: the descriptor is open (above) and this process's alone to
    // use: the parent handed it over for this session.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let acl = if allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    Ok(fuser::Session::from_fd(adapter, owned, acl)
        .spawn()
        .map_err(|e| format!("--fuse-fd {fd}: {e}"))?)
}

pub(crate) fn mount_cmd(a: MountArgs) -> AnyResult<()> {
    if a.daemon {
        return daemonize(&a);
    }
    if !a.metadata_ttl.is_finite() || a.metadata_ttl < 0.0 {
        return Err("--metadata-ttl must be a number of seconds, 0 or more".into());
    }
    // With --fuse-fd the mount point is already this process's mount (a
    // `stat` of it would wait for this process to answer), and may lie
    // under directories its user cannot search (the kubelet's).
    match a
        .fuse_fd
        .map_or_else(|| Some(std::fs::metadata(&a.mountpoint)), |_| None)
    {
        None => {}
        Some(Ok(m)) if m.is_dir() => {}
        Some(Ok(_)) => {
            return Err(format!("`{}` is not a directory", a.mountpoint.display()).into());
        }
        Some(Err(e)) => {
            return Err(format!("mount point `{}`: {e}", a.mountpoint.display()).into());
        }
    }
    if a.fuse_fd.is_none() && mounted(&a.mountpoint) {
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
        read_only: a.read_only,
        ..MountOptions::default()
    };
    let opts = MountOptions {
        uid: a.uid.unwrap_or(opts.uid),
        gid: a.gid.unwrap_or(opts.gid),
        file_mode: a.file_mode.unwrap_or(opts.file_mode),
        dir_mode: a.dir_mode.unwrap_or(opts.dir_mode),
        ..opts
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
                    "# TYPE ringfeed_mount_block_bytes gauge\nringfeed_mount_block_bytes {}\n\
                     # TYPE ringfeed_mount_inodes gauge\nringfeed_mount_inodes {}\n",
                    f.held(),
                    f.inodes()
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
    if a.read_only {
        options.push(MountOption::RO);
    }
    let adapter = Adapter {
        fs: Arc::clone(&fs),
        pool: Pool::new(a.threads, "rf-mount"),
        lanes: Lanes::new(a.threads),
        ttl,
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let session = match a.fuse_fd {
        Some(fd) => inherited_session(adapter, fd, a.allow_other)?,
        None => fuser::spawn_mount2(adapter, &a.mountpoint, &options)
            .map_err(|e| format!("cannot mount on `{}`: {e}", a.mountpoint.display()))?,
    };
    // The kernel's default read-ahead, in force unless ours is set (by the
    // parent that mounted, with --fuse-fd: sysfs is root's).
    let mut in_force = 128 << 10;
    if a.fuse_fd.is_some() {
        in_force = a.kernel_read_ahead.max(in_force);
    } else if a.kernel_read_ahead > 0 {
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
    if a.fuse_fd.is_none() && mounted(&a.mountpoint) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_ahead_of_a_directory_that_is_not_a_fuse_mount_is_left_alone() {
        // `/` is the disk's (or an overlay's) mount: its device's
        // read-ahead must never be written. The file the write would go
        // to keeps its value.
        let dev = {
            use std::os::unix::fs::MetadataExt;
            let d = std::fs::metadata("/").unwrap().dev();
            format!("{}:{}", libc::major(d), libc::minor(d))
        };
        let file = format!("/sys/class/bdi/{dev}/read_ahead_kb");
        let before = std::fs::read_to_string(&file).ok();
        let err = set_kernel_read_ahead(Path::new("/"), 64 << 20).unwrap_err();
        assert!(err.contains("is not this mount"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).ok(), before);
        // A directory that is no mount point at all.
        let tmp = tempfile::tempdir().unwrap();
        let err = set_kernel_read_ahead(tmp.path(), 64 << 20).unwrap_err();
        assert!(err.contains("is not this mount"), "{err}");
    }

    #[test]
    fn mountinfo_names_the_top_mount_and_its_type() {
        let (dev, kind) = mount_entry(Path::new("/proc")).unwrap();
        assert_eq!(kind, "proc");
        assert!(dev.contains(':'), "{dev}");
        assert!(mount_entry(Path::new("/definitely/not/here")).is_none());
    }
}
