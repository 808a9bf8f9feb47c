//! `ringfeed_stats`, the C view of a loader's counters and setup, and the
//! entry point that fills it (`ringfeed_loader_stats`); the JSON form with
//! the setup notes is `ringfeed_loader_stats_json` in `loader.rs`.

use super::boundary::{boundary, check, lookup};
use super::status::RINGFEED_OK;
use super::types::{
    RINGFEED_BACKEND_IO_URING, RINGFEED_BACKEND_THREADS, RINGFEED_MEMORY_HUGETLB,
    RINGFEED_MEMORY_NORMAL, RINGFEED_MEMORY_THP, ringfeed_loader,
};

/// A snapshot of a loader's counters and setup.
#[repr(C)]
#[derive(Default)]
pub struct ringfeed_stats {
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
    pub memory_kind: i32,
    /// One of `RINGFEED_BACKEND_*`.
    pub io_backend: i32,
    /// 1 when the arena is locked in memory (mlock).
    pub memory_locked: u32,
    /// 1 when the chunks are registered with io_uring as fixed buffers.
    pub buffers_registered: u32,
}

/// Writes a snapshot of the loader's counters to `*out`.
///
/// # Safety
/// `out` must be NULL or point to a writable `ringfeed_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfeed_loader_stats(
    loader: *mut ringfeed_loader,
    out: *mut ringfeed_stats,
) -> i32 {
    boundary(|| {
        check(out, "out")?;
        let s = lookup(loader)?.stats();
        let v = ringfeed_stats {
            bytes_delivered: s.bytes_delivered,
            samples_delivered: s.samples_delivered,
            batches_delivered: s.batches_delivered,
            bytes_read: s.bytes_read,
            bytes_copied: s.bytes_copied,
            reads: s.reads,
            members: s.members,
            members_skipped: s.members_skipped,
            entries_skipped: s.entries_skipped,
            samples_dropped: s.samples_dropped,
            shards_total: s.shards_total,
            shards_done: s.shards_done,
            epochs_done: s.epochs_done,
            chunk_size: s.chunk_size,
            chunk_count: s.chunk_count,
            chunks_in_use: s.chunks_in_use,
            chunks_peak: s.chunks_peak,
            arena_bytes: s.arena_bytes,
            consumer_wait_ns: s.consumer_wait_ns,
            time_to_first_batch_ns: s.time_to_first_batch_ns,
            elapsed_ns: s.elapsed_ns,
            http_requests: s.http_requests,
            retries: s.retries.values().sum(),
            samples_padded: s.samples_padded,
            batches_skipped: s.batches_skipped,
            samples_skipped: s.samples_skipped,
            shuffle_copied: s.shuffle_copied,
            epoch: s.epoch,
            consumers: s.consumers,
            consumer: s.consumer,
            workers: s.workers as u32,
            memory_kind: match s.memory_kind {
                "hugetlb" => RINGFEED_MEMORY_HUGETLB,
                "thp" => RINGFEED_MEMORY_THP,
                _ => RINGFEED_MEMORY_NORMAL,
            },
            io_backend: match s.io_backend {
                "io_uring" => RINGFEED_BACKEND_IO_URING,
                _ => RINGFEED_BACKEND_THREADS,
            },
            memory_locked: u32::from(s.memory_locked),
            buffers_registered: u32::from(s.buffers_registered),
        };
        // SAFETY: checked non-NULL and aligned; the caller says it is writable.
        unsafe { out.write(v) };
        Ok(RINGFEED_OK)
    })
}
