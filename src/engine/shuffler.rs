//! A worker's shuffle buffer over real samples, within the memory budget.
//!
//! The order comes from [`crate::plan::ShuffleBuffer`] (pure, seeded). What
//! this adds is memory: a sample waiting in the buffer keeps its whole chunk
//! alive, and the survivors of a chunk thin out slowly, so a buffer of B
//! samples of m per chunk pins about `B/m · (ln m + 0.6)` chunks, several
//! times its own bytes. When the chunks the buffer pins pass the worker's
//! limit, the survivors of the sparsest chunks are copied together into a
//! fresh chunk (counted as copied bytes), which lets the sparse chunks go
//! back to the pool. The order does not change: only where bytes live.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::counters::Counters;
use crate::error::{Error, Result};
use crate::memory::{ChunkPool, ChunkRef};
use crate::memory::{HeldSample, NO_SOURCE};
use crate::plan::ShuffleBuffer;

#[derive(Default, Clone, Copy)]
struct Pin {
    samples: u32,
    bytes: u64,
    chunks: u32,
}

/// `runs_of` for a sample pointing into several runs (or none).
const MULTI: u32 = u32::MAX;

fn run_of(h: &HeldSample) -> u32 {
    let mut runs = h.chunks();
    match (runs.next(), runs.next()) {
        (Some(c), None) => c.index(),
        _ => MULTI,
    }
}

pub(crate) struct Shuffler {
    buf: ShuffleBuffer<HeldSample>,
    /// Runs the buffered samples point into, by first chunk (a table over
    /// the pool's chunks: this is on every sample's path).
    pins: Vec<Pin>,
    /// Per buffered sample (mirroring the buffer's order), the run it points
    /// into, `MULTI` when several: compaction scans this, 4 bytes a sample,
    /// instead of the samples themselves.
    runs_of: Vec<u32>,
    pinned_chunks: usize,
    /// Payload bytes of the buffered samples.
    bytes: u64,
    /// Most chunks the buffer may pin before it compacts.
    limit: usize,
    stream: usize,
    /// The pool's owner number of the stream's chunks.
    owner: usize,
    /// Where compaction copies to, and the bytes used in it.
    target: Option<(ChunkRef, usize)>,
    pool: Arc<ChunkPool>,
    /// Where compaction counts what it copies (`shuffle_copied`).
    counters: Arc<Counters>,
}

impl Shuffler {
    pub(crate) fn new(
        buf: ShuffleBuffer<HeldSample>,
        limit: usize,
        (stream, owner): (usize, usize),
        pool: Arc<ChunkPool>,
        counters: Arc<Counters>,
    ) -> Self {
        Shuffler {
            buf,
            pins: vec![Pin::default(); pool.chunk_count()],
            runs_of: Vec::new(),
            pinned_chunks: 0,
            bytes: 0,
            limit: limit.max(1),
            stream,
            owner,
            target: None,
            pool,
            counters,
        }
    }

    fn pin(&mut self, h: &HeldSample, chunk_size: usize) {
        self.bytes += h.bytes();
        for c in h.chunks() {
            let p = &mut self.pins[c.index() as usize];
            if p.samples == 0 {
                p.chunks = (c.len() / chunk_size) as u32;
                self.pinned_chunks += p.chunks as usize;
            }
            p.samples += 1;
            p.bytes += h.bytes();
        }
    }

    fn unpin(&mut self, h: &HeldSample) {
        self.bytes -= h.bytes();
        for c in h.chunks() {
            let p = &mut self.pins[c.index() as usize];
            p.samples -= 1;
            p.bytes = p.bytes.saturating_sub(h.bytes());
            if p.samples == 0 {
                self.pinned_chunks -= p.chunks as usize;
                p.bytes = 0;
            }
        }
    }

    /// Puts a sample in; may give one out.
    pub(crate) fn push(&mut self, h: HeldSample) -> Result<Option<HeldSample>> {
        let cs = self.pool.chunk_size();
        self.pin(&h, cs);
        self.runs_of.push(run_of(&h));
        let out = self.buf.push(h);
        if let Some(o) = &out {
            self.runs_of.swap_remove(self.buf.last_taken());
            self.unpin(o);
        }
        if self.pinned_chunks > self.limit {
            self.compact()?;
        }
        // Packed tight, the buffer's samples would still pass the limit.
        if self.bytes.div_ceil(cs as u64) as usize > self.limit {
            return Err(self.too_big());
        }
        Ok(out)
    }

    fn too_big(&self) -> Error {
        Error::BudgetTooSmall {
            budget: self.pool.arena().len() as u64,
            detail: format!(
                "the shuffle buffer of worker {} holds {} samples ({} bytes) in {} chunks of {} bytes, \
                 and may pin {} of the {} a worker holds: lower `shuffle_buffer` or raise \
                 `memory_budget` (see docs/epochs.md, \"Memory cost of shuffling\")",
                self.stream,
                self.buf.len(),
                self.bytes,
                self.pinned_chunks,
                self.pool.chunk_size(),
                self.limit,
                self.pool.quota_of(self.owner)
            ),
        }
    }

    /// The next sample of the end-of-epoch drain.
    pub(crate) fn drain_one(&mut self) -> Option<HeldSample> {
        let out = self.buf.drain_one();
        if let Some(o) = &out {
            self.runs_of.swap_remove(self.buf.last_taken());
            self.unpin(o);
        }
        if self.buf.is_empty() {
            self.target = None;
        }
        out
    }

    /// Copies the survivors of the sparsest runs into dense chunks until the
    /// buffer pins less than its limit, or no run is at most 3/4 full.
    fn compact(&mut self) -> Result<()> {
        let cs = self.pool.chunk_size();
        let target_run = self.target.as_ref().map(|(t, _)| t.index());
        let mut runs: Vec<(u32, Pin)> = self
            .pins
            .iter()
            .enumerate()
            .map(|(k, p)| (k as u32, *p))
            .filter(|(k, p)| p.samples > 0 && Some(*k) != target_run)
            .collect();
        // Fullness: bytes per chunk of the run, emptiest first.
        runs.sort_by_key(|(k, p)| (p.bytes / u64::from(p.chunks.max(1)), *k));
        // Just back under the limit: the runs freed are then the oldest, with
        // the fewest survivors (a run's survivors thin out as exp(-age/B)),
        // so each chunk freed costs the least copy. Compacting further down
        // would move younger, fuller runs: measured 6.9% of the bytes copied
        // with a 3/4 target against 4.9% with this one (B = 2,500 per worker,
        // ~340 samples per chunk). The scan it costs per compaction is
        // sequential over the buffer.
        let goal = self.pinned_chunks - (self.limit - 1);
        let mut chosen = vec![false; self.pins.len()];
        // Moving a run 3/4 full frees a chunk for 3/4 of a chunk copied;
        // fuller runs are left alone, unless none is that empty: then any
        // run not full is moved (the buffer's bytes, packed, fit the limit:
        // `push` checks), or the stream would stop with the budget holding
        // room for them.
        let three_quarters = |p: &Pin| p.bytes * 4 <= u64::from(p.chunks) * cs as u64 * 3;
        let not_full = |p: &Pin| p.bytes < u64::from(p.chunks) * cs as u64;
        let mut any = false;
        for movable in [&three_quarters as &dyn Fn(&Pin) -> bool, &not_full] {
            let mut freed = 0usize;
            for &(k, p) in &runs {
                if !movable(&p) || freed >= goal {
                    break;
                }
                chosen[k as usize] = true;
                any = true;
                freed += p.chunks as usize;
            }
            if any {
                break;
            }
        }
        if !any {
            // Every run is full: the buffer's own bytes pass the limit,
            // which compaction cannot fix.
            if self.pinned_chunks > self.limit {
                return Err(self.too_big());
            }
            return Ok(());
        }
        let mut copied = 0u64;
        for i in 0..self.buf.len() {
            let hit = match self.runs_of[i] {
                MULTI => self.buf.items()[i]
                    .chunks()
                    .any(|c| chosen[c.index() as usize]),
                r => chosen[r as usize],
            };
            if !hit {
                continue;
            }
            let size = self.buf.items()[i].moved_size();
            if size > cs {
                continue;
            }
            let room = self
                .target
                .as_ref()
                .is_some_and(|(_, used)| used + size <= cs);
            if !room {
                // Never wait here: the chunks this would wait for may be
                // the ones this buffer pins. Compact again on a later push.
                match self.pool.acquire_as(self.owner, 1, false)? {
                    Some(run) => self.target = Some((run, 0)),
                    None => break,
                }
            }
            let (run, at) = {
                let (run, used) = self.target.as_ref().expect("a target exists");
                (run.clone(), *used)
            };
            let h = &mut self.buf.items_mut()[i];
            let bytes = h.bytes();
            // Unpin before the move (the pins follow the sample's chunks).
            let mut held = std::mem::replace(h, HeldSample::new(b"", NO_SOURCE));
            self.unpin(&held);
            // SAFETY: `at + size <= chunk size`: the range is free in the
            // target run, which only this worker writes.
            let end = unsafe { held.move_into(&run, at) };
            if let Some((_, used)) = self.target.as_mut() {
                *used = end;
            }
            self.pin(&held, cs);
            self.runs_of[i] = run_of(&held);
            self.buf.items_mut()[i] = held;
            copied += bytes;
        }
        self.pool.add_copied(copied);
        // Relaxed: a statistic.
        self.counters
            .shuffle_copied
            .fetch_add(copied, Ordering::Relaxed);
        Ok(())
    }
}
