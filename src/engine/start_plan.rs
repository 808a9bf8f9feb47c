//! The loader's start as a plan: what `Loader::start` (`open.rs`) decides —
//! workers, chunk size, the arena's chunks, the backend, fixed buffers,
//! network threads, queue depths, the cache tier, direct reads, whether a
//! node engine's streams leave room to pin — computed as one value from the
//! configuration, the shards and the facts of the machine and of the node
//! engine joined ([`Facts`]), so that each decision is tested alone on
//! fake facts. The start gathers the facts, decides, places the workers
//! (which claims CPUs), and carries the plan out. The reads in flight are
//! the configuration's ([`crate::config::ReadDepth`]), worked out there.

use crate::cache::CacheOptions;
use crate::config::{Config, IoBackend, Toggle};
use crate::dataset::{Shard, Source};
use crate::engine::planning::worker_count;
use crate::engine::setup::{auto_chunk, check_placement_keys, read_span};
use crate::engine::shared::faults_in_on_reads;
use crate::error::{Error, Fault, Result};
use crate::fetch::BackendKind;
use crate::topology::Topology;

/// What the start decides on besides the configuration and the shards.
pub(super) struct Facts<'a> {
    /// The machine's CPUs, NUMA nodes and NICs.
    pub topo: &'a Topology,
    /// The CPUs this process may use.
    pub allowed: &'a [usize],
    /// What probing io_uring found: the ring's setup flags, or why there
    /// is no ring; `None` where it was not probed (`io_backend` is
    /// "threads", or the readers are scripted).
    pub ring: Option<std::result::Result<&'static str, String>>,
    /// The readers come from a script (the engine's unit tests): no
    /// files, sockets or rings.
    pub scripted: bool,
    /// The default budget's bound for remote shards
    /// (`setup::remote_budget`: a share of the memory this process may use).
    pub remote_budget: u64,
    /// The node engine whose pool the loader joined; `None`: the loader
    /// has its own.
    pub engine: Option<EngineFacts>,
}

/// What a loader of a node engine finds of it at start.
pub(super) struct EngineFacts {
    /// The streams the engine runs: those of every consumer its pool
    /// serves now, or those it expects (`Config::node_streams`) when more.
    pub streams: usize,
    /// The engine's network threads (0: it runs none).
    pub net_threads: usize,
    /// Whether the engine runs a cache writer.
    pub spool: bool,
}

/// Which cache a loader reads and fills.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum CachePlan {
    None,
    /// The node engine's one writer, for all its consumers.
    Engine,
    /// A cache of the loader's own, opened at start.
    Own(CacheOptions),
}

/// Which network threads receive the workers' HTTP ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NetPlan {
    /// None: the workers receive (thread backend), or nothing is remote.
    None,
    /// The node engine's, for every read of its consumers, local files too.
    Engine,
    /// `count` of the loader's own, each with a ring of `ring_entries`.
    Own { count: usize, ring_entries: u32 },
}

impl NetPlan {
    pub fn threads(&self) -> usize {
        match self {
            NetPlan::Own { count, .. } => *count,
            _ => 0,
        }
    }
}

/// Everything the start decided.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StartPlan {
    /// Streams of the epoch plan, one worker each.
    pub workers: usize,
    /// Bytes per chunk: `chunk_size`, or auto's choice for the shards.
    pub chunk: usize,
    /// Chunks of a loader's own arena (the memory budget's whole chunks).
    pub chunks: usize,
    /// Where a read lands in a chunk (`setup::read_span`).
    pub slack: usize,
    pub data_len: usize,
    /// Some shard is remote.
    pub remote: bool,
    /// Most of the arena faults in as reads land in it.
    pub faults_in_on_reads: bool,
    /// `Some(streams)`: pinned workers are unpinned, the node engine's
    /// streams outnumbering the usable CPUs (measured: docs/decisions.md,
    /// "Node engine: a loader per consumer over shared parts").
    pub unpin_for: Option<usize>,
    pub backend: BackendKind,
    pub uring_flags: &'static str,
    /// The chunks registered as fixed buffers in this mode; `None`: not.
    pub fixed: Option<Toggle>,
    pub net: NetPlan,
    /// The loader runs no network threads of the engine's.
    pub own_net_links: bool,
    /// Batches a stream's queue holds.
    pub per_stream: usize,
    /// Bytes of local shards (what auto direct reads weigh).
    pub local_bytes: u64,
    pub cache: CachePlan,
    /// How cache entries are read: direct unless `cache_direct` is off.
    pub cache_direct: Toggle,
    /// What the decisions say to the user (the loader's notes).
    pub notes: Vec<String>,
}

impl StartPlan {
    /// The streams of the epoch plan (`planning::worker_count`), which the
    /// start needs before it decides the rest (to count the shards'
    /// samples); an error where there is no shard, or where `cpus` or
    /// `numa_node` name what the machine lacks.
    pub fn workers(cfg: &Config, shards: &[Shard], facts: &Facts) -> Result<usize> {
        if shards.is_empty() {
            return Err(Error::config("`urls` names no shard"));
        }
        check_placement_keys(cfg, facts.topo, facts.allowed)?;
        Ok(worker_count(cfg, shards))
    }

    /// Decides the start of a loader of `cfg` over `shards` on `facts`.
    /// Errors are the configuration's, named: no shard, CPUs or a node this
    /// machine lacks, a budget too small for the workers, io_uring or
    /// fixed buffers required where there are none.
    pub fn decide(cfg: &Config, shards: &[Shard], facts: &Facts) -> Result<StartPlan> {
        let workers = StartPlan::workers(cfg, shards, facts)?;
        let mut notes = Vec::new();
        let chunk = match cfg.chunk_size {
            0 => {
                let (size, note) = auto_chunk(cfg, shards);
                notes.extend(note);
                size
            }
            n => n,
        };
        let remote = shards.iter().any(|s| matches!(s.source, Source::Http(_)));
        // The default budget counts reads of the chunks chosen.
        let sized = Config {
            chunk_size: chunk,
            ..cfg.clone()
        };
        let budget = sized.effective_budget(workers, remote.then_some(facts.remote_budget));
        let chunks = (budget / chunk) as usize;
        let need = 2 * workers + 2;
        if chunks < need && facts.engine.is_none() {
            return Err(Error::config(format!(
                "`memory_budget` of {budget} bytes holds {chunks} chunks of {chunk} bytes; \
                 {workers} workers need at least {need}: raise `memory_budget`, lower \
                 `chunk_size` or `workers`"
            )));
        }
        let chunk = chunk as usize;
        let (slack, data_len) = read_span(chunk);
        // The loaders of a node engine run side by side: once their
        // streams outnumber the usable CPUs, pinned workers would queue on
        // theirs while another CPU idles.
        let unpin_for = facts
            .engine
            .as_ref()
            .map(|e| e.streams)
            .filter(|&streams| cfg.cpus.is_none() && streams > facts.allowed.len());
        let (backend, uring_flags) = backend(cfg, facts, &mut notes)?;
        let uring = backend == BackendKind::IoUring;
        if !uring && cfg.register_buffers == Toggle::On {
            return Err(Error::IoUring(
                "`register_buffers` is \"on\" but the thread backend runs (io_uring is off or \
                 unavailable); fixed buffers need io_uring: set it to \"auto\""
                    .into(),
            ));
        }
        let fixed = fixed_buffers(cfg, shards, facts, uring, remote, &mut notes);
        let own_net_links = facts.engine.as_ref().is_none_or(|e| e.net_threads == 0);
        let net = net_threads(cfg, facts, workers, uring, remote);
        let cache = cache(cfg, facts, remote, chunk, data_len, &mut notes);
        Ok(StartPlan {
            workers,
            chunk,
            chunks,
            slack,
            data_len,
            remote,
            faults_in_on_reads: faults_in_on_reads(cfg, shards),
            unpin_for,
            backend,
            uring_flags,
            fixed,
            net,
            own_net_links,
            // A stream's queue holds `prefetch_batches` too: the sequencer
            // takes the streams in turn, so each needs room to run ahead
            // while another is behind (descheduled, or at a shard
            // boundary); what the queues hold counts against each worker's
            // chunk quota (docs/decisions.md, "Defaults and the figures
            // behind them").
            per_stream: cfg.prefetch_batches.max(2),
            local_bytes: shards
                .iter()
                .filter(|s| matches!(s.source, Source::File(_)))
                .filter_map(|s| s.size)
                .sum(),
            cache,
            // Auto reads entries direct: a cache holds what the page cache
            // does not keep.
            cache_direct: match cfg.cache_direct {
                Toggle::Off => Toggle::Off,
                _ => Toggle::On,
            },
            notes,
        })
    }
}

/// io_uring where the probe found a ring and `io_backend` allows it; the
/// thread backend where it is asked for, the readers are scripted, or (on
/// auto) no ring could be made, said in a note.
fn backend(
    cfg: &Config,
    facts: &Facts,
    notes: &mut Vec<String>,
) -> Result<(BackendKind, &'static str)> {
    if facts.scripted || cfg.io_backend == IoBackend::Threads {
        return Ok((BackendKind::Threads, ""));
    }
    match &facts.ring {
        Some(Ok(flags)) => Ok((BackendKind::IoUring, flags)),
        Some(Err(e)) if cfg.io_backend == IoBackend::IoUring => Err(Error::IoUring(format!(
            "cannot set up a ring ({e}); `io_backend` is \"io_uring\": use \"auto\" or \"threads\""
        ))),
        Some(Err(e)) => {
            notes.push(format!("io_uring unavailable ({e}): thread backend"));
            Ok((BackendKind::Threads, ""))
        }
        None => Err(Error::internal(
            Fault::Invariant,
            "the start was not told whether io_uring works",
        )),
    }
}

/// Whether the rings register the chunks as fixed buffers (in
/// `register_buffers`' mode). Fixed buffers serve file reads (local
/// shards, cache entries): a loader of remote shards alone would pin its
/// whole arena, sized for a far store's reads in flight, for nothing. A
/// node engine's arena is not registered by its loaders' rings: its I/O
/// threads, where it runs them, take every read and register the budget's
/// chunks themselves (`setup::engine_fixed`); without them, not on auto:
/// registering pins every page of the arena, and its file is 4 times its
/// budget, the part past it meant to take no memory until more consumers
/// attach than expected (measured: registering it all took 1280 MiB for a
/// 320 MiB budget).
fn fixed_buffers(
    cfg: &Config,
    shards: &[Shard],
    facts: &Facts,
    uring: bool,
    remote: bool,
    notes: &mut Vec<String>,
) -> Option<Toggle> {
    if facts.engine.as_ref().is_some_and(|e| e.net_threads > 0) {
        return None;
    }
    let shared_auto = facts.engine.is_some() && cfg.register_buffers == Toggle::Auto;
    if shared_auto && uring && !facts.scripted {
        notes.push(
            "fixed buffers not registered: the node engine's arena is shared, and registering \
             would pin all of it"
                .into(),
        );
    }
    let reads_files = !remote
        || cfg.cache_dir.is_some()
        || shards.iter().any(|s| matches!(s.source, Source::File(_)));
    let wanted = reads_files || cfg.register_buffers == Toggle::On;
    (!facts.scripted && uring && !shared_auto && wanted).then_some(cfg.register_buffers)
}

/// Network threads receive the workers' HTTP ranges (io_uring only; the
/// thread backend receives on each worker). A node engine's take every
/// read, local files too: the engine's one set of I/O threads for all its
/// consumers. A loader's own: `net_threads`, or half the usable CPUs, at
/// most one a worker.
fn net_threads(cfg: &Config, facts: &Facts, workers: usize, uring: bool, remote: bool) -> NetPlan {
    let engine_threads = facts.engine.as_ref().map_or(0, |e| e.net_threads);
    if !uring || facts.scripted || !(remote || engine_threads > 0) {
        return NetPlan::None;
    }
    if engine_threads > 0 {
        return NetPlan::Engine;
    }
    let count = match cfg.net_threads {
        0 => (facts.allowed.len() / 2).clamp(1, workers),
        n => n.min(workers),
    };
    // Each serves its workers' reads in flight: two entries each (the step
    // and its time-out), and its own wake-up.
    let served = workers.div_ceil(count);
    let ring_entries = (served * cfg.read_depth().ring * 2 + 2).next_power_of_two() as u32;
    NetPlan::Own {
        count,
        ring_entries,
    }
}

/// The cache a loader of remote shards reads and fills (`cache_dir`); none
/// for local shards, nor (with a note) where a read is not whole checksum
/// blocks, since hits are checked a read at a time.
fn cache(
    cfg: &Config,
    facts: &Facts,
    remote: bool,
    chunk: usize,
    data_len: usize,
    notes: &mut Vec<String>,
) -> CachePlan {
    let block = crate::cache::entry::BLOCK;
    match cfg.cache_options() {
        None => CachePlan::None,
        Some(_) if !remote => CachePlan::None,
        Some(o) if data_len % block != 0 => {
            notes.push(format!(
                "cache {} not used: reads of {data_len} bytes (`chunk_size` {chunk}) are not \
                 whole {block}-byte checksum blocks; use a chunk_size of a multiple of 1 MiB",
                o.dir.display(),
            ));
            CachePlan::None
        }
        Some(_) if facts.engine.as_ref().is_some_and(|e| e.spool) => CachePlan::Engine,
        Some(o) => CachePlan::Own(o),
    }
}

#[cfg(test)]
mod tests;
