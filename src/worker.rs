//! A worker: one thread, one I/O backend, reading whole shards in file order
//! into chunks, walking their tar members, grouping samples, and pushing
//! full batches into the ring.
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

use crate::arena::ChunkRef;
use crate::batch::BatchBuilder;
use crate::dataset::{Shard, Source};
use crate::error::{Error, Result};
use crate::io::{Completion, ReadFail, ReadRequest, Reader, Target};
use crate::loader::{Item, Shared};
use crate::sample::split_name;
use crate::tar::{MemberSink, TarWalk};

/// Everything a worker thread owns.
pub(crate) struct Worker<'a> {
    shared: &'a Arc<Shared>,
    reader: &'a mut dyn Reader,
    builder: BatchBuilder,
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
    pub(crate) fn new(shared: &'a Arc<Shared>, reader: &'a mut dyn Reader) -> Self {
        Worker {
            shared,
            reader,
            builder: BatchBuilder::new(shared.cfg.batch_size),
            completions: Vec::new(),
            next_read_id: 1,
        }
    }

    /// Runs every epoch of the plan.
    pub(crate) fn run(&mut self) -> Result<()> {
        let sh = self.shared;
        let mut epoch = 0u64;
        loop {
            loop {
                if sh.stopping() {
                    return Err(Error::Closed);
                }
                // Relaxed: the index only hands out distinct shards; the
                // reset between epochs is ordered by the epoch lock.
                let idx = sh.next_shard.fetch_add(1, Ordering::Relaxed);
                if idx >= sh.shards.len() {
                    break;
                }
                self.shard(&sh.shards[idx], epoch)
                    .map_err(|e| tag_shard(e, &sh.shards[idx]))?;
                sh.counters.shards_done.fetch_add(1, Ordering::Relaxed);
            }
            let more = sh.cfg.epochs == 0 || epoch + 1 < sh.cfg.epochs;
            let mine = std::mem::replace(&mut self.builder, BatchBuilder::new(sh.cfg.batch_size));
            sh.end_epoch(mine, epoch, more)?;
            if !more {
                return Ok(());
            }
            epoch += 1;
        }
    }

    /// Reads one shard to its end and walks it.
    fn shard(&mut self, shard: &Shard, epoch: u64) -> Result<()> {
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
        let result = self.shard_reads(&target, shard, size, epoch, &mut pending);
        if result.is_err() {
            // Reads still in flight write into their chunks: wait for them
            // before the chunks can go back to the pool.
            self.drain(&mut pending);
        }
        result
    }

    fn shard_reads(
        &mut self,
        target: &Target,
        shard: &Shard,
        size: u64,
        epoch: u64,
        pending: &mut VecDeque<PendingRead>,
    ) -> Result<()> {
        let sh = self.shared;
        let mut walk = TarWalk::new(sh.pool.arena().len() as u64);
        let builder = std::mem::replace(&mut self.builder, BatchBuilder::new(sh.cfg.batch_size));
        let mut sink = ShardSink {
            shared: sh,
            builder,
            epoch,
            key: Vec::new(),
            open: false,
            segment: None,
            split: None,
            spill: None,
            shard,
        };
        let result = self.pump(target, shard, size, &mut walk, &mut sink, pending);
        self.builder = sink.builder;
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
                let got = if pending.is_empty() {
                    sh.pool.acquire(1, true)?
                } else {
                    sh.pool.acquire_spare()?
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
        }
        walk.finish()?;
        sink.close_sample()?;
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
    builder: BatchBuilder,
    epoch: u64,
    /// Key of the open sample.
    key: Vec<u8>,
    open: bool,
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
        let Some((key, field)) = split_name(name) else {
            sh.counters.members_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        if self.open && key == self.key.as_slice() {
            if self.builder.open_sample_has(field) {
                return Err(Error::DuplicateField {
                    shard: self.shard.name.clone(),
                    offset,
                    key: String::from_utf8_lossy(key).into_owned(),
                    field: String::from_utf8_lossy(field).into_owned(),
                });
            }
        } else {
            self.close_sample()?;
            self.key.clear();
            self.key.extend_from_slice(key);
            self.builder.begin_sample(key);
            self.open = true;
        }
        self.builder.add_field(field, chunk, data, len);
        sh.counters.members.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the open sample; pushes the batch if it is full.
    fn close_sample(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        self.builder.end_sample();
        if self.builder.len() == self.shared.cfg.batch_size {
            let batch = self.shared.seal(&mut self.builder, self.epoch);
            self.shared.push(Item::Batch(batch))?;
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
        let run = pool
            .acquire(chunks, true)?
            .expect("a waiting acquire returns a run or an error");
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
