//! What a loader counts, written once: [`Counts`] is both the Rust stats'
//! numbers and the C `ringfeed_stats` (cbindgen reads this file), and the
//! atomics the threads bump are generated from a list of its field names.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

// The one list of what a loader counts. C reads it as `ringfeed_stats` (the
// header's name for it, see cbindgen.toml), Rust and JSON as `Stats`, which
// adds the setup details that are text. A new counter is a field here; a
// counter the threads bump is also a name in the `live!` list below (the
// compiler checks that every name there is a field here).
/// A snapshot of a loader's counters and setup.
///
/// In C (`ringfeed_stats`) the struct may grow: set `size` to
/// `sizeof(ringfeed_stats)` before `ringfeed_loader_stats`, which writes at
/// most that many bytes and sets `size` to the bytes it wrote (see the
/// header's conventions). New fields are only ever added at the end.
#[repr(C)]
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Bytes of this struct: set by the caller, then the bytes written.
    #[serde(skip)]
    pub size: u64,
    pub bytes_delivered: u64,
    pub samples_delivered: u64,
    pub batches_delivered: u64,
    pub bytes_read: u64,
    /// Payload bytes the engine copied (members split across chunks).
    pub bytes_copied: u64,
    pub reads: u64,
    pub members: u64,
    /// Members skipped because their name has no field part.
    pub members_skipped: u64,
    /// Tar entries that are not regular files (directories, links, ...).
    pub entries_skipped: u64,
    /// Samples of a short last batch dropped by `drop_last`.
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
    pub consumer_wait_ns: u64,
    pub time_to_first_batch_ns: u64,
    pub elapsed_ns: u64,
    /// Network requests sent (ranged GETs and HEADs, retries included).
    pub http_requests: u64,
    /// Network ranges retried, all kinds (the JSON stats give each kind).
    #[serde(skip)]
    pub retries: u64,
    /// Samples repeated to even out an epoch across consumers (`remainder: "pad"`).
    pub samples_padded: u64,
    /// Batches and samples replayed and not handed out to resume a state.
    pub batches_skipped: u64,
    pub samples_skipped: u64,
    /// Payload bytes the shuffle buffers copied out of sparse chunks (also in
    /// `bytes_copied`).
    pub shuffle_copied: u64,
    /// The epoch `ringfeed_loader_next` is in.
    pub epoch: u64,
    /// Consumers of the dataset (`world_size` × `loader_workers`), and this
    /// loader's index among them.
    pub consumers: u64,
    pub consumer: u64,
    pub workers: u32,
    /// One of `RINGFEED_MEMORY_*`.
    #[serde(skip)]
    pub memory_kind: i32,
    /// One of `RINGFEED_BACKEND_*`.
    #[serde(skip)]
    pub io_backend: i32,
    /// 1 when the arena is locked in memory (mlock; its pages are locked as
    /// they fault in, and a thread faults them all in after the first
    /// batch).
    #[serde(skip)]
    pub memory_locked: u32,
    /// 1 when the chunks are used as io_uring fixed buffers: each ring
    /// registers them once the arena's memory is in (shortly after the first
    /// batch; at open with `register_buffers: "on"`), plain reads before;
    /// 0 again once a ring is refused (the notes say why).
    #[serde(skip)]
    pub buffers_registered: u32,
    /// The cache tier (`cache_dir`): remote shards read from an entry, and
    /// looked up without one; data bytes read from entries; entries written
    /// and their data bytes; entries evicted, dropped as corrupt, dropped
    /// as stale (the object changed); remote shards read uncached (no room,
    /// no version, writes stopped: the notes say why).
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_bytes: u64,
    pub cache_written: u64,
    pub cache_bytes_written: u64,
    pub cache_evictions: u64,
    pub cache_corrupt: u64,
    pub cache_stale: u64,
    pub cache_uncached: u64,
    /// Network reads the workers keep in flight now (found as the reads go
    /// when `reads_in_flight` is auto).
    pub net_reads_in_flight: u64,
    /// The median time of a network read, request to last byte, over the
    /// last window of reads (0: not measured yet).
    pub net_read_time_us: u64,
    /// The bandwidth-delay product measured: the bytes in flight that the
    /// last window's rate and read time make.
    pub net_bdp_bytes: u64,
    /// Reads of a stream's next remote shard begun before the shard being
    /// read was done.
    pub reads_ahead: u64,
    /// Late network ranges re-requested on a fresh connection (`hedge`).
    pub hedges_sent: u64,
    /// Ranges a hedge finished: its answer came first.
    pub hedges_won: u64,
    /// The median first-byte latency of a network read, request to its
    /// answer's head, over the last window of reads that said it (0: not
    /// measured yet, a fixed `reads_in_flight`, or reads on the thread
    /// backend).
    pub net_first_byte_us: u64,
    /// Samples left out of their batch because their image or label could
    /// not be made (`image_errors = "skip"`).
    pub images_skipped: u64,
}

/// `ringfeed_stats.memory_kind`: explicit huge pages (MAP_HUGETLB).
pub const RINGFEED_MEMORY_HUGETLB: i32 = 1;
/// `ringfeed_stats.memory_kind`: transparent huge pages (MADV_HUGEPAGE).
pub const RINGFEED_MEMORY_THP: i32 = 2;
/// `ringfeed_stats.memory_kind`: normal pages.
pub const RINGFEED_MEMORY_NORMAL: i32 = 3;
/// `ringfeed_stats.io_backend`: io_uring.
pub const RINGFEED_BACKEND_IO_URING: i32 = 1;
/// `ringfeed_stats.io_backend`: plain threads with pread.
pub const RINGFEED_BACKEND_THREADS: i32 = 2;

/// The counters the threads bump, as atomics named like the fields of
/// [`Counts`] they fill. All Relaxed: statistics, read only for reporting.
macro_rules! live {
    ($($name:ident),* $(,)?) => {
        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub $name: AtomicU64,)*
        }

        impl Counters {
            /// Copies every live counter into its field of `c`.
            pub(super) fn fill(&self, c: &mut Counts) {
                // Relaxed: a report, nothing is read through it.
                $(c.$name = self.$name.load(Ordering::Relaxed);)*
            }
        }
    };
}

live!(
    bytes_read,
    reads,
    members,
    members_skipped,
    entries_skipped,
    shards_done,
    samples_dropped,
    bytes_delivered,
    samples_delivered,
    batches_delivered,
    consumer_wait_ns,
    time_to_first_batch_ns,
    epochs_done,
    samples_padded,
    batches_skipped,
    samples_skipped,
    shuffle_copied,
    reads_ahead,
    images_skipped,
);
