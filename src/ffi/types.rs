//! The C types of the ABI: the opaque loader handle, the batch descriptor
//! `ringfeed_batch` (over the sample and field views of
//! `crate::memory::batch`). `ringfeed_stats` and the constants that name
//! its values are the engine's `Counts` (`crate::engine::counters`).

use crate::memory::{RawField, RawSample};

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

impl ringfeed_batch {
    /// What `ringfeed_loader_next` writes before it has a batch, and
    /// `ringfeed_batch_release` after: every field zero or NULL.
    pub(super) const EMPTY: ringfeed_batch = ringfeed_batch {
        handle: 0,
        epoch: 0,
        index: 0,
        bytes: 0,
        sample_count: 0,
        samples: std::ptr::null(),
        field_count: 0,
        fields: std::ptr::null(),
    };
}
