//! The C types of the ABI: the opaque loader handle, the batch descriptor
//! `ringfeed_batch` (over the sample and field views of
//! `crate::memory::batch`), and the constants that name the values of
//! `ringfeed_stats` fields. `ringfeed_stats` itself is in `stats.rs`.

use crate::memory::{RawField, RawSample};

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

/// An open loader. Opaque: only ever used through a pointer.
pub struct ringfeed_loader {
    _private: [u8; 0],
}

/// A batch handed out by `ringfeed_loader_next`. Every pointer in it stays
/// valid until `ringfeed_batch_release` is called with it.
///
/// Two layout rules let a consumer read a batch with array operations: the
/// samples' keys lie one after the other in sample order, each
/// NUL-terminated (`samples[i + 1].key == samples[i].key +
/// strlen(samples[i].key) + 1`), and the fields of one name share one
/// `name` pointer within the batch (compare pointers, not strings).
#[repr(C)]
pub struct ringfeed_batch {
    /// Identifies the batch to `ringfeed_batch_release`; 0 when empty.
    pub handle: u64,
    /// Epoch the batch belongs to, from 0.
    pub epoch: u64,
    /// Sequence number of the batch in the loader's output, from 0: the
    /// order in which `ringfeed_loader_next` handed batches out.
    pub index: u64,
    /// Payload bytes in all fields.
    pub bytes: u64,
    pub sample_count: usize,
    /// `sample_count` samples.
    pub samples: *const RawSample,
    pub field_count: usize,
    /// Every field of every sample, in sample order (`samples[i].fields`
    /// points into this array).
    pub fields: *const RawField,
}
