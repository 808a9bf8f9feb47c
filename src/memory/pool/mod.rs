//! The chunk pool: the arena ([`super::Arena`]) cut into equal chunks, handed
//! out as runs of consecutive chunks ([`ChunkRef`]s) to the workers that read
//! into them.
//!
//! A run goes back to the free set when its last reference drops; `acquire`
//! waits while none is free, which is how memory never passes the budget.
//! Owners (the plan's streams) each hold at most a quota of chunks, a reserve
//! is kept from read-ahead, and a waiter that nothing can ever free fails
//! with `BudgetTooSmall` instead of hanging.
//!
//! The files: this one (the pool, its chunks and owners, `acquire`), and
//! `shared.rs` (a pool several loaders share: owners that join and leave,
//! and processes outside keeping batches, charged what they keep).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::memory::{Arena, ChunkRef};
use crate::sync::{Locked, Waits};

mod shared;

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
    /// Chunks taken at least once: their pages are faulted in.
    touched: Vec<bool>,
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
    /// An owner's own limit where it differs (a shared pool's loader whose
    /// streams split its consumer's part: `ChunkPool::join`); 0: `quota`.
    quotas: Vec<usize>,
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
    /// Where each owner's runs are looked for first (the last entry is for
    /// `NO_OWNER`): the lowest free run from its base, the owners' bases
    /// spread over the arena. A stream's consecutive chunks then lie next
    /// to each other (a batch's samples span little more memory than their
    /// bytes: chunks come back about in the order they went out, so the
    /// lowest free one follows the last taken but at the wrap), and a
    /// stream reuses the memory it touched before rather than walking the
    /// arena: a chunk's first use costs the kernel's zeroing of its pages
    /// (about 1.5 GB/s a core here, as much CPU as receiving the bytes),
    /// so only the chunks a stream holds at once are ever faulted in.
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
    /// Whether each run (at its first chunk) has a chunk taken for the
    /// first time by its present holder (`ChunkRef::first_use`).
    first_use: Box<[AtomicBool]>,
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
            first_use: (0..n).map(|_| AtomicBool::new(false)).collect(),
            state: Mutex::new(PoolState {
                free: vec![true; n],
                #[cfg(test)]
                taken: vec![0; n],
                free_count: n,
                peak_in_use: 0,
                touched: vec![false; n],
                running: 0,
                waiting: 0,
                reserve: 0,
                owner: vec![u32::MAX; n],
                used: Vec::new(),
                quota: 0,
                quotas: Vec::new(),
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
        self.state.locked()
    }

    /// Whether the run starting at `start`, as now held, has a chunk taken
    /// for the first time: its first write faults its pages in.
    pub(crate) fn first_use(&self, start: u32) -> bool {
        // Relaxed: see where it is stored.
        self.first_use[start as usize].load(Ordering::Relaxed)
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

    /// What a worker stuck at its share is told: `owner` holds all of it
    /// itself, with no batch out to free a chunk.
    fn own_share_full(&self, s: &PoolState, owner: usize, n: usize) -> String {
        format!(
            "worker {owner} holds all {} chunks of its share ({} workers share {} \
             chunks of {} bytes) in its own open batch, shuffle buffer or spill, \
             with no batch out to free one; a run of {n} wanted",
            s.used[owner],
            s.live.iter().filter(|&&l| l).count(),
            self.chunk_count(),
            self.chunk_size
        )
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
        s.quotas = vec![0; owners];
        // Owners' bases spread over the arena.
        let n = self.chunk_count();
        s.next = (0..=owners).map(|o| o * n / (owners + 1)).collect();
    }

    /// The most chunks `owner` may hold (0: no limit): a loader's own
    /// pool gives each stream the same; in a shared pool, the streams of
    /// one loader split its consumer's part (`ChunkPool::join`).
    pub fn quota_of(&self, owner: usize) -> usize {
        self.lock().quota_for(owner)
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
                && u + 1 + headroom > s.quota_for(owner)
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
        let quota = s.quota_for(owner);
        if owned && n > quota {
            return Err(Error::BudgetTooSmall {
                budget: self.arena.len() as u64,
                detail: format!(
                    "a run of {n} chunks of {} bytes is wanted, but each of the {} workers may hold {quota}",
                    self.chunk_size,
                    s.used.len(),
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
            let allowed = !owned || s.used[owner] + n <= quota;
            let hint = s.next.len() - 1;
            let slot = if owned { owner.min(hint) } else { hint };
            if let Some(start) = s.find(n, s.next[slot]).filter(|_| allowed) {
                let fresh = s.touched[start..start + n].iter().any(|t| !t);
                // Past a hugetlb arena's backed part, pages are faulted in
                // here before their first write, or the run is not used.
                if fresh
                    && let Some(from) = self.arena.on_demand_from()
                    && (start + n) * self.chunk_size > from
                    && !self
                        .arena
                        .populate(start * self.chunk_size, n * self.chunk_size)
                {
                    return Err(Error::Memory(format!(
                        "the node engine's arena past its budget ({from} bytes, in huge pages) \
                         found no free huge page for a run of {n} chunks: reserve more huge \
                         pages (vm.nr_hugepages, the pod's hugepages-2Mi) or raise the engine's \
                         `memory_budget`"
                    )));
                }
                for f in &mut s.free[start..start + n] {
                    *f = false;
                }
                #[cfg(test)]
                for t in &mut s.taken[start..start + n] {
                    *t += 1;
                }
                s.free_count -= n;
                s.touched[start..start + n].fill(true);
                // Relaxed: read only through a reference to this run,
                // which the state lock orders after this store.
                self.first_use[start].store(fresh, Ordering::Relaxed);
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
                    // A waiter at its share waits on its own chunks, not
                    // on the arena (which may have free ones): said by
                    // name, as below, whichever of the two sees it first
                    // (this one, once the other workers are done).
                    let detail = if allowed {
                        format!(
                            "{} chunks of {} bytes, {} free, a run of {n} wanted",
                            self.chunk_count(),
                            self.chunk_size,
                            s.free_count
                        )
                    } else {
                        self.own_share_full(&s, owner, n)
                    };
                    return Err(Error::BudgetTooSmall {
                        budget: self.arena.len() as u64,
                        detail,
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
                        detail: self.own_share_full(&s, owner, n),
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
            let (g, _) = self.freed.wait_locked_for(s, Duration::from_millis(50));
            s = g;
            s.waiting -= 1;
        }
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
        if self.quotas.len() < end {
            self.quotas.resize(end, 0);
        }
    }

    /// The most chunks `owner` may hold: its own limit, else the pool's.
    fn quota_for(&self, owner: usize) -> usize {
        match self.quotas.get(owner) {
            Some(&q) if q > 0 => q,
            _ => self.quota,
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
mod tests;
