//! Sample assembly: receives the tar walk's members of one shard (the
//! [`MemberSink`]), makes members that cross chunks contiguous, groups
//! members into samples, keeps those the plan stream's segment wants (by
//! index in the shard), passes them through the shuffler, and fills batches
//! into the stream's queue. A sample delivered before a resume point is
//! passed on as a placeholder.
//!
//! Each chunk is laid out as `[front slack | data | back slack]`; reads fill
//! only the data region. A member that crosses from chunk k into chunk k+1 is
//! made contiguous by copying its smaller piece into a slack (the back slack
//! of k, or the front slack of k+1), else the whole member goes into a spill
//! run from the same pool. Either way the copy is counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dataset::Shard;
use crate::engine::shared::{Item, Shared};
use crate::engine::shuffler::Shuffler;
use crate::error::{Error, Result};
use crate::memory::{BatchBuilder, ChunkRef, HeldSample, NO_SOURCE};
use crate::plan::Segment;
use crate::tar::{MemberSink, lowercase_field, split_name};

/// A placeholder for a sample delivered before the resume point: it takes
/// the sample's place in the shuffle buffer and the batch (which the
/// sequencer skips) without its bytes.
pub(super) fn emit_ghost(
    sh: &Shared,
    stream: usize,
    builder: &mut BatchBuilder,
    shuffle: &mut Option<Shuffler>,
    epoch: u64,
) -> Result<()> {
    match shuffle {
        Some(sf) => {
            if let Some(out) = sf.push(HeldSample::new(b"", NO_SOURCE))? {
                emit_held(sh, stream, builder, out, epoch)?;
            }
            Ok(())
        }
        None => {
            builder.begin_sample(b"", NO_SOURCE);
            builder.end_sample();
            if builder.len() == sh.cfg.batch_size {
                let batch = sh.seal(builder, epoch, sh.owner(stream));
                sh.push_stream(stream, Item::Batch(batch))?;
            }
            Ok(())
        }
    }
}

/// A sample out of the shuffle buffer goes into the batch; a full batch goes
/// to the stream's queue.
pub(super) fn emit_held(
    sh: &Shared,
    stream: usize,
    builder: &mut BatchBuilder,
    h: HeldSample,
    epoch: u64,
) -> Result<()> {
    builder.push_held(h);
    if builder.len() == sh.cfg.batch_size {
        let batch = sh.seal(builder, epoch, sh.owner(stream));
        sh.push_stream(stream, Item::Batch(batch))?;
    }
    Ok(())
}

/// A member split across segments, waiting for its remaining pieces.
struct Split {
    name: Vec<u8>,
    offset: u64,
    size: usize,
    first: ChunkRef,
    first_ptr: *mut u8,
    first_len: usize,
    /// Where the member comes together, once decided: (run, start).
    dest: Option<(ChunkRef, *mut u8)>,
    filled: usize,
}

/// Receives the walk's members for one shard: places split members, groups
/// members into samples, and fills batches.
pub(super) struct ShardSink<'s> {
    shared: &'s Arc<Shared>,
    stream: usize,
    pub(super) builder: BatchBuilder,
    pub(super) shuffle: Option<Shuffler>,
    /// The open sample, when it goes to the shuffle buffer.
    held: Option<HeldSample>,
    epoch: u64,
    /// Key of the open sample.
    key: Vec<u8>,
    /// Room for a member's lower-cased field name (reused: no allocation
    /// per member).
    field_buf: Vec<u8>,
    open: bool,
    /// The open sample belongs to the segment.
    keep: bool,
    /// Samples begun in this shard so far (the next one's index).
    pub(super) index: u64,
    pub(super) seg: &'s Segment,
    /// Samples delivered before a resume point: passed on as placeholders.
    ghosts: Option<&'s [u64]>,
    /// Past the segment's last sample: the rest of the shard is not ours.
    pub(super) done: bool,
    /// The chunk whose data region is being fed.
    pub(super) segment: Option<ChunkRef>,
    split: Option<Split>,
    /// The current spill run and the bytes used in it.
    spill: Option<(ChunkRef, usize)>,
    shard: &'s Shard,
}

impl<'s> ShardSink<'s> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shared: &'s Arc<Shared>,
        stream: usize,
        builder: BatchBuilder,
        shuffle: Option<Shuffler>,
        epoch: u64,
        seg: &'s Segment,
        ghosts: Option<&'s [u64]>,
        shard: &'s Shard,
    ) -> Self {
        ShardSink {
            shared,
            stream,
            builder,
            shuffle,
            held: None,
            epoch,
            key: Vec::new(),
            field_buf: Vec::new(),
            open: false,
            keep: false,
            index: 0,
            seg,
            ghosts,
            done: false,
            segment: None,
            split: None,
            spill: None,
            shard,
        }
    }

    fn seg_ptr(&self, at: usize) -> (*mut u8, &ChunkRef) {
        let c = self.segment.as_ref().expect("a segment is being fed");
        // SAFETY: `at` is inside the data region the walk was given.
        (unsafe { c.ptr().add(self.shared.slack + at) }, c)
    }

    /// A member is complete and contiguous: group it into a sample, named
    /// as WebDataset names it (`crate::tar::split_name`, the field
    /// lower-cased).
    fn member(
        &mut self,
        name: &[u8],
        offset: u64,
        chunk: &ChunkRef,
        data: *const u8,
        len: usize,
    ) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let Some((key, field)) = split_name(name) else {
            let counters = &self.shared.counters;
            counters.members_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let mut buf = std::mem::take(&mut self.field_buf);
        let result = self.group(
            key,
            lowercase_field(field, &mut buf),
            offset,
            chunk,
            data,
            len,
        );
        self.field_buf = buf;
        result
    }

    fn group(
        &mut self,
        key: &[u8],
        field: &[u8],
        offset: u64,
        chunk: &ChunkRef,
        data: *const u8,
        len: usize,
    ) -> Result<()> {
        let sh = self.shared;
        let duplicate = || Error::DuplicateField {
            shard: self.shard.name.clone(),
            offset,
            key: String::from_utf8_lossy(key).into_owned(),
            field: String::from_utf8_lossy(field).into_owned(),
        };
        if self.open && key == self.key.as_slice() {
            let dup = match &self.held {
                Some(h) => h.has_field(field),
                None => self.keep && self.builder.open_sample_has(field),
            };
            if dup {
                return Err(duplicate());
            }
        } else {
            self.close_sample()?;
            let index = self.index;
            self.index += 1;
            if self.seg.to.is_some_and(|t| index >= t) {
                self.done = true;
                return Ok(());
            }
            self.key.clear();
            self.key.extend_from_slice(key);
            self.open = true;
            self.keep = self.seg.wants(index);
            if self.keep && self.ghosts.is_some_and(|g| g.binary_search(&index).is_ok()) {
                self.keep = false;
                emit_ghost(
                    sh,
                    self.stream,
                    &mut self.builder,
                    &mut self.shuffle,
                    self.epoch,
                )?;
            }
            if self.keep {
                if self.shuffle.is_some() {
                    self.held = Some(HeldSample::new(key, self.seg.shard as u32));
                } else {
                    self.builder.begin_sample(key, self.seg.shard as u32);
                }
            }
        }
        if self.keep {
            // WebDataset's sample dict (and the Python package's) holds
            // `__key__` and `__url__`: a field of that name is a duplicate.
            if matches!(field, b"__key__" | b"__url__") {
                return Err(duplicate());
            }
            match &mut self.held {
                Some(h) => h.add_field(field, chunk, data, len),
                None => self.builder.add_field(field, chunk, data, len),
            }
        }
        sh.counters.members.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the open sample; pushes the batch if it is full.
    pub(super) fn close_sample(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        if !self.keep {
            return Ok(());
        }
        let sh = self.shared;
        if let Some(h) = self.held.take() {
            let sf = self
                .shuffle
                .as_mut()
                .expect("held samples go to the shuffle buffer");
            if let Some(out) = sf.push(h)? {
                emit_held(sh, self.stream, &mut self.builder, out, self.epoch)?;
            }
            return Ok(());
        }
        self.builder.end_sample();
        if self.builder.len() == sh.cfg.batch_size {
            let batch = sh.seal(&mut self.builder, self.epoch, sh.owner(self.stream));
            sh.push_stream(self.stream, Item::Batch(batch))?;
        }
        Ok(())
    }

    /// `size` bytes of spill space: (run, start).
    fn spill_space(&mut self, size: usize) -> Result<(ChunkRef, *mut u8)> {
        let pool = &self.shared.pool;
        // 64-byte alignment keeps spilled members cache-line aligned.
        let at = |used: usize| (used + 63) & !63;
        if let Some((run, used)) = &mut self.spill {
            let start = at(*used);
            if start + size <= run.len() {
                *used = start + size;
                // SAFETY: start + size <= run length.
                return Ok((run.clone(), unsafe { run.ptr().add(start) }));
            }
        }
        let chunks = size.div_ceil(pool.chunk_size()).max(1);
        let (sh, stream) = (self.shared, self.stream);
        let run = pool.acquire_or_stuck(sh.owner(stream), chunks, &|| sh.awaited(stream))?;
        let ptr = run.ptr();
        self.spill = Some((run.clone(), size));
        Ok((run, ptr))
    }
}

impl MemberSink for ShardSink<'_> {
    fn whole(&mut self, name: &[u8], offset: u64, range: std::ops::Range<usize>) -> Result<()> {
        let (ptr, _) = self.seg_ptr(range.start);
        // Lend the segment's reference to `member` instead of cloning it: a
        // clone per member is two atomic operations on the hot path.
        let chunk = self.segment.take().expect("a segment is being fed");
        let result = self.member(name, offset, &chunk, ptr, range.len());
        self.segment = Some(chunk);
        result
    }

    fn split_begin(
        &mut self,
        name: &[u8],
        offset: u64,
        size: u64,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let (first_ptr, chunk) = self.seg_ptr(range.start);
        self.split = Some(Split {
            name: name.to_vec(),
            offset,
            size: size as usize,
            first: chunk.clone(),
            first_ptr,
            first_len: range.len(),
            dest: None,
            filled: 0,
        });
        Ok(())
    }

    fn split_more(&mut self, range: std::ops::Range<usize>, last: bool) -> Result<()> {
        let slack = self.shared.slack;
        let (piece, seg_chunk) = self.seg_ptr(range.start);
        let seg_chunk = seg_chunk.clone();
        let mut split = self.split.take().expect("split_more follows split_begin");
        let mut copied = 0usize;
        if split.dest.is_none() {
            let rest = split.size - split.first_len;
            let front_ok = last && range.start == 0 && split.first_len <= slack;
            let back_ok = rest <= slack;
            if front_ok && (!back_ok || split.first_len <= rest) {
                // Copy the first piece into this chunk's front slack, just
                // before its data region: the member ends where this piece does.
                // SAFETY: first_len <= slack, so dst is inside this chunk's
                // front slack, which no other member uses; the source is the
                // tail of the previous chunk's data region.
                let dst = unsafe { piece.sub(split.first_len) };
                // SAFETY: see above; the regions are in different chunks.
                unsafe { std::ptr::copy_nonoverlapping(split.first_ptr, dst, split.first_len) };
                self.shared.pool.add_copied(split.first_len as u64);
                let name = std::mem::take(&mut split.name);
                return self.member(&name, split.offset, &seg_chunk, dst, split.size);
            }
            if back_ok {
                // The rest goes into the first chunk's back slack, right after
                // the first piece (which ends its data region).
                split.dest = Some((split.first.clone(), split.first_ptr));
                split.filled = split.first_len;
            } else {
                let (run, ptr) = self.spill_space(split.size)?;
                // SAFETY: the spill space holds `size` >= first_len bytes.
                unsafe { std::ptr::copy_nonoverlapping(split.first_ptr, ptr, split.first_len) };
                copied += split.first_len;
                split.dest = Some((run, ptr));
                split.filled = split.first_len;
            }
        }
        let (run, start) = split.dest.clone().expect("destination chosen above");
        // SAFETY: filled + piece length <= size, and the destination has `size`
        // bytes from `start` (spill space, or first piece + back slack).
        unsafe { std::ptr::copy_nonoverlapping(piece, start.add(split.filled), range.len()) };
        copied += range.len();
        split.filled += range.len();
        self.shared.pool.add_copied(copied as u64);
        if last {
            let name = std::mem::take(&mut split.name);
            self.member(&name, split.offset, &run, start, split.size)
        } else {
            self.split = Some(split);
            Ok(())
        }
    }
}
