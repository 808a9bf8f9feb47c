//! Batches: N samples as flat descriptor arrays pointing into chunks.
//!
//! The arrays are laid out in the C ABI's own types (`ringfeed_sample`,
//! `ringfeed_field`), so handing a batch to C is filling one struct with three
//! pointers. A batch holds a reference to every chunk its fields point into;
//! dropping it (the consumer's `release`) gives them back.
//!
//! Keys and field names are copied into the batch's own tables, NUL
//! terminated for C: they are metadata of a few bytes per sample, not payload.
//! Two layout rules hold for every batch, and the C header promises them so
//! a consumer can read a whole batch with array operations instead of a
//! string comparison per field: the keys lie one after the other in sample
//! order (`samples[i + 1].key == samples[i].key + strlen(samples[i].key) + 1`),
//! and fields of the same name share one name pointer.
//!
//! This file holds the sealed, handed-out view ([`Batch`], its C-shaped
//! descriptors, [`SampleView`] for Rust consumers); `builder.rs` assembles
//! one ([`super::BatchBuilder`]) from tar members and held samples.

use std::ffi::c_char;
use std::sync::Arc;

use crate::memory::{ChunkPool, ChunkRef};

/// One field of a sample, as C sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawField {
    /// Field name, NUL-terminated (`"jpg"`, `"seg.png"`).
    pub name: *const c_char,
    /// First byte of the field's data (inside a chunk).
    pub data: *const u8,
    /// Bytes of data.
    pub len: usize,
}

/// One sample, as C sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawSample {
    /// Sample key, NUL-terminated (`"a/b/000123"`).
    pub key: *const c_char,
    /// The sample's fields: `field_count` entries of the batch's field array.
    pub fields: *const RawField,
    pub field_count: usize,
}

/// The source of a placeholder sample, which comes from no shard.
pub const NO_SOURCE: u32 = u32::MAX;

/// What a transform left with a batch.
#[derive(Default)]
pub(super) struct TransformKept {
    /// Memory the fields point into besides the chunks (the batch's
    /// tensors), kept while the batch lives.
    memory: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Samples the plan put in the batch that the transform left out
    /// (`image_errors = "skip"`): the batch stands for `len() + dropped`
    /// samples of the epoch's order.
    dropped: u32,
}

/// The names of the loader's shards, indexed by a sample's source.
pub type ShardNames = Arc<[Box<str>]>;
/// A sealed batch. Its pointers stay valid until it is dropped.
pub struct Batch {
    pub(super) samples: Vec<RawSample>,
    pub(super) fields: Vec<RawField>,
    pub(super) _keys: Vec<u8>,
    pub(super) _names: Vec<u8>,
    pub(super) sources: Vec<u32>,
    pub(super) shards: ShardNames,
    pub(super) chunks: Vec<ChunkRef>,
    pub(super) bytes: u64,
    pub(super) epoch: u64,
    pub(super) index: u64,
    /// Handed on towards the consumer (counted in the pool while alive).
    pub(super) out: bool,
    /// The worker whose chunks the batch holds (`NO_OWNER`: several).
    /// (`u32::MAX` for `NO_OWNER`: a narrow field keeps `Batch`, which
    /// `Next` carries by value, small.)
    pub(super) owner: u32,
    /// What a transform made of the batch (`engine::transform`), boxed
    /// for a thin pointer: `Next` carries a batch by value.
    pub(super) keep: Option<Box<TransformKept>>,
    pub(super) pool: Arc<ChunkPool>,
}

// SAFETY: the raw pointers point into the batch's own vectors and into chunks
// it holds references to; nothing writes to those bytes while it lives.
unsafe impl Send for Batch {}
// SAFETY: as above; the batch is read-only once sealed.
unsafe impl Sync for Batch {}

impl Batch {
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Payload bytes in the batch.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Position of the batch in the loader's output, from 0.
    pub fn index(&self) -> u64 {
        self.index
    }

    pub(crate) fn set_index(&mut self, index: u64) {
        self.index = index;
    }

    /// The batch goes on to the ring, towards a consumer.
    pub(crate) fn mark_out(&mut self) {
        if !self.out {
            self.out = true;
            self.pool.batch_out(self.owner());
        }
    }

    /// The worker whose chunks the batch holds (`NO_OWNER`: several).
    fn owner(&self) -> usize {
        match self.owner {
            u32::MAX => super::NO_OWNER,
            o => o as usize,
        }
    }

    pub fn raw_samples(&self) -> &[RawSample] {
        &self.samples
    }

    pub fn raw_fields(&self) -> &[RawField] {
        &self.fields
    }

    /// Points field `i` (of `raw_fields`) at `len` bytes at `data`, which
    /// `keep` must hold alive: a field replaced by what a transform made
    /// of it. The payload count follows.
    ///
    /// # Safety
    /// `data` must be valid for reads of `len` bytes for as long as what
    /// is passed to [`Batch::keep`] lives, and nothing may write there
    /// while the batch lives.
    pub(crate) unsafe fn retarget(&mut self, i: usize, data: *const u8, len: usize) {
        let f = &mut self.fields[i];
        self.bytes = self.bytes - f.len as u64 + len as u64;
        f.data = data;
        f.len = len;
    }

    /// The samples of the epoch's order this batch stands for: its own and
    /// those a transform left out ([`Batch::remove_samples`]). What a
    /// resume state counts.
    pub fn planned_len(&self) -> usize {
        self.samples.len() + self.keep.as_ref().map_or(0, |k| k.dropped as usize)
    }

    /// Takes the samples at `gone` (ascending indexes) out of the batch:
    /// the rest keep their order, their fields and the layout rules (keys
    /// one after the other, as the header promises). The chunks stay held
    /// (the kept fields may share them).
    pub(crate) fn remove_samples(&mut self, gone: &[usize]) {
        if gone.is_empty() {
            return;
        }
        let n = self.samples.len();
        let mut samples = Vec::with_capacity(n - gone.len());
        let mut fields = Vec::with_capacity(self.fields.len());
        let mut keys = Vec::with_capacity(self._keys.len());
        let mut sources = Vec::with_capacity(n - gone.len());
        let mut g = gone.iter().peekable();
        // Offsets first: the new vectors move while they grow.
        let mut at: Vec<(usize, usize, usize)> = Vec::with_capacity(n - gone.len());
        for (i, s) in self.samples.iter().enumerate() {
            if g.peek() == Some(&&i) {
                g.next();
                // SAFETY: the sample's fields are `field_count` entries of
                // the batch's own field array.
                let fs = unsafe { std::slice::from_raw_parts(s.fields, s.field_count) };
                self.bytes -= fs.iter().map(|f| f.len as u64).sum::<u64>();
                continue;
            }
            // SAFETY: the key is NUL-terminated in the batch's key table.
            let key = unsafe { std::ffi::CStr::from_ptr(s.key) }.to_bytes_with_nul();
            at.push((keys.len(), fields.len(), s.field_count));
            keys.extend_from_slice(key);
            // SAFETY: as above.
            fields
                .extend_from_slice(unsafe { std::slice::from_raw_parts(s.fields, s.field_count) });
            sources.push(self.sources.get(i).copied().unwrap_or(NO_SOURCE));
        }
        for (key, field, field_count) in at {
            samples.push(RawSample {
                // SAFETY: offsets into the vectors just filled.
                key: unsafe { keys.as_ptr().add(key) }.cast(),
                // SAFETY: as above.
                fields: unsafe { fields.as_ptr().add(field) },
                field_count,
            });
        }
        self.keep.get_or_insert_default().dropped += gone.len() as u32;
        self.samples = samples;
        self.fields = fields;
        self._keys = keys;
        self.sources = sources;
    }

    /// Keeps `memory` alive as long as the batch (see [`Batch::retarget`]);
    /// one memory a batch, the last given.
    pub(crate) fn keep(&mut self, memory: Box<dyn std::any::Any + Send + Sync>) {
        self.keep.get_or_insert_default().memory = Some(memory);
    }

    /// The name of the shard sample `i` came from (None for a placeholder,
    /// or past the end).
    pub fn source(&self, i: usize) -> Option<&str> {
        let s = *self.sources.get(i)?;
        self.shards.get(s as usize).map(|n| &**n)
    }

    /// The index of the shard sample `i` came from ([`NO_SOURCE`] for a
    /// placeholder; None past the end).
    pub fn source_index(&self, i: usize) -> Option<u32> {
        self.sources.get(i).copied()
    }

    /// Charges the chunks this batch holds to `owner`, a process keeping
    /// it (`ChunkPool::join_holder`): the streams that read them may read
    /// into others meanwhile.
    pub fn charge_to(&self, owner: usize) {
        for c in &self.chunks {
            self.pool.recharge(c, owner);
        }
    }

    /// The samples, for Rust consumers.
    pub fn samples(&self) -> impl Iterator<Item = SampleView<'_>> {
        self.samples.iter().map(|s| SampleView {
            raw: s,
            _batch: self,
        })
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index)
            .field("epoch", &self.epoch)
            .field("samples", &self.samples.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.chunks.clear();
        if self.out {
            self.pool.batch_out_gone(self.owner());
        }
        self.pool.batch_gone();
    }
}

/// A sample of a batch, borrowed.
pub struct SampleView<'a> {
    raw: &'a RawSample,
    _batch: &'a Batch,
}

impl<'a> SampleView<'a> {
    pub fn key(&self) -> &'a [u8] {
        // SAFETY: `key` points into the batch's string table, NUL-terminated,
        // alive as long as the borrowed batch.
        unsafe { std::ffi::CStr::from_ptr(self.raw.key) }.to_bytes()
    }

    /// `(name, data)` of each field.
    pub fn fields(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        // SAFETY: `fields` points at `field_count` entries of the batch's array.
        let fields = unsafe { std::slice::from_raw_parts(self.raw.fields, self.raw.field_count) };
        fields.iter().map(|f| {
            // SAFETY: the name is in the string table and the data in a chunk
            // the batch holds; neither changes while the batch lives.
            unsafe {
                (
                    std::ffi::CStr::from_ptr(f.name).to_bytes(),
                    std::slice::from_raw_parts(f.data, f.len),
                )
            }
        })
    }
}
