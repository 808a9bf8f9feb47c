//! The parts of a node engine that every connection shares: its identity,
//! its configuration (parsed once), the arena and its chunk pool, the
//! dataset (resolved and counted once, with the network threads that
//! receive its remote ranges for every consumer), the table of who holds
//! which batch (`holds.rs`), and the counters its stats report.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::holds::{Holds, Kept};
use super::proto::{EngineId, NodeStats};
use super::sock;
use crate::config::{Config, Toggle};
use crate::dataset::Shard;
use crate::engine::{EngineNet, Loader};
use crate::error::{Error, Fault, NodeFailure, Result};
use crate::fetch::fixed::FixedBuffers;
use crate::memory::{Arena, ArenaOptions, Batch, ChunkPool, MemoryKind};
use crate::sync::Locked;
use crate::topology::{self, PlacementRequest};

/// The longest the engine's arena waits for a first batch before its pages
/// are faulted in anyway.
const PREFAULT_AFTER: Duration = Duration::from_secs(2);

/// The node engine's arena file is this many times its budget: the pages
/// past the budget are used only while more streams are attached than the
/// engine expects (see `ChunkPool::new_shared`), and for the batches that
/// processes outside the engine keep (charged to them, not to the
/// streams); until then they are address space, and take no memory.
const OVERSUBSCRIBE: usize = 4;

impl Kept for Batch {
    fn charge_to(&self, owner: usize) {
        Batch::charge_to(self, owner);
    }
}

/// What the engine reports of itself.
#[derive(Default)]
pub(super) struct EngineReport {
    /// Consumers attached now, and since the start.
    pub consumers: AtomicUsize,
    pub attached: AtomicUsize,
    /// Holders linked now.
    pub holders: AtomicUsize,
    /// A consumer got its first batch (the arena's pages may fault in).
    pub first_out: AtomicBool,
}

/// The dataset every consumer's loader reads, and the network threads
/// that receive its remote ranges for all of them (stopped when the last
/// loader and the engine let go of it).
pub(super) struct Dataset {
    pub shards: Vec<Shard>,
    pub net: Option<EngineNet>,
}

pub(super) struct Engine {
    pub id: EngineId,
    pub socket: PathBuf,
    /// The engine's configuration, parsed once.
    pub base: Config,
    pub pool: Arc<ChunkPool>,
    /// The budget's chunks as fixed buffers for the I/O threads, ready once
    /// the prefault thread has faulted them in.
    fixed: Arc<FixedBuffers>,
    dataset: Mutex<Option<Arc<Dataset>>>,
    pub holds: Mutex<Holds<Batch>>,
    pub whole: EngineReport,
    /// The loaders of the consumers attached, by party number (metrics).
    pub loaders: Mutex<HashMap<u64, Weak<Loader>>>,
    parties: AtomicU64,
}

impl Engine {
    pub fn new(base: Config, socket: PathBuf) -> Result<Arc<Engine>> {
        let id = EngineId::random().map_err(|e| {
            Error::node(
                NodeFailure::Local,
                format!("cannot draw the engine's identity: {e}"),
            )
        })?;
        let pool = engine_pool(&base)?;
        let fixed = budget_buffers(&pool);
        if base.register_buffers == Toggle::On {
            // Asked for: every read goes into registered chunks, so the
            // budget is faulted in now, before the first consumer's.
            pool.arena()
                .populate(0, pool.preferred_chunks() * pool.chunk_size());
            fixed.set_ready(pool.preferred_chunks());
        }
        let engine = Arc::new(Engine {
            id,
            socket,
            fixed,
            pool,
            base,
            dataset: Mutex::new(None),
            holds: Mutex::new(Holds::default()),
            whole: EngineReport::default(),
            loaders: Mutex::new(HashMap::new()),
            parties: AtomicU64::new(0),
        });
        // The arena's pages fault in off the consumers' path (the loaders
        // of a shared pool leave this to the engine), once the first batch
        // is out: faulting in 4 KiB shared pages takes about 1 ms per 1 MiB
        // of one CPU, which the first consumers' start would wait for.
        let e = Arc::downgrade(&engine);
        let _ = std::thread::Builder::new()
            .name("ringfeed-node-prefault".into())
            .spawn(move || prefault(e));
        Ok(engine)
    }

    /// A new party number (a connection), never 0.
    pub fn party(&self) -> u64 {
        // Relaxed: only distinct numbers are needed.
        self.parties.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The dataset (every consumer gives the same dataset keys), resolved
    /// and counted once, with the network threads for its remote shards;
    /// an error is the asking consumer's, and the next one tries again.
    pub fn dataset(&self) -> Result<Arc<Dataset>> {
        let mut known = self.dataset.locked();
        if let Some(s) = &*known {
            return Ok(s.clone());
        }
        let shards = crate::engine::resolve_counted(&self.base)?;
        let net = crate::engine::engine_net_threads(&self.base, &shards, &self.fixed)?;
        let s = Arc::new(Dataset { shards, net });
        *known = Some(s.clone());
        Ok(s)
    }

    /// Changes the table of holds by `change` (a release, an exit), then
    /// frees the batches it gave back outside the table's lock: dropping
    /// one gives its chunks back to the pool, which takes the pool's lock.
    /// The one way the engine frees a batch it handed out.
    pub fn release<B: IntoIterator<Item = Batch>>(
        &self,
        change: impl FnOnce(&mut Holds<Batch>) -> B,
    ) {
        let freed: Vec<Batch> = change(&mut self.holds.locked()).into_iter().collect();
        drop(freed);
    }

    /// The engine's side of every stats reply; `party` is the asking
    /// consumer (its own held batches are counted apart).
    pub fn node_stats(&self, party: Option<u64>) -> NodeStats {
        let holds = self.holds.locked();
        let t = holds.tally();
        NodeStats {
            pid: std::process::id(),
            engine: self.id,
            consumers: self.whole.consumers.load(Ordering::Acquire) as u64,
            consumers_attached: self.whole.attached.load(Ordering::Acquire) as u64,
            holders: self.whole.holders.load(Ordering::Acquire) as u64,
            batches_held: t.held,
            batches_held_by_this_consumer: party.map_or(0, |p| holds.pending_for(p) as u64),
            batches_kept: t.kept,
            batches_in_transit: t.in_transit,
        }
    }
}

fn prefault(e: Weak<Engine>) {
    let begun = Instant::now();
    let mut i = 0;
    while let Some(e) = e.upgrade() {
        if !e.whole.first_out.load(Ordering::Acquire) && begun.elapsed() < PREFAULT_AFTER {
            drop(e);
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let cs = e.pool.chunk_size();
        if i == e.pool.preferred_chunks() {
            // The I/O threads may pin them now: they are in.
            e.fixed.set_ready(i);
            return;
        }
        e.pool.arena().populate(i * cs, cs);
        i += 1;
    }
}

/// The budget's chunks (the arena's first `preferred_chunks`), as fixed
/// buffers the I/O threads may register once they are in; they keep the
/// pool, and so the arena, mapped while a ring holds them.
fn budget_buffers(pool: &Arc<ChunkPool>) -> Arc<FixedBuffers> {
    let cs = pool.chunk_size();
    let iovecs = (0..pool.preferred_chunks())
        .map(|i| libc::iovec {
            // SAFETY: i < preferred_chunks <= chunk_count: inside the arena.
            iov_base: unsafe { pool.arena().base().add(i * cs) }.cast(),
            iov_len: cs,
        })
        .collect();
    let page = match pool.arena().report().kind {
        MemoryKind::Normal => 4096,
        MemoryKind::Hugetlb | MemoryKind::Thp => 2 << 20,
    };
    // SAFETY: the buffers keep the pool, and so the arena, mapped for as
    // long as any ring that registered them holds them.
    let fixed = unsafe { FixedBuffers::new(iovecs) };
    Arc::new(fixed.owned_by(
        Arc::clone(pool) as Arc<dyn std::any::Any + Send + Sync>,
        page,
    ))
}

/// The engine's arena, in a memory file no one may map writable again, nor
/// shrink or grow (the engine's own mapping is older), on the NIC's NUMA
/// node, cut into the pool every consumer's loader joins.
fn engine_pool(cfg: &Config) -> Result<Arc<ChunkPool>> {
    let topo = topology::discover();
    let allowed = topo.allowed();
    let req = PlacementRequest {
        threads: 1,
        allowed: &allowed,
        claimed: &[],
        nic: None,
        cpus: cfg.cpus.as_deref(),
        numa_node: cfg.numa_node,
    };
    let node = topology::worker_cpus(&topo, &req).numa_node;
    let chunk = cfg.chunk();
    let chunks = (cfg.node_budget() / chunk).max(1) as usize;
    // Only the budget must have memory behind it (in huge pages, only it
    // is reserved: the node's huge pages need cover no more).
    let mut arena = Arena::new_backed(
        chunks * OVERSUBSCRIBE * chunk as usize,
        chunks * chunk as usize,
        ArenaOptions {
            kind: cfg.memory_kind,
            lock: Some(false),
            prefault: false,
            shared: true,
        },
        node,
    )?;
    // The budget is locked, not the address space past it.
    arena.lock_prefix(chunks * chunk as usize, cfg.lock_memory.required())?;
    let fd = arena.shared_fd().ok_or_else(|| {
        Error::internal(
            Fault::Invariant,
            "the node engine's arena is not in a memory file",
        )
    })?;
    // No new writable mapping, no write(2), no hole punched (FUTURE_WRITE),
    // no size change (SHRINK, GROW: a truncated file would take the pages
    // of every mapping, the engine's included, and fault them with
    // SIGBUS), and no seal taken back (SEAL).
    sock::seal(
        fd,
        libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
    )
    .map_err(|e| {
        Error::Memory(format!(
            "cannot seal the node engine's arena against writes and resizing: {e}"
        ))
    })?;
    Ok(ChunkPool::new_shared(
        arena,
        chunk as usize,
        chunks / cfg.node_streams().max(1),
        chunks,
    ))
}
