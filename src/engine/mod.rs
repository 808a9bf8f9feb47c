//! The loader: owns the arena, the workers and the ring for one dataset, and
//! is what consumers call `next` on. It is `Sync`: several consumer threads
//! may call `next` at once, and `close` may come from any thread.
//!
//! Each worker reads one stream of the epoch plan (`crate::plan`) and pushes
//! its batches into its own queue; the sequencer thread takes them
//! round-robin (the plan's delivery order), merges the streams' short last
//! batches at the end of each epoch, skips what a resume state says was
//! delivered, and feeds the ring that `next` pops.

mod shuffler;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{AUTO_WORKERS, Config, IoBackend, Toggle};
use crate::dataset::{self, Shard};
use crate::error::{Error, Result};
use crate::fetch::threads::ThreadReader;
use crate::fetch::uring::{self, UringReader};
use crate::fetch::{BackendKind, NetOptions, Reader};
use crate::memory::{Arena, ArenaOptions, ChunkPool, NO_OWNER};
use crate::memory::{Batch, BatchBuilder, ShardNames};
use crate::plan::resume::{self, Round, Start, State};
use crate::plan::{ConsumerPlan, Delivered, Delivery, PlanOptions, plan_epoch};
use crate::queue::{Channel, RecvError};
use crate::topology;
use worker::Worker;

/// What the queues and the ring carry.
pub(crate) enum Item {
    Batch(Batch),
    /// A stream's short last batch of the epoch (stream queues only).
    Tail(BatchBuilder),
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
    pub samples_padded: AtomicU64,
    pub batches_skipped: AtomicU64,
    pub samples_skipped: AtomicU64,
    pub shuffle_copied: AtomicU64,
}

/// Where the consumer stands, for `state`.
#[derive(Debug, Clone)]
struct Progress {
    epoch: u64,
    batches: u64,
    samples: u64,
    history: Vec<Round>,
}

/// State shared by the loader and its workers.
pub(crate) struct Shared {
    pub cfg: Config,
    pub shards: Vec<Shard>,
    /// The shards' names, which each batch holds to name its samples' sources.
    shard_names: ShardNames,
    pub pool: Arc<ChunkPool>,
    pub channel: Channel<Item>,
    /// One queue per stream, from its worker to the sequencer.
    streams: Vec<Channel<Item>>,
    pub counters: Counters,
    pub plan_opts: PlanOptions,
    /// Each shard's sample count, where known.
    counts: Vec<Option<u64>>,
    pub start: Start,
    /// Samples of the start epoch delivered before an elastic resume.
    base_delivered: Option<Delivered>,
    /// For a resume at the same layout with every count known: per stream
    /// and segment, the samples of the skipped batches, which workers pass
    /// on as placeholders without reading them (see `plan::replayed`).
    replay: Option<Vec<Vec<Vec<u64>>>>,
    plans: Mutex<HashMap<u64, Arc<ConsumerPlan>>>,
    fingerprint: u64,
    /// Bytes of front and back slack in each chunk (see `worker`).
    pub slack: usize,
    /// Bytes of a chunk that reads fill.
    pub data_len: usize,
    pub net: NetOptions,
    batch_index: AtomicU64,
    /// Batches handed to consumers so far: the next batch's `index`.
    delivered: AtomicU64,
    progress: Mutex<Progress>,
    stop: AtomicBool,
    failure: Mutex<Option<Error>>,
    started: Instant,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        // Acquire: pairs with the Release store in `stop_all`.
        self.stop.load(Ordering::Acquire)
    }

    /// Seals a batch of `owner`'s chunks (`arena::NO_OWNER`: several).
    pub fn seal(&self, builder: &mut BatchBuilder, epoch: u64, owner: usize) -> Batch {
        // Relaxed: only needs distinct numbers.
        let index = self.batch_index.fetch_add(1, Ordering::Relaxed);
        builder.finish(&self.pool, &self.shard_names, epoch, index, owner)
    }

    pub fn push(&self, item: Item) -> Result<()> {
        let item = match item {
            Item::Batch(mut b) => {
                b.mark_out();
                Item::Batch(b)
            }
            other => other,
        };
        self.channel.push_wait(item).map_err(|_| Error::Closed)
    }

    /// True while the sequencer sleeps on `stream`'s empty queue (it is
    /// the queue's only reader): then a worker of that stream that cannot
    /// get a chunk holds up everything.
    pub fn awaited(&self, stream: usize) -> bool {
        self.streams[stream].sleepers() > 0
    }

    pub fn push_stream(&self, stream: usize, item: Item) -> Result<()> {
        self.streams[stream]
            .push_wait(item)
            .map_err(|_| Error::Closed)
    }

    /// The replayed samples of segment `seg` of `stream`, in `epoch`.
    pub fn replayed(&self, epoch: u64, stream: usize, seg: usize) -> Option<&[u64]> {
        if epoch != self.start.epoch {
            return None;
        }
        let r = self.replay.as_ref()?;
        Some(&r[stream][seg])
    }

    /// Each shard's sample count, where known.
    pub fn count(&self, shard: usize) -> Option<u64> {
        self.counts[shard]
    }

    /// This consumer's plan of `epoch` (made once, shared by the workers and
    /// the sequencer).
    pub fn plan(&self, epoch: u64) -> Result<Arc<ConsumerPlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plans.get(&epoch) {
            return Ok(Arc::clone(p));
        }
        let base = (epoch == self.start.epoch)
            .then_some(self.base_delivered.as_ref())
            .flatten();
        let p = Arc::new(plan_epoch(&self.plan_opts, &self.counts, epoch, base)?);
        // Plans are cheap to make again (pure); keep the last few epochs'.
        plans.retain(|&e, _| e.saturating_add(4) > epoch);
        plans.insert(epoch, Arc::clone(&p));
        Ok(p)
    }

    /// The sequencer: stream batches round-robin into the ring, epoch by
    /// epoch, as `crate::plan::order_of_plan` describes.
    fn sequence(&self) -> Result<()> {
        let bs = self.cfg.batch_size;
        let mut epoch = self.start.epoch;
        let mut skip = self.start.skip_batches;
        let mut skipped_samples = 0u64;
        while self.cfg.epochs == 0 || epoch < self.cfg.epochs {
            let plan = self.plan(epoch)?;
            let mut samples = 0u64;
            let mut deliver = |b: Batch, samples: &mut u64| -> Result<()> {
                *samples += b.len() as u64;
                if skip > 0 {
                    skip -= 1;
                    skipped_samples += b.len() as u64;
                    self.counters
                        .batches_skipped
                        .fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .samples_skipped
                        .fetch_add(b.len() as u64, Ordering::Relaxed);
                    if skip == 0 && skipped_samples != self.start.skip_samples {
                        return Err(Error::State(format!(
                            "the state says its {} batches held {} samples, but they hold {}: \
                             it was not saved by this dataset and configuration",
                            self.start.skip_batches, self.start.skip_samples, skipped_samples
                        )));
                    }
                    return Ok(());
                }
                if self.replay.is_some()
                    && epoch == self.start.epoch
                    && b.raw_samples().iter().any(|s| s.field_count == 0)
                {
                    return Err(Error::Internal(
                        "a replayed placeholder came after the resume point".into(),
                    ));
                }
                self.push(Item::Batch(b))
            };
            let mut order = Delivery::new(self.streams.len());
            let mut tails: Vec<Option<BatchBuilder>> =
                (0..self.streams.len()).map(|_| None).collect();
            while let Some(s) = order.next_stream() {
                match self.streams[s].pop_until(None) {
                    Ok(Item::Batch(b)) => deliver(b, &mut samples)?,
                    Ok(Item::Tail(t)) => {
                        tails[s] = Some(t);
                        order.ended(s);
                    }
                    Ok(Item::EndOfEpoch(_)) => {
                        return Err(Error::Internal(
                            "a worker sent an end-of-epoch marker".into(),
                        ));
                    }
                    Err(_) => return Err(Error::Closed),
                }
            }
            let mut carry = BatchBuilder::new(bs);
            let mut full = Vec::new();
            for t in tails.into_iter().flatten() {
                carry.absorb(t, |b| full.push(self.seal(b, epoch, NO_OWNER)));
            }
            for b in full {
                deliver(b, &mut samples)?;
            }
            if !carry.is_empty() {
                if self.cfg.drop_last {
                    samples += carry.len() as u64;
                    self.counters
                        .samples_dropped
                        .fetch_add(carry.len() as u64, Ordering::Relaxed);
                } else {
                    let b = self.seal(&mut carry, epoch, NO_OWNER);
                    deliver(b, &mut samples)?;
                }
            }
            if skip > 0 {
                return Err(Error::State(format!(
                    "the state is {} batches into epoch {epoch}, which has only {}",
                    self.start.skip_batches,
                    self.start.skip_batches - skip
                )));
            }
            if let Some(want) = plan.samples
                && want != samples
            {
                return Err(Error::Plan {
                    shard: "(epoch)".into(),
                    message: format!(
                        "epoch {epoch} gave {samples} samples where the plan expects {want}"
                    ),
                });
            }
            self.counters
                .samples_padded
                .fetch_add(plan.padded, Ordering::Relaxed);
            self.counters
                .samples_dropped
                .fetch_add(plan.dropped, Ordering::Relaxed);
            self.push(Item::EndOfEpoch(epoch))?;
            self.counters.epochs_done.fetch_add(1, Ordering::Relaxed);
            epoch += 1;
        }
        Ok(())
    }

    /// Stops the workers and the sequencer; `next` returns Closed.
    fn stop_all(&self) {
        self.halt();
        self.channel.close();
    }

    /// Stops the workers. The sequencer still passes on the batches the
    /// stream queues hold (in order, up to the first stream that ran dry),
    /// then closes the ring: batches made before a failure are delivered
    /// before its error.
    fn halt(&self) {
        // Release: pairs with the Acquire load in `stopping`.
        self.stop.store(true, Ordering::Release);
        self.pool.shut_down();
        for q in &self.streams {
            q.close();
        }
    }

    fn fail(&self, e: Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        drop(f);
        self.halt();
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
    /// Samples delivered a second time to even out an epoch (`remainder: pad`).
    pub samples_padded: u64,
    /// Batches (and samples) replayed and not handed out, to resume a state.
    pub batches_skipped: u64,
    pub samples_skipped: u64,
    /// Payload bytes the shuffle buffers copied out of sparse chunks (also
    /// counted in `bytes_copied`).
    pub shuffle_copied: u64,
    /// The layout: consumers (ranks × loader workers) and this one's index.
    pub consumers: u64,
    pub consumer: u64,
    /// The epoch `next` is in (the state's epoch).
    pub epoch: u64,
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
            0 => AUTO_WORKERS.min(shards.len()),
            n => n,
        };
        let (plan_opts, counts, start, base_delivered, replay, fingerprint) =
            plan_setup(&cfg, &shards, workers)?;
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
                shared: cfg.shared_arena,
            },
        )?;
        let mut notes = arena.report().notes.clone();
        let pool = ChunkPool::new(arena, chunk);
        // Per worker: its first read and a spill run.
        pool.set_reserve(2 * workers);
        // Each worker (plan stream) its share, so none waits on another's.
        pool.set_owners(workers, chunks / workers);

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
            // The engines of one rank's loader workers (each a process)
            // start at different CPUs instead of all at the first.
            topology::worker_cpus(
                workers,
                (cfg.loader_worker as usize).wrapping_mul(workers),
                &allowed,
            )
        } else {
            Vec::new()
        };
        // A stream's queue holds `prefetch_batches` too: the sequencer takes
        // the streams in turn, so each needs room to run ahead while
        // another is behind (descheduled, or at a shard boundary). With a
        // queue of 2 per stream, 4 workers on 2 cores delivered 6.3-6.5
        // GB/s of page-cache shards; with 8, 7.4-7.9 (dev machine). What the
        // queues hold counts against each worker's chunk quota.
        let per_stream = cfg.prefetch_batches.max(2);
        let shared = Arc::new(Shared {
            shard_names: shards.iter().map(|s| s.name.as_str().into()).collect(),
            shards,
            pool,
            channel: Channel::new(cfg.prefetch_batches),
            streams: (0..workers).map(|_| Channel::new(per_stream)).collect(),
            counters: Counters::default(),
            plan_opts,
            counts,
            progress: Mutex::new(Progress {
                epoch: start.epoch,
                batches: start.skip_batches,
                samples: start.skip_samples,
                history: start.history.clone(),
            }),
            start,
            base_delivered,
            replay,
            plans: Mutex::new(HashMap::new()),
            fingerprint,
            slack,
            data_len,
            net,
            batch_index: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
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
                    worker_main(worker_shared, id, cpu, backend, registered, &iovecs, ready)
                });
            keep_started(spawned, &mut threads, &shared, || {
                format!("worker thread {id}")
            })?;
        }
        drop(ready_tx);
        let seq_shared = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("ringfeed-seq".into())
            .spawn(move || sequencer_main(seq_shared));
        keep_started(spawned, &mut threads, &shared, || {
            "the sequencer thread".into()
        })?;
        let mut startup_error = None;
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(Some(note))) => notes.push(note),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => startup_error = startup_error.or(Some(e)),
                Err(_) => {
                    startup_error = startup_error.or(Some(Error::Internal(
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
                {
                    let mut p = sh.progress.lock().unwrap_or_else(|p| p.into_inner());
                    if b.epoch() > p.epoch {
                        // Another consumer thread has not recorded the end
                        // marker yet.
                        *p = Progress {
                            epoch: b.epoch(),
                            batches: 0,
                            samples: 0,
                            history: Vec::new(),
                        };
                    }
                    p.batches += 1;
                    p.samples += b.len() as u64;
                }
                if c.batches_delivered.fetch_add(1, Ordering::Relaxed) == 0 {
                    let since = sh.started.elapsed().as_nanos() as u64;
                    c.first_batch_ns.store(since, Ordering::Relaxed);
                }
                c.samples_delivered
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                c.bytes_delivered.fetch_add(b.bytes(), Ordering::Relaxed);
                Ok(Next::Batch(b))
            }
            Ok(Item::EndOfEpoch(e)) => {
                let mut p = sh.progress.lock().unwrap_or_else(|p| p.into_inner());
                if p.epoch <= e {
                    *p = Progress {
                        epoch: e + 1,
                        batches: 0,
                        samples: 0,
                        history: Vec::new(),
                    };
                }
                Ok(Next::EndOfEpoch(e))
            }
            Ok(Item::Tail(_)) => Err(Error::Internal("a stream's tail reached the ring".into())),
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
        for q in &self.shared.streams {
            while q.try_pop().is_some() {}
        }
    }

    /// The resume state after the batches handed out so far: give it back as
    /// `resume` (hex) to continue from here. See `crate::plan::resume` for the rule.
    pub fn state(&self) -> State {
        let sh = &self.shared;
        let p = sh
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        State {
            fingerprint: sh.fingerprint,
            epoch: p.epoch,
            consumers: sh.plan_opts.consumers,
            consumer: sh.plan_opts.consumer,
            streams: sh.plan_opts.streams as u64,
            batches: p.batches,
            samples: p.samples,
            history: p.history,
        }
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
            samples_padded: r(&c.samples_padded),
            batches_skipped: r(&c.batches_skipped),
            samples_skipped: r(&c.samples_skipped),
            shuffle_copied: r(&c.shuffle_copied),
            consumers: sh.plan_opts.consumers,
            consumer: sh.plan_opts.consumer,
            epoch: sh.progress.lock().unwrap_or_else(|p| p.into_inner()).epoch,
        }
    }

    /// The memory every batch's bytes live in.
    pub fn arena(&self) -> &Arena {
        self.shared.pool.arena()
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

/// Keeps a started thread, or stops and joins those started before and
/// names the one that failed.
fn keep_started(
    spawned: std::io::Result<JoinHandle<()>>,
    threads: &mut Vec<JoinHandle<()>>,
    shared: &Shared,
    what: impl FnOnce() -> String,
) -> Result<()> {
    match spawned {
        Ok(t) => {
            threads.push(t);
            Ok(())
        }
        Err(e) => {
            shared.stop_all();
            for t in threads.drain(..) {
                let _ = t.join();
            }
            Err(Error::Internal(format!("cannot start {}: {e}", what())))
        }
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
    stream: usize,
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
                    return;
                }
            }
        }
    };
    let _ = ready.send(Ok(note));
    drop(ready);
    shared.pool.worker_running(true);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Worker::new(&shared, &mut *reader, stream).run()
    }));
    shared.pool.worker_running(false);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(Error::Closed)) if shared.stopping() => {}
        Ok(Err(e)) => shared.fail(e),
        Err(panic) => {
            shared.fail(Error::Internal(format!(
                "a worker panicked: {}",
                panic_message(&*panic)
            )));
        }
    }
    drop(reader);
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

fn sequencer_main(shared: Arc<Shared>) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shared.sequence()));
    match result {
        // Every epoch went out: `next` returns Finished once the ring is empty.
        Ok(Ok(())) => {}
        // Stopped by close or by a worker's failure (already recorded).
        Ok(Err(Error::Closed)) if shared.stopping() => {}
        Ok(Err(e)) => shared.fail(e),
        Err(panic) => shared.fail(Error::Internal(format!(
            "the sequencer panicked: {}",
            panic_message(&*panic)
        ))),
    }
    shared.channel.close();
}

type Replay = Vec<Vec<Vec<u64>>>;
type PlanSetup = (
    PlanOptions,
    Vec<Option<u64>>,
    Start,
    Option<Delivered>,
    Option<Replay>,
    u64,
);

/// The plan's options, each shard's count where known (local shards are
/// counted from their headers when the plan needs counts), where to start
/// (from the resume states), and the dataset's fingerprint.
fn plan_setup(cfg: &Config, shards: &[Shard], workers: usize) -> Result<PlanSetup> {
    let opts = cfg.plan_options(workers);
    let ids: Vec<(&str, u64)> = shards.iter().map(|s| (s.name.as_str(), s.size)).collect();
    let fingerprint = resume::fingerprint(&ids, &opts);
    let states = cfg
        .resume
        .iter()
        .map(|h| State::from_hex(h))
        .collect::<Result<Vec<_>>>()?;
    let mut start = resume::start_from(&states, fingerprint, &opts)?;
    if states.is_empty() {
        start.epoch = cfg.epoch;
    }
    let mut counts: Vec<Option<u64>> = shards.iter().map(|s| s.samples).collect();
    if opts.needs_counts() || start.needs_counts() || start.skip_batches > 0 {
        for (c, s) in counts.iter_mut().zip(shards) {
            if c.is_none()
                && let crate::dataset::Source::File(path) = &s.source
            {
                *c = Some(crate::tar::count_file_samples(path)?);
            }
        }
    }
    let base = if start.needs_counts() {
        let known: Option<Vec<u64>> = counts.iter().copied().collect();
        match known {
            Some(k) => start.delivered(&opts, &k)?,
            None => {
                let missing = counts.iter().filter(|c| c.is_none()).count();
                return Err(Error::config(format!(
                    "resuming on another layout needs every shard's sample count and {missing} \
                     of {} shards have none: list them in a manifest with their counts \
                     (`ringfeed index URL... -o set.manifest`)",
                    counts.len()
                )));
            }
        }
    } else {
        None
    };
    // Surface plan errors (missing counts, bad layout) at open.
    let plan = plan_epoch(&opts, &counts, start.epoch, base.as_ref())?;
    // A resume with every count known replays the cut's batches without
    // reading them; with unknown counts it reads and skips them.
    let known: Option<Vec<u64>> = counts.iter().copied().collect();
    let replay = match known {
        Some(k) if start.skip_batches > 0 => {
            Some(crate::plan::replayed(&opts, &k, &plan, start.skip_batches))
        }
        _ => None,
    };
    Ok((opts, counts, start, base, replay, fingerprint))
}
