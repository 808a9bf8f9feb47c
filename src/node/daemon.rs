//! A node engine's life as a process: where its socket is when consumers
//! find it by their configuration (`"node": "auto"`), how a consumer starts
//! one when none runs (`ringfeed node --daemon`, fed its configuration on
//! standard input), how an engine takes its socket over from one that was
//! killed ([`listen`]), and the engine process's own body ([`run`]: listen,
//! detach, serve the metrics, serve consumers until it lingers out or is
//! told to stop by SIGTERM or SIGINT). The
//! CLI's `ringfeed node` parses its flags and calls [`run`].

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};

use super::serve::{MetricsSource, NodeOptions, serve_with_metrics};
use super::sock;
use crate::config::Config;
use crate::error::{Error, NodeFailure, Result};

/// How long an engine started on demand stays up after its last consumer
/// leaves: long enough for the next epoch's DataLoader workers to attach
/// without a new start.
pub const ON_DEMAND_LINGER: Duration = Duration::from_secs(5);

/// The linger of an engine started on demand, in ms: `ON_DEMAND_LINGER`,
/// or `RINGFEED_NODE_LINGER_MS`.
fn linger_ms() -> String {
    std::env::var("RINGFEED_NODE_LINGER_MS")
        .ok()
        .filter(|v| v.parse::<u64>().is_ok())
        .unwrap_or_else(|| ON_DEMAND_LINGER.as_millis().to_string())
}

/// This user's directory for node sockets (`topology::claims::user_dir`).
pub fn runtime_dir() -> Result<PathBuf> {
    crate::topology::claims::user_dir().map_err(|e| Error::node(NodeFailure::Local, e))
}

/// FNV-1a: a hash that is the same in every process and release.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The socket of this user's node engine for the job of `cfg`: consumers
/// of one job find one engine, other jobs others. The job is every key of
/// the job's scope (`Config::job_identity`), so no key that changes the
/// batches can be left out of the name.
pub fn auto_socket(cfg: &Config) -> Result<PathBuf> {
    let key = cfg.job_identity();
    Ok(runtime_dir()?.join(format!("node-{:016x}.sock", fnv(&key))))
}

/// The `ringfeed` program that runs node engines: `RINGFEED_NODE_EXE`, else
/// `ringfeed` next to this library (or in `../bin` of it), else on `PATH`.
pub fn node_program() -> PathBuf {
    if let Some(p) = std::env::var_os("RINGFEED_NODE_EXE") {
        return p.into();
    }
    // SAFETY: Dl_info is plain data; dladdr fills it for an address of ours.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: a function of this library; `info` is writable.
    let found = unsafe { libc::dladdr(node_program as *const libc::c_void, &mut info) };
    if found != 0 && !info.dli_fname.is_null() {
        // SAFETY: dladdr's file name is a NUL-terminated string.
        let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
        let me = Path::new(std::ffi::OsStr::from_bytes(me.to_bytes()));
        if let Some(dir) = me.parent() {
            for p in [
                dir.join("ringfeed"),
                dir.join("../bin/ringfeed"),
                dir.join("../ringfeed"),
            ] {
                if p.is_file() {
                    return p;
                }
            }
        }
    }
    PathBuf::from("ringfeed")
}

/// Starts the engine for `socket` unless one answers there: under a lock
/// file (so consumers starting at once start one engine), runs
/// `ringfeed node --socket … --linger-ms … --daemon` with the configuration
/// on its standard input (credentials included: the engine reads the data
/// with them, and it is this process's own child), and waits until it
/// listens.
pub(super) fn start_engine(socket: &Path, config: &Map<String, Value>) -> Result<()> {
    use std::io::Write;
    let lock_path = socket.with_extension("lock");
    // Beside the socket (a `--socket` may name a shared directory): 0600
    // and never through a link planted at the name.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock_path)
        .map_err(|e| {
            Error::node(
                NodeFailure::Start,
                format!("`{}`: {e}", lock_path.display()),
            )
        })?;
    // SAFETY: a valid descriptor; blocks until the lock is ours. Released
    // when `lock` is closed.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if sock::connect(socket).is_ok() {
        return Ok(());
    }
    // No engine answers: a socket left there by one that died is the new
    // engine's to replace ([`listen`]).
    let program = node_program();
    let log = socket.with_extension("log");
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log)
        .map_err(|e| Error::node(NodeFailure::Start, format!("`{}`: {e}", log.display())))?;
    let mut child = std::process::Command::new(&program)
        .arg("node")
        .arg("--socket")
        .arg(socket)
        .arg("--linger-ms")
        .arg(linger_ms())
        .arg("--daemon")
        .arg("--config-stdin")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| {
            Error::node(
                NodeFailure::Start,
                format!(
                    "cannot start `{} node`: {e} (set RINGFEED_NODE_EXE to the ringfeed program)",
                    program.display()
                ),
            )
        })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let sent = stdin.write_all(Value::Object(config.clone()).to_string().as_bytes());
    drop(stdin);
    let status = child.wait().map_err(|e| {
        Error::node(
            NodeFailure::Start,
            format!("waiting for `{} node`: {e}", program.display()),
        )
    })?;
    if sent.is_err() || !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(Error::node(
            NodeFailure::Start,
            format!(
                "`{} node` failed to start ({status}): {}",
                program.display(),
                text.trim()
            ),
        ));
    }
    Ok(())
}

/// Listens at `socket` for a new engine. A socket already there is
/// replaced when nobody answers on it: an engine killed by SIGKILL or the
/// OOM killer leaves its socket file behind, and every later bind would
/// fail with "address in use". One a live engine answers on is never
/// replaced (two engines would split the node's consumers), nor is
/// anything that is not a socket. Engines starting at the same path check
/// and replace one at a time, under a lock file beside the socket
/// (`SOCKET.lock`), so none removes a socket another has just bound.
pub fn listen(socket: &Path) -> Result<OwnedFd> {
    let fail = |why: String| {
        Error::node(
            NodeFailure::Start,
            format!("cannot listen on `{}`: {why}", socket.display()),
        )
    };
    let mut lock_path = socket.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = crate::cache::private::open_lock(Path::new(&lock_path)).map_err(|e| {
        fail(
            unwritable(socket, &e)
                .unwrap_or_else(|| format!("`{}`: {e}", Path::new(&lock_path).display())),
        )
    })?;
    // SAFETY: a valid descriptor; blocks until the lock is ours (another
    // engine holds it only while it checks and binds). Released when `lock`
    // is closed, at the end of this function.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    let in_use = match sock::listen(socket) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => e,
        Err(e) => {
            return Err(fail(
                unwritable(socket, &e).unwrap_or_else(|| e.to_string()),
            ));
        }
    };
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata(socket).map_err(|e| fail(e.to_string()))?;
    if !meta.file_type().is_socket() {
        return Err(fail(format!(
            "{in_use}, and it is not a socket: not replacing it"
        )));
    }
    match sock::connect(socket) {
        Ok(_) => {
            return Err(fail(
                "a node engine answers there already: not replacing it (stop it, or give \
                 another --socket)"
                    .to_string(),
            ));
        }
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {}
        Err(e) => {
            return Err(fail(format!(
                "{in_use}, and whether an engine answers there cannot be told ({e}): not \
                 replacing it"
            )));
        }
    }
    // Nobody listens: the socket of an engine that was killed.
    std::fs::remove_file(socket)
        .map_err(|e| fail(format!("removing the stale socket there: {e}")))?;
    eprintln!(
        "ringfeed node: replaced the stale socket {} (no engine answered on it)",
        socket.display()
    );
    sock::listen(socket).map_err(|e| fail(e.to_string()))
}

/// Why `e`, met making `socket` or its lock, is the folder's permissions,
/// if it is: said with the folder's owner and mode and this user, so a
/// folder made for another user (a Kubernetes hostPath the kubelet made,
/// root's and 0755) is named as the cause.
fn unwritable(socket: &Path, e: &std::io::Error) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return None;
    }
    let dir = socket.parent().filter(|d| !d.as_os_str().is_empty())?;
    let m = std::fs::metadata(dir).ok()?;
    Some(format!(
        "{e}: the folder `{}` (user {}, mode {:o}) may not be written by this user ({}); \
         make it this user's",
        dir.display(),
        m.uid(),
        m.mode() & 0o7777,
        crate::cache::private::euid()
    ))
}

/// How the engine process runs (`ringfeed node`'s flags).
pub struct NodeRun {
    /// The engine's configuration.
    pub config: Config,
    /// Where it listens; `None`: the socket consumers of this job find
    /// ([`auto_socket`]).
    pub socket: Option<PathBuf>,
    /// Exit once no consumer has been attached for this long (`None`: run
    /// until killed).
    pub linger: Option<Duration>,
    /// Return once the socket listens, the engine going on in a child
    /// process of its own session (how consumers start one on demand).
    pub daemon: bool,
    /// Serve the engine's metrics at http://ADDR:PORT/metrics.
    pub metrics_port: Option<u16>,
    /// ADDR (`None`: 127.0.0.1; `0.0.0.0` where a scraper outside the
    /// machine's loopback reads them, as in a pod).
    pub metrics_addr: Option<std::net::IpAddr>,
}

/// Runs a node engine in this process, as [`NodeRun`] says, until it
/// lingers out or gets SIGTERM or SIGINT (or, with `daemon`, returns in the
/// parent once the socket listens). Progress goes to standard error: where it listens, where its
/// metrics are, and why it exits.
///
/// With `daemon`, call it before this process starts any thread: it forks.
pub fn run(r: NodeRun) -> Result<()> {
    let socket = match r.socket {
        Some(s) => s,
        None => auto_socket(&r.config)?,
    };
    let listener = listen(&socket)?;
    eprintln!(
        "ringfeed node: listening on {} (pid {})",
        socket.display(),
        std::process::id()
    );
    if r.daemon {
        // No thread runs yet (the caller's promise): forking here is safe.
        // The parent returns once the socket listens (it already does); the
        // child serves.
        // SAFETY: a single-threaded process; the child only continues Rust
        // code that starts threads after the fork.
        match unsafe { libc::fork() } {
            -1 => {
                return Err(Error::node(
                    NodeFailure::Start,
                    format!("fork: {}", std::io::Error::last_os_error()),
                ));
            }
            0 => {
                // SAFETY: plain call; a new session leaves the consumer's
                // terminal and process group.
                unsafe { libc::setsid() };
            }
            _ => return Ok(()),
        }
    }
    // The endpoint listens before the engine starts (a taken port is an
    // error now), and answers once the engine gives its metrics. After the
    // fork above: a daemon's threads start in the child.
    let source: Arc<OnceLock<MetricsSource>> = Arc::default();
    let _metrics = match r.metrics_port {
        Some(port) => {
            let s = Arc::clone(&source);
            let ip = r
                .metrics_addr
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
            let m = crate::serve::metrics::serve_on(ip, port, move || {
                s.get().map(|f| f()).unwrap_or_default()
            })
            .map_err(|e| Error::node(NodeFailure::Start, e.to_string()))?;
            eprintln!("metrics: http://{}/metrics", m.addr());
            Some(m)
        }
        None => None,
    };
    let opts = NodeOptions {
        socket,
        config: r.config,
        linger: r.linger,
    };
    super::serve::stop_on_signals();
    serve_with_metrics(listener, opts, |m| {
        let _ = source.set(m);
    })?;
    match super::serve::stopped_by() {
        Some(sig) => eprintln!("ringfeed node: signal {sig}: removed the socket; exiting"),
        None => eprintln!("ringfeed node: no consumer for a while; exiting"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an engine killed by SIGKILL leaves: its socket file, bound once
    /// and listened on by no one.
    fn left_by_a_killed_engine(path: &Path) {
        drop(sock::listen(path).unwrap());
        assert!(path.exists());
    }

    #[test]
    fn a_socket_nobody_answers_on_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.sock");
        left_by_a_killed_engine(&path);
        let refused = sock::connect(&path).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ECONNREFUSED));
        // Control: binding it as is fails, as every restart did.
        let e = sock::listen(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        let listener = listen(&path).unwrap();
        let _client = sock::connect(&path).unwrap();
        sock::accept(&listener).unwrap();
    }

    #[test]
    fn a_socket_a_live_engine_answers_on_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.sock");
        let live = sock::listen(&path).unwrap();
        let e = listen(&path).unwrap_err().to_string();
        assert!(e.contains("a node engine answers there already"), "{e}");
        // The live one still has its socket: a consumer reaches it (past
        // the probe the refused engine made).
        let _client = sock::connect(&path).unwrap();
        sock::accept(&live).unwrap();
        sock::accept(&live).unwrap();
    }

    #[test]
    fn what_is_not_a_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.sock");
        std::fs::write(&path, b"not a socket").unwrap();
        let e = listen(&path).unwrap_err().to_string();
        assert!(e.contains("it is not a socket: not replacing it"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
    }
}
