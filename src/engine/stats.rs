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
use crate::sync::Locked;

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
    /// Threads the `transform` splits a batch among (0: no transform).
    pub transform_threads: usize,
    /// The CPUs they run on: those of the I/O threads' NUMA node, or the
    /// configured `cpus`; empty when not pinned (one node, `pin_cpus`
    /// false).
    pub transform_cpus: Vec<usize>,
    /// The `transform`'s decode memory budget (`decode_memory`; 0: no
    /// transform), the most of it its decodes held at once, the images
    /// decoded smaller to fit it, and those refused as over it.
    pub decode_memory: u64,
    pub decode_memory_peak: u64,
    pub images_reduced_for_budget: u64,
    pub images_over_budget: u64,
    /// Samples the `transform` made images and labels of, handed out or
    /// ahead of the consumer (0: no transform).
    pub images_transformed: u64,
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
    /// Where the records of https sessions were opened: "kernel" (the
    /// kernel's TLS took the session after its handshake: `kernel_tls`),
    /// "user" (rustls, in this process), "kernel+user", or "none" (no https
    /// session yet); the notes say why a session stayed in user space.
    pub tls_records: &'static str,
    /// https sessions handed to the kernel's TLS, and opened in user space.
    pub tls_sessions_kernel: u64,
    pub tls_sessions_user: u64,
    /// Retries of network ranges, by failure kind.
    pub retries: std::collections::BTreeMap<&'static str, u64>,
    /// Why a preferred setting was not obtained (huge pages, mlock, io_uring...).
    pub notes: Vec<String>,
    /// Bytes of the arena (and of the `transform` tensors' slots)
    /// registered with CUDA (`cuda_register`); 0 when not registered (the
    /// notes say why under "auto").
    pub cuda_registered: u64,
    /// What holds the network reads' throughput where it is now:
    /// "consumer" (the ring is full: the consumer is behind), "memory" (a
    /// read found no chunk free: `memory_budget`), "target"
    /// (`target_throughput` reached), "server" (more reads in flight made
    /// each slower: the server, the link or the CPU is full), "latency"
    /// (more reads in flight still pay: the count is growing),
    /// "throttled" (the host answered 503 SlowDown: as many reads as its
    /// paced request rate keeps busy), "probing" (too few reads yet),
    /// "reads_in_flight" (a fixed count was given).
    pub limited_by: &'static str,
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
            hedges_sent: sh.net.stats.hedges_sent.load(Ordering::Relaxed),
            hedges_won: sh.net.stats.hedges_won.load(Ordering::Relaxed),
            consumers: sh.plan_opts.consumers,
            consumer: sh.plan_opts.consumer,
            epoch: sh.progress.locked().epoch,
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
        let reads = sh.reads.report(sh.channel.blocked_pushers() > 0);
        c.net_reads_in_flight = reads.total as u64;
        c.net_read_time_us = reads.read_time_us;
        c.net_bdp_bytes = reads.bdp_bytes;
        c.net_first_byte_us = reads.first_byte_us;
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
            transform_threads: sh.transform.as_ref().map_or(0, |t| t.threads()),
            transform_cpus: sh
                .transform
                .as_ref()
                .map_or(Vec::new(), |t| t.cpus().to_vec()),
            decode_memory: sh.transform.as_ref().map_or(0, |t| t.budget().limit()),
            decode_memory_peak: sh.transform.as_ref().map_or(0, |t| t.budget().peak()),
            images_reduced_for_budget: sh.transform.as_ref().map_or(0, |t| t.budget().reduced()),
            images_over_budget: sh.transform.as_ref().map_or(0, |t| t.budget().refused()),
            images_transformed: sh.transform.as_ref().map_or(0, |t| t.transformed()),
            net_threads: sh.net_links.len(),
            local_reads: sh.direct.path_name(),
            local_files_direct: sh.direct.files().0,
            local_files_buffered: sh.direct.files().1,
            cache_reads: sh.cache_direct.path_name(),
            tls_records: sh.net.tls.records(),
            tls_sessions_kernel: sh.net.tls.sessions_kernel.load(Ordering::Relaxed),
            tls_sessions_user: sh.net.tls.sessions_user.load(Ordering::Relaxed),
            retries,
            notes: {
                let mut notes = self.setup.notes.clone();
                // A ring that could not register the buffers after all.
                notes.extend(self.setup.fixed.as_ref().and_then(|f| f.refused()));
                // Local files read buffered although direct was wanted.
                notes.extend(sh.direct.note());
                notes.extend(sh.transform.iter().flat_map(|t| t.notes()));
                // Cache entries read buffered, or no more entries written.
                notes.extend(sh.cache_direct.note().map(|n| format!("cache: {n}")));
                notes.extend(sh.cache.as_ref().and_then(|s| s.cache().note()));
                // CUDA refused the arena after open (`cuda_register` auto).
                let refused = pool.arena().cuda_refused();
                notes.extend(refused.map(crate::memory::cuda::not_registered));
                // The hosts that throttled, and the rate they are paced at.
                notes.extend(sh.net.pace.notes());
                // https sessions left in user space, and why.
                notes.extend(sh.net.tls.notes(crate::fetch::kernel_tls_refused()));
                // The notes quote errors and URLs: no credential through them.
                notes
                    .into_iter()
                    .map(|n| crate::redact::text(&n).into_owned())
                    .collect()
            },
            cuda_registered: (pool.arena().cuda_registered()
                + sh.transform.as_ref().map_or(0, |t| t.cuda_registered()))
                as u64,
            limited_by: reads.limit,
        }
    }
}

/// A counter of the stats: its JSON field, its metric name (Prometheus
/// conventions: `ringfeed_` prefix, base units, `_total` for counters),
/// what divides the field to reach the unit, and its help line.
const COUNTERS: &[(&str, &str, f64, &str)] = &[
    (
        "images_transformed",
        "ringfeed_images_transformed_total",
        1.0,
        "Samples the transform made images and labels of.",
    ),
    (
        "tls_sessions_kernel",
        "ringfeed_tls_sessions_kernel_total",
        1.0,
        "https sessions whose records the kernel's TLS opened.",
    ),
    (
        "tls_sessions_user",
        "ringfeed_tls_sessions_user_total",
        1.0,
        "https sessions whose records were opened in user space.",
    ),
    (
        "bytes_delivered",
        "ringfeed_delivered_bytes_total",
        1.0,
        "Payload bytes handed to consumers.",
    ),
    (
        "samples_delivered",
        "ringfeed_delivered_samples_total",
        1.0,
        "Samples handed to consumers.",
    ),
    (
        "batches_delivered",
        "ringfeed_delivered_batches_total",
        1.0,
        "Batches handed to consumers.",
    ),
    (
        "bytes_read",
        "ringfeed_read_bytes_total",
        1.0,
        "Bytes read from shards (files, network, cache).",
    ),
    (
        "reads_ahead",
        "ringfeed_reads_ahead_total",
        1.0,
        "Reads of a stream's next remote shard begun before the current one was done.",
    ),
    (
        "bytes_copied",
        "ringfeed_copied_bytes_total",
        1.0,
        "Payload bytes the engine copied.",
    ),
    (
        "reads",
        "ringfeed_reads_total",
        1.0,
        "Reads submitted (file reads and ranged GETs).",
    ),
    (
        "members",
        "ringfeed_tar_members_total",
        1.0,
        "Tar members walked.",
    ),
    (
        "members_skipped",
        "ringfeed_tar_members_skipped_total",
        1.0,
        "Members skipped for a name without a field part.",
    ),
    (
        "entries_skipped",
        "ringfeed_tar_entries_skipped_total",
        1.0,
        "Tar entries that are not regular files.",
    ),
    (
        "samples_dropped",
        "ringfeed_dropped_samples_total",
        1.0,
        "Samples of short last batches dropped (drop_last).",
    ),
    (
        "samples_padded",
        "ringfeed_padded_samples_total",
        1.0,
        "Samples repeated to even out epochs.",
    ),
    (
        "batches_skipped",
        "ringfeed_resume_skipped_batches_total",
        1.0,
        "Batches replayed, not handed out, to resume.",
    ),
    (
        "samples_skipped",
        "ringfeed_resume_skipped_samples_total",
        1.0,
        "Samples replayed, not handed out, to resume.",
    ),
    (
        "images_skipped",
        "ringfeed_images_skipped_total",
        1.0,
        "Samples left out of their batch for an image or label that could not be made.",
    ),
    (
        "shuffle_copied",
        "ringfeed_shuffle_copied_bytes_total",
        1.0,
        "Bytes the shuffle buffers copied out of sparse chunks.",
    ),
    (
        "shards_done",
        "ringfeed_shards_done_total",
        1.0,
        "Shards walked to their end, over all epochs.",
    ),
    (
        "epochs_done",
        "ringfeed_epochs_done_total",
        1.0,
        "Epochs finished.",
    ),
    (
        "http_requests",
        "ringfeed_http_requests_total",
        1.0,
        "Network requests sent (GETs and HEADs, retries included).",
    ),
    (
        "consumer_wait_ns",
        "ringfeed_consumer_wait_seconds_total",
        1e9,
        "Time consumers waited in next().",
    ),
    (
        "cache_hits",
        "ringfeed_cache_hits_total",
        1.0,
        "Remote shards read from the local cache.",
    ),
    (
        "cache_misses",
        "ringfeed_cache_misses_total",
        1.0,
        "Remote shards looked up in the cache and not found.",
    ),
    (
        "cache_bytes",
        "ringfeed_cache_read_bytes_total",
        1.0,
        "Data bytes read from cache entries.",
    ),
    (
        "cache_written",
        "ringfeed_cache_written_entries_total",
        1.0,
        "Cache entries written.",
    ),
    (
        "cache_bytes_written",
        "ringfeed_cache_written_bytes_total",
        1.0,
        "Data bytes written to cache entries.",
    ),
    (
        "cache_evictions",
        "ringfeed_cache_evictions_total",
        1.0,
        "Cache entries evicted (LRU).",
    ),
    (
        "cache_corrupt",
        "ringfeed_cache_corrupt_entries_total",
        1.0,
        "Cache entries dropped as corrupt.",
    ),
    (
        "cache_stale",
        "ringfeed_cache_stale_entries_total",
        1.0,
        "Cache entries dropped because the object changed.",
    ),
    (
        "cache_uncached",
        "ringfeed_cache_uncached_shards_total",
        1.0,
        "Remote shards read without caching them.",
    ),
];

/// The gauges: JSON field, metric name, divisor, help.
const GAUGES: &[(&str, &str, f64, &str)] = &[
    (
        "chunk_size",
        "ringfeed_chunk_size_bytes",
        1.0,
        "Bytes per chunk.",
    ),
    (
        "chunk_count",
        "ringfeed_chunks",
        1.0,
        "Chunks in the arena.",
    ),
    (
        "chunks_in_use",
        "ringfeed_chunks_in_use",
        1.0,
        "Chunks holding data now.",
    ),
    (
        "chunks_peak",
        "ringfeed_chunks_in_use_peak",
        1.0,
        "Most chunks in use at once.",
    ),
    (
        "arena_bytes",
        "ringfeed_arena_bytes",
        1.0,
        "Bytes of the arena.",
    ),
    (
        "shards_total",
        "ringfeed_shards",
        1.0,
        "Shards in the dataset.",
    ),
    ("workers", "ringfeed_workers", 1.0, "Worker threads."),
    (
        "net_reads_in_flight",
        "ringfeed_net_reads_in_flight",
        1.0,
        "Network reads kept in flight now.",
    ),
    (
        "net_read_time_us",
        "ringfeed_net_read_seconds",
        1e6,
        "Median time of a network read, request to last byte.",
    ),
    (
        "net_bdp_bytes",
        "ringfeed_net_bandwidth_delay_bytes",
        1.0,
        "Bytes in flight the measured rate and read time make.",
    ),
    (
        "net_first_byte_us",
        "ringfeed_net_first_byte_seconds",
        1e6,
        "Median first-byte latency of a network read, request to the answer's head.",
    ),
    (
        "epoch",
        "ringfeed_epoch",
        1.0,
        "The epoch consumers are in.",
    ),
    (
        "time_to_first_batch_ns",
        "ringfeed_first_batch_seconds",
        1e9,
        "Time from open to the first batch.",
    ),
    (
        "elapsed_ns",
        "ringfeed_uptime_seconds",
        1e9,
        "Time since the loader opened.",
    ),
];

/// The stats JSON (`ringfeed_loader_stats_json`'s text) as metrics in the
/// Prometheus text format (version 0.0.4): the counters, the gauges, the
/// retries by kind, and an info metric with the setup.
pub fn prometheus(stats_json: &str) -> crate::error::Result<String> {
    use std::fmt::Write as _;
    let v: serde_json::Value = serde_json::from_str(stats_json).map_err(|e| {
        crate::error::Error::internal(crate::error::Fault::Json, format!("stats JSON: {e}"))
    })?;
    let stats = v.get("stats").unwrap_or(&v);
    let num = |k: &str| stats.get(k).and_then(serde_json::Value::as_f64);
    let mut out = String::new();
    for (kind, table) in [("counter", COUNTERS), ("gauge", GAUGES)] {
        for &(field, name, div, help) in table {
            let Some(x) = num(field) else {
                continue;
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}",
                x / div
            );
        }
    }
    if let Some(r) = stats.get("retries").and_then(serde_json::Value::as_object) {
        let name = "ringfeed_retries_total";
        let _ = writeln!(
            out,
            "# HELP {name} Network ranges retried, by failure kind.\n# TYPE {name} counter"
        );
        for (kind, n) in r {
            let _ = writeln!(
                out,
                "{name}{{kind=\"{}\"}} {}",
                label(kind),
                n.as_f64().unwrap_or(0.0)
            );
        }
    }
    let text = |k: &str| {
        stats
            .get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    };
    let name = "ringfeed_info";
    let _ = writeln!(
        out,
        "# HELP {name} The loader's setup.\n# TYPE {name} gauge\n\
         {name}{{version=\"{}\",io_backend=\"{}\",memory_kind=\"{}\",local_reads=\"{}\",cache_reads=\"{}\",tls_records=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        label(text("io_backend")),
        label(text("memory_kind")),
        label(text("local_reads")),
        label(text("cache_reads")),
        label(text("tls_records")),
    );
    Ok(out)
}

/// A label value escaped as the text format wants (`\`, `"`, line feeds).
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
