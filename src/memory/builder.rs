//! Assembling batches: [`BatchBuilder`] gathers the samples of one batch
//! from the tar walk (or from [`HeldSample`]s that waited in a shuffle
//! buffer) and seals them into a [`Batch`], whose C-shaped descriptor arrays
//! and string tables are laid out as `batch.rs` describes.
//!
//! Pointers to the key and name tables are stored as offsets while the
//! tables grow, and fixed up once when the batch is sealed.

use std::sync::Arc;

use crate::memory::{Batch, ChunkPool, ChunkRef, RawField, RawSample, ShardNames};

/// A short array kept in place, spilling to the heap when it outgrows `N`.
/// A held sample is read once, at a random place of a large shuffle buffer:
/// everything in one place is one cache miss instead of one per allocation,
/// and no allocator call per sample.
struct Small<T: Copy, const N: usize> {
    len: usize,
    inline: [T; N],
    heap: Vec<T>,
}

impl<T: Copy, const N: usize> Small<T, N> {
    fn new(fill: T) -> Self {
        Small {
            len: 0,
            inline: [fill; N],
            heap: Vec::new(),
        }
    }

    fn extend(&mut self, items: &[T]) {
        if self.heap.is_empty() && self.len + items.len() <= N {
            self.inline[self.len..self.len + items.len()].copy_from_slice(items);
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.extend_from_slice(items);
        }
        self.len += items.len();
    }

    fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

/// Room for a key and two or three field names of usual WebDataset length.
const HELD_NAMES: usize = 48;
/// Most WebDataset samples have 1-3 fields.
const HELD_FIELDS: usize = 3;

/// A sample outside any batch (waiting in a shuffle buffer): key and field
/// names, pointers into chunks, and references to those chunks.
pub struct HeldSample {
    /// The key, then each field name, each NUL-terminated.
    names: Small<u8, HELD_NAMES>,
    /// Per field: name offset in `names`, data, length.
    fields: Small<(usize, *const u8, usize), HELD_FIELDS>,
    /// The run of the first field, kept inline: the shuffle buffer reads it
    /// for every sample it takes out, at a random place in the buffer, and a
    /// separate allocation would be one more cache miss each time.
    chunk: Option<ChunkRef>,
    /// Other runs (fields in different chunks, spills).
    more: Vec<ChunkRef>,
    bytes: u64,
    /// Index of the shard the sample came from (`NO_SOURCE`: none).
    source: u32,
}

// SAFETY: the pointers point into chunks the sample holds references to;
// nothing writes there while it lives, so it may move between threads.
unsafe impl Send for HeldSample {}

impl HeldSample {
    pub fn new(key: &[u8], source: u32) -> HeldSample {
        let mut names = Small::new(0);
        names.extend(key);
        names.extend(&[0]);
        HeldSample {
            names,
            fields: Small::new((0, std::ptr::null(), 0)),
            chunk: None,
            more: Vec::new(),
            bytes: 0,
            source,
        }
    }

    pub fn has_field(&self, name: &[u8]) -> bool {
        self.fields
            .as_slice()
            .iter()
            .any(|&(off, _, _)| cstr_at(self.names.as_slice(), off) == name)
    }

    pub fn add_field(&mut self, name: &[u8], chunk: &ChunkRef, data: *const u8, len: usize) {
        let off = self.names.len;
        self.names.extend(name);
        self.names.extend(&[0]);
        self.fields.extend(&[(off, data, len)]);
        self.bytes += len as u64;
        match &self.chunk {
            None => self.chunk = Some(chunk.clone()),
            Some(c) if c.same_run(chunk) => {}
            Some(_) => {
                if !self.more.iter().any(|c| c.same_run(chunk)) {
                    self.more.push(chunk.clone());
                }
            }
        }
    }

    /// Payload bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The runs the sample's fields point into.
    pub fn chunks(&self) -> impl Iterator<Item = &ChunkRef> {
        self.chunk.iter().chain(self.more.iter())
    }

    /// Copies every field into `dest` from `at` (which must hold `bytes()`
    /// more bytes, 64-byte aligned per field), and points the sample there.
    /// Returns the end offset.
    ///
    /// # Safety
    /// `dest` from `at` has room for the fields as laid out here, and no
    /// one else writes that range.
    pub unsafe fn move_into(&mut self, dest: &ChunkRef, mut at: usize) -> usize {
        for f in self.fields.as_mut_slice() {
            // SAFETY: the caller gives room; the source lives in a chunk this
            // sample still references, a different range from the destination.
            unsafe {
                let to = dest.ptr().add(at);
                std::ptr::copy_nonoverlapping(f.1, to, f.2);
                f.1 = to;
            }
            at = (at + f.2 + 63) & !63;
        }
        self.more.clear();
        self.chunk = Some(dest.clone());
        at
    }

    /// Bytes `move_into` uses, alignment included.
    pub fn moved_size(&self) -> usize {
        self.fields
            .as_slice()
            .iter()
            .map(|f| (f.2 + 63) & !63)
            .sum()
    }
}

/// Builds one batch. Pointers to the key and name tables are stored as
/// offsets while they grow, and fixed up once in [`BatchBuilder::finish`].
pub struct BatchBuilder {
    samples: Vec<RawSample>,
    fields: Vec<RawField>,
    /// Every key, NUL-terminated, in sample order.
    keys: Vec<u8>,
    /// Each distinct field name once, NUL-terminated.
    names: Vec<u8>,
    /// (offset, length) in `names` of each distinct name.
    name_at: Vec<(usize, usize)>,
    /// Index in `name_at` of the last name interned: samples list their
    /// fields in the same order, so the next name is most often the next one.
    last_name: usize,
    /// Each sample's shard (`NO_SOURCE` for placeholders).
    sources: Vec<u32>,
    chunks: Vec<ChunkRef>,
    bytes: u64,
    /// Index in `fields` of the open sample's first field.
    open_from: Option<usize>,
    batch_size: usize,
}

// SAFETY: the builder's pointers are offsets or point into chunks it holds
// references to; moving it to another thread (the epoch carry) is sound.
unsafe impl Send for BatchBuilder {}

fn offset_ptr<T>(off: usize) -> *const T {
    std::ptr::without_provenance(off)
}

/// `s` up to its first NUL: C strings end there, and tar names never hold one.
fn c_prefix(s: &[u8]) -> &[u8] {
    &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
}

impl BatchBuilder {
    pub fn new(batch_size: usize) -> Self {
        BatchBuilder {
            samples: Vec::with_capacity(batch_size),
            // Most WebDataset samples have 1-4 fields.
            fields: Vec::with_capacity(batch_size * 2),
            // WebDataset keys are mostly 10-30 bytes.
            keys: Vec::with_capacity(batch_size * 24),
            names: Vec::new(),
            name_at: Vec::new(),
            last_name: 0,
            sources: Vec::with_capacity(batch_size),
            chunks: Vec::new(),
            bytes: 0,
            open_from: None,
            batch_size,
        }
    }

    /// Complete samples in the batch.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.open_from.is_none()
    }

    /// Offset of `name` in the name table, added there the first time.
    fn intern_name(&mut self, name: &[u8]) -> usize {
        let name = c_prefix(name);
        let same = |&(off, len): &(usize, usize)| self.names[off..off + len] == *name;
        let n = self.name_at.len();
        // Try the name after the last one first, then every name: a batch
        // has a handful of distinct names, so a scan is cheaper than a hash.
        let next = (self.last_name + 1) % n.max(1);
        let found = if n > 0 && same(&self.name_at[next]) {
            Some(next)
        } else {
            self.name_at.iter().position(same)
        };
        let i = found.unwrap_or_else(|| {
            let off = self.names.len();
            self.names.extend_from_slice(name);
            self.names.push(0);
            self.name_at.push((off, name.len()));
            n
        });
        self.last_name = i;
        self.name_at[i].0
    }

    /// Opens a sample from shard `source`; its fields follow with `add_field`.
    pub fn begin_sample(&mut self, key: &[u8], source: u32) {
        debug_assert!(self.open_from.is_none());
        let off = self.keys.len();
        self.keys.extend_from_slice(c_prefix(key));
        self.keys.push(0);
        self.open_from = Some(self.fields.len());
        self.samples.push(RawSample {
            key: offset_ptr(off),
            fields: std::ptr::null(),
            field_count: 0,
        });
        self.sources.push(source);
    }

    /// True if the open sample already has a field of this name.
    pub fn open_sample_has(&self, name: &[u8]) -> bool {
        let Some(from) = self.open_from else {
            return false;
        };
        self.fields[from..]
            .iter()
            .any(|f| cstr_at(&self.names, f.name.addr()) == name)
    }

    /// Adds a field of the open sample: `len` bytes at `data`, inside `chunk`.
    pub fn add_field(&mut self, name: &[u8], chunk: &ChunkRef, data: *const u8, len: usize) {
        debug_assert!(self.open_from.is_some());
        let name = self.intern_name(name);
        self.fields.push(RawField {
            name: offset_ptr(name),
            data,
            len,
        });
        self.bytes += len as u64;
        if !self.chunks.last().is_some_and(|c| c.same_run(chunk)) {
            self.chunks.push(chunk.clone());
        }
    }

    /// Adds a held sample as one complete sample.
    pub fn push_held(&mut self, h: HeldSample) {
        let names = h.names.as_slice();
        self.begin_sample(cstr_at(names, 0), h.source);
        for &(off, data, len) in h.fields.as_slice() {
            let name = self.intern_name(cstr_at(names, off));
            self.fields.push(RawField {
                name: offset_ptr(name),
                data,
                len,
            });
        }
        self.bytes += h.bytes;
        for c in h.chunk.into_iter().chain(h.more) {
            if !self.chunks.last().is_some_and(|l| l.same_run(&c)) {
                self.chunks.push(c);
            }
        }
        self.end_sample();
    }

    /// Closes the open sample.
    pub fn end_sample(&mut self) {
        if let Some(from) = self.open_from.take() {
            let s = self.samples.last_mut().expect("an open sample exists");
            s.fields = offset_ptr(from);
            s.field_count = self.fields.len() - from;
        }
    }

    /// Moves every complete sample of `other` into `self`, calling `full` with
    /// `self` each time it reaches `batch_size`.
    pub fn absorb(&mut self, other: BatchBuilder, mut full: impl FnMut(&mut BatchBuilder)) {
        let mut attached = false;
        for (s, &source) in other.samples.iter().zip(&other.sources) {
            self.begin_sample(cstr_at(&other.keys, s.key.addr()), source);
            let from = s.fields.addr();
            for f in &other.fields[from..from + s.field_count] {
                let name = self.intern_name(cstr_at(&other.names, f.name.addr()));
                self.fields.push(RawField {
                    name: offset_ptr(name),
                    data: f.data,
                    len: f.len,
                });
                self.bytes += f.len as u64;
            }
            // The sample's chunks are among `other`'s: the first sample that
            // lands in a builder brings references to all of them.
            if !attached {
                self.chunks.extend(other.chunks.iter().cloned());
                attached = true;
            }
            self.end_sample();
            if self.len() == self.batch_size {
                full(self);
                attached = false;
            }
        }
    }

    /// Seals the batch. `epoch` and `index` identify it; `owner` is the
    /// worker whose chunks it holds (`NO_OWNER` when several);
    /// `shards` names the samples' sources.
    pub fn finish(
        &mut self,
        pool: &Arc<ChunkPool>,
        shards: &ShardNames,
        epoch: u64,
        index: u64,
        owner: usize,
    ) -> Batch {
        self.end_sample();
        let mut b = std::mem::replace(self, BatchBuilder::new(self.batch_size));
        let names = b.names.as_ptr();
        for f in &mut b.fields {
            // SAFETY: the offset was returned by `intern_name`, inside `names`.
            f.name = unsafe { names.add(f.name.addr()) }.cast();
        }
        let keys = b.keys.as_ptr();
        let fbase = b.fields.as_ptr();
        for s in &mut b.samples {
            // SAFETY: offsets were taken from `keys` and `fields` above.
            unsafe {
                s.key = keys.add(s.key.addr()).cast();
                s.fields = fbase.add(s.fields.addr());
            }
        }
        pool.batch_born();
        Batch {
            samples: b.samples,
            fields: b.fields,
            _keys: b.keys,
            _names: b.names,
            sources: b.sources,
            shards: Arc::clone(shards),
            chunks: b.chunks,
            bytes: b.bytes,
            epoch,
            index,
            out: false,
            keep: None,
            owner: u32::try_from(owner).unwrap_or(u32::MAX),
            pool: Arc::clone(pool),
        }
    }
}

fn cstr_at(strings: &[u8], off: usize) -> &[u8] {
    let end = strings[off..].iter().position(|&b| b == 0).unwrap_or(0);
    &strings[off..off + end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Arena, ArenaOptions, MemoryKind};

    #[test]
    fn held_samples_keep_names_and_fields_in_place_or_spilled() {
        let arena = Arena::new(
            2 * 4096,
            ArenaOptions {
                kind: Some(MemoryKind::Normal),
                lock: Some(false),
                prefault: false,
                shared: false,
            },
        )
        .unwrap();
        let pool = ChunkPool::new(arena, 4096);
        let a = pool.acquire(1, false).unwrap().unwrap();
        let b = pool.acquire(1, false).unwrap().unwrap();
        // Short: everything inline. Long: a 100-byte key and 5 fields spill.
        for (key, n) in [(b"k1".to_vec(), 2usize), (vec![b'x'; 100], 5)] {
            let mut h = HeldSample::new(&key, 0);
            for i in 0..n {
                let name = format!("field{i}");
                let chunk = if i % 2 == 0 { &a } else { &b };
                // SAFETY: i * 8 < 4096, inside the chunk.
                let p = unsafe { chunk.ptr().add(i * 8) };
                h.add_field(name.as_bytes(), chunk, p, i + 1);
                assert!(h.has_field(name.as_bytes()));
            }
            assert!(!h.has_field(b"nope"));
            assert_eq!(h.chunks().count(), if n > 1 { 2 } else { 1 });
            let mut builder = BatchBuilder::new(1);
            builder.push_held(h);
            let shards: ShardNames = vec!["s0.tar".into()].into();
            let batch = builder.finish(&pool, &shards, 0, 0, crate::memory::NO_OWNER);
            assert_eq!(batch.source(0), Some("s0.tar"));
            assert_eq!(batch.source(1), None);
            let s = batch.samples().next().unwrap();
            assert_eq!(s.key(), key.as_slice());
            let fields: Vec<(Vec<u8>, usize)> =
                s.fields().map(|(f, d)| (f.to_vec(), d.len())).collect();
            let want: Vec<(Vec<u8>, usize)> = (0..n)
                .map(|i| (format!("field{i}").into_bytes(), i + 1))
                .collect();
            assert_eq!(fields, want);
        }
    }
}
