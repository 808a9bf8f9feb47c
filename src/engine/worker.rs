//! A worker: one thread, one I/O backend, one stream of the epoch plan
//! (`crate::plan`). It reads its segments' shards in file order into chunks
//! (its reads are `reading`'s), feeds each chunk's bytes to the tar walk in
//! shard order (sample assembly is `assemble`), and at the end of an epoch
//! drains its shuffler and sends its short last batch to the sequencer.
//!
//! How many reads go: on local files `reads_in_flight` (auto: 4); over the
//! network what the loader's in-flight count (`NetReads`) gives each
//! worker, counting the reads whose bytes are still coming (a read done
//! and waiting behind a slower one holds a chunk, not a place in flight);
//! and once every read of a remote shard is asked for, the stream's next
//! shard's reads begin (`Ahead`), so a shard's end does not idle the link.
//! Every read in flight owns its chunk until its completion arrives, on
//! every path out (error or panic).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dataset::{Shard, Source};
use crate::engine::assemble::{ShardSink, emit_ghost, emit_held};
use crate::engine::reading::{
    HEADROOM, NextShards, PendingRead, Reading, ahead_reads, coming, held_bound,
};
use crate::engine::shared::{Item, Shared};
use crate::engine::shuffler::Shuffler;
use crate::engine::tier::{Tier, consult};
use crate::error::{Error, Result};
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{Reader, Target};
use crate::memory::BatchBuilder;
use crate::net::retry::Jitter;
use crate::net::version::VersionPin;
use crate::plan::{Segment, ShuffleBuffer};
use crate::tar::TarWalk;

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
    /// The plan stream this worker reads; also its chunk-quota owner.
    stream: usize,
    builder: BatchBuilder,
    shuffle: Option<Shuffler>,
    /// Connections for the `HEAD`s that check a remote shard's version
    /// against the cache (made at the first).
    heads: Option<(HttpPool, Jitter)>,
    /// The reads, in flight and done.
    io: Reading<'a>,
}

impl<'a> Worker<'a> {
    pub(crate) fn new(shared: &'a Arc<Shared>, reader: &'a mut dyn Reader, stream: usize) -> Self {
        Worker {
            shared,
            stream,
            builder: BatchBuilder::new(shared.cfg.batch_size),
            shuffle: None,
            heads: None,
            io: Reading::new(shared, reader, stream),
        }
    }

    /// Runs every epoch of the plan; reads of next shards begun early are
    /// waited for on every way out (an error or a panic too) before their
    /// chunks can go back.
    pub(crate) fn run(&mut self) -> Result<()> {
        let result = catch_unwind(AssertUnwindSafe(|| self.epochs()));
        while let Some(mut a) = self.io.ahead.pop_front() {
            self.io.drain(&mut a.pending);
        }
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    fn epochs(&mut self) -> Result<()> {
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
                let quota = sh.pool.quota_of(sh.owner(self.stream));
                // Besides the buffer's chunks a worker holds its reads in
                // flight, the chunk being parsed, a spill run and a
                // compaction target; one more absorbs the check coming
                // after the push that crossed the limit.
                let remote = sh
                    .shards
                    .iter()
                    .any(|s| matches!(s.source, Source::Http(_)));
                let local = sh.cfg.read_depth().local;
                let reads = match remote {
                    true => local.max(sh.reads.most_per_worker()),
                    false => local,
                };
                let limit = quota.saturating_sub(reads + HEADROOM + 2);
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
                if sh.is_full(epoch) {
                    // A nominal epoch delivered its length: the sequencer
                    // leaves out the rest, so it is not read.
                    break;
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
                // The next shards' reads may begin before this one's end
                // when nothing must be asked first (a cache's HEAD) and
                // none of them is skipped (a resume's replay): as many
                // shards as a worker keeps reads in flight at the most
                // (each takes one at least), up to the first that may not.
                let next: Vec<(usize, &Shard)> = match sh.cache.is_none() {
                    true => plan.streams[self.stream]
                        .iter()
                        .enumerate()
                        .skip(place + 1)
                        .take(sh.reads.most_per_worker())
                        .map(|(p, n)| (p, &sh.shards[n.shard]))
                        .take_while(|&(p, s)| {
                            matches!(s.source, Source::Http(_))
                                && sh.replayed(epoch, self.stream, p).is_none()
                        })
                        .collect(),
                    false => Vec::new(),
                };
                self.shard(shard, seg, ghosts, epoch, place, &next)
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
        place: usize,
        next: NextShards<'_>,
    ) -> Result<()> {
        let mut pending: VecDeque<PendingRead> = VecDeque::new();
        let mut next_offset = 0;
        let begun = match self.io.ahead.front() {
            Some(a) if a.place == place && a.epoch == epoch => self.io.ahead.pop_front(),
            _ => {
                // Begun for shards that are not next after all.
                while let Some(mut stale) = self.io.ahead.pop_front() {
                    self.io.drain(&mut stale.pending);
                }
                None
            }
        };
        // The file (when local, or a cache entry) stays open until every
        // read of it completed.
        let mut tier = Tier::None;
        let (_file, target, size) = match &shard.source {
            _ if begun.is_some() => {
                let mut a = begun.expect("checked");
                if let Some(e) = a.failed.take() {
                    self.io.drain(&mut a.pending);
                    return Err(e);
                }
                self.io.pin = Some(a.pin);
                pending = a.pending;
                next_offset = a.next_offset;
                (None, a.target, a.size)
            }
            Source::File(path) => {
                self.io.pin = None;
                let (file, fd, size) = self.shared.direct.open(path, self.shared.layout())?;
                (Some(file), Target::File(fd), Some(size))
            }
            Source::Http(obj) => {
                let (tier_now, file, size, etag) =
                    consult(self.shared, &mut self.heads, self.stream, shard, obj, seg);
                tier = tier_now;
                self.io.pin = Some(Arc::new(VersionPin::planned(etag, size)));
                match file {
                    Some((file, fd)) => (Some(file), Target::File(fd), size),
                    // Unknown (`None`) for a remote shard the resolver did
                    // not size: its first read learns it.
                    None => (None, Target::Http(Arc::clone(obj)), size),
                }
            }
        };
        // Reads still in flight write into their chunks: on every way out of
        // the shard, an error or a panic included, wait for them before the
        // chunks can go back to the pool (unwinding would drop `pending`).
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.shard_reads(
                &target,
                shard,
                seg,
                ghosts,
                (size, next_offset),
                (epoch, next),
                &mut pending,
                &mut tier,
            )
        }));
        if !matches!(result, Ok(Ok(()))) {
            // The next shards' reads are waited for with this one's.
            while let Some(a) = self.io.ahead.pop_front() {
                pending.extend(a.pending);
            }
        }
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
            self.io.drain(&mut pending);
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
        (size, next_offset): (Option<u64>, u64),
        (epoch, next): (u64, NextShards<'_>),
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
        let result = self.pump(
            target,
            shard,
            (size, next_offset),
            (epoch, next),
            &mut walk,
            &mut sink,
            pending,
            tier,
        );
        self.builder = sink.builder;
        self.shuffle = sink.shuffle;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn pump(
        &mut self,
        target: &Target,
        shard: &Shard,
        (mut size, mut next_offset): (Option<u64>, u64),
        (epoch, next): (u64, NextShards<'_>),
        walk: &mut TarWalk,
        sink: &mut ShardSink<'_>,
        pending: &mut VecDeque<PendingRead>,
        tier: &mut Tier,
    ) -> Result<()> {
        let sh = self.shared;
        loop {
            if let Some(s) = size {
                self.io.last_size = s;
            }
            // Keep up to `reads_in_flight` reads going; block for a chunk only
            // when nothing is in flight, so parsing never waits on itself.
            // Until this worker's first read is in, it is the only one: over
            // the network, read-ahead would share the bandwidth with it and
            // delay the first batch (4 workers x 4 reads of 8 MiB is 128 MiB
            // before any sample; 32 MiB with this).
            let net = matches!(target, Target::Http(_));
            let depth = match (self.io.bytes_in, net) {
                (false, _) => 1,
                // As many as the link needs (`NetReads`), counted while
                // their bytes are still coming: a read done and waiting
                // for the walk behind a slow one holds its chunk, not a
                // place in flight, so one slow answer never idles the
                // link (`held_bound` bounds the reads waiting).
                (true, true) => sh.reads.per_worker(),
                (true, false) => sh.cfg.read_depth().local,
            };
            // A shard of unknown size has its first read alone (the rest
            // is planned when its completion says the size), unless the
            // shard before it filled the whole read-ahead: then its reads go
            // out together, each able to end early (a read that starts past
            // the end gets nothing, and the size), so a run of large shards
            // pays no round trip alone per shard, and a run of small ones
            // sends no read in vain.
            let speculate = self.io.last_size >= depth as u64 * sh.data_len as u64;
            let issue = if size.is_none() && !speculate {
                1
            } else {
                depth
            };
            let room = |w: &Self, p: &VecDeque<PendingRead>| match net {
                true => {
                    let (held, due) = ahead_reads(&w.io.ahead);
                    coming(p) + due < issue && p.len() + held < held_bound(issue)
                }
                false => p.len() < issue,
            };
            while room(self, pending) && size.is_none_or(|s| next_offset < s) {
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
                    if net {
                        sh.reads.short_of_memory();
                    }
                    break;
                };
                let len = match size {
                    Some(s) => (sh.data_len as u64).min(s - next_offset) as usize,
                    None => sh.data_len,
                };
                let id = self.io.next_read_id;
                self.io.next_read_id += 1;
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
                    asked: None,
                    timing: None,
                };
                next_offset += len as u64;
                pending.push_back(read);
                let last = pending.len() - 1;
                self.io
                    .start_read(target, &mut pending[last], shard, tier)?;
            }
            if net && !next.is_empty() && size.is_some_and(|s| next_offset >= s) {
                // Every read of this shard is asked for: the next ones'
                // may begin.
                self.io.read_ahead(next, epoch, depth, pending)?;
            }
            let Some(front) = pending.front() else {
                break;
            };
            if front.in_flight || front.done < front.len {
                self.io.reap(target, pending, shard, &mut size, tier)?;
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
                        self.io.start_read(target, &mut pending[0], shard, tier)?;
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
                                "`{}`: the disk could not write it without holding the reads \
                                 up (`cache_fill` \"spare\"); a later read fills it",
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
            && self.io.pin.as_ref().is_some_and(|p| p.strong().is_some())
        {
            // Read whole, every piece of the one version the entry is keyed
            // by (each answer had the pinned strong ETag, or the read
            // failed): the entry is complete, with the count learned.
            fill.finish(Some(found));
        }
        Ok(())
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
