//! The `Stats` snapshot the C ABI, the CLI and Python read: the counters
//! (`counters`) and the setup decided at open.

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::engine::counters::{
    Counts, RINGFEED_BACKEND_IO_URING, RINGFEED_BACKEND_THREADS, RINGFEED_MEMORY_HUGETLB,
    RINGFEED_MEMORY_NORMAL, RINGFEED_MEMORY_THP,
};
use crate::engine::loader::Loader;
use crate::fetch::BackendKind;
use crate::memory::MemoryKind;

/// A loader's counters ([`Counts`], which it dereferences to: `stats.reads`)
/// and the setup details that are text, as the JSON stats give them.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    #[serde(flatten)]
    pub counts: Counts,
    pub memory_kind: &'static str,
    pub memory_locked: bool,
    pub buffers_registered: bool,
    pub io_backend: &'static str,
    pub io_uring_flags: &'static str,
    /// CPU of each worker; empty when not pinned.
    pub worker_cpus: Vec<usize>,
    /// What decided `worker_cpus`: "nic-queues" (CPUs of the NIC's queue
    /// interrupts), "numa" (its NUMA node's), "allowed" (other allowed
    /// CPUs), "config" (`cpus`), or "none (...)" with the reason.
    pub placement: String,
    /// The NUMA node the arena is bound to; `None` when unknown or refused
    /// (the notes say why).
    pub numa_node: Option<usize>,
    /// Threads receiving the workers' HTTP ranges; 0 when each worker
    /// receives its own (thread backend, or local shards only).
    pub net_threads: usize,
    /// How local shards were read: "direct" (O_DIRECT), "buffered",
    /// "direct+buffered" (some files could not be direct: see the notes), or
    /// "none" (no local file opened yet).
    pub local_reads: &'static str,
    /// Local files opened so far with O_DIRECT, and buffered.
    pub local_files_direct: u64,
    pub local_files_buffered: u64,
    /// How cache entries were read, as `local_reads` says of local files.
    pub cache_reads: &'static str,
    /// Retries of network ranges, by failure kind.
    pub retries: std::collections::BTreeMap<&'static str, u64>,
    /// Why a preferred setting was not obtained (huge pages, mlock, io_uring...).
    pub notes: Vec<String>,
    /// Bytes of the arena registered with CUDA (`cuda_register`); 0 when
    /// not registered (the notes say why under "auto").
    pub cuda_registered: u64,
}

impl std::ops::Deref for Stats {
    type Target = Counts;
    fn deref(&self) -> &Counts {
        &self.counts
    }
}

impl Loader {
    pub fn stats(&self) -> Stats {
        let sh = &self.shared;
        let pool = &sh.pool;
        let usage = pool.usage();
        let report = pool.arena().report();
        let retries: std::collections::BTreeMap<_, _> =
            sh.net.stats.retries_by_kind().into_iter().collect();
        // Planned fixed buffers that a ring could not register are not in
        // use: its reads stay plain (the notes give the refusal).
        let registered = (self.setup.fixed.as_ref()).is_some_and(|f| f.refused().is_none());
        let mut c = Counts {
            size: std::mem::size_of::<Counts>() as u64,
            bytes_copied: pool.copied(),
            shards_total: sh.shards.len() as u64,
            chunk_size: pool.chunk_size() as u64,
            chunk_count: pool.chunk_count() as u64,
            chunks_in_use: usage.in_use as u64,
            chunks_peak: usage.peak as u64,
            arena_bytes: report.bytes as u64,
            elapsed_ns: sh.started.elapsed().as_nanos() as u64,
            // Relaxed: a statistic.
            http_requests: sh.net.stats.requests.load(Ordering::Relaxed),
            retries: retries.values().sum(),
            consumers: sh.plan_opts.consumers,
            consumer: sh.plan_opts.consumer,
            epoch: sh.progress.lock().unwrap_or_else(|p| p.into_inner()).epoch,
            workers: self.setup.workers as u32,
            memory_kind: match report.kind {
                MemoryKind::Hugetlb => RINGFEED_MEMORY_HUGETLB,
                MemoryKind::Thp => RINGFEED_MEMORY_THP,
                MemoryKind::Normal => RINGFEED_MEMORY_NORMAL,
            },
            io_backend: match self.setup.backend {
                BackendKind::IoUring => RINGFEED_BACKEND_IO_URING,
                BackendKind::Threads => RINGFEED_BACKEND_THREADS,
            },
            memory_locked: u32::from(report.locked),
            buffers_registered: u32::from(registered),
            ..Counts::default()
        };
        sh.counters.fill(&mut c);
        if let Some(spool) = &sh.cache {
            let k = spool.cache().stats.snapshot();
            c.cache_hits = k.hits;
            c.cache_misses = k.misses;
            c.cache_bytes = k.bytes_hit;
            c.cache_written = k.written;
            c.cache_bytes_written = k.bytes_written;
            c.cache_evictions = k.evictions;
            c.cache_corrupt = k.corrupt;
            c.cache_stale = k.stale;
            c.cache_uncached = k.uncached;
        }
        Stats {
            counts: c,
            memory_kind: report.kind.name(),
            memory_locked: report.locked,
            buffers_registered: registered,
            io_backend: self.setup.backend.name(),
            io_uring_flags: self.setup.uring_flags,
            worker_cpus: self.setup.cpus.clone(),
            placement: self.setup.placement.clone(),
            numa_node: report.numa_node,
            net_threads: sh.net_links.len(),
            local_reads: sh.direct.path_name(),
            local_files_direct: sh.direct.files().0,
            local_files_buffered: sh.direct.files().1,
            cache_reads: sh.cache_direct.path_name(),
            retries,
            notes: {
                let mut notes = self.setup.notes.clone();
                // A ring that could not register the buffers after all.
                notes.extend(self.setup.fixed.as_ref().and_then(|f| f.refused()));
                // Local files read buffered although direct was wanted.
                notes.extend(sh.direct.note());
                // Cache entries read buffered, or no more entries written.
                notes.extend(sh.cache_direct.note().map(|n| format!("cache: {n}")));
                notes.extend(sh.cache.as_ref().and_then(|s| s.cache().note()));
                // CUDA refused the arena after open (`cuda_register` auto).
                let refused = pool.arena().cuda_refused();
                notes.extend(refused.map(crate::memory::cuda::not_registered));
                notes
            },
            cuda_registered: pool.arena().cuda_registered() as u64,
        }
    }
}
