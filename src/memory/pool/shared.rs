//! A pool several loaders share (a node engine's, one loader per
//! consumer): owners come and go with their loaders, each stream with the
//! same share; the budget's chunks are used first, the arena past it only
//! while more streams are attached than the budget was split among, or for
//! what processes outside the engine keep, charged to them
//! ([`ChunkPool::join_holder`], [`ChunkPool::recharge`]).

use std::sync::Arc;

use super::{ChunkPool, MAX_OWNERS, PoolState};
use crate::error::{Error, Fault, Result};
use crate::memory::{Arena, ChunkRef};

impl ChunkPool {
    /// A pool several loaders share (a node engine's, one loader per
    /// consumer): each stream of each loader may hold `share` chunks, as
    /// it would in a loader of its own. The first `preferred` chunks (the
    /// budget) are used first; the rest of the arena only while more
    /// streams are attached than the budget was split among (a second
    /// DataLoader over the same data, an old one not yet shut down), so no
    /// consumer ever waits on chunks another one holds. Each loader takes
    /// its owners with [`ChunkPool::join`].
    pub fn new_shared(
        arena: Arena,
        chunk_size: usize,
        share: usize,
        preferred: usize,
    ) -> Arc<ChunkPool> {
        let pool = ChunkPool::new(arena, chunk_size);
        {
            let mut s = pool.lock();
            s.shared = true;
            s.quota = share;
            s.preferred = preferred.clamp(1, pool.chunk_count().max(1));
            // Owners start spread over the budget (eight starting points).
            let n = s.preferred;
            s.next = (0..=MAX_OWNERS).map(|o| o % 8 * n / 8).collect();
        }
        pool
    }

    pub fn is_shared(&self) -> bool {
        self.lock().shared
    }

    /// The chunks used first: a shared pool's budget, else all of them.
    pub fn preferred_chunks(&self) -> usize {
        let s = self.lock();
        if s.shared {
            s.preferred
        } else {
            self.chunk_count()
        }
    }

    /// Owners of loaders using the pool now (a shared pool's streams).
    pub fn live_owners(&self) -> usize {
        let s = self.lock();
        s.live
            .iter()
            .zip(&s.holders)
            .filter(|(l, h)| **l && h.is_none())
            .count()
    }

    /// Takes `owners` owner numbers of a shared pool for one loader (its
    /// streams) and returns the first. The engine split its budget among
    /// `expected` streams per consumer: the loader's streams split that
    /// part, so one that runs fewer (a consumer whose part of the dataset
    /// is one or two shards) gives each a larger share, never a smaller
    /// one than the pool's; and at least `want` each (what a stream needs
    /// for the batch its consumer keeps and the next:
    /// `engine::setup::batch_share`), taken past the budget where the part
    /// is short of it. Fails when the pool's share is under `min_share`,
    /// or when the arena has no room for `owners` more streams' shares.
    pub fn join(
        &self,
        owners: usize,
        expected: usize,
        min_share: usize,
        want: usize,
    ) -> Result<usize> {
        let mut s = self.lock();
        if !s.shared {
            return Err(Error::internal(
                Fault::Invariant,
                "join on a pool that is not shared",
            ));
        }
        let share = s.quota;
        if share < min_share {
            return Err(Error::Memory(format!(
                "the node engine's `memory_budget` of {} bytes, split among the streams it \
                 expects (`loader_workers` x `LOCAL_WORLD_SIZE` x `workers`), gives each {share} \
                 chunks of {} bytes, fewer than the {min_share} a stream needs: raise the \
                 engine's `memory_budget`, or lower `workers` or `chunk_size`",
                s.preferred * self.chunk_size,
                self.chunk_size
            )));
        }
        let part = share.max(share * expected.max(1) / owners.max(1));
        let streams: Vec<usize> = (0..s.live.len())
            .filter(|&i| s.live[i] && s.holders[i].is_none())
            .collect();
        let live = streams.len();
        let promised: usize = streams.iter().map(|&i| s.quota_for(i)).sum();
        let held: usize = s.used.iter().sum();
        let fits = |each: usize| {
            promised + owners * each <= self.chunk_count()
                && held + owners * each <= self.chunk_count()
        };
        // Room for two batches where the arena has it; else the part, as
        // before (a consumer whose kept batches go to a holder, as a
        // DataLoader's main process does, needs room for one only).
        let each = if fits(part.max(want)) {
            part.max(want)
        } else {
            part
        };
        if !fits(each) {
            let kept = ChunkPool::held_by_holders(&s);
            let by = if kept.is_empty() {
                String::new()
            } else {
                format!("; {}", self.describe_held(&kept))
            };
            return Err(Error::Memory(format!(
                "the node engine is full: {live} streams attached with shares of {promised} \
                 chunks of {} bytes in all, {owners} more want {each} each, and its arena \
                 holds {} chunks{by}: raise the engine's `memory_budget`",
                self.chunk_size,
                self.chunk_count()
            )));
        }
        let free_slot =
            |s: &PoolState, i: usize| i >= s.live.len() || (!s.live[i] && s.used[i] == 0);
        let Some(base) = (0..=MAX_OWNERS.saturating_sub(owners))
            .find(|&b| (b..b + owners).all(|i| free_slot(&s, i)))
        else {
            return Err(Error::Memory(format!(
                "the shared pool has no room for {owners} more streams ({MAX_OWNERS} at most)"
            )));
        };
        let end = base + owners;
        s.grow_owners(end);
        for i in base..end {
            s.live[i] = true;
            s.closing[i] = false;
            s.holders[i] = None;
            s.quotas[i] = each;
        }
        s.reserve += 2 * owners;
        Ok(base)
    }

    /// An owner number of a shared pool for a process that keeps batches
    /// it did not read (a node engine's receiver: the main process of a
    /// DataLoader): the chunks of the batches it keeps are charged to it
    /// ([`ChunkPool::recharge`]) instead of to the streams that read them,
    /// so what it keeps never holds up their reads. `name` says who it is
    /// in errors. Given back with [`ChunkPool::leave`].
    pub fn join_holder(&self, name: String) -> Result<usize> {
        let mut s = self.lock();
        let free_slot =
            |s: &PoolState, i: usize| i >= s.live.len() || (!s.live[i] && s.used[i] == 0);
        let Some(owner) = (0..MAX_OWNERS).find(|&i| free_slot(&s, i)) else {
            return Err(Error::Memory(format!(
                "the shared pool has no owner number left for a process keeping batches \
                 ({MAX_OWNERS} at most)"
            )));
        };
        s.grow_owners(owner + 1);
        s.live[owner] = true;
        s.closing[owner] = false;
        s.holders[owner] = Some(name);
        s.quotas[owner] = 0;
        Ok(owner)
    }

    /// Charges `run` to `owner` (a holder) when a stream holds it: the
    /// stream may then read into other chunks in its place. A run already
    /// charged to a holder stays with it.
    pub fn recharge(&self, run: &ChunkRef, owner: usize) {
        let mut s = self.lock();
        let start = run.start as usize;
        let from = s.owner[start] as usize;
        let stream = from < s.used.len() && s.holders.get(from).is_some_and(Option::is_none);
        if !stream || owner >= s.used.len() || from == owner {
            return;
        }
        let n = run.len as usize;
        s.used[from] -= n;
        s.used[owner] += n;
        s.owner[start] = owner as u32;
        self.freed.notify_all();
    }

    /// The chunks each holder keeps, with its name: what a full arena is
    /// made of when streams wait on it.
    pub(super) fn held_by_holders(s: &PoolState) -> Vec<(String, usize)> {
        s.holders
            .iter()
            .zip(&s.used)
            .filter_map(|(h, &u)| h.as_ref().filter(|_| u > 0).map(|h| (h.clone(), u)))
            .collect()
    }

    /// Ends the waits of owners `base..base + owners` with `Closed` (their
    /// loader is closing).
    pub fn close_owners(&self, base: usize, owners: usize) {
        let mut s = self.lock();
        let end = (base + owners).min(s.closing.len());
        for c in &mut s.closing[base.min(end)..end] {
            *c = true;
        }
        self.freed.notify_all();
    }

    /// Gives back owners `base..base + owners` (their loader closed); each
    /// number is taken again once the chunks it still holds came back.
    pub fn leave(&self, base: usize, owners: usize) {
        let mut s = self.lock();
        let end = (base + owners).min(s.live.len());
        for i in base.min(end)..end {
            if std::mem::replace(&mut s.live[i], false) && s.holders[i].is_none() {
                s.reserve = s.reserve.saturating_sub(2);
            }
        }
        self.freed.notify_all();
    }

    /// "process 12 keeps 30 chunks (240 MiB)", for each holder.
    pub(super) fn describe_held(&self, kept: &[(String, usize)]) -> String {
        kept.iter()
            .map(|(who, n)| {
                format!(
                    "{who} keeps {n} chunks ({} MiB)",
                    (*n * self.chunk_size) >> 20
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
