//! The node engine: listens on a Unix socket, and for each consumer that
//! attaches (same user only) opens that consumer's loader — the consumer's
//! rank, loader worker, resume state and start epoch over the engine's
//! configuration. Every loader takes its chunks from one arena, in a
//! memory file, made when the engine starts (`memory_budget` is the whole
//! engine's; each stream holds at most the budget split among the streams
//! the engine expects, and streams beyond those take theirs past the
//! budget: `ChunkPool::new_shared`). A consumer is handed:
//!
//! - the arena's memory file, reopened read-only (the consumer can map it
//!   but never write it), the rings' memory file (`shm.rs`) and two
//!   eventfds (records ready; records read or batches released);
//! - a feeder thread takes the loader's batches, encodes each as a record
//!   of offsets into the arena (`wire.rs`) and keeps the batch in a table
//!   until the consumer releases its number;
//! - the session's own thread answers requests on the socket (stats, a
//!   sample's shard), takes releases, and on a hang-up — the consumer
//!   closed, exited or crashed — closes the loader and drops every batch
//!   the consumer still held, so its memory comes back.
//!
//! A batch the consumer handed on to another process (a DataLoader worker's
//! batch, held by the main process) outlives the consumer when kept: a
//! one-off connection asks `{"keep": {"session", "id", "for": pid}}` while
//! the consumer still holds it; the consumer's own release of a kept batch
//! is then ignored, and at its hang-up the kept batches move to the
//! engine's orphans, freed by `{"release": {"session", "id"}}` or when the
//! process they were kept for exits (a pidfd). `client::keep` and
//! `client::release` send these; `ringfeed._transport` decides when.
//!
//! An on-demand engine (`linger`) exits when no consumer has been attached
//! for that long.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::shm::Rings;
use super::sock;
use super::wire;
use crate::config::{Config, PER_CONSUMER};
use crate::dataset::Shard;
use crate::engine::EngineNet;
use crate::engine::{Loader, Next};
use crate::error::{Error, Result};
use crate::memory::{Arena, ArenaOptions, Batch, ChunkPool};
use crate::topology::{self, Request};

/// How the engine runs.
pub struct NodeOptions {
    /// Where it listens (already bound: see [`sock::listen`]).
    pub socket: PathBuf,
    /// The engine's configuration: the dataset and epoch keys every consumer
    /// must match, and the memory, thread and I/O keys of every loader.
    pub config: Map<String, Value>,
    /// Exit once no consumer has been attached for this long (`None`: run
    /// until killed).
    pub linger: Option<Duration>,
}

/// The longest the engine's arena waits for a first batch before its pages
/// are faulted in anyway.
const PREFAULT_AFTER: Duration = Duration::from_secs(2);

/// How long an engine with a linger waits for its first consumer.
const FIRST_WAIT: Duration = Duration::from_secs(60);

/// What the engine reports of itself in every consumer's stats.
#[derive(Default)]
struct Whole {
    /// Consumers attached now.
    consumers: AtomicUsize,
    /// Batches handed out and not yet released, over all consumers.
    held: AtomicUsize,
    /// Consumers attached since the start.
    attached: AtomicUsize,
    /// A consumer got its first batch (the arena's pages may fault in).
    first_out: AtomicBool,
    /// The last session number given.
    sessions: AtomicU64,
}

/// The engine's metrics in the Prometheus text format, made when asked.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves consumers on `listener` until the engine lingers out.
pub fn serve(listener: OwnedFd, opts: NodeOptions) -> Result<()> {
    serve_with_metrics(listener, opts, |_| {})
}

/// As [`serve`]; `metrics` is given, once the engine is set up, what makes
/// its metrics: every attached consumer's loader summed (counters, retries
/// by kind), the shared arena's chunks, and the consumers attached and the
/// batches they hold (`ringfeed_node_*`).
pub fn serve_with_metrics(
    listener: OwnedFd,
    opts: NodeOptions,
    metrics: impl FnOnce(MetricsSource),
) -> Result<()> {
    let base = Config::from_map(&opts.config)?;
    let whole = Arc::new(Whole::default());
    let engine = Engine::new(&base, &whole)?;
    {
        let (e, w) = (Arc::downgrade(&engine), Arc::clone(&whole));
        metrics(Arc::new(move || match e.upgrade() {
            Some(engine) => engine_metrics(&engine, &w),
            None => String::new(),
        }));
    }
    let opts = Arc::new(opts);
    let active = Arc::new(AtomicUsize::new(0));
    let mut idle_since = Instant::now();
    let mut sessions = Vec::new();
    loop {
        let ready = sock::poll(&[(&listener, true)], Some(Duration::from_millis(200)))
            .map_err(|e| Error::Node(format!("waiting for consumers: {e}")))?;
        if ready[0].readable {
            match sock::accept(&listener) {
                Ok(conn) => {
                    active.fetch_add(1, Ordering::AcqRel);
                    let (o, b, a, w) = (opts.clone(), base.clone(), active.clone(), whole.clone());
                    let e = engine.clone();
                    let t = std::thread::Builder::new()
                        .name("ringfeed-node-session".into())
                        .spawn(move || {
                            // Counted out however the session ends, a
                            // panic included: else the engine would never
                            // linger out.
                            let _out = CountOut(&a);
                            session(conn, &o, &b, &w, &e);
                        });
                    match t {
                        Ok(t) => sessions.push(t),
                        Err(e) => {
                            active.fetch_sub(1, Ordering::AcqRel);
                            crate::log::log(crate::log::Level::Error, || {
                                format!("ringfeed node: cannot start a session thread: {e}")
                            });
                        }
                    }
                }
                Err(e) => crate::log::log(crate::log::Level::Error, || {
                    format!("ringfeed node: accept: {e}")
                }),
            }
        }
        sessions.retain(|t| !t.is_finished());
        engine.reap_orphans(&whole);
        // Before its first consumer, an engine waits at least FIRST_WAIT:
        // the consumers of a job may take seconds to start.
        let patience = match opts.linger {
            Some(l) if whole.attached.load(Ordering::Acquire) == 0 => Some(l.max(FIRST_WAIT)),
            other => other,
        };
        if active.load(Ordering::Acquire) > 0 {
            idle_since = Instant::now();
        } else if patience.is_some_and(|l| idle_since.elapsed() >= l) {
            let _ = std::fs::remove_file(&opts.socket);
            return Ok(());
        }
    }
}

/// What every consumer's loader of the engine shares.
struct Engine {
    pool: Arc<ChunkPool>,
    /// The dataset, resolved and counted by the first consumer's session.
    shards: Mutex<Option<Arc<Dataset>>>,
    /// The consumers attached, by session number (for `keep`).
    feeds: Mutex<HashMap<u64, Weak<Feed>>>,
    /// Kept batches of consumers gone, by session and batch number.
    orphans: Mutex<HashMap<(u64, u64), Held>>,
}

/// A batch handed out and not released: kept for `receiver` (a pidfd) when
/// the consumer handed it on to another process. Freed when neither holds
/// it: the consumer released it (or left) and the receiver released it (or
/// exited).
struct Held {
    /// Dropping it gives its memory back to the pool.
    _batch: Batch,
    receiver: Option<OwnedFd>,
    consumer_released: bool,
}

/// The dataset every consumer's loader reads, and the network threads
/// that receive its remote ranges for all of them (stopped when the last
/// loader and the engine let go of it).
struct Dataset {
    shards: Vec<Shard>,
    net: Option<EngineNet>,
}

/// Takes one off a count when dropped (on unwinding too).
struct CountOut<'a>(&'a AtomicUsize);

impl Drop for CountOut<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The engine's metrics (see [`serve_with_metrics`]).
fn engine_metrics(engine: &Engine, whole: &Whole) -> String {
    let feeds: Vec<Arc<Feed>> = engine
        .feeds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter_map(Weak::upgrade)
        .collect();
    // Counters and retries summed over the consumers' loaders; the setup
    // (backend, memory) is the first one's, the same for all.
    let mut sum = serde_json::Map::new();
    for f in &feeds {
        let Ok(Value::Object(one)) = serde_json::to_value(f.loader.stats()) else {
            continue;
        };
        for (k, v) in one {
            match (sum.get_mut(&k), &v) {
                (Some(Value::Number(a)), Value::Number(b)) => {
                    let total = a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0);
                    if let Some(n) = serde_json::Number::from_f64(total) {
                        *a = n;
                    }
                }
                (Some(Value::Object(a)), Value::Object(b)) if k == "retries" => {
                    for (kind, n) in b {
                        let total = a.get(kind).and_then(Value::as_f64).unwrap_or(0.0)
                            + n.as_f64().unwrap_or(0.0);
                        a.insert(kind.clone(), json!(total));
                    }
                }
                (None, _) => {
                    sum.insert(k, v);
                }
                _ => {}
            }
        }
    }
    // The arena is the engine's, not each loader's.
    let usage = engine.pool.usage();
    sum.insert("chunk_count".into(), json!(engine.pool.chunk_count()));
    sum.insert("chunks_in_use".into(), json!(usage.in_use));
    sum.insert("chunks_peak".into(), json!(usage.peak));
    sum.insert("chunk_size".into(), json!(engine.pool.chunk_size()));
    sum.insert("arena_bytes".into(), json!(engine.pool.arena().len()));
    for k in [
        "epoch",
        "workers",
        "shards_total",
        "time_to_first_batch_ns",
        "elapsed_ns",
    ] {
        sum.remove(k);
    }
    let mut text = crate::engine::prometheus(&Value::Object(sum).to_string()).unwrap_or_default();
    for (name, help, v) in [
        (
            "ringfeed_node_consumers",
            "Consumers attached now.",
            whole.consumers.load(Ordering::Relaxed),
        ),
        (
            "ringfeed_node_batches_held",
            "Batches handed to consumers and not yet released.",
            whole.held.load(Ordering::Relaxed),
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    }
    let name = "ringfeed_node_attached_total";
    text.push_str(&format!(
        "# HELP {name} Consumers attached since the engine started.\n# TYPE {name} counter\n{name} {}\n",
        whole.attached.load(Ordering::Relaxed)
    ));
    text
}

impl Engine {
    fn new(base: &Config, whole: &Arc<Whole>) -> Result<Arc<Engine>> {
        let engine = Arc::new(Engine {
            pool: engine_pool(base)?,
            shards: Mutex::new(None),
            feeds: Mutex::new(HashMap::new()),
            orphans: Mutex::new(HashMap::new()),
        });
        // The arena's pages fault in off the consumers' path (the loaders
        // of a shared pool leave this to the engine), once the first batch
        // is out: faulting in 4 KiB shared pages takes about 1 ms per 1 MiB
        // of one CPU, which the first consumers' start would wait for.
        let e = Arc::downgrade(&engine);
        let whole = whole.clone();
        let _ = std::thread::Builder::new()
            .name("ringfeed-node-prefault".into())
            .spawn(move || {
                let begun = Instant::now();
                let mut i = 0;
                while let Some(e) = e.upgrade() {
                    if !whole.first_out.load(Ordering::Acquire) && begun.elapsed() < PREFAULT_AFTER
                    {
                        drop(e);
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    let cs = e.pool.chunk_size();
                    if i == e.pool.preferred_chunks() {
                        return;
                    }
                    e.pool.arena().populate(i * cs, cs);
                    i += 1;
                }
            });
        Ok(engine)
    }

    /// The dataset (every consumer gives the same dataset keys), resolved
    /// and counted once, with the network threads for its remote shards;
    /// an error is the asking consumer's, and the next one tries again.
    fn shards(&self, base: &Config) -> Result<Arc<Dataset>> {
        let mut known = lock(&self.shards);
        if let Some(s) = &*known {
            return Ok(s.clone());
        }
        let shards = crate::engine::resolve_counted(base)?;
        let net = crate::engine::engine_net_threads(base, &shards)?;
        let s = Arc::new(Dataset { shards, net });
        *known = Some(s.clone());
        Ok(s)
    }
}

impl Engine {
    /// Keeps batch `id` of session `session` for process `pid` (see the
    /// module's doc): it must still be held by its consumer, or kept.
    fn keep(&self, session: u64, id: u64, pid: i32) -> Result<()> {
        let receiver = sock::pidfd(pid).map_err(|e| {
            Error::Node(format!(
                "process {pid}, for which batch {id} would be kept, is not running ({e})"
            ))
        })?;
        let feed = lock(&self.feeds).get(&session).and_then(Weak::upgrade);
        if let Some(feed) = feed
            && let Some(h) = lock(&feed.held).get_mut(&id)
        {
            h.receiver.get_or_insert(receiver);
            return Ok(());
        }
        // A session's end moves its kept batches here under its `held` lock:
        // looked up after it, a batch kept in time is found one place or
        // the other.
        if lock(&self.orphans).contains_key(&(session, id)) {
            return Ok(());
        }
        Err(Error::Node(format!(
            "batch {id} of consumer {session} is no longer held: the consumer released it, or \
             left, before it was kept"
        )))
    }

    /// Ends the receiver's hold on a kept batch (freed unless its consumer
    /// still holds it); false when it was not kept (already released).
    fn release_kept(&self, session: u64, id: u64, whole: &Whole) -> bool {
        if lock(&self.orphans).remove(&(session, id)).is_some() {
            whole.held.fetch_sub(1, Ordering::AcqRel);
            return true;
        }
        let Some(feed) = lock(&self.feeds).get(&session).and_then(Weak::upgrade) else {
            return false;
        };
        let mut held = lock(&feed.held);
        let Some(h) = held.get_mut(&id).filter(|h| h.receiver.is_some()) else {
            return false;
        };
        if h.consumer_released {
            held.remove(&id);
            whole.held.fetch_sub(1, Ordering::AcqRel);
        } else {
            h.receiver = None;
        }
        true
    }

    /// Frees the orphans whose receiver exited.
    fn reap_orphans(&self, whole: &Whole) {
        let mut orphans = lock(&self.orphans);
        let before = orphans.len();
        orphans.retain(|_, h| !h.receiver.as_ref().is_none_or(sock::exited));
        whole
            .held
            .fetch_sub(before - orphans.len(), Ordering::AcqRel);
    }

    /// Batches kept for another process, over all consumers.
    fn kept(&self) -> usize {
        let live: usize = lock(&self.feeds)
            .values()
            .filter_map(Weak::upgrade)
            .map(|f| {
                lock(&f.held)
                    .values()
                    .filter(|h| h.receiver.is_some())
                    .count()
            })
            .sum();
        live + lock(&self.orphans).len()
    }
}

/// Answers a one-off request (`keep` or `release` of a kept batch; see the
/// module's doc) on its own connection.
fn hand_over(req: &Value, engine: &Engine, whole: &Whole) -> Result<Value> {
    let num = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Node(format!("the request lacks `{k}` (a non-negative integer)")))
    };
    if let Some(k) = req.get("keep") {
        let pid = i32::try_from(num(k, "for")?)
            .map_err(|_| Error::Node("`for` is not a process id".into()))?;
        engine.keep(num(k, "session")?, num(k, "id")?, pid)?;
        return Ok(json!({"kept": true}));
    }
    let r = &req["release"];
    let released = engine.release_kept(num(r, "session")?, num(r, "id")?, whole);
    Ok(json!({ "released": released }))
}

/// The engine's arena, in a memory file no one may map writable again
/// (the engine's own mapping is older), on the NIC's NUMA node, cut into
/// the pool every consumer's loader joins.
fn engine_pool(cfg: &Config) -> Result<Arc<ChunkPool>> {
    let topo = topology::discover();
    let allowed = topo.allowed();
    let req = Request {
        threads: 1,
        allowed: &allowed,
        claimed: &[],
        nic: None,
        cpus: cfg.cpus.as_deref(),
        numa_node: cfg.numa_node,
    };
    let node = topology::worker_cpus(&topo, &req).numa_node;
    let chunks = (cfg.node_budget() / cfg.chunk_size).max(1) as usize;
    let arena = Arena::new_on_node(
        chunks * OVERSUBSCRIBE * cfg.chunk_size as usize,
        ArenaOptions {
            kind: cfg.memory_kind,
            lock: cfg.lock_memory.required(),
            prefault: false,
            shared: true,
        },
        node,
    )?;
    let fd = arena
        .shared_fd()
        .ok_or_else(|| Error::Internal("the node engine's arena is not in a memory file".into()))?;
    // SAFETY: fcntl on the arena's own descriptor; plain arguments.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) } != 0 {
        return Err(Error::Memory(format!(
            "cannot seal the node engine's arena against writable mappings: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(ChunkPool::new_shared(
        arena,
        cfg.chunk_size as usize,
        chunks / cfg.node_streams().max(1),
        chunks,
    ))
}

/// The node engine's arena file is this many times its budget: the pages
/// past the budget are used only while more streams are attached than the
/// engine expects (see `ChunkPool::new_shared`); until then they are
/// address space, and take no memory.
const OVERSUBSCRIBE: usize = 4;

/// Replies with an error and returns.
fn refuse(conn: &OwnedFd, status: i32, message: &str) {
    let reply = json!({"error": {"status": status, "message": message}});
    let _ = sock::send(conn, reply.to_string().as_bytes(), &[]);
}

/// The consumer's loader configuration: the engine's, with the consumer's
/// own keys; checked to agree on the shared ones.
fn consumer_config(
    attach: &Map<String, Value>,
    opts: &NodeOptions,
    base: &Config,
) -> Result<Config> {
    let theirs = Config::from_map(attach)?;
    if let Some((key, ours, theirs)) = base.disagreement(&theirs) {
        return Err(Error::Node(format!(
            "the consumer's `{key}` ({theirs}) differs from the node engine's ({ours}): every \
             consumer of one engine must give the same dataset, epoch and layout keys"
        )));
    }
    let mut m = opts.config.clone();
    for key in PER_CONSUMER {
        m.remove(*key);
        if let Some(v) = attach.get(*key) {
            m.insert((*key).into(), v.clone());
        }
    }
    m.insert("node".into(), json!("off"));
    m.insert("shared_arena".into(), json!(true));
    // The consumer registers its own mapping with CUDA (it is the process
    // that copies to the GPU); the engine's would pin for nothing.
    m.insert("cuda_register".into(), json!("off"));
    Config::from_map(&m)
}

/// What the feeder and the session share for one consumer.
struct Feed {
    loader: Loader,
    rings: Rings,
    ready: OwnedFd,
    whole: Arc<Whole>,
    /// Batches handed out and not yet released, by number.
    held: Mutex<HashMap<u64, Held>>,
    stop: AtomicBool,
    /// The consumer read records (room in the ring) or released batches.
    room: (Mutex<()>, Condvar),
}

fn session(conn: OwnedFd, opts: &NodeOptions, base: &Config, whole: &Arc<Whole>, engine: &Engine) {
    let me = effective_uid();
    let peer = sock::peer(&conn);
    if !matches!(peer, Ok((uid, _)) if uid == me) {
        let why = match peer {
            Ok((uid, pid)) => format!(
                "node engine: process {pid} of user {uid} may not attach to the engine of user {me}"
            ),
            Err(e) => format!("node engine: the peer's credentials cannot be read ({e})"),
        };
        // The request is read first: closing a SOCK_SEQPACKET socket with a
        // message unread resets it, and the peer would never see why.
        if sock::poll(&[(&conn, true)], Some(Duration::from_secs(2))).is_ok() {
            let _ = sock::recv(&conn);
        }
        return refuse(&conn, Error::Node(String::new()).status(), &why);
    }
    let first = match sock::recv(&conn) {
        Ok(Some((msg, _))) => msg,
        _ => return,
    };
    let node_err = |e: Error| refuse(&conn, e.status(), &e.to_string());
    let attach: Value = match serde_json::from_slice(&first) {
        Ok(v) => v,
        Err(e) => return node_err(Error::Node(format!("not an attach request: {e}"))),
    };
    let version = attach.get("version").and_then(Value::as_str).unwrap_or("");
    if version != env!("CARGO_PKG_VERSION") {
        return node_err(Error::Node(format!(
            "the consumer's library is version {version:?}, the engine's {}: start the engine \
             from the same release",
            env!("CARGO_PKG_VERSION")
        )));
    }
    if attach.get("keep").is_some() || attach.get("release").is_some() {
        let reply = match hand_over(&attach, engine, whole) {
            Ok(v) => json!({ "ok": v }),
            Err(e) => json!({"error": {"status": e.status(), "message": e.to_string()}}),
        };
        let _ = sock::send(&conn, reply.to_string().as_bytes(), &[]);
        return;
    }
    let Some(cfg) = attach.get("config").and_then(Value::as_object) else {
        return node_err(Error::Node(
            "the attach request has no configuration".into(),
        ));
    };
    let opened = consumer_config(cfg, opts, base)
        .and_then(|c| Ok((c, engine.shards(base)?)))
        .and_then(|(c, ds)| Loader::open_in(c, &engine.pool, ds.shards.clone(), ds.net.as_ref()));
    let loader = match opened {
        Ok(l) => l,
        Err(e) => return node_err(e),
    };
    let made = (|| -> std::io::Result<_> {
        let (rings, rings_file) = Rings::create()?;
        let ready = sock::eventfd()?;
        let wake = sock::eventfd()?;
        let fd = loader
            .arena()
            .shared_fd()
            .ok_or_else(|| std::io::Error::other("the loader's arena is not in a memory file"))?;
        // Sealed (`engine_pool`): a consumer reopening this descriptor
        // through /proc with write access still cannot map it writable.
        let arena_ro = sock::reopen_read_only(fd)?;
        Ok((rings, rings_file, ready, wake, arena_ro))
    })();
    let (rings, rings_file, ready, wake, arena_ro) = match made {
        Ok(m) => m,
        Err(e) => return node_err(Error::Node(format!("setting up the transport: {e}"))),
    };
    let number = whole.sessions.fetch_add(1, Ordering::AcqRel) + 1;
    let reply = json!({"ok": {
        "session": number,
        "arena_len": loader.arena().len(),
        // The part of the arena in use unless more consumers attach than
        // expected: what a consumer registers with CUDA (pinning the rest
        // would allocate it).
        "budget_len": engine.pool.preferred_chunks() * engine.pool.chunk_size(),
        "state": loader.state().to_hex(),
        "pid": std::process::id(),
        "socket": opts.socket,
    }});
    let fds = [
        arena_ro.as_raw_fd(),
        rings_file.as_raw_fd(),
        ready.as_raw_fd(),
        wake.as_raw_fd(),
    ];
    if sock::send(&conn, reply.to_string().as_bytes(), &fds).is_err() {
        return;
    }
    drop((arena_ro, rings_file));
    let feed = Arc::new(Feed {
        loader,
        rings,
        ready,
        whole: whole.clone(),
        held: Mutex::new(HashMap::new()),
        stop: AtomicBool::new(false),
        room: (Mutex::new(()), Condvar::new()),
    });
    let feeder = {
        let feed = feed.clone();
        std::thread::Builder::new()
            .name("ringfeed-node-feed".into())
            .spawn(move || run_feed(&feed))
    };
    lock(&engine.feeds).insert(number, Arc::downgrade(&feed));
    whole.consumers.fetch_add(1, Ordering::AcqRel);
    whole.attached.fetch_add(1, Ordering::AcqRel);
    if let Ok(feeder) = feeder {
        control(&conn, &wake, &feed, engine);
        feed.stop.store(true, Ordering::Release);
        feed.room.1.notify_all();
        feed.loader.close();
        let _ = feeder.join();
    }
    // The consumer is gone: what it held comes back to the pool, but for
    // the batches kept for another process.
    lock(&engine.feeds).remove(&number);
    let mut held = lock(&feed.held);
    let mut freed = 0;
    for (id, h) in held.drain() {
        if h.receiver.is_some() {
            lock(&engine.orphans).insert((number, id), h);
        } else {
            freed += 1;
        }
    }
    whole.held.fetch_sub(freed, Ordering::AcqRel);
    drop(held);
    whole.consumers.fetch_sub(1, Ordering::AcqRel);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Pushes one record, waiting while the ring is full; `false` once stopped.
fn push(feed: &Feed, rec: &[u8]) -> bool {
    loop {
        if feed.rings.push_record(rec) {
            sock::notify(&feed.ready);
            return true;
        }
        if feed.stop.load(Ordering::Acquire) {
            return false;
        }
        let g = lock(&feed.room.0);
        let _ = feed.room.1.wait_timeout(g, Duration::from_millis(50));
    }
}

fn run_feed(feed: &Feed) {
    let arena = feed.loader.arena();
    let (base, len) = (arena.base().cast_const(), arena.len());
    let mut buf = Vec::new();
    let mut next_id = 1u64;
    loop {
        if feed.stop.load(Ordering::Acquire) {
            return;
        }
        let rec = match feed.loader.next(Some(Duration::from_millis(200))) {
            Ok(Next::Batch(b)) => {
                let id = next_id;
                next_id += 1;
                let state = feed.loader.state().to_hex();
                if let Err(e) = wire::encode_batch(&b, id, &state, base, len, &mut buf) {
                    let e = Error::Internal(e);
                    push(feed, &wire::encode_failed(e.status(), &e.to_string()));
                    return;
                }
                if buf.len() > feed.rings.max_record() {
                    let e = Error::Node(format!(
                        "a batch's descriptor takes {} bytes, over the ring's {}: lower \
                         `batch_size`",
                        buf.len(),
                        feed.rings.max_record()
                    ));
                    push(feed, &wire::encode_failed(e.status(), &e.to_string()));
                    return;
                }
                lock(&feed.held).insert(
                    id,
                    Held {
                        _batch: b,
                        receiver: None,
                        consumer_released: false,
                    },
                );
                feed.whole.first_out.store(true, Ordering::Release);
                feed.whole.held.fetch_add(1, Ordering::AcqRel);
                if !push(feed, &buf) {
                    return;
                }
                continue;
            }
            Ok(Next::EndOfEpoch(e)) => wire::encode_end_of_epoch(e, &feed.loader.state().to_hex()),
            Ok(Next::Timeout) => continue,
            Ok(Next::Finished) => {
                push(feed, &wire::encode_finished());
                return;
            }
            Err(Error::Closed) if feed.stop.load(Ordering::Acquire) => return,
            Err(e) => {
                push(feed, &wire::encode_failed(e.status(), &e.to_string()));
                return;
            }
        };
        if !push(feed, &rec) {
            return;
        }
    }
}

/// The session's loop: requests, releases, and the consumer's hang-up.
fn control(conn: &OwnedFd, wake: &OwnedFd, feed: &Feed, engine: &Engine) {
    let mut released = Vec::new();
    loop {
        let Ok(ready) = sock::poll(&[(conn, true), (wake, true)], None) else {
            return;
        };
        if ready[1].readable {
            sock::drain(wake);
            released.clear();
            if feed.rings.drain_releases(&mut released).is_err() {
                // A consumer that breaks the ring is treated as gone.
                return;
            }
            if !released.is_empty() {
                let mut held = lock(&feed.held);
                for id in &released {
                    match held.get_mut(id) {
                        // Kept for another process: freed when it releases.
                        Some(h) if h.receiver.is_some() => h.consumer_released = true,
                        Some(_) => {
                            held.remove(id);
                            feed.whole.held.fetch_sub(1, Ordering::AcqRel);
                        }
                        None => {}
                    }
                }
            }
            feed.room.1.notify_all();
        }
        if ready[0].readable {
            match sock::recv(conn) {
                Ok(Some((msg, _))) => {
                    let reply = answer(&msg, feed, engine);
                    if sock::send(conn, reply.to_string().as_bytes(), &[]).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        } else if ready[0].hangup {
            return;
        }
    }
}

/// Answers one request: `{"stats": true}` or `{"source": shard index}`.
fn answer(msg: &[u8], feed: &Feed, engine: &Engine) -> Value {
    let req: Value = serde_json::from_slice(msg).unwrap_or(Value::Null);
    if req.get("stats").is_some() {
        let s = feed.loader.stats();
        let counts = &s.counts;
        // SAFETY: Counts is repr(C) plain integers; its bytes are read.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (counts as *const crate::engine::Counts).cast::<u8>(),
                std::mem::size_of::<crate::engine::Counts>(),
            )
        };
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let w = &feed.whole;
        let kept = engine.kept();
        let node = json!({
            "pid": std::process::id(),
            "consumers": w.consumers.load(Ordering::Acquire),
            "consumers_attached": w.attached.load(Ordering::Acquire),
            "batches_held": w.held.load(Ordering::Acquire),
            "batches_held_by_this_consumer": lock(&feed.held).len(),
            "batches_kept": kept,
        });
        return json!({"stats": s, "counts": hex, "node": node});
    }
    if let Some(i) = req.get("source").and_then(Value::as_u64) {
        let name = feed.loader.shards().get(i as usize).map(|s| s.name.clone());
        return json!({ "source": name });
    }
    json!({"error": {"message": "unknown request"}})
}
