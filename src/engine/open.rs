//! Start-up: resolves the dataset, makes the epoch plan's options and the
//! resume point, sets up the arena and the chunk pool, probes io_uring and
//! fixed buffers, and starts the worker and sequencer threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::cache::{Cache, Spool};
use crate::config::{AUTO_WORKERS, Config, IoBackend, Toggle};
use crate::dataset::Source;
use crate::dataset::{self, Shard};
use crate::engine::counters::Counters;
use crate::engine::loader::{Loader, Setup};
use crate::engine::shared::{Progress, Shared};
use crate::engine::threads::{
    MakeReader, Readers, net_main, prefault_main, sequencer_main, worker_main,
};
use crate::error::{Error, Result};
use crate::fetch::direct::DirectIo;
use crate::fetch::net_thread::NetLink;
use crate::fetch::uring::{self, FixedBuffers, UringReader};
use crate::fetch::{BackendKind, NetOptions};
use crate::memory::{Arena, ArenaOptions, ChunkPool, cuda};
use crate::plan::resume::{self, Start, State};
use crate::plan::{Delivered, PlanOptions, plan_epoch};
use crate::queue::Channel;
use crate::topology::{self, Claims, ClaimsDir, Placement, Request, Topology, Why};

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
        Loader::start(cfg, net, shards, started, None, None)
    }

    /// Opens a loader over `shards` (resolved, and counted where the plan
    /// needs it, once for every loader of a node engine) whose chunks come
    /// from `pool`, a pool that several loaders share (one per consumer):
    /// it joins the pool with one owner per stream and leaves it at close.
    /// Remote reads go to the engine's network threads (when it runs any
    /// and the loader runs io_uring), whose counters the stats then give.
    pub(crate) fn open_in(
        cfg: Config,
        pool: &Arc<ChunkPool>,
        shards: Vec<Shard>,
        engine_net: Option<&EngineNet>,
    ) -> Result<Loader> {
        let started = Instant::now();
        cfg.validate()?;
        if pool.chunk_size() as u64 != cfg.chunk_size {
            return Err(Error::Internal(format!(
                "a loader of {}-byte chunks cannot use a pool of {}-byte chunks",
                cfg.chunk_size,
                pool.chunk_size()
            )));
        }
        let net = match engine_net {
            Some(e) => e.net.clone(),
            None => NetOptions::for_config(&cfg),
        };
        let workers = worker_count(&cfg, &shards);
        let base = pool.join(workers, MIN_SHARE)?;
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
        cfg: Config,
        net: NetOptions,
        shards: Vec<Shard>,
        started: Instant,
        make: Option<MakeReader>,
        joined: Option<Joined>,
    ) -> Result<Loader> {
        if shards.is_empty() {
            return Err(Error::config("`urls` names no shard"));
        }
        let topo = topology::discover();
        let allowed = topo.allowed();
        check_placement_keys(&cfg, &topo, &allowed)?;
        let workers = worker_count(&cfg, &shards);
        let mut shards = shards;
        if make.is_none() {
            learn_cached_counts(&cfg, &mut shards, &net, workers)?;
        }
        let (plan_opts, counts, start, base_delivered, replay, fingerprint) =
            plan_setup(&cfg, &net, &shards, workers)?;
        let chunk = cfg.chunk_size as usize;
        let budget = cfg.effective_budget(workers);
        let chunks = (budget / cfg.chunk_size) as usize;
        let need = 2 * workers + 2;
        if chunks < need && joined.is_none() {
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
        let mut placement_notes = Vec::new();
        let (mut placement, mut claims) =
            place(&cfg, &topo, &allowed, workers, &mut placement_notes);
        // The loaders of a node engine run side by side: once their streams
        // outnumber the usable CPUs, pinned workers would queue on theirs
        // while another CPU idles (measured: 4 one-stream consumers on 2
        // CPUs, 10.9 GB/s pinned, 12.5 unpinned).
        let engine_streams = joined
            .as_ref()
            .map(|j| j.pool.live_owners().max(cfg.node_streams()));
        if let Some(threads) = engine_streams
            && cfg.cpus.is_none()
            && placement.cpus.is_some()
            && threads > allowed.len()
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
        let (pool, owner_base, engine_net, engine_spool, mut notes, cuda_later) = match joined {
            Some(j) => {
                let mut notes = j.pool.arena().report().notes.clone();
                notes.extend(placement_notes);
                (j.pool, j.base, j.net_links, j.spool, notes, None)
            }
            None => {
                let (pool, notes, cuda_later) =
                    own_pool(&cfg, chunks, workers, placement.numa_node, placement_notes)?;
                (pool, 0, Vec::new(), None, notes, cuda_later)
            }
        };
        let (backend, uring_flags) = match cfg.io_backend {
            _ if make.is_some() => (BackendKind::Threads, ""),
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
        // Registering pins every page of the arena: a node engine's file is
        // 4 times its budget, the part past it meant to take no memory
        // until more consumers attach than expected (measured: registering
        // it all took 1280 MiB for a 320 MiB budget).
        let shared_auto = pool.is_shared() && cfg.register_buffers == Toggle::Auto;
        if shared_auto && backend == BackendKind::IoUring && make.is_none() {
            notes.push(
                "fixed buffers not registered: the node engine's arena is shared, and registering \
                 would pin all of it"
                    .into(),
            );
        }
        let fixed = match make.is_none() && backend == BackendKind::IoUring && !shared_auto {
            true => fixed_buffers(iovecs, cfg.register_buffers, workers + 1, &net, &mut notes)?,
            false => None,
        };

        let cpus = placement.cpus.clone().unwrap_or_default();
        // Network threads receive the workers' HTTP ranges (io_uring only;
        // the thread backend receives on each worker).
        // A node engine's I/O threads take every read, local files too: the
        // engine's one set of I/O threads for all its consumers.
        let remote = shards.iter().any(|s| matches!(s.source, Source::Http(_)));
        let own_net_links = engine_net.is_empty();
        let receives =
            (remote || !own_net_links) && backend == BackendKind::IoUring && make.is_none();
        let net_threads = match cfg.net_threads {
            _ if !receives => 0,
            _ if !own_net_links => engine_net.len(),
            0 => (allowed.len() / 2).clamp(1, workers),
            n => n.min(workers),
        };
        let net_links = match own_net_links {
            _ if !receives => Vec::new(),
            false => engine_net,
            true => (0..net_threads)
                .map(|_| NetLink::new())
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| {
                    Error::IoUring(format!("cannot make a network thread's eventfd: {e}"))
                })?,
        };
        // A stream's queue holds `prefetch_batches` too: the sequencer takes
        // the streams in turn, so each needs room to run ahead while
        // another is behind (descheduled, or at a shard boundary). With a
        // queue of 2 per stream, 4 workers on 2 cores delivered 6.3-6.5
        // GB/s of page-cache shards; with 8, 7.4-7.9 (dev machine). What the
        // queues hold counts against each worker's chunk quota.
        let per_stream = cfg.prefetch_batches.max(2);
        let local_bytes = shards
            .iter()
            .filter(|s| matches!(s.source, dataset::Source::File(_)))
            .filter_map(|s| s.size)
            .sum();
        let direct = DirectIo::new(cfg.direct_io, local_bytes);
        let cache = match cfg.cache_options() {
            Some(_) if !remote => None,
            // Hits are checked a read at a time, in whole checksum blocks.
            Some(o) if data_len % crate::cache::entry::BLOCK != 0 => {
                notes.push(format!(
                    "cache {} not used: reads of {data_len} bytes (`chunk_size` {chunk}) are not \
                     whole {}-byte checksum blocks; use a chunk_size of a multiple of 1 MiB",
                    o.dir.display(),
                    crate::cache::entry::BLOCK
                ));
                None
            }
            // A node engine's one writer, for all its consumers.
            Some(_) if engine_spool.is_some() => engine_spool,
            Some(o) => Some(Arc::new(
                Spool::start(Arc::new(Cache::open(o)), cfg.cache_fill)
                    .map_err(|e| Error::Internal(format!("cannot start the cache writer: {e}")))?,
            )),
            None => None,
        };
        // Auto reads entries direct: a cache holds what the page cache
        // does not keep.
        let cache_direct = DirectIo::new(
            match cfg.cache_direct {
                Toggle::Off => Toggle::Off,
                _ => Toggle::On,
            },
            0,
        );
        let shared = Arc::new(Shared {
            shard_names: shards.iter().map(|s| s.name.as_str().into()).collect(),
            shards,
            pool,
            channel: Channel::new(cfg.prefetch_batches),
            streams: (0..workers).map(|_| Channel::new(per_stream)).collect(),
            counters: Arc::new(Counters::default()),
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
            direct,
            cache,
            cache_direct,
            net,
            net_links,
            own_net_links,
            batch_index: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            lead_done: AtomicBool::new(false),
            failure: Mutex::new(None),
            owner_base,
            started,
            cfg,
        });

        let readers = match make {
            Some(make) => Readers::Made(make),
            None => Readers::Backend {
                kind: backend,
                fixed: fixed.clone(),
            },
        };
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<Option<String>, Error>>();
        let mut threads = Vec::with_capacity(workers + net_threads + 2);
        let own_links = if shared.own_net_links {
            &shared.net_links[..]
        } else {
            &[]
        };
        for (id, link) in own_links.iter().enumerate() {
            let link = Arc::clone(link);
            let net_shared = Arc::clone(&shared);
            // Each serves its workers' reads in flight: two entries each
            // (the step and its time-out), and its own wake-up.
            let served = workers.div_ceil(net_threads);
            let entries = (served * shared.cfg.reads_in_flight * 2 + 2).next_power_of_two() as u32;
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
                    startup_error = startup_error.or(Some(Error::Internal(
                        "a worker thread died while starting".into(),
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
                backend,
                uring_flags,
                fixed,
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
}

/// A node engine's network threads and the options (with the request
/// and retry counters) they run with.
pub(crate) struct EngineNet {
    pub net: NetOptions,
    pub links: Vec<Arc<NetLink>>,
    /// The cache's writer, one for every consumer (`cache_dir` with remote
    /// shards).
    pub spool: Option<Arc<Spool>>,
}

impl Drop for EngineNet {
    fn drop(&mut self) {
        for l in &self.links {
            l.stop();
        }
    }
}

/// The parts a node engine runs for all its loaders: its I/O threads, which
/// take every read of every consumer's streams (local files and HTTP
/// ranges) — with io_uring, `net_threads` of them (auto: one per usable
/// CPU), each sized for its share of the streams the engine expects; none
/// on the thread backend, where each stream reads on its own thread — and
/// its cache writer.
pub(crate) fn engine_net_threads(cfg: &Config, shards: &[Shard]) -> Result<Option<EngineNet>> {
    let remote = shards.iter().any(|s| matches!(s.source, Source::Http(_)));
    let spool = match cfg.cache_options() {
        Some(o) if remote => Some(Arc::new(
            Spool::start(Arc::new(Cache::open(o)), cfg.cache_fill)
                .map_err(|e| Error::Internal(format!("cannot start the cache writer: {e}")))?,
        )),
        _ => None,
    };
    if cfg.io_backend == IoBackend::Threads || uring::probe().is_err() {
        // No I/O threads: each stream reads on its own thread; the cache
        // writer is still the engine's one.
        let net = NetOptions::for_config(cfg);
        return Ok(Some(EngineNet {
            net,
            links: Vec::new(),
            spool,
        }));
    }
    // Auto: one per usable CPU, at most one per stream the engine expects.
    // They carry the kernel's copies of every read, local files included,
    // which one thread on a 2-CPU machine could not keep up with: 4
    // one-stream consumers of page-cache shards took 4.1 GB/s through one,
    // 6.1 through two, as many with four (`benches/node_share.py`,
    // `NODE_CONFIG='{"net_threads": N}'`).
    let streams = cfg.node_streams().max(1);
    let n = match cfg.net_threads {
        0 => topology::discover().allowed().len().clamp(1, streams),
        n => n,
    };
    let entries = (streams.div_ceil(n) * cfg.reads_in_flight * 2 + 2)
        .next_power_of_two()
        .min(1 << 15) as u32;
    let net = NetOptions::for_config(cfg);
    let mut links: Vec<Arc<NetLink>> = Vec::with_capacity(n);
    for id in 0..n {
        let link = NetLink::new()
            .map_err(|e| Error::IoUring(format!("cannot make a network thread's eventfd: {e}")))?;
        let (l, opts) = (Arc::clone(&link), net.clone());
        let seed = (std::process::id() as u64) << 32 ^ (id as u64) << 16 ^ 0x6e6f6465;
        let spawned = std::thread::Builder::new()
            .name(format!("ringfeed-node-net{id}"))
            .spawn(move || l.run(opts, seed, entries));
        if let Err(e) = spawned {
            for l in &links {
                l.stop();
            }
            return Err(Error::Internal(format!(
                "cannot start the node engine's network thread {id}: {e}"
            )));
        }
        links.push(link);
    }
    Ok(Some(EngineNet { net, links, spool }))
}

/// The dataset of `cfg`, each local shard's samples counted when the
/// plan's split needs them: what a node engine resolves once for all its
/// consumers' loaders (each would count every shard again).
pub(crate) fn resolve_counted(cfg: &Config) -> Result<Vec<Shard>> {
    let net = NetOptions::for_config(cfg);
    let mut shards = dataset::resolve_config(cfg, &net)?;
    let workers = worker_count(cfg, &shards);
    learn_cached_counts(cfg, &mut shards, &net, workers)?;
    if cfg.plan_options(workers).needs_counts() {
        for s in shards.iter_mut() {
            s.samples = counted(s)?;
        }
    }
    Ok(shards)
}

/// Remote shards' sample counts from the cache, when the plan needs
/// counts (a split among consumers, a resume) and a cache is configured:
/// what an earlier run learned reading them whole, for the current
/// versions of the objects.
fn learn_cached_counts(
    cfg: &Config,
    shards: &mut [Shard],
    net: &NetOptions,
    workers: usize,
) -> Result<()> {
    let Some(o) = cfg.cache_options() else {
        return Ok(());
    };
    if !cfg.plan_options(workers).needs_counts() && cfg.resume.is_empty() {
        return Ok(());
    }
    if shards.iter().all(|s| s.samples.is_some()) {
        return Ok(());
    }
    dataset::learn_counts(shards, &Cache::open(o), net)
}

/// A shard's sample count: known, or counted from a local file's headers
/// (`None` for a remote shard without one).
fn counted(s: &Shard) -> Result<Option<u64>> {
    match (&s.source, s.samples) {
        (_, Some(n)) => Ok(Some(n)),
        (Source::File(path), None) => crate::tar::count_file_samples(path).map(Some),
        _ => Ok(None),
    }
}

/// Streams of a loader: `workers`, or one per shard up to `AUTO_WORKERS`.
fn worker_count(cfg: &Config, shards: &[Shard]) -> usize {
    match cfg.workers {
        0 => AUTO_WORKERS.min(shards.len()),
        n => n,
    }
}

/// The least share of a shared pool a stream may have: its first read, a
/// spill run and one chunk of a batch.
const MIN_SHARE: usize = 3;

/// A loader's own arena of `chunks` chunks (on `numa_node`), and its pool
/// split among `workers` streams; with the arena's notes after `notes`
/// and the CUDA runtime to register it with once populated.
fn own_pool(
    cfg: &Config,
    chunks: usize,
    workers: usize,
    numa_node: Option<usize>,
    placement_notes: Vec<String>,
) -> Result<(Arc<ChunkPool>, Vec<String>, Option<&'static cuda::Runtime>)> {
    let chunk = cfg.chunk_size as usize;
    let arena = Arena::new_on_node(
        chunks * chunk,
        ArenaOptions {
            kind: cfg.memory_kind,
            lock: cfg.lock_memory.required(),
            // Pages fault in as reads land in them and a thread
            // populates the rest (`prefault_main`), so the first reads
            // do not wait for the whole arena. Only fixed buffers
            // required at open need every page in now.
            // So do pages registered with CUDA at open.
            prefault: cfg.register_buffers == Toggle::On || cfg.cuda_register == Toggle::On,
            shared: cfg.shared_arena,
        },
        numa_node,
    )?;
    let mut notes = arena.report().notes.clone();
    let cuda_later = register_cuda(&arena, cfg, &mut notes)?;
    notes.extend(placement_notes);
    let pool = ChunkPool::new(arena, chunk);
    // Per worker: its first read and a spill run.
    pool.set_reserve(2 * workers);
    // Each worker (plan stream) its share, so none waits on another's.
    pool.set_owners(workers, chunks / workers);
    Ok((pool, notes, cuda_later))
}

/// Checks `cpus` and `numa_node` against this machine: every listed CPU
/// must be one this process may use, and the node one that exists.
fn check_placement_keys(cfg: &Config, topo: &Topology, allowed: &[usize]) -> Result<()> {
    if let Some(list) = &cfg.cpus {
        let outside: Vec<usize> = list
            .iter()
            .copied()
            .filter(|c| !allowed.contains(c))
            .collect();
        if !outside.is_empty() {
            return Err(Error::config(format!(
                "`cpus` names CPUs {} that this process may not use (its CPUs: {})",
                topology::format_cpu_list(&outside),
                topology::format_cpu_list(allowed)
            )));
        }
    }
    if let Some(node) = cfg.numa_node
        && !topo.nodes.is_empty()
        && !topo.nodes.iter().any(|n| n.id == node)
    {
        let ids: Vec<usize> = topo.nodes.iter().map(|n| n.id).collect();
        return Err(Error::config(format!(
            "`numa_node` is {node} but this machine's NUMA nodes are {}",
            topology::format_cpu_list(&ids)
        )));
    }
    Ok(())
}

/// Where the workers run and the arena lives: placed by NIC queue and
/// NUMA node, away from CPUs other engines on this node claimed (and
/// claimed for this loader until it closes), or by the configuration.
fn place(
    cfg: &Config,
    topo: &Topology,
    allowed: &[usize],
    workers: usize,
    notes: &mut Vec<String>,
) -> (Placement, Claims) {
    let req = Request {
        threads: workers,
        allowed,
        claimed: &[],
        nic: None,
        cpus: cfg.cpus.as_deref(),
        numa_node: cfg.numa_node,
    };
    let (mut placement, claims) = if !cfg.pin_cpus {
        (topology::worker_cpus(topo, &req), Claims::default())
    } else {
        match ClaimsDir::for_user() {
            Ok(dir) => dir.place(topo, &req),
            Err(e) => {
                notes.push(format!(
                    "CPU claims unavailable ({e}): placed without them, so another engine on \
                     this node may pin onto the same CPUs"
                ));
                (topology::worker_cpus(topo, &req), Claims::default())
            }
        }
    };
    if !cfg.pin_cpus {
        placement.cpus = None;
        placement.why = Why::Off;
    }
    if let Why::TooMany { threads, cpus } = placement.why {
        notes.push(format!(
            "workers not pinned: {threads} workers on {cpus} usable CPUs (pinned, two would \
             share a CPU while another idles)"
        ));
    }
    if let Some(chosen) = &placement.cpus
        && claims.cpus().len() < chosen.len()
        && cfg.pin_cpus
        && !notes.iter().any(|n| n.starts_with("CPU claims"))
    {
        notes.push(format!(
            "CPUs {} are claimed by other engines too: every usable CPU was",
            topology::format_cpu_list(
                &chosen
                    .iter()
                    .copied()
                    .filter(|c| !claims.cpus().contains(c))
                    .collect::<Vec<_>>()
            )
        ));
    }
    if placement.numa_node.is_none() {
        notes.push("NUMA node unknown: the arena is not bound to one".into());
    }
    (placement, claims)
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

/// Whether the workers' rings use the chunks as fixed buffers. `on`: a
/// probe ring registers them now (the arena was prefaulted for it), and a
/// refusal is an error. `auto`: decided now by the rule the kernel applies
/// (CAP_IPC_LOCK, or an RLIMIT_MEMLOCK that covers every ring's pin), and
/// each ring registers them once the prefault thread has the memory in.
fn fixed_buffers(
    iovecs: Vec<libc::iovec>,
    want: Toggle,
    rings: usize,
    net: &NetOptions,
    notes: &mut Vec<String>,
) -> Result<Option<Arc<FixedBuffers>>> {
    if want == Toggle::Off {
        return Ok(None);
    }
    let bytes: u64 = iovecs.iter().map(|v| v.iov_len as u64).sum();
    let count = iovecs.len();
    // SAFETY: the iovecs point into the arena, which outlives every reader:
    // the shared state holds the pool, and the readers end with the workers.
    let fixed = Arc::new(unsafe { FixedBuffers::new(iovecs) });
    let why = if count > MAX_REGISTERED {
        format!("{count} chunks exceed io_uring's {MAX_REGISTERED} fixed buffers")
    } else if want == Toggle::On {
        fixed.set_ready();
        match UringReader::new(8, Some(Arc::clone(&fixed)), net.clone(), 0) {
            Ok(_) => return Ok(Some(fixed)),
            Err(e) => format!("register_buffers refused ({e})"),
        }
    } else {
        match pin_allowed(bytes.saturating_mul(rings as u64)) {
            Ok(()) => return Ok(Some(fixed)),
            Err(why) => why,
        }
    };
    if want == Toggle::On {
        return Err(Error::IoUring(format!(
            "{why}; `register_buffers` is \"on\": raise `ulimit -l` or set it to \"auto\""
        )));
    }
    notes.push(format!("{why}: plain reads into unregistered chunks"));
    Ok(None)
}

/// Whether this process may pin `bytes` with io_uring: the kernel charges
/// registered buffers to RLIMIT_MEMLOCK unless the ring's creator has
/// CAP_IPC_LOCK.
fn pin_allowed(bytes: u64) -> std::result::Result<(), String> {
    if has_cap_ipc_lock() {
        return Ok(());
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(format!(
            "register_buffers not tried (RLIMIT_MEMLOCK unreadable: {})",
            std::io::Error::last_os_error()
        ));
    }
    if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= bytes {
        return Ok(());
    }
    Err(format!(
        "register_buffers refused: the rings would pin {bytes} bytes, over RLIMIT_MEMLOCK ({} \
         bytes), without CAP_IPC_LOCK",
        lim.rlim_cur
    ))
}

/// CAP_IPC_LOCK in this thread's effective set (`CapEff` of
/// /proc/thread-self/status, bit 14).
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The fingerprint to check `states` against: the dataset's, or, for
/// states that do not match it while some shards are unsized, the one with
/// every size (states saved when open sized each remote shard with a `HEAD`
/// carry their sizes): then the sizes are asked for, in parallel, so those
/// states still resume. The loader's own states carry the dataset's.
fn sized_fingerprint(
    states: &[State],
    fingerprint: u64,
    shards: &[Shard],
    net: &NetOptions,
    opts: &PlanOptions,
) -> Result<u64> {
    if states.iter().all(|s| s.fingerprint == fingerprint)
        || shards.iter().all(|s| s.size.is_some())
    {
        return Ok(fingerprint);
    }
    let mut sized = shards.to_vec();
    dataset::head_sizes(&mut sized, net)?;
    let ids: Vec<(&str, Option<u64>)> = sized.iter().map(|s| (s.name.as_str(), s.size)).collect();
    let full = resume::fingerprint(&ids, opts);
    Ok(if states.iter().all(|s| s.fingerprint == full) {
        full
    } else {
        fingerprint
    })
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
fn plan_setup(
    cfg: &Config,
    net: &NetOptions,
    shards: &[Shard],
    workers: usize,
) -> Result<PlanSetup> {
    let opts = cfg.plan_options(workers);
    let ids: Vec<(&str, Option<u64>)> = shards.iter().map(|s| (s.name.as_str(), s.size)).collect();
    let fingerprint = resume::fingerprint(&ids, &opts);
    let states = cfg
        .resume
        .iter()
        .map(|h| State::from_hex(h))
        .collect::<Result<Vec<_>>>()?;
    let checked = sized_fingerprint(&states, fingerprint, shards, net, &opts)?;
    let mut start = resume::start_from(&states, checked, &opts)?;
    if states.is_empty() {
        start.epoch = cfg.epoch;
    }
    let counts = if opts.needs_counts() || start.needs_counts() || start.skip_batches > 0 {
        shards.iter().map(counted).collect::<Result<Vec<_>>>()?
    } else {
        shards.iter().map(|s| s.samples).collect()
    };
    let base = if start.needs_counts() {
        let known: Option<Vec<u64>> = counts.iter().copied().collect();
        match known {
            Some(k) => start.delivered(&opts, &k)?,
            None => {
                let missing = counts.iter().filter(|c| c.is_none()).count();
                return Err(Error::config(format!(
                    "resuming on another layout needs every shard's sample count and {missing} \
                     of {} shards have none: list them in a manifest with their counts \
                     (`ringfeed index URL... -o set.manifest`), or read them whole once with a \
                     `cache_dir`, which keeps the counts",
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

/// Registers the arena with the CUDA runtime as `cuda_register` asks:
/// `on` registers now or fails; `auto` says in the notes why not when no
/// runtime loads, and otherwise returns the runtime for the prefault thread
/// to register with once the pages are in (registering pins every page,
/// which the first batch should not wait for; a refusal then shows in the
/// stats notes), or registers now when the arena was prefaulted at open;
/// `off` never loads the runtime.
fn register_cuda(
    arena: &Arena,
    cfg: &Config,
    notes: &mut Vec<String>,
) -> Result<Option<&'static cuda::Runtime>> {
    let want = cfg.cuda_register;
    if want == Toggle::Off {
        return Ok(None);
    }
    let runtime = cuda::runtime().map_err(|e| format!("CUDA runtime not found: {e}"));
    let registered = match runtime {
        Ok(rt) if want == Toggle::Auto && cfg.register_buffers != Toggle::On => {
            return Ok(Some(rt));
        }
        Ok(rt) => arena.register_cuda(rt),
        Err(e) => Err(e),
    };
    match registered {
        Ok(()) => Ok(None),
        Err(e) if want == Toggle::On => Err(Error::Memory(format!(
            "`cuda_register` is \"on\" but the arena cannot be registered with CUDA ({e}); \
             set it to \"auto\" or \"off\", or set RINGFEED_CUDART to the runtime's path"
        ))),
        Err(e) => {
            notes.push(cuda::not_registered(&e));
            Ok(None)
        }
    }
}
