//! A worker's reads (`Reading`): the reads in flight of the shard being
//! walked (`PendingRead`), and of the stream's next shards begun before
//! this one's end (`Ahead`); submitting them to the backend, applying
//! completions (short reads continued, a shard's size learned from its
//! first read, the time of each network read given to `NetReads`), and
//! waiting for every read in flight before its chunk goes back — on every
//! path out, errors and panics included.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::dataset::{Shard, Source};
use crate::engine::shared::Shared;
use crate::engine::tier::Tier;
use crate::error::{Error, Fault, IoOp, Result};
use crate::fetch::{Completion, ReadFail, ReadRequest, Reader, Target};
use crate::memory::ChunkRef;
use crate::net::version::VersionPin;

/// Chunks of a worker's quota that read-ahead leaves alone: one for a spill
/// run and one for a shuffle compaction target.
pub(super) const HEADROOM: usize = 2;

/// The most of a worker's network reads, in flight or done and waiting
/// behind a slower one for the walk, when `depth` may be in flight: a
/// quarter more (at least one), so a slow answer at the head does not
/// stop the link at once, while the chunks held behind it stay few. Each
/// chunk held is memory touched, and on a VM whose host backs a page only
/// at its first touch that costs as much as the read: on the emulator's S3
/// model a quarter more read faster and at less CPU per GB than twice the
/// depth, with more transfers in flight, not fewer (docs/benchmark-history.md,
/// "An object store's shape, commit 4cf4d38").
pub(super) fn held_bound(depth: usize) -> usize {
    depth + (depth / 4).max(1)
}

pub(super) struct PendingRead {
    pub(super) id: u64,
    pub(super) chunk: ChunkRef,
    /// Shard offset of the first byte.
    pub(super) offset: u64,
    pub(super) len: usize,
    /// Bytes that arrived so far (short reads are continued).
    pub(super) done: usize,
    pub(super) in_flight: bool,
    /// Set while the backend's `submit` runs: if it panics, whether the
    /// read was queued is unknown, so its chunk is never returned.
    pub(super) submitting: bool,
    /// The shard's first read while its size is unknown: it may end early,
    /// and its completion says the size (`ReadRequest::open_end`).
    pub(super) open_end: bool,
    /// Read from a cache entry (checked before use), not the network.
    pub(super) cached: bool,
    /// When it was first asked for (the reads in flight are sized by how
    /// long network reads take).
    pub(super) asked: Option<std::time::Instant>,
    /// How long its answer took (`Completion::timing`).
    pub(super) timing: Option<crate::fetch::Answered>,
}

/// Reads of one of a stream's next shards, started while the current
/// one's last reads were still coming in (remote shards read without a
/// cache): at a far object store a read takes ~115 ms, and a worker that
/// waited for a shard's last read before asking for the next shard's
/// first would leave the link half idle at every shard's end.
pub(super) struct Ahead {
    /// The next shard's place in the stream's plan, and the epoch.
    pub(super) place: usize,
    pub(super) epoch: u64,
    pub(super) name: String,
    pub(super) target: Target,
    pub(super) pin: Arc<VersionPin>,
    pub(super) pending: VecDeque<PendingRead>,
    pub(super) next_offset: u64,
    pub(super) size: Option<u64>,
    /// A read of it failed: the error, given when its turn comes (the
    /// shard before it is not to blame).
    pub(super) failed: Option<Error>,
}

/// The shards after the current one in a stream's plan whose reads may
/// start early, in order: their places and the shards. Small shards (a
/// read or two each) need several begun at once to keep the link busy:
/// 1 MiB at S3's ~32 ms is ~30 MB/s a read.
pub(super) type NextShards<'s> = &'s [(usize, &'s Shard)];

/// The reads in flight still to get bytes.
pub(super) fn coming(q: &VecDeque<PendingRead>) -> usize {
    q.iter().filter(|r| r.done < r.len).count()
}

/// The reads begun ahead: those holding a chunk, and those still coming.
pub(super) fn ahead_reads(a: &VecDeque<Ahead>) -> (usize, usize) {
    a.iter().fold((0, 0), |(h, c), x| {
        (h + x.pending.len(), c + coming(&x.pending))
    })
}

/// What a worker's reads share: its backend, the completions buffer, the
/// read ids, and what the reads have learned.
pub(super) struct Reading<'a> {
    pub(super) shared: &'a Arc<Shared>,
    reader: &'a mut dyn Reader,
    pub(super) stream: usize,
    completions: Vec<Completion>,
    pub(super) next_read_id: u64,
    /// A read of this worker has completed (read-ahead may start).
    pub(super) bytes_in: bool,
    /// The size of the last shard this worker read (0 before the first).
    pub(super) last_size: u64,
    /// The version the remote shard being read is pinned to: every GET of
    /// it carries the pin (`If-Match`, answers checked), so one read of a
    /// shard is one version or fails with `Error::Changed` (never a
    /// restart: samples of it may be out already).
    pub(super) pin: Option<Arc<VersionPin>>,
    /// Reads of the stream's next shards, started before this one's end,
    /// in the plan's order.
    pub(super) ahead: VecDeque<Ahead>,
}

impl<'a> Reading<'a> {
    pub(super) fn new(shared: &'a Arc<Shared>, reader: &'a mut dyn Reader, stream: usize) -> Self {
        Reading {
            shared,
            reader,
            stream,
            completions: Vec::new(),
            next_read_id: 1,
            bytes_in: false,
            last_size: 0,
            pin: None,
            ahead: VecDeque::new(),
        }
    }

    pub(super) fn start_read(
        &mut self,
        target: &Target,
        r: &mut PendingRead,
        shard: &Shard,
        tier: &Tier,
    ) -> Result<()> {
        // A cache entry's data starts at `base` of its file; a read taken
        // back from a corrupt entry goes to the network.
        let (target, base) = match tier {
            Tier::Hit { base, .. } if r.cached => (target, *base),
            Tier::Hit { net, .. } => (net, 0),
            _ => (target, 0),
        };
        let pin = self.pin.clone();
        self.submit(target, base, r, &shard.name, pin)
    }

    /// Starts (or continues) read `r` of `target` from `base`, pinned to
    /// `pin` when it goes over the network.
    fn submit(
        &mut self,
        target: &Target,
        base: u64,
        r: &mut PendingRead,
        name: &str,
        pin: Option<Arc<VersionPin>>,
    ) -> Result<()> {
        let sh = self.shared;
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
                Target::Http(_) => pin,
                Target::File(_) => None,
            },
        };
        r.asked.get_or_insert_with(std::time::Instant::now);
        r.submitting = true;
        // SAFETY: the chunk stays referenced by `r` until the completion is
        // reaped (`reap`, or `drain` on the error path; for ever when the
        // backend panicked inside `submit`), and `fd` stays open (the File
        // outlives both). A direct file's read widened to whole blocks
        // stays inside the chunk: its layout was checked at the file's open
        // (`ChunkLayout::fits`).
        let submitted = unsafe { self.reader.submit(req) };
        r.submitting = false;
        submitted.map_err(|e| Error::io(IoOp::Read, name, &e))?;
        r.in_flight = true;
        sh.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts reads of the stream's next shards (`next`, in the plan's
    /// order) while `current`'s last reads come in, up to `depth` coming in
    /// for all of them; never waits for a chunk. A shard's reads begin only
    /// once every read of the one before it is asked for. A shard of
    /// unknown size gets as many reads as the one before it took (each
    /// able to end early), then the rest once its size is in.
    pub(super) fn read_ahead(
        &mut self,
        next: NextShards<'_>,
        epoch: u64,
        depth: usize,
        current: &VecDeque<PendingRead>,
    ) -> Result<()> {
        for (i, &(place, shard)) in next.iter().enumerate() {
            let Source::Http(obj) = &shard.source else {
                return Ok(());
            };
            if i == self.ahead.len() {
                self.ahead.push_back(Ahead {
                    place,
                    epoch,
                    name: shard.name.clone(),
                    target: Target::Http(Arc::clone(obj)),
                    pin: Arc::new(VersionPin::planned(None, shard.size)),
                    pending: VecDeque::new(),
                    next_offset: 0,
                    size: shard.size,
                    failed: None,
                });
            }
            let a = &self.ahead[i];
            if a.place != place || a.epoch != epoch {
                // Begun for another plan's shard: not ours to go on with.
                return Ok(());
            }
            self.read_ahead_one(i, shard, depth, current)?;
            let a = &self.ahead[i];
            let guess = self.last_size.max(1);
            let asked = a
                .size
                .map_or(a.next_offset >= guess, |s| a.next_offset >= s);
            if a.failed.is_some() || !asked {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Reads of `self.ahead[i]` (of `next`), as `read_ahead` says.
    fn read_ahead_one(
        &mut self,
        i: usize,
        next: &Shard,
        depth: usize,
        current: &VecDeque<PendingRead>,
    ) -> Result<()> {
        let sh = self.shared;
        let guess = self.last_size.max(1);
        let mut result = Ok(());
        loop {
            let (held, due) = ahead_reads(&self.ahead);
            let a = &self.ahead[i];
            if !(a.failed.is_none()
                && coming(current) + due < depth
                && current.len() + held < held_bound(depth)
                && a.size.map_or(a.next_offset < guess, |s| a.next_offset < s))
            {
                break;
            }
            let chunk = match sh.pool.acquire_spare_as(sh.owner(self.stream), HEADROOM) {
                Ok(Some(c)) => c,
                Ok(None) => {
                    sh.reads.short_of_memory();
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let a = &mut self.ahead[i];
            let len = match a.size {
                Some(s) => (sh.data_len as u64).min(s - a.next_offset) as usize,
                None => sh.data_len,
            };
            let id = self.next_read_id;
            self.next_read_id += 1;
            a.pending.push_back(PendingRead {
                id,
                chunk,
                offset: a.next_offset,
                len,
                done: 0,
                in_flight: false,
                submitting: false,
                open_end: a.size.is_none(),
                cached: false,
                asked: None,
                timing: None,
            });
            a.next_offset += len as u64;
            sh.counters.reads_ahead.fetch_add(1, Ordering::Relaxed);
            let pin = Some(Arc::clone(&a.pin));
            let target = a.target.clone();
            // Taken out while it is submitted: `submit` borrows `self`.
            let mut r = a.pending.pop_back().expect("just pushed");
            let submitted = catch_unwind(AssertUnwindSafe(|| {
                self.submit(&target, 0, &mut r, &next.name, pin)
            }));
            let a = &mut self.ahead[i];
            match submitted {
                Ok(Ok(())) => a.pending.push_back(r),
                Ok(Err(e)) => {
                    // Not queued: the chunk is free to go back.
                    drop(r);
                    a.failed = Some(e);
                }
                Err(panic) => {
                    // Whether the backend queued it is unknown: its chunk
                    // is kept for ever, and the rest are waited for.
                    std::mem::forget(r.chunk);
                    resume_unwind(panic);
                }
            }
        }
        result
    }

    /// Waits for at least one completion and applies them; the first read
    /// of a shard of unknown `size` sets it. Completions of the next
    /// shards' reads (`Ahead`) are applied to those: a failure of one is
    /// kept for that shard's turn.
    pub(super) fn reap(
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
        let net = matches!(target, Target::Http(_));
        for c in done.drain(..) {
            if let Some(r) = pending.iter_mut().find(|r| r.id == c.id) {
                result = result.and(self.apply(r, c, size, &shard.name, net));
                continue;
            }
            self.apply_ahead(c);
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
        // Continue the short reads begun ahead.
        let mut aheads = std::mem::take(&mut self.ahead);
        for a in aheads.iter_mut() {
            let target = a.target.clone();
            for i in 0..a.pending.len() {
                let r = &a.pending[i];
                if a.failed.is_some() || r.in_flight || r.done == r.len {
                    continue;
                }
                let pin = Some(Arc::clone(&a.pin));
                let name = a.name.clone();
                let r = &mut a.pending[i];
                match catch_unwind(AssertUnwindSafe(|| self.submit(&target, 0, r, &name, pin))) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => a.failed = Some(e),
                    Err(panic) => {
                        // Whether the backend queued it is unknown: its
                        // chunk is kept for ever; the rest are waited for.
                        if let Some(r) = a.pending.remove(i) {
                            std::mem::forget(r.chunk);
                        }
                        self.ahead = aheads;
                        resume_unwind(panic);
                    }
                }
            }
        }
        self.ahead = aheads;
        Ok(())
    }

    /// Applies completion `c` to the read begun ahead it belongs to, if
    /// any; a failure is that shard's, given when its turn comes.
    fn apply_ahead(&mut self, c: Completion) {
        let Some(i) = self
            .ahead
            .iter()
            .position(|a| a.pending.iter().any(|r| r.id == c.id))
        else {
            return;
        };
        let mut a = self.ahead.remove(i).expect("found");
        let r = a.pending.iter_mut().find(|r| r.id == c.id).expect("found");
        if let Err(e) = self.apply(r, c, &mut a.size, &a.name, true) {
            a.failed.get_or_insert(e);
        }
        self.ahead.insert(i, a);
    }

    /// Applies completion `c` to read `r` (of a shard of `size`, named
    /// `name`; `net`: over the network).
    fn apply(
        &mut self,
        r: &mut PendingRead,
        c: Completion,
        size: &mut Option<u64>,
        name: &str,
        net: bool,
    ) -> Result<()> {
        r.in_flight = false;
        // A read continued after a short one: the first answer's first
        // byte, the last one's end and pacing.
        r.timing = match (r.timing, c.timing) {
            (Some(was), Some(now)) => Some(crate::fetch::Answered {
                first_byte: was.first_byte,
                ..now
            }),
            (was, now) => now.or(was),
        };
        if c.copied > 0 {
            self.shared.pool.add_copied(c.copied as u64);
        }
        if r.open_end && c.result.is_ok() {
            let Some(total) = c.total else {
                return Err(Error::internal(
                    Fault::Invariant,
                    format!(
                        "`{name}`: the read that was to learn the shard's size did not report it"
                    ),
                ));
            };
            // The rest of the shard is read as one of known size.
            r.open_end = false;
            r.len = r.len.min(total.saturating_sub(r.offset) as usize);
            *size = Some(total);
        }
        match c.result {
            Ok(0) if r.done == r.len => Ok(()),
            Ok(0) => Err(Error::Io {
                op: IoOp::Read,
                path: name.into(),
                message: format!(
                    "the file ended at byte {} but was {} bytes when opened",
                    r.offset + r.done as u64,
                    size.map_or("?".into(), |s| s.to_string())
                ),
                errno: 0,
            }),
            Ok(n) => {
                r.done += n;
                self.bytes_in = true;
                self.shared
                    .counters
                    .bytes_read
                    .fetch_add(n as u64, Ordering::Relaxed);
                if r.done == r.len
                    && !r.cached
                    && net
                    && let Some(asked) = r.asked
                {
                    let fresh = r.chunk.first_use();
                    self.shared.reads.completed(asked, r.timing, r.len, fresh);
                }
                Ok(())
            }
            Err(ReadFail::Io(e)) => Err(Error::io(IoOp::Read, name, &e)),
            Err(ReadFail::Net(e)) => Err(e),
        }
    }

    /// Waits for every read still in flight; errors no longer matter here.
    pub(super) fn drain(&mut self, pending: &mut VecDeque<PendingRead>) {
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
                    continue;
                }
                // The next shards' reads go on: theirs are applied.
                self.apply_ahead(c);
            }
        }
        pending.clear();
    }
}
