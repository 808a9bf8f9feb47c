//! Start-up: resolves the dataset, makes the epoch plan's options and the
//! resume point (`planning.rs`), gathers the machine's facts and decides the
//! start (`start_plan.rs`), then carries the plan out: places the workers,
//! sets up the arena, the chunk pool, fixed buffers and the cache
//! (`setup.rs`), and starts the network, worker, sequencer and prefault
//! threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::cache::{Cache, Spool};
use crate::config::{Config, IoBackend, Toggle};
use crate::dataset::{self, Shard};
use crate::engine::counters::Counters;
use crate::engine::loader::{Loader, Setup};
use crate::engine::planning::{counts_or_nominal, plan_setup, worker_count};
use crate::engine::setup::{
    EngineNet, MIN_SHARE, batch_share, fixed_buffers, own_pool, place, register_cuda, remote_budget,
};
use crate::engine::shared::{DeliveryProgress, NetReads, Shared};
use crate::engine::start_plan::{CachePlan, EngineFacts, Facts, NetPlan, StartPlan};
use crate::engine::threads::{
    MakeReader, Readers, net_main, prefault_main, sequencer_main, worker_main,
};
use crate::error::{Error, Fault, Result};
use crate::fetch::NetOptions;
use crate::fetch::direct::DirectIo;
use crate::fetch::fixed::FixedBuffers;
use crate::fetch::net_thread::NetLink;
use crate::fetch::ring;
use crate::memory::ChunkPool;
use crate::queue::Channel;
use crate::topology::{self, Why};

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
        Loader::start(cfg, net, shards, started, None, None)
    }

    /// Opens a loader over `shards` (resolved, and counted where the plan
    /// needs it, once for every loader of a node engine) whose chunks come
    /// from `pool`, a pool that several loaders share (one per consumer):
    /// it joins the pool with one owner per stream and leaves it at close.
    /// Remote reads go to the engine's network threads (when it runs any
    /// and the loader runs io_uring), whose counters the stats then give.
    pub(crate) fn open_in(
        mut cfg: Config,
        pool: &Arc<ChunkPool>,
        shards: Vec<Shard>,
        engine_net: Option<&EngineNet>,
    ) -> Result<Loader> {
        let started = Instant::now();
        cfg.validate()?;
        if cfg.chunk_size == 0 {
            cfg.chunk_size = pool.chunk_size() as u64;
        }
        if pool.chunk_size() as u64 != cfg.chunk_size {
            return Err(Error::internal(
                Fault::Invariant,
                format!(
                    "a loader of {}-byte chunks cannot use a pool of {}-byte chunks",
                    cfg.chunk_size,
                    pool.chunk_size()
                ),
            ));
        }
        let net = match engine_net {
            Some(e) => e.net.clone(),
            None => NetOptions::for_config(&cfg),
        };
        let workers = worker_count(&cfg, &shards);
        // The engine's budget counts `workers` (or auto's most) streams
        // for each consumer: this loader's split that part.
        let want = batch_share(&cfg, &shards, cfg.chunk_size);
        let base = pool.join(workers, cfg.workers_or_auto(), MIN_SHARE, want)?;
        let opened = Loader::start(
            cfg,
            net,
            shards,
            started,
            None,
            Some(Joined {
                pool: Arc::clone(pool),
                base,
                net_links: engine_net.map(|e| e.links.clone()).unwrap_or_default(),
                spool: engine_net.and_then(|e| e.spool.clone()),
                fixed: engine_net.and_then(|e| e.fixed.clone()),
                fixed_note: engine_net.and_then(|e| e.fixed_note.clone()),
            }),
        );
        if opened.is_err() {
            pool.leave(base, workers);
        }
        opened
    }

    /// A loader over `shards` whose workers read through readers `make`
    /// gives (the engine's unit tests: scripted readers, no files or
    /// sockets). Stats report the thread backend.
    #[cfg(test)]
    pub(crate) fn open_with_readers(
        cfg: Config,
        shards: Vec<Shard>,
        make: MakeReader,
    ) -> Result<Loader> {
        cfg.validate()?;
        let net = NetOptions::for_config(&cfg);
        Loader::start(cfg, net, shards, Instant::now(), Some(make), None)
    }

    /// Sets up memory and I/O for `shards` and starts the threads; the
    /// chunks come from a pool of the loader's own, or from a shared pool
    /// the loader joined as owners `base..` (`shared_pool`).
    fn start(
        mut cfg: Config,
        net: NetOptions,
        shards: Vec<Shard>,
        started: Instant,
        make: Option<MakeReader>,
        joined: Option<Joined>,
    ) -> Result<Loader> {
        let topo = topology::discover();
        let allowed = topo.allowed();
        let probe = make.is_none() && cfg.io_backend != IoBackend::Threads;
        let facts = Facts {
            topo: &topo,
            allowed: &allowed,
            ring: probe.then(|| ring::probe().map(|s| s.flags).map_err(|e| e.to_string())),
            scripted: make.is_some(),
            remote_budget: remote_budget(),
            engine: joined.as_ref().map(|j| EngineFacts {
                streams: j.pool.live_owners().max(cfg.node_streams()),
                net_threads: j.net_links.len(),
                spool: j.spool.is_some(),
            }),
        };
        // What the configuration asks of the shards and the machine is
        // checked before the shards are counted (which may read over the
        // network).
        let workers = StartPlan::workers(&cfg, &shards, &facts)?;
        let mut shards = shards;
        // Scripted readers (the engine's unit tests) carry their counts.
        let nominal = match make {
            None => counts_or_nominal(&cfg, &mut shards, &net, workers)?,
            Some(_) => None,
        };
        let (plan_opts, counts, start, base_delivered, replay, fingerprint) =
            plan_setup(&cfg, &net, &shards, workers, nominal.as_ref())?;
        let plan = StartPlan::decide(&cfg, &shards, &facts)?;
        cfg.chunk_size = plan.chunk as u64;
        let chunk = plan.chunk;
        let mut placement_notes = plan.notes.clone();
        let (mut placement, mut claims) =
            place(&cfg, &topo, &allowed, workers, &mut placement_notes);
        if let Some(threads) = plan.unpin_for
            && placement.cpus.is_some()
        {
            claims.release();
            placement.cpus = None;
            placement.why = Why::TooMany {
                threads,
                cpus: allowed.len(),
            };
            placement_notes.push(format!(
                "workers not pinned: the node engine runs {threads} streams on {} usable CPUs",
                allowed.len()
            ));
        }
        let mut engine_fixed = None;
        let (pool, owner_base, engine_net, engine_spool, mut notes, cuda_later) = match joined {
            Some(j) => {
                let mut notes = j.pool.arena().report().notes.clone();
                notes.extend(placement_notes);
                notes.extend(j.fixed_note);
                engine_fixed = j.fixed;
                (j.pool, j.base, j.net_links, j.spool, notes, None)
            }
            None => {
                let (pool, notes, cuda_later) = own_pool(
                    &cfg,
                    plan.chunks,
                    workers,
                    placement.numa_node,
                    placement_notes,
                    plan.faults_in_on_reads,
                )?;
                (pool, 0, Vec::new(), None, notes, cuda_later)
            }
        };
        if let Some(n) = &nominal {
            notes.push(format!(
                "no sample counts for some shards: split by shard, a nominal epoch of {}",
                n.why
            ));
        }
        let fixed = match plan.fixed {
            Some(mode) => {
                let iovecs: Vec<libc::iovec> = (0..pool.chunk_count())
                    .map(|i| libc::iovec {
                        // SAFETY: i < chunk_count, inside the arena.
                        iov_base: unsafe { pool.arena().base().add(i * chunk) }.cast(),
                        iov_len: chunk,
                    })
                    .collect();
                fixed_buffers(iovecs, mode, workers + 1, &net, &mut notes)?
            }
            None => None,
        };
        let cpus = placement.cpus.clone().unwrap_or_default();
        let net_links = match plan.net {
            NetPlan::None => Vec::new(),
            NetPlan::Engine => engine_net,
            NetPlan::Own { count, .. } => (0..count)
                .map(|_| NetLink::new())
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| {
                    Error::IoUring(format!("cannot make a network thread's eventfd: {e}"))
                })?,
        };
        let direct = DirectIo::new(cfg.direct_io, plan.local_bytes);
        let cache = match plan.cache.clone() {
            CachePlan::None => None,
            CachePlan::Engine => engine_spool,
            CachePlan::Own(o) => Some(Arc::new(
                Spool::start(Arc::new(Cache::open(o)?), cfg.cache_fill).map_err(|e| {
                    Error::internal(Fault::Thread, format!("cannot start the cache writer: {e}"))
                })?,
            )),
        };
        let cache_direct = DirectIo::new(plan.cache_direct, 0);
        let reads = NetReads::new(&cfg, workers, pool.quota_of(owner_base), started);
        let transform_cpus = match cfg.pin_cpus {
            true => {
                topology::transform_cpus(&topo, &allowed, cfg.cpus.as_deref(), placement.numa_node)
            }
            false => None,
        };
        let transform = crate::engine::transform::Transformer::new(
            &cfg,
            transform_cpus,
            placement.numa_node,
            &|arena, notes| register_cuda(arena, &cfg, notes),
        )?;
        let shared = Arc::new(Shared {
            reads,
            shard_names: shards.iter().map(|s| s.name.as_str().into()).collect(),
            shards,
            pool,
            channel: Channel::new(cfg.prefetch_batches),
            streams: (0..workers)
                .map(|_| Channel::new(plan.per_stream))
                .collect(),
            counters: Arc::new(Counters::default()),
            plan_opts,
            counts,
            progress: Mutex::new(DeliveryProgress {
                epoch: start.epoch,
                batches: start.skip_batches,
                samples: start.skip_samples,
                history: start.history.clone(),
            }),
            start,
            base_delivered,
            replay,
            transform,
            plans: Mutex::new(HashMap::new()),
            fingerprint,
            slack: plan.slack,
            data_len: plan.data_len,
            direct,
            cache,
            cache_direct,
            net,
            net_links,
            own_net_links: plan.own_net_links,
            batch_index: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            lead_done: AtomicBool::new(false),
            full_below: AtomicU64::new(0),
            failure: Mutex::new(None),
            owner_base,
            started,
            cfg,
        });

        let readers = match make {
            Some(make) => Readers::Made(make),
            None => Readers::Backend {
                kind: plan.backend,
                fixed: fixed.clone(),
            },
        };
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<Option<String>, Error>>();
        let mut threads = Vec::with_capacity(workers + plan.net.threads() + 2);
        let (own_links, entries) = match plan.net {
            NetPlan::Own { ring_entries, .. } => (&shared.net_links[..], ring_entries),
            _ => (&[][..], 0),
        };
        for (id, link) in own_links.iter().enumerate() {
            let link = Arc::clone(link);
            let net_shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("ringfeed-net{id}"))
                .spawn(move || net_main(net_shared, link, id, entries));
            keep_started(spawned, &mut threads, &shared, || {
                format!("network thread {id}")
            })?;
        }
        for id in 0..workers {
            let worker_shared = Arc::clone(&shared);
            let cpu = cpus.get(id).copied();
            let ready = ready_tx.clone();
            let readers = readers.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ringfeed-w{id}"))
                .spawn(move || worker_main(worker_shared, id, cpu, readers, ready));
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
        // A shared pool's arena is its engine's to fault in; without fixed
        // buffers or CUDA to register there is nothing left for the thread.
        let prefault_work = !shared.pool.is_shared() || fixed.is_some() || cuda_later.is_some();
        if shared.cfg.register_buffers != Toggle::On && prefault_work {
            let pre_shared = Arc::clone(&shared);
            let pre_fixed = fixed.clone();
            let spawned = std::thread::Builder::new()
                .name("ringfeed-prefault".into())
                .spawn(move || prefault_main(pre_shared, pre_fixed, cuda_later));
            keep_started(spawned, &mut threads, &shared, || {
                "the prefault thread".into()
            })?;
        }
        let mut startup_error = None;
        for _ in 0..workers {
            match ready_rx.recv() {
                Ok(Ok(Some(note))) => notes.push(note),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => startup_error = startup_error.or(Some(e)),
                Err(_) => {
                    startup_error = startup_error.or(Some(Error::internal(
                        Fault::Thread,
                        "a worker thread died while starting",
                    )))
                }
            }
        }
        notes.sort();
        notes.dedup();
        // Each fallback goes to the log once per process.
        for n in &notes {
            crate::log::once(n, crate::log::note_level(n), || n.clone());
        }
        let loader = Loader {
            shared,
            setup: Setup {
                backend: plan.backend,
                uring_flags: plan.uring_flags,
                // A node engine's: what its I/O threads register, for the
                // stats (this loader's rings read nothing of their own).
                fixed: fixed.or(engine_fixed),
                workers,
                cpus,
                placement: placement.why.describe(),
                notes,
            },
            claims: Mutex::new(claims),
            threads: Mutex::new(threads),
            closed: AtomicBool::new(false),
        };
        if let Some(e) = startup_error {
            loader.close();
            return Err(e);
        }
        Ok(loader)
    }
}

/// What a loader of a node engine takes from the engine: its owners in
/// the shared pool, and the engine's network threads (none: its own).
struct Joined {
    pool: Arc<ChunkPool>,
    base: usize,
    net_links: Vec<Arc<NetLink>>,
    /// The engine's cache writer, when it caches.
    spool: Option<Arc<Spool>>,
    /// The budget's chunks its I/O threads register (for the stats), or
    /// why they do not.
    fixed: Option<Arc<FixedBuffers>>,
    fixed_note: Option<String>,
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
            Err(Error::internal(
                Fault::Thread,
                format!("cannot start {}: {e}", what()),
            ))
        }
    }
}
