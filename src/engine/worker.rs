//! A worker: one thread, one I/O backend, one stream of the epoch plan
//! (`crate::plan`). It reads its segments' shards in file order into chunks,
//! walks their tar members, groups samples, keeps the samples its segments
//! want (by index in the shard), passes them through its shuffle buffer,
//! and pushes full batches into its stream's queue; at the end of an epoch
//! its short last batch goes to the sequencer (`crate::loader`).
//!
//! Each chunk is laid out as `[front slack | data | back slack]`; reads fill
//! only the data region. A member that crosses from chunk k into chunk k+1 is
//! made contiguous by copying its smaller piece into a slack (the back slack
//! of k, or the front slack of k+1), else the whole member goes into a spill
//! run from the same pool. Either way the copy is counted.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dataset::{Shard, Source};
use crate::engine::shuffler::Shuffler;
use crate::engine::{Item, Shared};
use crate::error::{Error, Result};
use crate::fetch::{Completion, ReadFail, ReadRequest, Reader, Target};
use crate::memory::ChunkRef;
use crate::memory::{BatchBuilder, Held, NO_SOURCE};
use crate::plan::{Segment, ShuffleBuffer};
use crate::tar::split_name;
use crate::tar::{MemberSink, TarWalk};

/// Chunks of a worker's quota that read-ahead leaves alone: one for a spill
/// run and one for a shuffle compaction target.
const HEADROOM: usize = 2;

/// Everything a worker thread owns.
pub(crate) struct Worker<'a> {
    shared: &'a Arc<Shared>,
    reader: &'a mut dyn Reader,
    /// The plan stream this worker reads; also its chunk-quota owner.
    stream: usize,
    builder: BatchBuilder,
    shuffle: Option<Shuffler>,
    completions: Vec<Completion>,
    next_read_id: u64,
}

struct PendingRead {
    id: u64,
    chunk: ChunkRef,
    /// Shard offset of the first byte.
    offset: u64,
    len: usize,
    /// Bytes that arrived so far (short reads are continued).
    done: usize,
    in_flight: bool,
}

impl<'a> Worker<'a> {
    pub(crate) fn new(shared: &'a Arc<Shared>, reader: &'a mut dyn Reader, stream: usize) -> Self {
        Worker {
            shared,
            reader,
            stream,
            builder: BatchBuilder::new(shared.cfg.batch_size),
            shuffle: None,
            completions: Vec::new(),
            next_read_id: 1,
        }
    }

    /// Runs every epoch of the plan.
    pub(crate) fn run(&mut self) -> Result<()> {
        let sh = self.shared;
        let mut epoch = sh.start.epoch;
        while sh.cfg.epochs == 0 || epoch < sh.cfg.epochs {
            let plan = sh.plan(epoch)?;
            if sh.plan_opts.shuffle_buffer > 0 {
                let buf = ShuffleBuffer::for_stream(&sh.plan_opts, epoch, self.stream);
                let quota = sh.pool.quota();
                // Besides the buffer's chunks a worker holds its reads in
                // flight, the chunk being parsed, a spill run and a
                // compaction target; one more absorbs the check coming
                // after the push that crossed the limit.
                let limit = quota.saturating_sub(sh.cfg.reads_in_flight + HEADROOM + 2);
                self.shuffle = Some(Shuffler::new(
                    buf,
                    limit,
                    self.stream,
                    sh.pool.chunk_count(),
                ));
            }
            for (place, seg) in plan.streams[self.stream].iter().enumerate() {
                if sh.stopping() {
                    return Err(Error::Closed);
                }
                let shard = &sh.shards[seg.shard];
                let ghosts = sh.replayed(epoch, self.stream, place);
                if let (Some(g), Some(count)) = (ghosts, sh.count(seg.shard)) {
                    let wanted = (seg.from..seg.to.unwrap_or(count))
                        .filter(|&i| seg.wants(i))
                        .count();
                    if wanted == g.len() {
                        // Every sample of the segment went out before the
                        // cut: pass placeholders on without reading.
                        for _ in 0..wanted {
                            emit_ghost(
                                sh,
                                self.stream,
                                &mut self.builder,
                                &mut self.shuffle,
                                epoch,
                            )?;
                        }
                        continue;
                    }
                }
                self.shard(shard, seg, ghosts, epoch)
                    .map_err(|e| tag_shard(e, shard))
                    .map_err(|e| match e {
                        // The pool's own check fired first: say what holds
                        // the chunks.
                        Error::BudgetTooSmall { budget, detail } if self.shuffle.is_some() => {
                            Error::BudgetTooSmall {
                                budget,
                                detail: format!(
                                    "{detail}; the shuffle buffer holds samples too: lower \
                                     `shuffle_buffer` or raise `memory_budget`"
                                ),
                            }
                        }
                        e => e,
                    })?;
                sh.counters.shards_done.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(mut sf) = self.shuffle.take() {
                while let Some(h) = sf.drain_one() {
                    emit_held(sh, self.stream, &mut self.builder, h, epoch)?;
                }
            }
            let tail = std::mem::replace(&mut self.builder, BatchBuilder::new(sh.cfg.batch_size));
            sh.push_stream(self.stream, Item::Tail(tail))?;
            epoch += 1;
        }
        Ok(())
    }

    /// Reads one shard (to its end, or until the segment's last sample) and
    /// walks it.
    fn shard(
        &mut self,
        shard: &Shard,
        seg: &Segment,
        ghosts: Option<&[u64]>,
        epoch: u64,
    ) -> Result<()> {
        // The file (when local) stays open until every read of it completed.
        let (_file, target, size) = match &shard.source {
            Source::File(path) => {
                let file = File::open(path).map_err(|e| Error::io("open", path, &e))?;
                let size = file
                    .metadata()
                    .map_err(|e| Error::io("stat", path, &e))?
                    .len();
                let fd = file.as_raw_fd();
                (Some(file), Target::File(fd), size)
            }
            Source::Http(obj) => (None, Target::Http(Arc::clone(obj)), shard.size),
        };
        let mut pending: VecDeque<PendingRead> = VecDeque::new();
        let result = self.shard_reads(&target, shard, seg, ghosts, size, epoch, &mut pending);
        if result.is_err() || !pending.is_empty() {
            // Reads still in flight write into their chunks: wait for them
            // before the chunks can go back to the pool.
            self.drain(&mut pending);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn shard_reads(
        &mut self,
        target: &Target,
        shard: &Shard,
        seg: &Segment,
        ghosts: Option<&[u64]>,
        size: u64,
        epoch: u64,
        pending: &mut VecDeque<PendingRead>,
    ) -> Result<()> {
        let sh = self.shared;
        let mut walk = TarWalk::new(sh.pool.arena().len() as u64);
        let builder = std::mem::replace(&mut self.builder, BatchBuilder::new(sh.cfg.batch_size));
        let mut sink = ShardSink {
            shared: sh,
            stream: self.stream,
            builder,
            shuffle: self.shuffle.take(),
            held: None,
            epoch,
            key: Vec::new(),
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
        };
        let result = self.pump(target, shard, size, &mut walk, &mut sink, pending);
        self.builder = sink.builder;
        self.shuffle = sink.shuffle;
        result
    }

    fn pump(
        &mut self,
        target: &Target,
        shard: &Shard,
        size: u64,
        walk: &mut TarWalk,
        sink: &mut ShardSink<'_>,
        pending: &mut VecDeque<PendingRead>,
    ) -> Result<()> {
        let sh = self.shared;
        let mut next_offset = 0u64;
        loop {
            // Keep up to `reads_in_flight` reads going; block for a chunk only
            // when nothing is in flight, so parsing never waits on itself.
            while pending.len() < sh.cfg.reads_in_flight && next_offset < size {
                // The first read may wait (and use the reserve); read-ahead
                // takes only chunks beyond it.
                let stream = self.stream;
                let got = if pending.is_empty() {
                    Some(
                        sh.pool
                            .acquire_or_stuck(stream, 1, &|| sh.awaited(stream))?,
                    )
                } else {
                    sh.pool.acquire_spare_as(self.stream, HEADROOM)?
                };
                let Some(chunk) = got else {
                    break;
                };
                let len = (sh.data_len as u64).min(size - next_offset) as usize;
                let id = self.next_read_id;
                self.next_read_id += 1;
                let read = PendingRead {
                    id,
                    chunk,
                    offset: next_offset,
                    len,
                    done: 0,
                    in_flight: false,
                };
                next_offset += len as u64;
                pending.push_back(read);
                let last = pending.len() - 1;
                self.start_read(target, &mut pending[last], shard)?;
            }
            let Some(front) = pending.front() else {
                break;
            };
            if front.in_flight || front.done < front.len {
                self.reap(target, pending, shard)?;
                continue;
            }
            let read = pending.pop_front().expect("front exists");
            // SAFETY: the read completed; its data region holds `len` bytes
            // that nothing else writes while this worker holds the chunk.
            let seg = unsafe {
                std::slice::from_raw_parts(read.chunk.ptr().add(sh.slack).cast_const(), read.len)
            };
            sink.segment = Some(read.chunk);
            walk.feed(seg, sink)?;
            sink.segment = None;
            if sink.done {
                // The segment's last sample went by: the rest of the shard
                // is another consumer's (reads in flight are drained).
                return Ok(());
            }
        }
        walk.finish()?;
        sink.close_sample()?;
        let found = sink.index;
        let expected = sink.seg.to.or(shard.samples);
        if let Some(n) = expected.filter(|&n| n > found || (sink.seg.to.is_none() && n != found)) {
            return Err(Error::Plan {
                shard: shard.name.clone(),
                message: format!(
                    "holds {found} samples but the plan expects {n} (from the manifest or an \
                     earlier count): fix the manifest's count, or the shard changed"
                ),
            });
        }
        let counts = walk.counts();
        sh.counters
            .entries_skipped
            .fetch_add(counts.skipped, Ordering::Relaxed);
        Ok(())
    }

    fn start_read(&mut self, target: &Target, r: &mut PendingRead, shard: &Shard) -> Result<()> {
        let sh = self.shared;
        let req = ReadRequest {
            id: r.id,
            target: target.clone(),
            offset: r.offset + r.done as u64,
            // SAFETY: slack + done < slack + len <= chunk size.
            buf: unsafe { r.chunk.ptr().add(sh.slack + r.done) },
            len: r.len - r.done,
            buf_index: r.chunk.index(),
        };
        // SAFETY: the chunk stays referenced by `r` until the completion is
        // reaped (`reap`, or `drain` on the error path), and `fd` stays open
        // (the File outlives both).
        unsafe { self.reader.submit(req) }.map_err(|e| Error::io("read", &shard.name, &e))?;
        r.in_flight = true;
        sh.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for at least one completion and applies them.
    fn reap(
        &mut self,
        target: &Target,
        pending: &mut VecDeque<PendingRead>,
        shard: &Shard,
    ) -> Result<()> {
        let mut done = std::mem::take(&mut self.completions);
        done.clear();
        self.reader
            .wait(1, &mut done)
            .map_err(|e| Error::io("read", &shard.name, &e))?;
        let mut result = Ok(());
        for c in done.drain(..) {
            let Some(r) = pending.iter_mut().find(|r| r.id == c.id) else {
                continue;
            };
            r.in_flight = false;
            if c.copied > 0 {
                self.shared.pool.add_copied(c.copied as u64);
            }
            match c.result {
                Ok(0) => {
                    result = result.and(Err(Error::Io {
                        op: "read",
                        path: shard.name.clone().into(),
                        message: format!(
                            "the file ended at byte {} but was {} bytes when opened",
                            r.offset + r.done as u64,
                            shard.size
                        ),
                        errno: 0,
                    }));
                }
                Ok(n) => {
                    r.done += n;
                    self.shared
                        .counters
                        .bytes_read
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(ReadFail::Io(e)) => {
                    result = result.and(Err(Error::io("read", &shard.name, &e)))
                }
                Err(ReadFail::Net(e)) => result = result.and(Err(e)),
            }
        }
        self.completions = done;
        result?;
        // Continue short reads.
        for i in 0..pending.len() {
            if !pending[i].in_flight && pending[i].done < pending[i].len {
                let mut r = pending.remove(i).expect("index in range");
                let res = self.start_read(target, &mut r, shard);
                pending.insert(i, r);
                res?;
            }
        }
        Ok(())
    }

    /// Waits for every read still in flight; errors no longer matter here.
    fn drain(&mut self, pending: &mut VecDeque<PendingRead>) {
        while pending.iter().any(|r| r.in_flight) {
            let mut done = Vec::new();
            if self.reader.wait(1, &mut done).is_err() {
                // The backend cannot wait: keep the chunks forever rather
                // than let the kernel write into reused memory.
                for r in pending.drain(..) {
                    std::mem::forget(r.chunk);
                }
                return;
            }
            for c in done {
                if let Some(r) = pending.iter_mut().find(|r| r.id == c.id) {
                    r.in_flight = false;
                }
            }
        }
        pending.clear();
    }
}

/// A placeholder for a sample delivered before the resume point: it takes
/// the sample's place in the shuffle buffer and the batch (which the
/// sequencer skips) without its bytes.
fn emit_ghost(
    sh: &Shared,
    stream: usize,
    builder: &mut BatchBuilder,
    shuffle: &mut Option<Shuffler>,
    epoch: u64,
) -> Result<()> {
    match shuffle {
        Some(sf) => {
            if let Some(out) = sf.push(Held::new(b"", NO_SOURCE), sh)? {
                emit_held(sh, stream, builder, out, epoch)?;
            }
            Ok(())
        }
        None => {
            builder.begin_sample(b"", NO_SOURCE);
            builder.end_sample();
            if builder.len() == sh.cfg.batch_size {
                let batch = sh.seal(builder, epoch, stream);
                sh.push_stream(stream, Item::Batch(batch))?;
            }
            Ok(())
        }
    }
}

/// A sample out of the shuffle buffer goes into the batch; a full batch goes
/// to the stream's queue.
fn emit_held(
    sh: &Shared,
    stream: usize,
    builder: &mut BatchBuilder,
    h: Held,
    epoch: u64,
) -> Result<()> {
    builder.push_held(h);
    if builder.len() == sh.cfg.batch_size {
        let batch = sh.seal(builder, epoch, stream);
        sh.push_stream(stream, Item::Batch(batch))?;
    }
    Ok(())
}

fn tag_shard(e: Error, shard: &Shard) -> Error {
    match e {
        Error::Tar { shard: s, source } if s.is_empty() => Error::Tar {
            shard: shard.name.clone(),
            source,
        },
        other => other,
    }
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
struct ShardSink<'s> {
    shared: &'s Arc<Shared>,
    stream: usize,
    builder: BatchBuilder,
    shuffle: Option<Shuffler>,
    /// The open sample, when it goes to the shuffle buffer.
    held: Option<Held>,
    epoch: u64,
    /// Key of the open sample.
    key: Vec<u8>,
    open: bool,
    /// The open sample belongs to the segment.
    keep: bool,
    /// Samples begun in this shard so far (the next one's index).
    index: u64,
    seg: &'s Segment,
    /// Samples delivered before a resume point: passed on as placeholders.
    ghosts: Option<&'s [u64]>,
    /// Past the segment's last sample: the rest of the shard is not ours.
    done: bool,
    /// The chunk whose data region is being fed.
    segment: Option<ChunkRef>,
    split: Option<Split>,
    /// The current spill run and the bytes used in it.
    spill: Option<(ChunkRef, usize)>,
    shard: &'s Shard,
}

impl ShardSink<'_> {
    fn seg_ptr(&self, at: usize) -> (*mut u8, &ChunkRef) {
        let c = self.segment.as_ref().expect("a segment is being fed");
        // SAFETY: `at` is inside the data region the walk was given.
        (unsafe { c.ptr().add(self.shared.slack + at) }, c)
    }

    /// A member is complete and contiguous: group it into a sample.
    fn member(
        &mut self,
        name: &[u8],
        offset: u64,
        chunk: &ChunkRef,
        data: *const u8,
        len: usize,
    ) -> Result<()> {
        let sh = self.shared;
        if self.done {
            return Ok(());
        }
        let Some((key, field)) = split_name(name) else {
            sh.counters.members_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        if self.open && key == self.key.as_slice() {
            let dup = match &self.held {
                Some(h) => h.has_field(field),
                None => self.keep && self.builder.open_sample_has(field),
            };
            if dup {
                return Err(Error::DuplicateField {
                    shard: self.shard.name.clone(),
                    offset,
                    key: String::from_utf8_lossy(key).into_owned(),
                    field: String::from_utf8_lossy(field).into_owned(),
                });
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
                    self.held = Some(Held::new(key, self.seg.shard as u32));
                } else {
                    self.builder.begin_sample(key, self.seg.shard as u32);
                }
            }
        }
        if self.keep {
            match &mut self.held {
                Some(h) => h.add_field(field, chunk, data, len),
                None => self.builder.add_field(field, chunk, data, len),
            }
        }
        sh.counters.members.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the open sample; pushes the batch if it is full.
    fn close_sample(&mut self) -> Result<()> {
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
            if let Some(out) = sf.push(h, sh)? {
                emit_held(sh, self.stream, &mut self.builder, out, self.epoch)?;
            }
            return Ok(());
        }
        self.builder.end_sample();
        if self.builder.len() == sh.cfg.batch_size {
            let batch = sh.seal(&mut self.builder, self.epoch, self.stream);
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
        let run = pool.acquire_or_stuck(stream, chunks, &|| sh.awaited(stream))?;
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
