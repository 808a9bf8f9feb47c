//! What a loader's threads share: the configuration and shards, the chunk
//! pool, the queues (one per plan stream, from its worker to the sequencer,
//! and the ring to consumers), the counters, the plans per epoch, where the
//! consumer stands (for resume states), and the stop flag with the first
//! failure. Lower parts (the worker, the shuffler) take only what they need
//! from it; nothing here knows about threads or I/O backends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::cache::Spool;
use crate::config::Config;
use crate::dataset::{Shard, Source};
use crate::engine::counters::Counters;
use crate::error::{Error, Result};
use crate::fetch::direct::{ChunkLayout, DirectIo};
use crate::fetch::net_thread::NetLink;
use crate::fetch::{Answered, NetOptions};
use crate::memory::{Batch, BatchBuilder, ChunkPool, ShardNames};
use crate::net::inflight::{InFlight, Limit, Read};
use crate::plan::resume::{Round, Start};
use crate::plan::{ConsumerPlan, Delivered, PlanOptions, plan_epoch};
use crate::queue::Channel;
use crate::sync::Locked;

pub(crate) enum Item {
    Batch(Batch),
    /// A stream's short last batch of the epoch (stream queues only).
    Tail(BatchBuilder),
    EndOfEpoch(u64),
}

#[derive(Debug, Clone)]
pub(super) struct DeliveryProgress {
    pub(super) epoch: u64,
    pub(super) batches: u64,
    pub(super) samples: u64,
    pub(super) history: Vec<Round>,
}

pub(crate) struct Shared {
    pub cfg: Config,
    pub shards: Vec<Shard>,
    /// The shards' names, which each batch holds to name its samples' sources.
    pub(super) shard_names: ShardNames,
    pub pool: Arc<ChunkPool>,
    pub channel: Channel<Item>,
    /// One queue per stream, from its worker to the sequencer.
    pub(super) streams: Vec<Channel<Item>>,
    pub counters: Arc<Counters>,
    pub plan_opts: PlanOptions,
    /// Each shard's sample count, where known.
    pub(super) counts: Vec<Option<u64>>,
    pub start: Start,
    /// Samples of the start epoch delivered before an elastic resume.
    pub(super) base_delivered: Option<Delivered>,
    /// For a resume at the same layout with every count known: per stream
    /// and segment, the samples of the skipped batches, which workers pass
    /// on as placeholders without reading them (see `plan::replayed`).
    pub(super) replay: Option<Vec<Vec<Vec<u64>>>>,
    /// The image pipeline the sequencer runs on each batch (`transform`).
    pub(super) transform: Option<crate::engine::transform::Transformer>,
    pub(super) plans: Mutex<HashMap<u64, Arc<ConsumerPlan>>>,
    pub(super) fingerprint: u64,
    /// Bytes of front and back slack in each chunk (see `worker`).
    pub slack: usize,
    /// Bytes of a chunk that reads fill.
    pub data_len: usize,
    /// Whether local shards are opened with O_DIRECT, and which were.
    pub direct: DirectIo,
    /// The cache tier's writer, and through it the cache (`cache_dir`).
    pub cache: Option<Arc<Spool>>,
    /// The same for cache entries (`cache_direct`).
    pub cache_direct: DirectIo,
    pub net: NetOptions,
    /// The network threads' links (empty: workers receive their own HTTP
    /// ranges); worker `i` uses `net_links[i % len]`.
    pub(super) net_links: Vec<Arc<NetLink>>,
    /// The network threads are this loader's (not its node engine's).
    pub(super) own_net_links: bool,
    pub(super) batch_index: AtomicU64,
    /// Batches handed to consumers so far: the next batch's `index`.
    pub(super) delivered: AtomicU64,
    pub(super) progress: Mutex<DeliveryProgress>,
    pub(super) stop: AtomicBool,
    /// Stream 0's worker can give no first batch on its own (see
    /// `await_first_batch`).
    pub(super) lead_done: AtomicBool,
    /// Epochs below this one delivered their nominal length (see
    /// `plan::PlanOptions::nominal`): their workers read no further shards.
    pub(super) full_below: AtomicU64,
    pub(super) failure: Mutex<Option<Error>>,
    /// This loader's first owner number in the pool: 0 in its own pool,
    /// the one `ChunkPool::join` gave in a shared one (a node engine's).
    pub(super) owner_base: usize,
    pub(super) started: Instant,
    /// How many network reads the workers keep in flight.
    pub(super) reads: NetReads,
}

/// Whether most of a loader's arena faults in as reads first land in it
/// (`prefault_main` populates only a local dataset's default share of it):
/// a remote dataset's arena of the default size, which is sized for a far
/// store's reads in flight.
pub(crate) fn faults_in_on_reads(cfg: &Config, shards: &[Shard]) -> bool {
    cfg.memory_budget == 0 && shards.iter().all(|s| matches!(s.source, Source::Http(_)))
}

/// How long after a read found no chunk free memory still counts as what
/// limits the reads (`limited_by`): a few read times at S3's ~115 ms.
const SHORT_OF_MEMORY_FOR: u64 = 500_000_000;

/// How many network reads a loader's workers keep in flight: fixed by
/// `reads_in_flight`, or found as the reads go (auto, `crate::net::inflight`),
/// shared out evenly among the workers; and what holds it where it is.
pub(crate) struct NetReads {
    /// None: fixed at `fixed` per worker.
    auto: Option<Mutex<InFlight>>,
    fixed: usize,
    workers: usize,
    /// The most one worker keeps in flight.
    most: usize,
    /// The auto count's total, read at every read (Relaxed: a hint, no
    /// memory is read through it).
    total: AtomicUsize,
    /// When a worker last wanted a network read and found no chunk free,
    /// ns after `started` (0: never).
    short_of_memory: AtomicU64,
    started: Instant,
}

/// What the stats give of the reads in flight.
pub(crate) struct ReadsReport {
    pub total: usize,
    pub read_time_us: u64,
    pub first_byte_us: u64,
    pub bdp_bytes: u64,
    pub limit: &'static str,
}

impl NetReads {
    /// `quota`: the chunks a worker's stream holds at most, which bound
    /// an auto count ([`crate::config::ReadDepth::net_most`]).
    pub fn new(cfg: &Config, workers: usize, quota: usize, started: Instant) -> NetReads {
        let workers = workers.max(1);
        let depth = cfg.read_depth();
        let most = depth.net_most(quota);
        let auto = depth.net_fixed.is_none().then(|| {
            let max = most * workers;
            let target = (cfg.target_throughput > 0).then_some(cfg.target_throughput as f64);
            Mutex::new(InFlight::new(
                depth.net_start() * workers,
                workers,
                max,
                target,
            ))
        });
        let total = auto.as_ref().map_or(0, |a| a.locked().total());
        NetReads {
            auto,
            fixed: depth.net_fixed.unwrap_or(0),
            workers,
            most,
            total: AtomicUsize::new(total),
            short_of_memory: AtomicU64::new(0),
            started,
        }
    }

    /// The network reads one worker keeps in flight now.
    pub fn per_worker(&self) -> usize {
        match &self.auto {
            // Relaxed: see `total`.
            Some(_) => self.total.load(Ordering::Relaxed).div_ceil(self.workers),
            None => self.fixed,
        }
    }

    /// The most network reads one worker keeps in flight.
    pub fn most_per_worker(&self) -> usize {
        self.most
    }

    /// A network read of `bytes` asked for at `asked` has all its bytes;
    /// `timing`: its answer's times, when known; `fresh`: its chunk was
    /// used for the first time.
    pub fn completed(&self, asked: Instant, timing: Option<Answered>, bytes: usize, fresh: bool) {
        let Some(auto) = &self.auto else {
            return;
        };
        let now = self.started.elapsed().as_secs_f64();
        let read = Read {
            bytes: bytes as u64,
            secs: asked.elapsed().as_secs_f64(),
            first_byte: timing.map(|t| t.first_byte.as_secs_f64()),
            on_wire: timing.map(|t| t.last_byte.as_secs_f64()),
            paced: timing.and_then(|t| t.paced),
            fresh,
        };
        let mut a = auto.locked();
        if a.record(now, read) {
            // Relaxed: see `total`.
            self.total.store(a.total(), Ordering::Relaxed);
        }
    }

    /// A worker wanted another network read and no chunk was free.
    pub fn short_of_memory(&self) {
        let ns = (self.started.elapsed().as_nanos() as u64).max(1);
        // Relaxed: a report.
        self.short_of_memory.store(ns, Ordering::Relaxed);
    }

    /// What the stats say, with `ring_full` (the consumer is behind).
    pub fn report(&self, ring_full: bool) -> ReadsReport {
        let now = self.started.elapsed().as_nanos() as u64;
        // Relaxed: a report.
        let short = self.short_of_memory.load(Ordering::Relaxed);
        let memory = short != 0 && now.saturating_sub(short) < SHORT_OF_MEMORY_FOR;
        let (total, time, first, bdp, limit) = match &self.auto {
            Some(a) => {
                let a = a.locked();
                let limit = match a.limit() {
                    // Wanted more than the chunks allow.
                    Limit::Growing if memory => Limit::Memory.name(),
                    l => l.name(),
                };
                (a.total(), a.read_time(), a.first_byte(), a.bdp(), limit)
            }
            None => (
                self.fixed * self.workers,
                None,
                None,
                None,
                "reads_in_flight",
            ),
        };
        let limit = if ring_full {
            "consumer"
        } else if memory {
            "memory"
        } else {
            limit
        };
        ReadsReport {
            total,
            read_time_us: time.map_or(0, |t| (t * 1e6) as u64),
            first_byte_us: first.map_or(0, |t| (t * 1e6) as u64),
            bdp_bytes: bdp.map_or(0, |b| b as u64),
            limit,
        }
    }
}

impl Shared {
    pub fn stopping(&self) -> bool {
        // Acquire: pairs with the Release store in `stop_all`.
        self.stop.load(Ordering::Acquire)
    }

    /// Says `epoch` delivered its nominal length: what its workers read
    /// from now on would be left out.
    pub(super) fn epoch_full(&self, epoch: u64) {
        // Relaxed: a hint that spares reads; a worker that misses it reads
        // shards the sequencer then leaves out, which is correct.
        self.full_below.fetch_max(epoch + 1, Ordering::Relaxed);
    }

    /// Whether `epoch` delivered its nominal length already.
    pub(super) fn is_full(&self, epoch: u64) -> bool {
        // Relaxed: see `epoch_full`.
        epoch < self.full_below.load(Ordering::Relaxed)
    }

    /// The pool's owner number of `stream`'s chunks.
    pub fn owner(&self, stream: usize) -> usize {
        self.owner_base + stream
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

    /// Says that stream 0's worker can give no first batch on its own: its
    /// epoch ended short of one, its share of the chunks is used up, or the
    /// worker ended.
    pub fn lead_done(&self) {
        // Release: pairs with the Acquire in `await_first_batch`; it orders
        // only the start-up.
        self.lead_done.store(true, Ordering::Release);
    }

    /// Waits, at most `most`, until the first batch is handed out (or
    /// stream 0's worker can give none). A fresh start's first batch is
    /// stream 0's (the sequencer takes the streams in turn from 0), and on
    /// a busy machine the other workers' first reads (each faulting in and
    /// filling a chunk) took the CPU its read, the sequencer and the
    /// consumer needed: see docs/decisions.md. Polled: it lasts one batch,
    /// once per loader.
    pub fn await_first_batch(&self, most: std::time::Duration) {
        let t0 = Instant::now();
        // Relaxed (the counter): a start signal, nothing is read through
        // it. Acquire: pairs with the Release in `lead_done`.
        while self.counters.time_to_first_batch_ns.load(Ordering::Relaxed) == 0
            && !self.lead_done.load(Ordering::Acquire)
            && t0.elapsed() < most
            && !self.stopping()
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
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

    /// Where reads land in the chunks, for opening direct files.
    pub fn layout(&self) -> ChunkLayout {
        ChunkLayout {
            chunk: self.pool.chunk_size(),
            slack: self.slack,
            data_len: self.data_len,
        }
    }

    /// This consumer's plan of `epoch` (made once, shared by the workers and
    /// the sequencer).
    pub fn plan(&self, epoch: u64) -> Result<Arc<ConsumerPlan>> {
        let mut plans = self.plans.locked();
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

    /// Stops the workers and the sequencer; `next` returns Closed.
    pub(super) fn stop_all(&self) {
        self.halt();
        self.channel.close();
        // Each network thread finishes the reads it has (the workers drain
        // theirs), then exits; a node engine's go on for its other loaders.
        if self.own_net_links {
            for l in &self.net_links {
                l.stop();
            }
        }
    }

    /// Stops the workers. The sequencer still passes on the batches the
    /// stream queues hold (in order, up to the first stream that ran dry),
    /// then closes the ring: batches made before a failure are delivered
    /// before its error.
    pub(super) fn halt(&self) {
        // Release: pairs with the Acquire load in `stopping`.
        self.stop.store(true, Ordering::Release);
        if self.pool.is_shared() {
            // Other loaders go on with the pool: only this one's waits end.
            self.pool.close_owners(self.owner_base, self.streams.len());
        } else {
            self.pool.shut_down();
        }
        for q in &self.streams {
            q.close();
        }
    }

    pub(super) fn fail(&self, e: Error) {
        let mut f = self.failure.locked();
        if f.is_none() {
            *f = Some(e);
        }
        drop(f);
        self.halt();
    }

    pub(super) fn failure(&self) -> Option<Error> {
        self.failure.locked().clone()
    }
}
