//! A worker: one thread, one I/O backend, one stream of the epoch plan
//! (`crate::plan`). It reads its segments' shards in file order into chunks
//! with up to `reads_in_flight` reads going, continues short reads, feeds
//! each chunk's bytes to the tar walk in shard order (sample assembly is
//! `assemble`), and at the end of an epoch drains its shuffler and sends its
//! short last batch to the sequencer. Every read in flight owns its chunk
//! until its completion arrives, on every path out (error or panic).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::cache::{Entry, Fill, Identity, SpoolFill};
use crate::dataset::{Shard, Source};
use crate::engine::assemble::{ShardSink, emit_ghost, emit_held};
use crate::engine::shared::{Item, Shared};
use crate::engine::shuffler::Shuffler;
use crate::error::{Error, IoOp, Result};
use crate::fetch::direct::LocalFd;
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{Completion, ReadFail, ReadRequest, Reader, Target, with_retries};
use crate::memory::BatchBuilder;
use crate::memory::ChunkRef;
use crate::net::http::HttpObject;
use crate::net::retry::Jitter;
use crate::net::version::VersionPin;
use crate::plan::{Segment, ShuffleBuffer};
use crate::tar::TarWalk;

/// Chunks of a worker's quota that read-ahead leaves alone: one for a spill
/// run and one for a shuffle compaction target.
const HEADROOM: usize = 2;

/// The longest a worker other than stream 0's holds its first read until
/// the first batch is out (`Shared::await_first_batch`): long against a
/// page-cache or loopback first batch (2-20 ms), short against an epoch,
/// so a slow first batch (a far server, a consumer that asks late) does
/// not keep the other workers idle long.
const FIRST_BATCH_ALONE: std::time::Duration = std::time::Duration::from_millis(100);

/// Says stream 0's worker ended, however it ends, so no worker waits for
/// its first batch in vain.
struct LeadEnds<'a>(&'a Shared);

impl Drop for LeadEnds<'_> {
    fn drop(&mut self) {
        self.0.lead_done();
    }
}

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
    /// A read of this worker has completed (read-ahead may start).
    bytes_in: bool,
    /// The size of the last shard this worker read (0 before the first).
    last_size: u64,
    /// Connections for the `HEAD`s that check a remote shard's version
    /// against the cache (made at the first).
    heads: Option<(HttpPool, Jitter)>,
    /// The version the remote shard being read is pinned to: every GET of
    /// it carries the pin (`If-Match`, answers checked), so one read of a
    /// shard is one version or fails with `Error::Changed` (never a
    /// restart: samples of it may be out already).
    pin: Option<Arc<VersionPin>>,
}

/// What the cache tier does for one remote shard's read.
enum Tier {
    /// Nothing: no cache, a local shard, or read uncached.
    None,
    /// Read from the cache entry (`target` is its file, at `base`), each
    /// read checked against the entry's block checksums; a read that
    /// fails is read again from `net`, and so is the rest of the shard.
    Hit {
        entry: Entry,
        id: Identity,
        base: u64,
        net: Target,
        dropped: bool,
    },
    /// Read from the network and copied to a new entry in the background.
    Fill(SpoolFill),
}

impl Tier {
    /// Whether new reads go to the cache entry.
    fn reads_entry(&self) -> bool {
        matches!(self, Tier::Hit { dropped: false, .. })
    }
}

/// A cache consultation's outcome: the tier, the entry's file when it is
/// read, the shard's size where known, and the ETag its `HEAD` gave (what
/// the read is pinned to, so a fill holds the version its entry is keyed by).
type Consulted = (
    Tier,
    Option<(std::fs::File, LocalFd)>,
    Option<u64>,
    Option<String>,
);

struct PendingRead {
    id: u64,
    chunk: ChunkRef,
    /// Shard offset of the first byte.
    offset: u64,
    len: usize,
    /// Bytes that arrived so far (short reads are continued).
    done: usize,
    in_flight: bool,
    /// Set while the backend's `submit` runs: if it panics, whether the
    /// read was queued is unknown, so its chunk is never returned.
    submitting: bool,
    /// The shard's first read while its size is unknown: it may end early,
    /// and its completion says the size (`ReadRequest::open_end`).
    open_end: bool,
    /// Read from a cache entry (checked before use), not the network.
    cached: bool,
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
            bytes_in: false,
            last_size: 0,
            heads: None,
            pin: None,
        }
    }

    /// Runs every epoch of the plan.
    pub(crate) fn run(&mut self) -> Result<()> {
        let sh = self.shared;
        let _lead = (self.stream == 0).then(|| LeadEnds(sh));
        // A fresh start's first batch is stream 0's: let its read, the
        // sequencer and the consumer have the machine (a resume may start
        // at another stream).
        if self.stream != 0 && sh.start.skip_batches == 0 {
            sh.await_first_batch(FIRST_BATCH_ALONE);
        }
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
                    (self.stream, sh.owner(self.stream)),
                    Arc::clone(&sh.pool),
                    Arc::clone(&sh.counters),
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
            if self.stream == 0 {
                // Stream 0's epoch ended: what it gave is all the first
                // batch will get from it.
                sh.lead_done();
            }
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
        // The file (when local, or a cache entry) stays open until every
        // read of it completed.
        let mut tier = Tier::None;
        let (_file, target, size) = match &shard.source {
            Source::File(path) => {
                self.pin = None;
                let (file, fd, size) = self.shared.direct.open(path, self.shared.layout())?;
                (Some(file), Target::File(fd), Some(size))
            }
            Source::Http(obj) => {
                let (tier_now, file, size, etag) = self.consult_cache(shard, obj, seg);
                tier = tier_now;
                self.pin = Some(Arc::new(VersionPin::planned(etag, size)));
                match file {
                    Some((file, fd)) => (Some(file), Target::File(fd), size),
                    // Unknown (`None`) for a remote shard the resolver did
                    // not size: its first read learns it.
                    None => (None, Target::Http(Arc::clone(obj)), size),
                }
            }
        };
        let mut pending: VecDeque<PendingRead> = VecDeque::new();
        // Reads still in flight write into their chunks: on every way out of
        // the shard, an error or a panic included, wait for them before the
        // chunks can go back to the pool (unwinding would drop `pending`).
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.shard_reads(
                &target,
                shard,
                seg,
                ghosts,
                size,
                epoch,
                &mut pending,
                &mut tier,
            )
        }));
        if result.is_err() {
            // A panic inside the backend's `submit` may have left that read
            // queued: its chunk is kept for ever rather than reused under it.
            pending.retain_mut(|r| {
                if r.submitting {
                    std::mem::forget(r.chunk.clone());
                }
                !r.submitting
            });
        }
        if !pending.is_empty() {
            self.drain(&mut pending);
        }
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn shard_reads(
        &mut self,
        target: &Target,
        shard: &Shard,
        seg: &Segment,
        ghosts: Option<&[u64]>,
        size: Option<u64>,
        epoch: u64,
        pending: &mut VecDeque<PendingRead>,
        tier: &mut Tier,
    ) -> Result<()> {
        let sh = self.shared;
        let mut walk = TarWalk::new(sh.pool.arena().len() as u64);
        let builder = std::mem::replace(&mut self.builder, BatchBuilder::new(sh.cfg.batch_size));
        let mut sink = ShardSink::new(
            sh,
            self.stream,
            builder,
            self.shuffle.take(),
            epoch,
            seg,
            ghosts,
            shard,
        );
        let result = self.pump(target, shard, size, &mut walk, &mut sink, pending, tier);
        self.builder = sink.builder;
        self.shuffle = sink.shuffle;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn pump(
        &mut self,
        target: &Target,
        shard: &Shard,
        mut size: Option<u64>,
        walk: &mut TarWalk,
        sink: &mut ShardSink<'_>,
        pending: &mut VecDeque<PendingRead>,
        tier: &mut Tier,
    ) -> Result<()> {
        let sh = self.shared;
        let mut next_offset = 0u64;
        loop {
            if let Some(s) = size {
                self.last_size = s;
            }
            // Keep up to `reads_in_flight` reads going; block for a chunk only
            // when nothing is in flight, so parsing never waits on itself.
            // Until this worker's first read is in, it is the only one: over
            // the network, read-ahead would share the bandwidth with it and
            // delay the first batch (4 workers x 4 reads of 8 MiB is 128 MiB
            // before any sample; 32 MiB with this).
            let depth = if self.bytes_in {
                sh.cfg.reads_in_flight
            } else {
                1
            };
            // A shard of unknown size has its first read alone (the rest
            // is planned when its completion says the size), unless the
            // shard before it filled the whole read-ahead: then its reads go
            // out together, each able to end early (a read that starts past
            // the end gets nothing, and the size), so a run of large shards
            // pays no round trip alone per shard, and a run of small ones
            // sends no read in vain.
            let speculate = self.last_size >= depth as u64 * sh.data_len as u64;
            let depth = if size.is_none() && !speculate {
                1
            } else {
                depth
            };
            while pending.len() < depth && size.is_none_or(|s| next_offset < s) {
                // The first read may wait (and use the reserve); read-ahead
                // takes only chunks beyond it.
                let stream = self.stream;
                let got = if pending.is_empty() {
                    // Asked when this worker's share is used up with no
                    // batch of it out: stream 0's first batch then needs
                    // the others to go on (or the pool to name the case).
                    let stuck = || {
                        if stream == 0 {
                            sh.lead_done();
                        }
                        sh.awaited(stream)
                    };
                    Some(sh.pool.acquire_or_stuck(sh.owner(stream), 1, &stuck)?)
                } else {
                    sh.pool.acquire_spare_as(sh.owner(stream), HEADROOM)?
                };
                let Some(chunk) = got else {
                    break;
                };
                let len = match size {
                    Some(s) => (sh.data_len as u64).min(s - next_offset) as usize,
                    None => sh.data_len,
                };
                let id = self.next_read_id;
                self.next_read_id += 1;
                let read = PendingRead {
                    id,
                    chunk,
                    offset: next_offset,
                    len,
                    done: 0,
                    in_flight: false,
                    submitting: false,
                    open_end: size.is_none(),
                    cached: tier.reads_entry(),
                };
                next_offset += len as u64;
                pending.push_back(read);
                let last = pending.len() - 1;
                self.start_read(target, &mut pending[last], shard, tier)?;
            }
            let Some(front) = pending.front() else {
                break;
            };
            if front.in_flight || front.done < front.len {
                self.reap(target, pending, shard, &mut size, tier)?;
                continue;
            }
            let mut read = pending.pop_front().expect("front exists");
            // SAFETY: the read completed; its data region holds `len` bytes
            // that nothing else writes while this worker holds the chunk.
            let seg = unsafe {
                std::slice::from_raw_parts(read.chunk.ptr().add(sh.slack).cast_const(), read.len)
            };
            match tier {
                Tier::Hit {
                    entry, id, dropped, ..
                } if read.cached => {
                    if let Err(bad) = entry.check(read.offset, seg) {
                        // Corrupt on disk: the entry goes, and this read
                        // and the rest of the shard come from the network.
                        if !*dropped {
                            *dropped = true;
                            if let Some(spool) = &sh.cache {
                                spool.cache().drop_corrupt(id, &bad);
                            }
                        }
                        read.cached = false;
                        read.done = 0;
                        pending.push_front(read);
                        self.start_read(target, &mut pending[0], shard, tier)?;
                        continue;
                    }
                    if let Some(spool) = &sh.cache {
                        spool.cache().hit_bytes(read.len as u64);
                    }
                }
                Tier::Fill(fill) => {
                    // SAFETY: the chunk's clone keeps the data region alive,
                    // and no one writes a data region once it is read.
                    let queued = unsafe {
                        fill.append(seg.as_ptr(), seg.len(), Box::new(read.chunk.clone()))
                    };
                    if !queued {
                        *tier = Tier::None;
                        if let Some(spool) = &sh.cache {
                            spool.cache().not_cached(&format!(
                                "`{}`: the disk fell behind the reads (`cache_fill` \"spare\"); \
                                 a later read fills it",
                                shard.name
                            ));
                        }
                    }
                }
                _ => {}
            }
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
        if let Tier::Fill(fill) = std::mem::replace(tier, Tier::None)
            && size.is_some_and(|s| s == fill.queued())
            && self.pin.as_ref().is_some_and(|p| p.strong().is_some())
        {
            // Read whole, every piece of the one version the entry is keyed
            // by (each answer had the pinned strong ETag, or the read
            // failed): the entry is complete, with the count learned.
            fill.finish(Some(found));
        }
        Ok(())
    }

    /// What the cache does for the remote shard `obj`: its `HEAD` gives
    /// the size and version; a current entry is read instead of the
    /// network (its file, O_DIRECT where it takes it); a shard read from
    /// its start to its end without one is filled (unless another process
    /// fills it: then it is waited for). Anything that keeps the cache from
    /// serving (no version, no `HEAD`, an entry that will not open) reads
    /// the shard as without a cache, and is counted.
    fn consult_cache(&mut self, shard: &Shard, obj: &Arc<HttpObject>, seg: &Segment) -> Consulted {
        let sh = self.shared;
        let Some(spool) = &sh.cache else {
            return (Tier::None, None, shard.size, None);
        };
        let cache = spool.cache();
        let stream = self.stream;
        let (pool, jitter) = self.heads.get_or_insert_with(|| {
            let seed = (std::process::id() as u64) << 32 ^ (stream as u64) << 8 ^ 0xcac4e;
            (
                HttpPool::new(sh.net.stall, Arc::clone(&sh.net.tls)),
                Jitter::new(seed),
            )
        });
        let head = with_retries(&sh.net, jitter, &obj.url, || pool.head_version(obj));
        let (size, etag, version) = match head {
            Ok((size, Some(etag))) => match crate::dataset::cache_version(&etag) {
                Some(v) => (size, etag, v),
                None => {
                    cache.not_cached(&format!(
                        "`{}` has only a weak ETag ({etag}), which cannot pin a read to \
                         one version: not cached",
                        shard.name
                    ));
                    return (Tier::None, None, Some(size), Some(etag));
                }
            },
            // No version to key an entry by, or no `HEAD` (a URL signed
            // for GET only): the reads themselves say what is wrong, if
            // anything.
            Ok((size, None)) => {
                cache.not_cached(&format!(
                    "`{}` has no ETag, so a read of it cannot be pinned to one version: not \
                     cached",
                    shard.name
                ));
                return (Tier::None, None, Some(size), None);
            }
            Err(e) => {
                cache.not_cached(&format!("no HEAD for `{}`: {e}", shard.name));
                return (Tier::None, None, shard.size, None);
            }
        };
        let id = crate::dataset::cache_identity(shard, obj, version, size);
        let etag = Some(etag);
        let entry = match cache.lookup(&id) {
            Some(e) => e,
            // A segment that ends inside the shard reads part of it: it
            // fills nothing.
            None if seg.to.is_some() => return (Tier::None, None, Some(size), etag),
            None if !spool.admits() => {
                cache.not_cached(&format!(
                    "`{}`: the disk was behind the reads when it started (`cache_fill` \
                     \"spare\"); a later read fills it",
                    shard.name
                ));
                return (Tier::None, None, Some(size), etag);
            }
            None => match cache.fill(&id, sh.net.stall) {
                Fill::Hit(e) => e,
                Fill::Write(filler) => {
                    let tier = spool.take(filler, size).map_or(Tier::None, Tier::Fill);
                    return (tier, None, Some(size), etag);
                }
                Fill::Uncached(_) => return (Tier::None, None, Some(size), etag),
            },
        };
        let path = cache.dir().join(id.file_name());
        let opened = entry
            .file
            .try_clone()
            .map_err(|e| Error::io(IoOp::Open, &path, &e))
            .and_then(|f| sh.cache_direct.adopt(f, &path, sh.layout()));
        let (file, fd) = match opened {
            Ok((file, fd, _)) => (file, fd),
            Err(e) => {
                cache.not_cached(&e.to_string());
                return (Tier::None, None, Some(size), etag);
            }
        };
        let base = entry.header.data_offset as u64;
        let tier = Tier::Hit {
            entry,
            id,
            base,
            net: Target::Http(Arc::clone(obj)),
            dropped: false,
        };
        (tier, Some((file, fd)), Some(size), etag)
    }

    fn start_read(
        &mut self,
        target: &Target,
        r: &mut PendingRead,
        shard: &Shard,
        tier: &Tier,
    ) -> Result<()> {
        let sh = self.shared;
        // A cache entry's data starts at `base` of its file; a read taken
        // back from a corrupt entry goes to the network.
        let (target, base) = match tier {
            Tier::Hit { base, .. } if r.cached => (target, *base),
            Tier::Hit { net, .. } => (net, 0),
            _ => (target, 0),
        };
        let req = ReadRequest {
            id: r.id,
            target: target.clone(),
            offset: base + r.offset + r.done as u64,
            // SAFETY: slack + done < slack + len <= chunk size.
            buf: unsafe { r.chunk.ptr().add(sh.slack + r.done) },
            len: r.len - r.done,
            buf_index: r.chunk.index(),
            open_end: r.open_end,
            pin: match target {
                Target::Http(_) => self.pin.clone(),
                Target::File(_) => None,
            },
        };
        r.submitting = true;
        // SAFETY: the chunk stays referenced by `r` until the completion is
        // reaped (`reap`, or `drain` on the error path; for ever when the
        // backend panicked inside `submit`), and `fd` stays open (the File
        // outlives both). A direct file's read widened to whole blocks
        // stays inside the chunk: its layout was checked at the file's open
        // (`ChunkLayout::fits`).
        let submitted = unsafe { self.reader.submit(req) };
        r.submitting = false;
        submitted.map_err(|e| Error::io(IoOp::Read, &shard.name, &e))?;
        r.in_flight = true;
        sh.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for at least one completion and applies them; the first read
    /// of a shard of unknown `size` sets it.
    fn reap(
        &mut self,
        target: &Target,
        pending: &mut VecDeque<PendingRead>,
        shard: &Shard,
        size: &mut Option<u64>,
        tier: &Tier,
    ) -> Result<()> {
        let mut done = std::mem::take(&mut self.completions);
        done.clear();
        // A backend may give completions and then fail: apply what it gave
        // (those reads are over) before the error is returned.
        let mut result = self
            .reader
            .wait(1, &mut done)
            .map_err(|e| Error::io(IoOp::Read, &shard.name, &e));
        for c in done.drain(..) {
            let Some(r) = pending.iter_mut().find(|r| r.id == c.id) else {
                continue;
            };
            r.in_flight = false;
            if c.copied > 0 {
                self.shared.pool.add_copied(c.copied as u64);
            }
            if r.open_end && c.result.is_ok() {
                let Some(total) = c.total else {
                    result = result.and(Err(Error::Internal(format!(
                        "`{}`: the read that was to learn the shard's size did not report it",
                        shard.name
                    ))));
                    continue;
                };
                // The rest of the shard is read as one of known size.
                r.open_end = false;
                r.len = r.len.min(total.saturating_sub(r.offset) as usize);
                *size = Some(total);
            }
            match c.result {
                Ok(0) if r.done == r.len => {}
                Ok(0) => {
                    result = result.and(Err(Error::Io {
                        op: IoOp::Read,
                        path: shard.name.clone().into(),
                        message: format!(
                            "the file ended at byte {} but was {} bytes when opened",
                            r.offset + r.done as u64,
                            size.map_or("?".into(), |s| s.to_string())
                        ),
                        errno: 0,
                    }));
                }
                Ok(n) => {
                    r.done += n;
                    self.bytes_in = true;
                    self.shared
                        .counters
                        .bytes_read
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(ReadFail::Io(e)) => {
                    result = result.and(Err(Error::io(IoOp::Read, &shard.name, &e)))
                }
                Err(ReadFail::Net(e)) => result = result.and(Err(e)),
            }
        }
        self.completions = done;
        result?;
        // Continue short reads.
        for r in pending.iter_mut() {
            if !r.in_flight && r.done < r.len {
                // In place: the read stays in `pending` (and its chunk with
                // it) whatever `submit` does.
                self.start_read(target, r, shard, tier)?;
            }
        }
        Ok(())
    }

    /// Waits for every read still in flight; errors no longer matter here.
    fn drain(&mut self, pending: &mut VecDeque<PendingRead>) {
        while pending.iter().any(|r| r.in_flight) {
            let mut done = Vec::new();
            let waited = catch_unwind(AssertUnwindSafe(|| self.reader.wait(1, &mut done)));
            if !matches!(waited, Ok(Ok(()))) {
                // The backend cannot wait (or panicked): keep the chunks
                // forever rather than let the kernel write into reused memory.
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
