//! What a loader's start-up sets up besides its threads: its own arena and
//! chunk pool, where its workers run (placement and the CPU claims),
//! whether its rings use the chunks as fixed buffers, the arena's CUDA
//! registration, and the parts a node engine runs for all its loaders (its
//! I/O threads and cache writer).

use std::sync::Arc;

use crate::cache::{Cache, Spool};
use crate::config::{Config, DEFAULT_CHUNK, IoBackend, Toggle};
use crate::dataset::{Shard, Source};
use crate::error::{Error, Fault, Result};
use crate::fetch::NetOptions;
use crate::fetch::fixed::FixedBuffers;
use crate::fetch::net_thread::NetLink;
use crate::fetch::ring;
use crate::fetch::uring::UringReader;
use crate::memory::{Arena, ArenaOptions, ChunkPool, cuda};
use crate::topology::{self, Claims, ClaimsDir, Placement, PlacementRequest, Topology, Why};

/// Most buffers io_uring registers in one table (IORING_MAX_REG_BUFFERS).
const MAX_REGISTERED: usize = 1 << 14;

/// A node engine's network threads and the options (with the request
/// and retry counters) they run with.
pub(crate) struct EngineNet {
    pub net: NetOptions,
    pub links: Vec<Arc<NetLink>>,
    /// The cache's writer, one for every consumer (`cache_dir` with remote
    /// shards).
    pub spool: Option<Arc<Spool>>,
    /// The budget's chunks, which the I/O threads register and read files
    /// into with `READ_FIXED` once the engine has faulted them in.
    pub fixed: Option<Arc<FixedBuffers>>,
    /// Why they do not, when they do not.
    pub fixed_note: Option<String>,
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
/// CPU), each sized for its share of the streams the engine expects, which
/// read files into the budget's chunks `fixed` as fixed buffers where
/// `register_buffers` allows ([`engine_fixed`]); none on the thread
/// backend, where each stream reads on its own thread — and its cache
/// writer.
pub(crate) fn engine_net_threads(
    cfg: &Config,
    shards: &[Shard],
    fixed: &Arc<FixedBuffers>,
) -> Result<Option<EngineNet>> {
    let remote = shards.iter().any(|s| matches!(s.source, Source::Http(_)));
    let threads = cfg.io_backend == IoBackend::Threads || ring::probe().is_err();
    if threads && cfg.register_buffers == Toggle::On {
        return Err(Error::IoUring(
            "`register_buffers` is \"on\" but the node engine runs the thread backend (io_uring \
             is off or unavailable); fixed buffers need io_uring: set it to \"auto\""
                .into(),
        ));
    }
    let spool = match cfg.cache_options() {
        Some(o) if remote => Some(Arc::new(
            Spool::start(Arc::new(Cache::open(o)?), cfg.cache_fill).map_err(|e| {
                Error::internal(Fault::Thread, format!("cannot start the cache writer: {e}"))
            })?,
        )),
        _ => None,
    };
    if threads {
        // No I/O threads: each stream reads on its own thread; the cache
        // writer is still the engine's one.
        let net = NetOptions::for_config(cfg);
        return Ok(Some(EngineNet {
            net,
            links: Vec::new(),
            spool,
            fixed: None,
            fixed_note: None,
        }));
    }
    // Auto: one per usable CPU, at most one per stream the engine expects.
    // They carry the kernel's copies of every read, local files included,
    // which one thread on a 2-CPU machine could not keep up with; two did,
    // four no better (docs/decisions.md, "Node engine: a loader per
    // consumer over shared parts").
    let streams = cfg.node_streams().max(1);
    let n = match cfg.net_threads {
        0 => topology::discover().allowed().len().clamp(1, streams),
        n => n,
    };
    let entries = (streams.div_ceil(n) * cfg.read_depth().ring * 2 + 2)
        .next_power_of_two()
        .min(1 << 15) as u32;
    let net = NetOptions::for_config(cfg);
    let reads_files =
        cfg.cache_dir.is_some() || shards.iter().any(|s| matches!(s.source, Source::File(_)));
    let (fixed, fixed_note) = match engine_fixed(fixed, cfg.register_buffers, n, reads_files, &net)
    {
        Ok(f) => (f, None),
        Err(why) if cfg.register_buffers == Toggle::On => {
            return Err(Error::IoUring(format!(
                "{why}; `register_buffers` is \"on\": raise `ulimit -l` or set it to \"auto\""
            )));
        }
        Err(why) => (
            None,
            Some(format!("{why}: plain reads into the engine's chunks")),
        ),
    };
    let mut links: Vec<Arc<NetLink>> = Vec::with_capacity(n);
    for id in 0..n {
        let link = NetLink::with_fixed(fixed.clone())
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
            return Err(Error::internal(
                Fault::Thread,
                format!("cannot start the node engine's network thread {id}: {e}"),
            ));
        }
        links.push(link);
    }
    Ok(Some(EngineNet {
        net,
        links,
        spool,
        fixed,
        fixed_note,
    }))
}

/// Whether a node engine's `rings` I/O threads register the budget's
/// chunks `fixed` (`None`: not asked to, or no file to read on auto; the
/// error says why they cannot). Only the budget: the engine faults it in
/// anyway (and locks it, unless `lock_memory` is off), where the part of
/// the arena file past it is meant to take no memory until used. Pinning
/// takes no page more, but the kernel keeps an entry per page pinned in
/// each ring: on auto, not past [`PIN_TABLES_MAX`] for all the rings
/// (4 KiB pages: a 16 GiB budget in 64 rings would take 4 GiB). Each ring
/// registers once the engine has faulted the budget in (a refusal then
/// shows in the stats notes); with `"on"` the budget is in at start and a
/// probe ring registers it now, its refusal the error. Registered, the
/// kernel's copy of a file read into a chunk goes through the pages it
/// pinned instead of the engine's page tables.
fn engine_fixed(
    fixed: &Arc<FixedBuffers>,
    want: Toggle,
    rings: usize,
    reads_files: bool,
    net: &NetOptions,
) -> std::result::Result<Option<Arc<FixedBuffers>>, String> {
    if want == Toggle::Off || (want == Toggle::Auto && !reads_files) {
        return Ok(None);
    }
    let count = fixed.count();
    if count > MAX_REGISTERED {
        return Err(format!(
            "{count} chunks exceed io_uring's {MAX_REGISTERED} fixed buffers"
        ));
    }
    let tables = pin_tables(fixed.bytes(), fixed.page(), rings);
    if want == Toggle::Auto && tables > PIN_TABLES_MAX {
        return Err(format!(
            "fixed buffers not registered: the budget in {rings} I/O threads' rings would take {} \
             MiB of the kernel's tables of pinned pages, over {} MiB",
            tables >> 20,
            PIN_TABLES_MAX >> 20
        ));
    }
    pin_allowed(fixed.bytes().saturating_mul(rings as u64))?;
    if want == Toggle::On {
        UringReader::new(8, Some(Arc::clone(fixed)), net.clone(), 0)
            .map_err(|e| format!("register_buffers refused ({e})"))?;
    }
    Ok(Some(Arc::clone(fixed)))
}

/// The most kernel memory a node engine's rings may take, on auto, for
/// the entries of the pages its budget pins in them ([`pin_tables`]).
const PIN_TABLES_MAX: u64 = 64 << 20;

/// The kernel's entries for `bytes` in pages of `page` bytes pinned in
/// each of `rings` rings: one of 16 bytes a page (a `bio_vec`).
fn pin_tables(bytes: u64, page: usize, rings: usize) -> u64 {
    (bytes / page.max(1) as u64)
        .saturating_mul(16)
        .saturating_mul(rings as u64)
}

/// Where a read lands in a chunk of `chunk` bytes: `(slack, len)`, a slack
/// of 1/16 chunk on each side, which absorbs the smaller piece of any
/// member up to 1/8 of a chunk (1 MiB at 8 MiB chunks) without a spill,
/// and the bytes between, which one read fills.
pub(super) fn read_span(chunk: usize) -> (usize, usize) {
    let slack = (chunk / 16) & !4095;
    (slack, chunk - 2 * slack)
}

/// The chunk size when `chunk_size` is auto, with a note saying why when
/// it is not the default: for remote shards the least whole MiB whose
/// read (`read_span`) holds the median shard of those sized at open (by a
/// manifest, a listing or the first shard's `HEAD`), where that is less
/// than [`DEFAULT_CHUNK`]. Each remote read takes one chunk, whatever the
/// shard holds: with 8 MiB chunks a far store's budget held one 1 MiB
/// shard per 8 MiB; 1 MiB chunks asked two GETs of each 1.1 MB shard (the
/// sizes measured: docs/benchmarks.md, "An object store's shape", scenario
/// E). Local shards keep the default: their reads are
/// few and the arena is populated ahead. So does a cache (`cache_dir`):
/// its entries are written from reads of whole 1 MiB blocks, which only
/// multiples of 8 MiB give.
pub(super) fn auto_chunk(cfg: &Config, shards: &[Shard]) -> (u64, Option<String>) {
    let mut sizes: Vec<u64> = shards
        .iter()
        .filter(|s| matches!(s.source, Source::Http(_)))
        .filter_map(|s| s.size)
        .collect();
    if sizes.is_empty() || cfg.cache_options().is_some() {
        return (DEFAULT_CHUNK, None);
    }
    sizes.sort_unstable();
    let median = sizes[sizes.len() / 2];
    const MIB: u64 = 1 << 20;
    let chunk = (1..DEFAULT_CHUNK / MIB)
        .map(|n| n * MIB)
        .find(|&c| read_span(c as usize).1 as u64 >= median)
        .unwrap_or(DEFAULT_CHUNK);
    if chunk == DEFAULT_CHUNK {
        return (DEFAULT_CHUNK, None);
    }
    let note = format!(
        "chunks of {} MiB (`chunk_size` auto): the least whose read holds a shard of {median} \
         bytes, the median of the {} remote shards sized at open",
        chunk / MIB,
        sizes.len()
    );
    (chunk, Some(note))
}

/// The least share of a shared pool a stream may have: its first read, a
/// spill run and one chunk of a batch.
pub(super) const MIN_SHARE: usize = 3;

/// Chunks of `chunk` bytes one stream needs so that its consumer may keep
/// a batch while it asks for the next (`for batch in loader` does): the
/// chunks the batch kept and the one being filled span together (one
/// more than their bytes), and the read after them. Batches of
/// `batch_size` samples of the shards' mean size, with a quarter more for
/// samples above it; 0 where no shard has both its size and its sample
/// count known.
pub(super) fn batch_share(cfg: &Config, shards: &[Shard], chunk: u64) -> usize {
    let (bytes, samples) = shards
        .iter()
        .filter_map(|s| Some((s.size?, s.samples?)))
        .fold((0u64, 0u64), |(b, n), (sb, sn)| (b + sb, n + sn));
    if samples == 0 || chunk == 0 {
        return 0;
    }
    let two = (2 * cfg.batch_size as u64)
        .saturating_mul(bytes / samples)
        .saturating_mul(5)
        / 4;
    two.div_ceil(chunk) as usize + 2
}

/// The default budget's bound for remote shards: a sixteenth of the memory
/// this process may use (the machine's, or its cgroup's limit when lower,
/// as in a Kubernetes pod), between 256 MiB and `REMOTE_BUDGET_MAX`.
pub(super) fn remote_budget() -> u64 {
    const FLOOR: u64 = 256 << 20;
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let kib = m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
        Some(
            kib.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024,
        )
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let usable = match (machine, cgroup) {
        (Some(m), Some(c)) => m.min(c),
        (m, c) => m
            .or(c)
            .unwrap_or(FLOOR * crate::config::REMOTE_BUDGET_SHARE),
    };
    (usable / crate::config::REMOTE_BUDGET_SHARE).clamp(FLOOR, crate::config::REMOTE_BUDGET_MAX)
}

/// A loader's own arena of `chunks` chunks (on `numa_node`), and its pool
/// split among `workers` streams; with the arena's notes after `notes`
/// and the CUDA runtime to register it with once populated. `on_reads`:
/// its pages fault in as reads land (`shared::faults_in_on_reads`).
pub(super) fn own_pool(
    cfg: &Config,
    chunks: usize,
    workers: usize,
    numa_node: Option<usize>,
    placement_notes: Vec<String>,
    on_reads: bool,
) -> Result<(Arc<ChunkPool>, Vec<String>, Option<&'static cuda::Runtime>)> {
    let chunk = cfg.chunk_size as usize;
    let opts = |kind| ArenaOptions {
        kind,
        lock: cfg.lock_memory.required(),
        // Pages fault in as reads land in them and a thread
        // populates the rest (`prefault_main`), so the first reads
        // do not wait for the whole arena. Only fixed buffers
        // required at open need every page in now.
        // So do pages registered with CUDA at open.
        prefault: cfg.register_buffers == Toggle::On || cfg.cuda_register == Toggle::On,
        shared: cfg.shared_arena,
    };
    let arena = match cfg.memory_kind {
        // Pages faulted in by the reads themselves are not asked for as
        // transparent huge pages: where free memory is fragmented
        // (`defrag` = `madvise`, the default) the kernel compacts it on
        // the reading thread, and every read of that ring waits (measured:
        // docs/decisions.md, "A remote dataset's default arena is not
        // transparent huge pages").
        None if on_reads => Arena::new_without_thp(chunks * chunk, opts(None), numa_node)?,
        kind => Arena::new_on_node(chunks * chunk, opts(kind), numa_node)?,
    };
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
pub(super) fn check_placement_keys(cfg: &Config, topo: &Topology, allowed: &[usize]) -> Result<()> {
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
pub(super) fn place(
    cfg: &Config,
    topo: &Topology,
    allowed: &[usize],
    workers: usize,
    notes: &mut Vec<String>,
) -> (Placement, Claims) {
    let req = PlacementRequest {
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

/// Whether the workers' rings use the chunks as fixed buffers. `on`: a
/// probe ring registers them now (the arena was prefaulted for it), and a
/// refusal is an error. `auto`: decided now by the rule the kernel applies
/// (CAP_IPC_LOCK, or an RLIMIT_MEMLOCK that covers every ring's pin), and
/// each ring registers them once the prefault thread has the memory in.
pub(super) fn fixed_buffers(
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
        fixed.set_ready(count);
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

/// Registers the arena with the CUDA runtime as `cuda_register` asks:
/// `on` registers now or fails; `auto` says in the notes why not when no
/// runtime loads, and otherwise returns the runtime for the prefault thread
/// to register with once the pages are in (registering pins every page,
/// which the first batch should not wait for; a refusal then shows in the
/// stats notes), or registers now when the arena was prefaulted at open;
/// `off` never loads the runtime.
pub(super) fn register_cuda(
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

#[cfg(test)]
mod tests;
