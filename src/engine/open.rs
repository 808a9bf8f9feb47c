//! Start-up: resolves the dataset, makes the epoch plan's options and the
//! resume point (`planning.rs`), sets up the arena, the chunk pool,
//! placement, io_uring and fixed buffers (`setup.rs`), and starts the
//! worker and sequencer threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::cache::{Cache, Spool};
use crate::config::{Config, IoBackend, Toggle};
use crate::dataset::Source;
use crate::dataset::{self, Shard};
use crate::engine::counters::Counters;
use crate::engine::loader::{Loader, Setup};
use crate::engine::planning::{counts_or_nominal, plan_setup, worker_count};
use crate::engine::setup::{
    EngineNet, MIN_SHARE, auto_chunk, batch_share, check_placement_keys, fixed_buffers, own_pool,
    place, read_span, register_cuda, remote_budget,
};
use crate::engine::shared::{NetReads, Progress, Shared, faults_in_on_reads};
use crate::engine::threads::{
    MakeReader, Readers, net_main, prefault_main, sequencer_main, worker_main,
};
use crate::error::{Error, Result};
use crate::fetch::direct::DirectIo;
use crate::fetch::net_thread::NetLink;
use crate::fetch::ring;
use crate::fetch::{BackendKind, NetOptions};
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
        if shards.is_empty() {
            return Err(Error::config("`urls` names no shard"));
        }
        let topo = topology::discover();
        let allowed = topo.allowed();
        check_placement_keys(&cfg, &topo, &allowed)?;
        let workers = worker_count(&cfg, &shards);
        let mut shards = shards;
        // Scripted readers (the engine's unit tests) carry their counts.
        let nominal = match make {
            None => counts_or_nominal(&cfg, &mut shards, &net, workers)?,
            Some(_) => None,
        };
        let (plan_opts, counts, start, base_delivered, replay, fingerprint) =
            plan_setup(&cfg, &net, &shards, workers, nominal.as_ref())?;
        let chunk_note = match cfg.chunk_size {
            0 => {
                let (size, note) = auto_chunk(&cfg, &shards);
                cfg.chunk_size = size;
                note
            }
            _ => None,
        };
        let chunk = cfg.chunk_size as usize;
        let remote = shards
            .iter()
            .any(|s| matches!(s.source, Source::Http(_)))
            .then(remote_budget);
        let budget = cfg.effective_budget(workers, remote);
        let chunks = (budget / cfg.chunk_size) as usize;
        let need = 2 * workers + 2;
        if chunks < need && joined.is_none() {
            return Err(Error::config(format!(
                "`memory_budget` of {} bytes holds {chunks} chunks of {chunk} bytes; {workers} workers \
                 need at least {need}: raise `memory_budget`, lower `chunk_size` or `workers`",
                budget
            )));
        }
        let (slack, data_len) = read_span(chunk);
        let mut placement_notes = Vec::new();
        placement_notes.extend(chunk_note);
        let (mut placement, mut claims) =
            place(&cfg, &topo, &allowed, workers, &mut placement_notes);
        // The loaders of a node engine run side by side: once their streams
        // outnumber the usable CPUs, pinned workers would queue on theirs
        // while another CPU idles (measured: docs/decisions.md, "Node
        // engine: a loader per consumer over shared parts").
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
                let (pool, notes, cuda_later) = own_pool(
                    &cfg,
                    chunks,
                    workers,
                    placement.numa_node,
                    placement_notes,
                    faults_in_on_reads(&cfg, &shards),
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
        let (backend, uring_flags) = match cfg.io_backend {
            _ if make.is_some() => (BackendKind::Threads, ""),
            IoBackend::Threads => (BackendKind::Threads, ""),
            want => match ring::probe() {
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
        // Fixed buffers serve file reads (local shards, cache entries); a
        // loader of remote shards alone would pin its whole arena, sized
        // for a far store's reads in flight, for nothing.
        let reads_files = remote.is_none()
            || cfg.cache_dir.is_some()
            || shards.iter().any(|s| matches!(s.source, Source::File(_)));
        let files_auto = reads_files || cfg.register_buffers == Toggle::On;
        let fixed =
            match make.is_none() && backend == BackendKind::IoUring && !shared_auto && files_auto {
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
                Spool::start(Arc::new(Cache::open(o)?), cfg.cache_fill)
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
        // A third of a stream's chunks may be network reads in flight: the
        // rest is for the reads done and waiting behind a slower one (up
        // to the count again), the chunk being walked, the batches queued
        // towards the consumer and a shuffle buffer, so ready batches
        // never starve the reads (nor the reads the batches). (Three
        // quarters let a worker's reads and its open batch hold all its
        // chunks: tests/throttle.rs, a 64-chunk share, failed with
        // `BudgetTooSmall` one run in three. Half, on the emulator's S3
        // model, sent a far store's jump to 92 reads whose waiting
        // neighbours took every chunk of the default 1.5 GB budget, each
        // read then waiting for a chunk, and every page of it faulted in:
        // slower than a third, docs/remote-sources.md, "Reads in flight".)
        let reads = NetReads::new(&cfg, workers, pool.quota_of(owner_base) / 3, started);
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
            transform,
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
            full_below: AtomicU64::new(0),
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
            let entries = (served * shared.cfg.max_reads() * 2 + 2).next_power_of_two() as u32;
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
