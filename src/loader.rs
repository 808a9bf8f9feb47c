//! The loader: owns the arena, the workers and the ring for one dataset, and
//! is what consumers call `next` on. It is `Sync`: several consumer threads
//! may call `next` at once, and `close` may come from any thread.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::arena::{Arena, ArenaOptions, ChunkPool};
use crate::batch::{Batch, BatchBuilder};
use crate::channel::{Channel, RecvError};
use crate::config::{Config, IoBackend, MAX_AUTO_WORKERS, Toggle};
use crate::dataset::{self, Shard};
use crate::error::{Error, Result};
use crate::io::threads::ThreadReader;
use crate::io::uring::{self, UringReader};
use crate::io::{BackendKind, NetOptions, Reader};
use crate::topology;
use crate::worker::Worker;

/// What the ring carries.
pub(crate) enum Item {
    Batch(Batch),
    EndOfEpoch(u64),
}

/// What `next` returns when it does not fail.
#[derive(Debug)]
pub enum Next {
    Batch(Batch),
    /// Every batch of this epoch was handed out.
    EndOfEpoch(u64),
    /// Nothing arrived before the time-out.
    Timeout,
    /// Every epoch is over; no batch will come.
    Finished,
}

/// Counters, all Relaxed: statistics read only for reporting.
#[derive(Default)]
pub(crate) struct Counters {
    pub bytes_read: AtomicU64,
    pub reads: AtomicU64,
    pub members: AtomicU64,
    pub members_skipped: AtomicU64,
    pub entries_skipped: AtomicU64,
    pub shards_done: AtomicU64,
    pub samples_dropped: AtomicU64,
    pub bytes_delivered: AtomicU64,
    pub samples_delivered: AtomicU64,
    pub batches_delivered: AtomicU64,
    pub consumer_wait_ns: AtomicU64,
    pub first_batch_ns: AtomicU64,
    pub epochs_done: AtomicU64,
}

struct EpochSync {
    epoch: u64,
    finished: usize,
    carry: Option<BatchBuilder>,
}

/// State shared by the loader and its workers.
pub(crate) struct Shared {
    pub cfg: Config,
    pub shards: Vec<Shard>,
    pub pool: Arc<ChunkPool>,
    pub channel: Channel<Item>,
    pub counters: Counters,
    pub next_shard: AtomicUsize,
    /// Bytes of front and back slack in each chunk (see `worker`).
    pub slack: usize,
    /// Bytes of a chunk that reads fill.
    pub data_len: usize,
    pub net: NetOptions,
    workers: usize,
    workers_alive: AtomicUsize,
    batch_index: AtomicU64,
    /// Batches handed to consumers so far: the next batch's `index`.
    delivered: AtomicU64,
    epoch: Mutex<EpochSync>,
    epoch_cv: Condvar,
    stop: AtomicBool,
    failure: Mutex<Option<Error>>,
    started: Instant,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        // Acquire: pairs with the Release store in `stop_all`.
        self.stop.load(Ordering::Acquire)
    }

    pub fn seal(&self, builder: &mut BatchBuilder, epoch: u64) -> Batch {
        // Relaxed: only needs distinct numbers.
        let index = self.batch_index.fetch_add(1, Ordering::Relaxed);
        builder.finish(&self.pool, epoch, index)
    }

    pub fn push(&self, item: Item) -> Result<()> {
        self.channel.push_wait(item).map_err(|_| Error::Closed)
    }

    /// A worker's shards for `epoch` are done: merge its short batch into the
    /// shared carry; the last worker seals the epoch, the others wait for it
    /// when `more` epochs follow.
    pub fn end_epoch(&self, mine: BatchBuilder, epoch: u64, more: bool) -> Result<()> {
        let mut s = self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        let bs = self.cfg.batch_size;
        let carry = s.carry.get_or_insert_with(|| BatchBuilder::new(bs));
        let mut full = Vec::new();
        carry.absorb(mine, |b| full.push(self.seal(b, epoch)));
        // Pushed under the lock so no batch of this epoch follows its marker.
        for b in full {
            self.push(Item::Batch(b))?;
        }
        s.finished += 1;
        if s.finished == self.workers {
            let mut carry = s.carry.take().unwrap_or_else(|| BatchBuilder::new(bs));
            if !carry.is_empty() {
                if self.cfg.drop_last {
                    self.counters
                        .samples_dropped
                        .fetch_add(carry.len() as u64, Ordering::Relaxed);
                } else {
                    let b = self.seal(&mut carry, epoch);
                    self.push(Item::Batch(b))?;
                }
            }
            drop(carry);
            self.push(Item::EndOfEpoch(epoch))?;
            self.counters.epochs_done.fetch_add(1, Ordering::Relaxed);
            s.finished = 0;
            s.epoch = epoch + 1;
            // Relaxed: ordered before the next epoch by this lock.
            self.next_shard.store(0, Ordering::Relaxed);
            self.epoch_cv.notify_all();
            return Ok(());
        }
        if !more {
            return Ok(());
        }
        self.pool.worker_running(false);
        while s.epoch == epoch && !self.stopping() {
            s = self.epoch_cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        self.pool.worker_running(true);
        if self.stopping() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn stop_all(&self) {
        // Release: pairs with the Acquire load in `stopping`.
        self.stop.store(true, Ordering::Release);
        self.pool.shut_down();
        self.channel.close();
        let _s = self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        self.epoch_cv.notify_all();
    }

    fn fail(&self, e: Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        drop(f);
        self.stop_all();
    }

    fn failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Fixed facts of a loader, decided at open.
#[derive(Debug, Clone)]
struct Setup {
    backend: BackendKind,
    uring_flags: &'static str,
    registered: bool,
    workers: usize,
    cpus: Vec<usize>,
    notes: Vec<String>,
}

/// A snapshot of a loader's counters and setup.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub bytes_delivered: u64,
    pub samples_delivered: u64,
    pub batches_delivered: u64,
    pub bytes_read: u64,
    /// Payload bytes the engine copied (members split across chunks).
    pub bytes_copied: u64,
    pub reads: u64,
    pub members: u64,
    /// Members whose name has no field part (no dot in the basename).
    pub members_skipped: u64,
    /// Tar entries that are not regular files.
    pub entries_skipped: u64,
    pub samples_dropped: u64,
    pub shards_total: u64,
    /// Shards walked to their end, counted over all epochs.
    pub shards_done: u64,
    pub epochs_done: u64,
    pub chunk_size: u64,
    pub chunk_count: u64,
    pub chunks_in_use: u64,
    pub chunks_peak: u64,
    pub arena_bytes: u64,
    pub memory_kind: &'static str,
    pub memory_locked: bool,
    pub buffers_registered: bool,
    pub io_backend: &'static str,
    pub io_uring_flags: &'static str,
    pub workers: usize,
    /// CPU of each worker; empty when not pinned.
    pub worker_cpus: Vec<usize>,
    pub consumer_wait_ns: u64,
    pub time_to_first_batch_ns: u64,
    pub elapsed_ns: u64,
    /// Network requests sent (ranged GETs and HEADs, retries included).
    pub http_requests: u64,
    /// Retries of network ranges, by failure kind.
    pub retries: std::collections::BTreeMap<&'static str, u64>,
    /// Why a preferred setting was not obtained (huge pages, mlock, io_uring...).
    pub notes: Vec<String>,
}

/// A running loader.
pub struct Loader {
    shared: Arc<Shared>,
    setup: Setup,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
}

/// Most buffers io_uring registers in one table (IORING_MAX_REG_BUFFERS).
const MAX_REGISTERED: usize = 1 << 14;

impl Loader {
    /// Opens a loader from a JSON configuration.
    pub fn open_json(json: &str) -> Result<Loader> {
        Loader::open(Config::from_json(json)?)
    }

    /// Resolves the dataset, sets up memory and I/O, and starts the workers.
    pub fn open(cfg: Config) -> Result<Loader> {
        let started = Instant::now();
        cfg.validate()?;
        let net = NetOptions::for_config(&cfg);
        let shards = dataset::resolve_config(&cfg, &net)?;
        if shards.is_empty() {
            return Err(Error::config("`urls` names no shard"));
        }
        let allowed = topology::allowed_cpus();
        let workers = match cfg.workers {
            0 => allowed
                .len()
                .clamp(1, MAX_AUTO_WORKERS)
                .min(shards.len().max(1)),
            n => n,
        };
        let chunk = cfg.chunk_size as usize;
        let budget = cfg.effective_budget(workers);
        let chunks = (budget / cfg.chunk_size) as usize;
        let need = 2 * workers + 2;
        if chunks < need {
            return Err(Error::config(format!(
                "`memory_budget` of {} bytes holds {chunks} chunks of {chunk} bytes; {workers} workers \
                 need at least {need}: raise `memory_budget`, lower `chunk_size` or `workers`",
                budget
            )));
        }
        // Slack of 1/16 chunk on each side: it absorbs the smaller piece of any
        // member up to 1/8 of a chunk (1 MiB at 8 MiB chunks) without a spill.
        let slack = (chunk / 16) & !4095;
        let data_len = chunk - 2 * slack;
        let arena = Arena::new(
            chunks * chunk,
            ArenaOptions {
                kind: cfg.memory_kind,
                lock: cfg.lock_memory.required(),
                prefault: true,
            },
        )?;
        let mut notes = arena.report().notes.clone();
        let pool = ChunkPool::new(arena, chunk);
        // Per worker: its first read and a spill run.
        pool.set_reserve(2 * workers);

        let (backend, uring_flags) = match cfg.io_backend {
            IoBackend::Threads => (BackendKind::Threads, ""),
            want => match uring::probe() {
                Ok(setup) => (BackendKind::IoUring, setup.flags),
                Err(e) if want == IoBackend::IoUring => {
                    return Err(Error::IoUring(format!(
                        "cannot set up a ring ({e}); `io_backend` is \"io_uring\": use \"auto\" or \"threads\""
                    )));
                }
                Err(e) => {
                    notes.push(format!("io_uring unavailable ({e}): thread backend"));
                    (BackendKind::Threads, "")
                }
            },
        };
        let iovecs: Vec<libc::iovec> = (0..pool.chunk_count())
            .map(|i| libc::iovec {
                // SAFETY: i < chunk_count, inside the arena.
                iov_base: unsafe { pool.arena().base().add(i * chunk) }.cast(),
                iov_len: chunk,
            })
            .collect();
        if backend == BackendKind::Threads && cfg.register_buffers == Toggle::On {
            return Err(Error::IoUring(
                "`register_buffers` is \"on\" but the thread backend runs (io_uring is off or unavailable); \
                 fixed buffers need io_uring: set it to \"auto\""
                    .into(),
            ));
        }
        let registered = backend == BackendKind::IoUring
            && register_probe(&iovecs, cfg.register_buffers, &net, &mut notes)?;

        let cpus = if cfg.pin_cpus {
            topology::worker_cpus(workers, &allowed)
        } else {
            Vec::new()
        };
        let shared = Arc::new(Shared {
            shards,
            pool,
            channel: Channel::new(cfg.prefetch_batches),
            counters: Counters::default(),
            next_shard: AtomicUsize::new(0),
            slack,
            data_len,
            net,
            workers,
            workers_alive: AtomicUsize::new(workers),
            batch_index: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            epoch: Mutex::new(EpochSync {
                epoch: 0,
                finished: 0,
                carry: None,
            }),
            epoch_cv: Condvar::new(),
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
            started,
            cfg,
        });

        let iovecs = Arc::new(Iovecs(iovecs));
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<Option<String>, Error>>();
        let mut threads = Vec::with_capacity(workers);
        for id in 0..workers {
            let worker_shared = Arc::clone(&shared);
            let cpu = cpus.get(id).copied();
            let ready = ready_tx.clone();
            let iovecs = Arc::clone(&iovecs);
            let spawned = std::thread::Builder::new()
                .name(format!("ringfeed-w{id}"))
                .spawn(move || {
                    worker_main(worker_shared, cpu, backend, registered, &iovecs, ready)
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    shared.stop_all();
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(Error::Memory(format!(
                        "cannot start worker thread {id}: {e}"
                    )));
                }
            }
        }
        drop(ready_tx);
        let mut startup_error = None;
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(Some(note))) => notes.push(note),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => startup_error = startup_error.or(Some(e)),
                Err(_) => {
                    startup_error = startup_error.or(Some(Error::Memory(
                        "a worker thread died while starting".into(),
                    )))
                }
            }
        }
        notes.sort();
        notes.dedup();
        let loader = Loader {
            shared,
            setup: Setup {
                backend,
                uring_flags,
                registered,
                workers,
                cpus,
                notes,
            },
            threads: Mutex::new(threads),
            closed: AtomicBool::new(false),
        };
        if let Some(e) = startup_error {
            loader.close();
            return Err(e);
        }
        Ok(loader)
    }

    /// The next batch, end of epoch, or time-out (`None`: wait for ever).
    pub fn next(&self, timeout: Option<Duration>) -> Result<Next> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let sh = &self.shared;
        let t0 = Instant::now();
        let got = sh.channel.pop_until(timeout.map(|t| t0 + t));
        let waited = t0.elapsed().as_nanos() as u64;
        let c = &sh.counters;
        c.consumer_wait_ns.fetch_add(waited, Ordering::Relaxed);
        match got {
            Ok(Item::Batch(mut b)) => {
                // Relaxed: distinct, increasing numbers in hand-out order.
                b.set_index(sh.delivered.fetch_add(1, Ordering::Relaxed));
                if c.batches_delivered.fetch_add(1, Ordering::Relaxed) == 0 {
                    let since = sh.started.elapsed().as_nanos() as u64;
                    c.first_batch_ns.store(since, Ordering::Relaxed);
                }
                c.samples_delivered
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                c.bytes_delivered.fetch_add(b.bytes(), Ordering::Relaxed);
                Ok(Next::Batch(b))
            }
            Ok(Item::EndOfEpoch(e)) => Ok(Next::EndOfEpoch(e)),
            Err(RecvError::Timeout) => Ok(Next::Timeout),
            Err(RecvError::Closed) => match sh.failure() {
                Some(e) => Err(e),
                None if self.closed.load(Ordering::Acquire) || sh.stopping() => Err(Error::Closed),
                None => Ok(Next::Finished),
            },
        }
    }

    /// Stops the workers and frees what the loader holds. Batches already
    /// handed out stay valid until dropped (they keep the arena alive).
    /// Idempotent; other threads blocked in `next` return `Error::Closed`.
    pub fn close(&self) {
        // AcqRel: the first closer does the work; later ones see it done.
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.stop_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        while self.shared.channel.try_pop().is_some() {}
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> Stats {
        let sh = &self.shared;
        let c = &sh.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let pool = &sh.pool;
        let usage = pool.usage();
        let report = pool.arena().report();
        Stats {
            bytes_delivered: r(&c.bytes_delivered),
            samples_delivered: r(&c.samples_delivered),
            batches_delivered: r(&c.batches_delivered),
            bytes_read: r(&c.bytes_read),
            bytes_copied: pool.copied(),
            reads: r(&c.reads),
            members: r(&c.members),
            members_skipped: r(&c.members_skipped),
            entries_skipped: r(&c.entries_skipped),
            samples_dropped: r(&c.samples_dropped),
            shards_total: sh.shards.len() as u64,
            shards_done: r(&c.shards_done),
            epochs_done: r(&c.epochs_done),
            chunk_size: pool.chunk_size() as u64,
            chunk_count: pool.chunk_count() as u64,
            chunks_in_use: usage.in_use as u64,
            chunks_peak: usage.peak as u64,
            arena_bytes: report.bytes as u64,
            memory_kind: report.kind.name(),
            memory_locked: report.locked,
            buffers_registered: self.setup.registered,
            io_backend: self.setup.backend.name(),
            io_uring_flags: self.setup.uring_flags,
            workers: self.setup.workers,
            worker_cpus: self.setup.cpus.clone(),
            consumer_wait_ns: r(&c.consumer_wait_ns),
            time_to_first_batch_ns: r(&c.first_batch_ns),
            elapsed_ns: sh.started.elapsed().as_nanos() as u64,
            http_requests: sh.net.stats.requests.load(Ordering::Relaxed),
            retries: sh.net.stats.retries_by_kind().into_iter().collect(),
            notes: self.setup.notes.clone(),
        }
    }

    /// Shards of the dataset, in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shared.shards
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.close();
    }
}

/// Registers the chunks on a probe ring to learn whether workers may; the
/// answer depends on RLIMIT_MEMLOCK / CAP_IPC_LOCK, not on the ring.
fn register_probe(
    iovecs: &[libc::iovec],
    want: Toggle,
    net: &NetOptions,
    notes: &mut Vec<String>,
) -> Result<bool> {
    if want == Toggle::Off {
        return Ok(false);
    }
    let why = if iovecs.len() > MAX_REGISTERED {
        format!(
            "{} chunks exceed io_uring's {MAX_REGISTERED} fixed buffers",
            iovecs.len()
        )
    } else {
        // SAFETY: the iovecs point into the arena, which outlives the probe reader.
        match unsafe { UringReader::new(8, Some(iovecs), net.clone(), 0) } {
            Ok(_) => return Ok(true),
            Err(e) => format!("register_buffers refused ({e})"),
        }
    };
    if want == Toggle::On {
        return Err(Error::IoUring(format!(
            "{why}; `register_buffers` is \"on\": raise `ulimit -l` or set it to \"auto\""
        )));
    }
    notes.push(format!("{why}: plain reads into unregistered chunks"));
    Ok(false)
}

/// The chunks as io_uring buffer descriptors.
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the iovecs only describe arena memory; they are read, never written,
// and the arena itself is Send + Sync.
unsafe impl Send for Iovecs {}
// SAFETY: as above.
unsafe impl Sync for Iovecs {}

fn worker_main(
    shared: Arc<Shared>,
    cpu: Option<usize>,
    backend: BackendKind,
    registered: bool,
    iovecs: &Iovecs,
    ready: mpsc::Sender<std::result::Result<Option<String>, Error>>,
) {
    let mut note = None;
    if let Some(cpu) = cpu
        && let Err(e) = topology::pin_current_thread(cpu)
    {
        note = Some(format!("pinning to CPU {cpu} failed ({e})"));
    }
    let entries = (shared.cfg.reads_in_flight * 2).next_power_of_two().max(8) as u32;
    // Jitter seeds differ per worker and per run.
    let seed = (std::process::id() as u64) << 32
        ^ cpu.unwrap_or(0) as u64
        ^ shared.started.elapsed().as_nanos() as u64;
    let mut reader: Box<dyn Reader> = match backend {
        BackendKind::Threads => Box::new(ThreadReader::new(shared.net.clone(), seed)),
        BackendKind::IoUring => {
            // SAFETY: the iovecs point into the arena, which `shared` keeps
            // alive for longer than this reader (dropped at the end of this fn).
            match unsafe {
                UringReader::new(
                    entries,
                    registered.then_some(&iovecs.0[..]),
                    shared.net.clone(),
                    seed,
                )
            } {
                Ok(r) => Box::new(r),
                Err(e) => {
                    let _ = ready.send(Err(Error::IoUring(format!(
                        "worker ring setup failed: {e}"
                    ))));
                    finish_worker(&shared);
                    return;
                }
            }
        }
    };
    let _ = ready.send(Ok(note));
    drop(ready);
    shared.pool.worker_running(true);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Worker::new(&shared, &mut *reader).run()
    }));
    shared.pool.worker_running(false);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(Error::Closed)) if shared.stopping() => {}
        Ok(Err(e)) => shared.fail(e),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            shared.fail(Error::Memory(format!(
                "internal error: a worker panicked: {msg}"
            )));
        }
    }
    drop(reader);
    finish_worker(&shared);
}

fn finish_worker(shared: &Shared) {
    // AcqRel: the last worker out closes the channel after all pushes.
    if shared.workers_alive.fetch_sub(1, Ordering::AcqRel) == 1 {
        shared.channel.close();
    }
}
