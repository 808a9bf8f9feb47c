//! One engine per node: consumers (ranks, DataLoader workers; C, C++ or
//! Python) attach to a node engine over a Unix socket and take their
//! batches through shared memory, instead of each opening an engine of its
//! own. The engine opens one loader per consumer — the consumer's rank,
//! loader worker, resume state and start epoch over the engine's
//! configuration — so each consumer gets exactly the batches, in exactly
//! the order, that an engine of its own would give it.
//!
//! - [`server`]: the engine (`ringfeed node`, or started on demand);
//! - [`client`]: the consumer's side ([`NodeLoader`]);
//! - `shm.rs`: the per-consumer rings in shared memory (batch records out,
//!   releases back);
//! - `wire.rs`: a batch as a record of offsets into the arena;
//! - `sock.rs`: the socket, descriptor passing, peer credentials, eventfds.
//!
//! [`Attached`] is what the C ABI holds: a loader in this process or one
//! attached to a node engine, chosen by the configuration's `node` key.

pub mod client;
pub mod server;
mod shm;
pub mod sock;
mod wire;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

pub use client::{NodeBatch, NodeLoader, NodeNext, keep, release};
pub use server::{MetricsSource, NodeOptions, serve, serve_with_metrics};

use crate::config::{Config, NodeMode};
use crate::engine::{Counts, Loader, Next};
use crate::error::{Error, Result};
use crate::memory::Batch;

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
    crate::topology::claims::user_dir().map_err(Error::Node)
}

/// FNV-1a: a hash that is the same in every process and release.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The socket of this user's node engine for the dataset and epoch
/// settings of `cfg`: consumers of one job find one engine, other jobs
/// others.
pub fn auto_socket(cfg: &Config) -> Result<PathBuf> {
    let key = format!(
        "{:?}|{:?}|{:?}|{}|{}|{}|{}|{}|{:?}|{}|{}|{:?}|{}|{}|{}",
        cfg.urls,
        cfg.manifest,
        cfg.s3.endpoint,
        cfg.batch_size,
        cfg.drop_last,
        cfg.seed,
        cfg.shuffle,
        cfg.shuffle_buffer,
        cfg.shuffle_initial,
        cfg.resampled,
        cfg.samples_per_epoch,
        cfg.remainder,
        cfg.world_size,
        cfg.loader_workers,
        cfg.workers,
    );
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
/// on its standard input, and waits until it listens.
fn start_engine(socket: &Path, config: &Map<String, Value>) -> Result<()> {
    use std::io::Write;
    let lock_path = socket.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::Node(format!("`{}`: {e}", lock_path.display())))?;
    // SAFETY: a valid descriptor; blocks until the lock is ours. Released
    // when `lock` is closed.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if sock::connect(socket).is_ok() {
        return Ok(());
    }
    // No engine answers: what is there is a stale socket of one that died.
    let _ = std::fs::remove_file(socket);
    let program = node_program();
    let log = socket.with_extension("log");
    let log_file = std::fs::File::create(&log)
        .map_err(|e| Error::Node(format!("`{}`: {e}", log.display())))?;
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
            Error::Node(format!(
                "cannot start `{} node`: {e} (set RINGFEED_NODE_EXE to the ringfeed program)",
                program.display()
            ))
        })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let sent = stdin.write_all(Value::Object(config.clone()).to_string().as_bytes());
    drop(stdin);
    let status = child
        .wait()
        .map_err(|e| Error::Node(format!("waiting for `{} node`: {e}", program.display())))?;
    if sent.is_err() || !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(Error::Node(format!(
            "`{} node` failed to start ({status}): {}",
            program.display(),
            text.trim()
        )));
    }
    Ok(())
}

/// A loader in this process, or one attached to a node engine.
pub enum Attached {
    Local(Loader),
    Node(NodeLoader),
}

/// A batch of either kind of loader.
#[derive(Debug)]
pub enum AnyBatch {
    Local(Batch),
    Node(NodeBatch),
}

/// What `next` returns when it does not fail.
#[derive(Debug)]
pub enum AnyNext {
    Batch(AnyBatch),
    EndOfEpoch(u64),
    Timeout,
    Finished,
}

impl Attached {
    /// Opens a loader from a JSON configuration: in this process, or, by
    /// its `node` key, attached to a node engine (started if `auto` finds
    /// none).
    pub fn open_json(text: &str) -> Result<Attached> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(format!("not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Loader::open_json(text).map(Attached::Local);
        };
        let cfg = Config::from_map(&map)?;
        let socket = match &cfg.node {
            NodeMode::Off => return Loader::open(cfg).map(Attached::Local),
            NodeMode::Socket(p) => p.clone(),
            NodeMode::Auto => {
                let socket = auto_socket(&cfg)?;
                if sock::connect(&socket).is_err() {
                    start_engine(&socket, &map)?;
                }
                socket
            }
        };
        NodeLoader::attach(&socket, &map, cfg.cuda_register).map(Attached::Node)
    }

    pub fn next(&self, timeout: Option<Duration>) -> Result<AnyNext> {
        Ok(match self {
            Attached::Local(l) => match l.next(timeout)? {
                Next::Batch(b) => AnyNext::Batch(AnyBatch::Local(b)),
                Next::EndOfEpoch(e) => AnyNext::EndOfEpoch(e),
                Next::Timeout => AnyNext::Timeout,
                Next::Finished => AnyNext::Finished,
            },
            Attached::Node(n) => match n.next(timeout)? {
                NodeNext::Batch(b) => AnyNext::Batch(AnyBatch::Node(b)),
                NodeNext::EndOfEpoch(e) => AnyNext::EndOfEpoch(e),
                NodeNext::Timeout => AnyNext::Timeout,
                NodeNext::Finished => AnyNext::Finished,
            },
        })
    }

    /// The resume state (hex) after the batches taken so far.
    pub fn state_hex(&self) -> String {
        match self {
            Attached::Local(l) => l.state().to_hex(),
            Attached::Node(n) => n.state_hex(),
        }
    }

    /// The stats as JSON text, and the counters.
    pub fn stats(&self) -> Result<(String, Counts)> {
        match self {
            Attached::Local(l) => {
                let s = l.stats();
                let text = serde_json::to_string(&s).map_err(|e| Error::Internal(e.to_string()))?;
                Ok((text, s.counts))
            }
            Attached::Node(n) => n.stats(),
        }
    }

    /// The memory file of the arena (`None`: private), its first byte in
    /// this process, its length.
    pub fn arena(&self) -> Option<(i32, *const u8, usize)> {
        match self {
            Attached::Local(l) => {
                let a = l.arena();
                a.shared_fd().map(|fd| (fd, a.base().cast_const(), a.len()))
            }
            Attached::Node(n) => Some(n.arena()),
        }
    }

    /// The name of the shard sample `i` of `b` came from.
    pub fn source(&self, b: &AnyBatch, i: usize) -> Result<Option<String>> {
        match b {
            AnyBatch::Local(b) => Ok(b.source(i).map(str::to_string)),
            AnyBatch::Node(b) => match (self, b.source_index(i)) {
                (Attached::Node(n), Some(s)) => n.shard_name(s),
                _ => Ok(None),
            },
        }
    }

    pub fn close(&self) {
        match self {
            Attached::Local(l) => l.close(),
            Attached::Node(n) => n.close(),
        }
    }
}

impl AnyBatch {
    /// The key of a node engine's batch (`NodeBatch::key`); `None` for a
    /// batch of a loader in this process.
    pub fn node_key(&self) -> Option<String> {
        match self {
            AnyBatch::Local(_) => None,
            AnyBatch::Node(b) => Some(b.key()),
        }
    }
    pub fn epoch(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.epoch(),
            AnyBatch::Node(b) => b.epoch(),
        }
    }
    pub fn index(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.index(),
            AnyBatch::Node(b) => b.index(),
        }
    }
    pub fn bytes(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.bytes(),
            AnyBatch::Node(b) => b.bytes(),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            AnyBatch::Local(b) => b.len(),
            AnyBatch::Node(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn raw_samples(&self) -> &[crate::memory::RawSample] {
        match self {
            AnyBatch::Local(b) => b.raw_samples(),
            AnyBatch::Node(b) => b.raw_samples(),
        }
    }
    pub fn raw_fields(&self) -> &[crate::memory::RawField] {
        match self {
            AnyBatch::Local(b) => b.raw_fields(),
            AnyBatch::Node(b) => b.raw_fields(),
        }
    }
}
