//! The chunk pool: the arena ([`super::Arena`]) cut into equal chunks, handed
//! out as runs of consecutive chunks ([`ChunkRef`]s) to the workers that read
//! into them.
//!
//! A run goes back to the free set when its last reference drops; `acquire`
//! waits while none is free, which is how memory never passes the budget.
//! Owners (the plan's streams) each hold at most a quota of chunks, a reserve
//! is kept from read-ahead, and a waiter that nothing can ever free fails
//! with `BudgetTooSmall` instead of hanging.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::memory::{Arena, ChunkRef};

/// Counters of chunk use.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolUse {
    pub in_use: usize,
    pub peak: usize,
}

struct PoolState {
    free: Vec<bool>,
    /// Times each chunk was taken (tests only: see `checkout`).
    #[cfg(test)]
    taken: Vec<u64>,
    free_count: usize,
    peak_in_use: usize,
    /// Workers that may still acquire chunks (not parked at an epoch end).
    running: usize,
    /// Of those, how many are blocked in `acquire` now.
    waiting: usize,
    /// Chunks that read-ahead (`acquire_spare`) leaves for reads that must
    /// happen (a worker's first read, a spill), so speculative reads cannot
    /// take the last chunks that a batch needs to complete.
    reserve: usize,
    /// Owner of each run (at its first chunk), `NO_OWNER` for none.
    owner: Vec<u32>,
    /// Chunks each owner holds (runs not yet returned).
    used: Vec<usize>,
    /// Most chunks one owner may hold; 0: no limit.
    quota: usize,
    /// Owners of a loader that is using them (`join` to `leave`).
    live: Vec<bool>,
    /// Owners whose loader is closing: their waits end with `Closed`.
    closing: Vec<bool>,
    /// Owners that are processes keeping batches of a shared pool (see
    /// [`ChunkPool::join_holder`]), with the name errors give them; `None`
    /// for a stream.
    holders: Vec<Option<String>>,
    /// A shared pool (`ChunkPool::new_shared`): owners come and go with
    /// their loaders, each with the same quota (its share).
    shared: bool,
    /// Chunks of a shared pool looked at first (its budget); the rest is
    /// used only while more streams are attached than it expects.
    preferred: usize,
    /// Where each owner's next run is looked for first: right after its
    /// last one, so that a stream's consecutive chunks lie next to each
    /// other and a batch's samples span little more memory than their bytes
    /// (the last entry is for `NO_OWNER`).
    next: Vec<usize>,
}

/// The owner of runs taken without one (no quota applies).
pub const NO_OWNER: usize = u32::MAX as usize;

/// Most owners (workers) a pool tells apart; `workers` is bounded by it.
pub const MAX_OWNERS: usize = 1024;

/// How long an owner must look stuck before `acquire_or_stuck` gives up:
/// long against any hand-over (the sequencer taking a batch and passing it
/// on takes microseconds), short against a person waiting for an error.
const STUCK_FOR: Duration = Duration::from_millis(250);

/// How long a shared pool's arena must stay full, with part of it kept by
/// processes outside the engine, before a waiting stream fails naming
/// them: long against a receiver's turnover of its batches, short against
/// a person waiting for a training job that will never go on.
const HELD_FOR: Duration = if cfg!(test) {
    Duration::from_millis(100)
} else {
    Duration::from_secs(5)
};

/// Reference-counted chunks over an [`Arena`].
pub struct ChunkPool {
    arena: Arena,
    chunk_size: usize,
    /// Reference count of each run, stored at the run's first chunk.
    pub(super) refs: Box<[AtomicU32]>,
    state: Mutex<PoolState>,
    freed: Condvar,
    stop: AtomicBool,
    /// Batches alive anywhere (in the ring or held by a consumer). Decremented
    /// only after a batch's chunks went back (see `Batch`'s `Drop`), so a waiter
    /// that reads 0 under the state lock sees every chunk they held as free.
    batches_alive: AtomicUsize,
    /// Of those, the ones handed on to the ring (and so to a consumer, who
    /// will release them), by the owner of their chunks; the last slot
    /// counts batches of several owners (merged epoch tails). See
    /// `acquire_or_stuck`.
    batches_out: Box<[AtomicUsize]>,
    copied: AtomicU64,
}

impl ChunkPool {
    pub fn new(arena: Arena, chunk_size: usize) -> Arc<ChunkPool> {
        let n = arena.len() / chunk_size;
        Arc::new(ChunkPool {
            arena,
            chunk_size,
            refs: (0..n).map(|_| AtomicU32::new(0)).collect(),
            state: Mutex::new(PoolState {
                free: vec![true; n],
                #[cfg(test)]
                taken: vec![0; n],
                free_count: n,
                peak_in_use: 0,
                running: 0,
                waiting: 0,
                reserve: 0,
                owner: vec![u32::MAX; n],
                used: Vec::new(),
                quota: 0,
                live: Vec::new(),
                closing: Vec::new(),
                holders: Vec::new(),
                shared: false,
                preferred: 0,
                next: vec![0],
            }),
            freed: Condvar::new(),
            stop: AtomicBool::new(false),
            batches_alive: AtomicUsize::new(0),
            batches_out: (0..=MAX_OWNERS).map(|_| AtomicUsize::new(0)).collect(),
            copied: AtomicU64::new(0),
        })
    }

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
    /// streams), each with the pool's share, and returns the first. Fails
    /// when the share is under `min_share`, or when the arena has no room
    /// for the share of `owners` more streams.
    pub fn join(&self, owners: usize, min_share: usize) -> Result<usize> {
        let mut s = self.lock();
        if !s.shared {
            return Err(Error::Internal("join on a pool that is not shared".into()));
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
        let live = s.live.iter().filter(|&&l| l).count();
        let held: usize = s.used.iter().sum();
        let live = live
            - s.holders
                .iter()
                .zip(&s.live)
                .filter(|(h, l)| h.is_some() && **l)
                .count();
        if (live + owners) * share > self.chunk_count()
            || held + owners * share > self.chunk_count()
        {
            let kept = ChunkPool::held_by_holders(&s);
            let by = if kept.is_empty() {
                String::new()
            } else {
                format!("; {}", self.describe_held(&kept))
            };
            return Err(Error::Memory(format!(
                "the node engine is full: {live} streams attached, each with {share} chunks of \
                 {} bytes, and its arena holds {} chunks{by}: raise the engine's `memory_budget`",
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
    fn held_by_holders(s: &PoolState) -> Vec<(String, usize)> {
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

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    pub fn chunk_count(&self) -> usize {
        self.refs.len()
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A poisoned lock means a panic elsewhere; the state (a free set and
        // counters) is still consistent because every update is one statement.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn usage(&self) -> PoolUse {
        let s = self.lock();
        PoolUse {
            in_use: self.chunk_count() - s.free_count,
            peak: s.peak_in_use,
        }
    }

    /// Which check-out of chunk `index` this is (counted from 1), or `None`
    /// while it is in the pool: the engine's tests record it when a read
    /// into the chunk starts and check it is the same when the read ends, so
    /// a chunk returned (and perhaps taken again) under a read is caught.
    #[cfg(test)]
    pub(crate) fn checkout(&self, index: usize) -> Option<u64> {
        let s = self.lock();
        (!s.free[index]).then_some(s.taken[index])
    }

    /// Payload bytes copied by the engine (spilled members).
    pub fn add_copied(&self, n: u64) {
        // Relaxed: a statistic, read only for reporting.
        self.copied.fetch_add(n, Ordering::Relaxed);
    }

    pub fn copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Wakes every waiter and makes `acquire` fail with `Error::Closed`.
    pub fn shut_down(&self) {
        // Release: pairs with the Acquire load in `acquire`'s wait loop.
        self.stop.store(true, Ordering::Release);
        let _s = self.lock();
        self.freed.notify_all();
    }

    pub fn worker_running(&self, running: bool) {
        let mut s = self.lock();
        if running {
            s.running += 1;
        } else {
            s.running -= 1;
        }
        self.freed.notify_all();
    }

    fn out_slot(&self, owner: usize) -> &AtomicUsize {
        &self.batches_out[owner.min(MAX_OWNERS)]
    }

    /// A batch of `owner`'s chunks (`NO_OWNER`: of several) went on towards
    /// the consumer.
    pub(crate) fn batch_out(&self, owner: usize) {
        // Relaxed: read in `acquire_or_stuck`, which needs the condition to
        // hold for STUCK_FOR before it decides.
        self.out_slot(owner).fetch_add(1, Ordering::Relaxed);
    }

    /// A batch that went out was released (after its chunks went back).
    pub(crate) fn batch_out_gone(&self, owner: usize) {
        // Release: as in `batch_gone`.
        self.out_slot(owner).fetch_sub(1, Ordering::Release);
    }

    /// True when no batch holding `owner`'s chunks is out with a consumer.
    fn none_out(&self, owner: usize) -> bool {
        // Acquire: pairs with the Release decrement in `batch_out_gone`.
        self.out_slot(owner).load(Ordering::Acquire) == 0
            && self.out_slot(NO_OWNER).load(Ordering::Acquire) == 0
    }

    pub(crate) fn batch_born(&self) {
        // Relaxed: the count is read under the state lock after chunk returns,
        // which are themselves ordered by that lock (see `batch_gone`).
        self.batches_alive.fetch_add(1, Ordering::Relaxed);
    }

    /// Called after the batch's chunk references were dropped.
    pub(crate) fn batch_gone(&self) {
        // Release: orders the preceding chunk returns before the decrement; the
        // Acquire load in `acquire` then sees those chunks free.
        self.batches_alive.fetch_sub(1, Ordering::Release);
        if self.lock().waiting > 0 {
            self.freed.notify_all();
        }
    }

    /// Sets how many free chunks `acquire_spare` leaves alone.
    pub fn set_reserve(&self, chunks: usize) {
        self.lock().reserve = chunks;
    }

    /// Splits the pool among `owners` (the plan's streams), each holding at
    /// most `quota` chunks. A stream then never waits on chunks that another
    /// stream's queued batches or shuffle buffer hold: the round-robin
    /// delivery waits on each stream in turn, so one stream starving
    /// another would deadlock.
    pub fn set_owners(&self, owners: usize, quota: usize) {
        let mut s = self.lock();
        s.used = vec![0; owners];
        s.live = vec![true; owners];
        s.closing = vec![false; owners];
        s.holders = vec![None; owners];
        s.quota = quota;
        // Owners start spread over the arena and walk it from there.
        let n = self.chunk_count();
        s.next = (0..=owners).map(|o| o * n / (owners + 1)).collect();
    }

    /// The per-owner quota (a shared pool's share per stream; 0: none).
    pub fn quota(&self) -> usize {
        self.lock().quota
    }

    /// One chunk for read-ahead, only while more than the reserve is free
    /// and `owner` keeps `headroom` chunks of its quota; never waits.
    #[cfg(test)]
    pub fn acquire_spare(self: &Arc<Self>) -> Result<Option<ChunkRef>> {
        self.acquire_spare_as(NO_OWNER, 0)
    }

    /// One chunk for read-ahead, only while more than the reserve is free and
    /// `owner` keeps `headroom` chunks of its quota; never waits.
    pub fn acquire_spare_as(
        self: &Arc<Self>,
        owner: usize,
        headroom: usize,
    ) -> Result<Option<ChunkRef>> {
        {
            let s = self.lock();
            if s.free_count <= s.reserve {
                return Ok(None);
            }
            if let Some(&u) = s.used.get(owner)
                && u + 1 + headroom > s.quota
            {
                return Ok(None);
            }
        }
        self.acquire_as(owner, 1, false)
    }

    /// Takes a run of `n` consecutive chunks. With `wait`, blocks until one is
    /// free; fails when the pool shuts down, or when no progress is possible.
    #[cfg(test)]
    pub fn acquire(self: &Arc<Self>, n: usize, wait: bool) -> Result<Option<ChunkRef>> {
        self.acquire_as(NO_OWNER, n, wait)
    }

    /// Takes a run of `n` consecutive chunks counted against `owner`'s quota.
    /// With `wait`, blocks until one is free; fails when the pool shuts
    /// down, or when no progress is possible.
    pub fn acquire_as(
        self: &Arc<Self>,
        owner: usize,
        n: usize,
        wait: bool,
    ) -> Result<Option<ChunkRef>> {
        self.acquire_inner(owner, n, wait, &|| false)
    }

    /// A waiting [`ChunkPool::acquire_as`] that fails with `BudgetTooSmall`
    /// instead of waiting for ever when, for `STUCK_FOR` on end, `owner` is
    /// at its quota, no batch holding its chunks is out with a consumer
    /// (none will come back), and `stuck()` says the owner is the one
    /// everything waits on (the loader's sequencer sleeps on its stream's
    /// empty queue): then the chunks are all held by the owner itself — its
    /// open batch, shuffle buffer or spill — and nothing can free one.
    pub fn acquire_or_stuck(
        self: &Arc<Self>,
        owner: usize,
        n: usize,
        stuck: &dyn Fn() -> bool,
    ) -> Result<ChunkRef> {
        Ok(self
            .acquire_inner(owner, n, true, stuck)?
            .expect("a waiting acquire returns a run or an error"))
    }

    fn acquire_inner(
        self: &Arc<Self>,
        owner: usize,
        n: usize,
        wait: bool,
        stuck: &dyn Fn() -> bool,
    ) -> Result<Option<ChunkRef>> {
        if n == 0 || n > self.chunk_count() {
            return Err(Error::Memory(format!(
                "a run of {n} chunks cannot come from a pool of {}",
                self.chunk_count()
            )));
        }
        let mut s = self.lock();
        let owned = owner < s.used.len();
        if owned && n > s.quota {
            return Err(Error::BudgetTooSmall {
                budget: self.arena.len() as u64,
                detail: format!(
                    "a run of {n} chunks of {} bytes is wanted, but each of the {} workers may hold {}",
                    self.chunk_size,
                    s.used.len(),
                    s.quota
                ),
            });
        }
        let mut stuck_rounds = 0;
        let mut own_since: Option<(std::time::Instant, u32)> = None;
        let mut full_since: Option<std::time::Instant> = None;
        loop {
            if owned && s.closing[owner] {
                return Err(Error::Closed);
            }
            let allowed = !owned || s.used[owner] + n <= s.quota;
            let hint = s.next.len() - 1;
            let slot = if owned { owner.min(hint) } else { hint };
            if let Some(start) = s.find(n, s.next[slot]).filter(|_| allowed) {
                for f in &mut s.free[start..start + n] {
                    *f = false;
                }
                #[cfg(test)]
                for t in &mut s.taken[start..start + n] {
                    *t += 1;
                }
                s.next[slot] = (start + n) % self.chunk_count();
                s.free_count -= n;
                if owned {
                    s.owner[start] = owner as u32;
                    s.used[owner] += n;
                }
                let in_use = self.chunk_count() - s.free_count;
                s.peak_in_use = s.peak_in_use.max(in_use);
                // Relaxed: the chunk is exclusively ours; the state lock
                // ordered its previous release before this point.
                self.refs[start].store(1, Ordering::Relaxed);
                return Ok(Some(ChunkRef {
                    pool: Arc::clone(self),
                    start: start as u32,
                    len: n as u32,
                }));
            }
            if !wait {
                return Ok(None);
            }
            // Acquire: pairs with the Release store in `shut_down`.
            if self.stop.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            // Acquire: pairs with the Release decrement in `batch_gone`.
            let alive = self.batches_alive.load(Ordering::Acquire);
            if s.waiting + 1 >= s.running && alive == 0 {
                stuck_rounds += 1;
                if stuck_rounds >= 3 {
                    return Err(Error::BudgetTooSmall {
                        budget: self.arena.len() as u64,
                        detail: format!(
                            "{} chunks of {} bytes, {} free, a run of {n} wanted",
                            self.chunk_count(),
                            self.chunk_size,
                            s.free_count
                        ),
                    });
                }
            } else {
                stuck_rounds = 0;
            }
            if !allowed && self.none_out(owner) && stuck() {
                let (since, checks) = own_since.get_or_insert((std::time::Instant::now(), 0));
                *checks += 1;
                if *checks >= 3 && since.elapsed() >= STUCK_FOR {
                    return Err(Error::BudgetTooSmall {
                        budget: self.arena.len() as u64,
                        detail: format!(
                            "worker {owner} holds all {} chunks of its share ({} workers share {} \
                             chunks of {} bytes) in its own open batch, shuffle buffer or spill, \
                             with no batch out to free one; a run of {n} wanted",
                            s.used[owner],
                            s.live.iter().filter(|&&l| l).count(),
                            self.chunk_count(),
                            self.chunk_size
                        ),
                    });
                }
            } else {
                own_since = None;
            }
            // The whole arena is in use, and processes keeping batches hold
            // part of it: they alone can free it. Said by name once it
            // lasts (a receiver that takes a batch and lets go of an older
            // one frees chunks every few milliseconds).
            let kept = if s.shared && s.free_count < n {
                ChunkPool::held_by_holders(&s)
            } else {
                Vec::new()
            };
            if kept.is_empty() {
                full_since = None;
            } else if full_since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                >= HELD_FOR
            {
                return Err(Error::Memory(format!(
                    "the node engine's arena ({} chunks of {} bytes) is full and no stream can \
                     read: {}; release them (drop the tensors and arrays made from them), or \
                     raise the engine's `memory_budget`",
                    self.chunk_count(),
                    self.chunk_size,
                    self.describe_held(&kept)
                )));
            }
            s.waiting += 1;
            // The time-out only bounds how long a missed shutdown or a stuck
            // state goes unnoticed; wake-ups come from `release_run`.
            let (g, _) = self
                .freed
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner());
            s = g;
            s.waiting -= 1;
        }
    }

    /// "process 12 keeps 30 chunks (240 MiB)", for each holder.
    fn describe_held(&self, kept: &[(String, usize)]) -> String {
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

    pub(super) fn release_run(&self, start: usize, n: usize) {
        let mut s = self.lock();
        let o = std::mem::replace(&mut s.owner[start], u32::MAX) as usize;
        if let Some(u) = s.used.get_mut(o) {
            *u -= n;
        }
        for f in &mut s.free[start..start + n] {
            *f = true;
        }
        s.free_count += n;
        if s.waiting > 0 {
            self.freed.notify_all();
        }
    }
}

impl PoolState {
    /// Makes room in the per-owner tables for owners below `end`.
    fn grow_owners(&mut self, end: usize) {
        if self.live.len() < end {
            self.live.resize(end, false);
            self.closing.resize(end, false);
            self.used.resize(end, 0);
            self.holders.resize(end, None);
        }
    }

    /// A free run of `n` for the owner whose hint is `from`: in a shared
    /// pool within the preferred chunks first (the budget, whose pages are
    /// in), from the hint on, then from their start; then anywhere.
    fn find(&self, n: usize, from: usize) -> Option<usize> {
        if self.shared {
            let head = &self.free[..self.preferred];
            return find_run_from(head, n, from).or_else(|| find_run(&self.free, n));
        }
        find_run_from(&self.free, n, from)
    }
}

/// A run of `n` free chunks, the first from `from` on, else the first at all.
fn find_run_from(free: &[bool], n: usize, from: usize) -> Option<usize> {
    let from = from.min(free.len());
    find_run(&free[from..], n)
        .map(|i| i + from)
        .or_else(|| find_run(free, n))
}

fn find_run(free: &[bool], n: usize) -> Option<usize> {
    let mut len = 0;
    for (i, &f) in free.iter().enumerate() {
        if f {
            len += 1;
            if len == n {
                return Some(i + 1 - n);
            }
        } else {
            len = 0;
        }
    }
    None
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ArenaOptions, MemoryKind};

    fn pool(chunks: usize) -> Arc<ChunkPool> {
        let opts = ArenaOptions {
            kind: Some(MemoryKind::Normal),
            lock: Some(false),
            prefault: false,
            shared: false,
        };
        ChunkPool::new(Arena::new(chunks * 4096, opts).unwrap(), 4096)
    }

    #[test]
    fn chunks_return_when_the_last_reference_drops() {
        let p = pool(4);
        let a = p.acquire(1, false).unwrap().unwrap();
        let b = a.clone();
        assert_eq!(p.usage().in_use, 1);
        drop(a);
        assert_eq!(p.usage().in_use, 1);
        drop(b);
        assert_eq!(p.usage().in_use, 0);
        assert_eq!(p.usage().peak, 1);
    }

    #[test]
    fn an_owners_runs_follow_each_other_while_the_next_chunk_is_free() {
        let p = pool(8);
        p.set_owners(2, 4);
        // Owner 0 starts at chunk 0, owner 1 at chunk 8 * 1 / 3 = 2.
        let a0 = p.acquire_as(0, 1, false).unwrap().unwrap();
        let b0 = p.acquire_as(1, 1, false).unwrap().unwrap();
        let a1 = p.acquire_as(0, 1, false).unwrap().unwrap();
        let b1 = p.acquire_as(1, 1, false).unwrap().unwrap();
        assert_eq!((a0.index(), a1.index()), (0, 1));
        assert_eq!((b0.index(), b1.index()), (2, 3));
        // Owner 0's next chunk (2) is taken: it goes on after owner 1's.
        let a2 = p.acquire_as(0, 1, false).unwrap().unwrap();
        assert_eq!(a2.index(), 4);
        // Freed chunks behind the hint are found when nothing is ahead.
        drop((a0, a1));
        let rest: Vec<_> = (0..3).map(|_| p.acquire_as(1, 1, false).unwrap()).collect();
        let got: Vec<_> = rest.iter().map(|r| r.as_ref().map(|c| c.index())).collect();
        assert_eq!(got, vec![Some(5), Some(6), None], "owner 1's quota is 4");
        let a3 = p.acquire_as(0, 1, false).unwrap().unwrap();
        assert_eq!(a3.index(), 7);
        let a4 = p.acquire_as(0, 1, false).unwrap().unwrap();
        assert_eq!(a4.index(), 0, "wraps to the first free chunk");
    }

    #[test]
    fn runs_are_contiguous_and_never_exceed_the_pool() {
        let p = pool(4);
        let a = p.acquire(1, false).unwrap().unwrap();
        let _b = p.acquire(1, false).unwrap().unwrap();
        let c = p.acquire(2, false).unwrap().unwrap();
        assert_eq!(c.index(), 2);
        assert_eq!(c.len(), 8192);
        assert!(p.acquire(1, false).unwrap().is_none());
        drop(a);
        assert!(
            p.acquire(2, false).unwrap().is_none(),
            "no two adjacent chunks free"
        );
        assert!(p.acquire(5, true).is_err());
    }

    #[test]
    fn read_ahead_leaves_the_reserve_alone() {
        let p = pool(3);
        p.set_reserve(2);
        let a = p.acquire_spare().unwrap().expect("3 free > 2 reserved");
        assert!(p.acquire_spare().unwrap().is_none());
        assert!(
            p.acquire(1, false).unwrap().is_some(),
            "the reserve serves plain acquires"
        );
        drop(a);
    }

    #[test]
    fn a_stuck_waiter_reports_the_budget_instead_of_hanging() {
        let p = pool(2);
        p.worker_running(true);
        let _a = p.acquire(2, false).unwrap().unwrap();
        match p.acquire(1, true) {
            Err(Error::BudgetTooSmall { .. }) => {}
            other => panic!("expected BudgetTooSmall, got {other:?}"),
        }
    }

    #[test]
    fn a_waiter_wakes_when_a_chunk_comes_back() {
        let p = pool(1);
        p.worker_running(true);
        p.worker_running(true);
        let a = p.acquire(1, false).unwrap().unwrap();
        let p2 = Arc::clone(&p);
        let t = std::thread::spawn(move || p2.acquire(1, true).map(|c| c.is_some()));
        std::thread::sleep(Duration::from_millis(20));
        drop(a);
        assert!(t.join().unwrap().unwrap());
    }

    #[test]
    fn loaders_sharing_a_pool_each_get_their_share_budget_first() {
        let shared = |chunks: usize, share: usize, preferred: usize| {
            let arena = Arena::new(
                chunks * 4096,
                ArenaOptions {
                    kind: Some(MemoryKind::Normal),
                    lock: Some(false),
                    prefault: false,
                    shared: true,
                },
            )
            .unwrap();
            ChunkPool::new_shared(arena, 4096, share, preferred)
        };
        // 12 chunks, a budget of 6, shares of 3.
        let p = shared(12, 3, 6);
        let a = p.join(2, 3).unwrap();
        let b = p.join(1, 3).unwrap();
        assert_eq!(
            (a, b),
            (0, 2),
            "owner numbers of different loaders never overlap"
        );
        let mut held = Vec::new();
        for owner in [a, a + 1, b] {
            for _ in 0..3 {
                held.push(
                    p.acquire_as(owner, 1, false)
                        .unwrap()
                        .expect("within the share"),
                );
            }
            assert!(
                p.acquire_as(owner, 1, false).unwrap().is_none(),
                "past the share"
            );
        }
        // The budget is used first; b, the third stream, spills past it.
        assert!(
            held[..6].iter().all(|c| c.index() < 6),
            "a's chunks lie in the budget"
        );
        assert!(held[6..].iter().all(|c| c.index() >= 6), "b's lie past it");
        // A fourth stream still fits (4 x 3 = 12); a fifth does not.
        let c = p.join(1, 3).unwrap();
        match p.join(1, 3) {
            Err(Error::Memory(m)) => {
                assert!(m.contains("full") && m.contains("memory_budget"), "{m}")
            }
            other => panic!("expected a memory error, got {other:?}"),
        }
        // b leaves (twice: idempotent) and its chunks come back: its number
        // is taken again.
        p.leave(b, 1);
        p.leave(b, 1);
        held.truncate(6);
        assert_eq!(p.join(1, 3).unwrap(), b);
        // Closing a loader ends its streams' waits and no other's.
        for _ in 0..3 {
            held.push(p.acquire_as(c, 1, false).unwrap().expect("c's share"));
        }
        p.worker_running(true);
        p.worker_running(true);
        let p2 = Arc::clone(&p);
        let waiter = std::thread::spawn(move || p2.acquire_as(c, 1, true).map(|_| ()));
        std::thread::sleep(Duration::from_millis(20));
        p.close_owners(c, 1);
        assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
        assert!(
            p.acquire_as(b, 1, false).unwrap().is_some(),
            "b's new owner goes on"
        );
        // A share under what a stream needs is refused, naming the key.
        match shared(4, 2, 4).join(1, 3) {
            Err(Error::Memory(m)) => assert!(m.contains("memory_budget"), "{m}"),
            other => panic!("expected a memory error, got {other:?}"),
        }
    }

    #[test]
    fn chunks_a_holder_keeps_leave_the_streams_share_and_a_full_arena_names_it() {
        let arena = Arena::new(
            6 * 4096,
            ArenaOptions {
                kind: Some(MemoryKind::Normal),
                lock: Some(false),
                prefault: false,
                shared: true,
            },
        )
        .unwrap();
        // A budget of 4 chunks for one stream of share 2; 6 in the arena.
        let p = ChunkPool::new_shared(arena, 4096, 2, 4);
        let stream = p.join(1, 1).unwrap();
        let holder = p.join_holder("process 77".into()).unwrap();
        assert_ne!(stream, holder);
        let a = p.acquire_as(stream, 1, false).unwrap().unwrap();
        let b = p.acquire_as(stream, 1, false).unwrap().unwrap();
        assert!(
            p.acquire_as(stream, 1, false).unwrap().is_none(),
            "at the share"
        );
        // Kept by the holder: the stream reads into two more.
        p.recharge(&a, holder);
        p.recharge(&b, holder);
        p.recharge(&b, holder); // charged once
        let c = p.acquire_as(stream, 1, false).unwrap().unwrap();
        let d = p.acquire_as(stream, 1, false).unwrap().unwrap();
        // Charged to a holder, a run is not charged back to a stream.
        p.recharge(&c, holder);
        p.recharge(&c, stream);
        let e = p.acquire_as(stream, 1, false).unwrap().unwrap();
        assert!(p.acquire_as(stream, 1, false).unwrap().is_none());
        // The holder keeps 5 chunks, the stream reads into the last one:
        // the arena is full, and a waiting stream fails naming the holder
        // once that lasts.
        p.recharge(&d, holder);
        p.recharge(&e, holder);
        let f = p.acquire_as(stream, 1, false).unwrap().unwrap();
        p.worker_running(true);
        p.worker_running(true);
        match p.acquire_as(stream, 1, true) {
            Err(Error::Memory(m)) => {
                assert!(m.contains("process 77 keeps 5 chunks"), "{m}")
            }
            other => panic!("expected the holder named, got {other:?}"),
        }
        // Its chunks come back as it lets go; its number is free again
        // once they have.
        drop((a, b, c, d, e, f));
        p.leave(holder, 1);
        assert_eq!(p.join_holder("process 78".into()).unwrap(), holder);
    }

    #[test]
    fn shut_down_wakes_waiters_with_closed() {
        let p = pool(1);
        p.worker_running(true);
        p.worker_running(true);
        let _a = p.acquire(1, false).unwrap().unwrap();
        let p2 = Arc::clone(&p);
        let t = std::thread::spawn(move || p2.acquire(1, true).map(|_| ()));
        std::thread::sleep(Duration::from_millis(20));
        p.shut_down();
        assert!(matches!(t.join().unwrap(), Err(Error::Closed)));
    }
}
