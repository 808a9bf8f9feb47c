//! The arena: one anonymous mapping sized by the memory budget, holding every
//! payload byte the engine reads, cut into equal chunks with reference counts.
//!
//! Memory is asked for in order of preference — explicit huge pages
//! (`MAP_HUGETLB`), transparent huge pages (`MADV_HUGEPAGE`), normal pages —
//! then locked with `mlock` when permitted and prefaulted, so no page fault
//! lands mid-run. What was obtained, and why a preference was not, is kept in
//! [`ArenaReport`] for the stats.
//!
//! [`ChunkPool`] hands out runs of consecutive chunks as [`ChunkRef`]s. A run
//! goes back to the free set when its last reference drops; `acquire` waits
//! while none is free, which is how memory never passes the budget.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use memmap2::{Advice, MmapMut, MmapOptions};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Which kind of memory backs the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// Explicit huge pages from the reserved pool (`/proc/sys/vm/nr_hugepages`).
    Hugetlb,
    /// Transparent huge pages, asked for with `madvise(MADV_HUGEPAGE)`.
    Thp,
    /// Ordinary 4 KiB pages.
    Normal,
}

impl MemoryKind {
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Hugetlb => "hugetlb",
            MemoryKind::Thp => "thp",
            MemoryKind::Normal => "normal",
        }
    }
}

/// What the arena setup obtained, for the stats.
#[derive(Debug, Clone)]
pub struct ArenaReport {
    pub kind: MemoryKind,
    pub bytes: usize,
    pub locked: bool,
    /// Why a better memory kind, or locking, was not obtained.
    pub notes: Vec<String>,
}

/// How the arena is asked to set itself up (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct ArenaOptions {
    /// `None`: best available. `Some(kind)`: exactly that kind, or an error.
    pub kind: Option<MemoryKind>,
    /// `None`: lock when permitted. `Some(true)`: lock or fail. `Some(false)`: never.
    pub lock: Option<bool>,
    pub prefault: bool,
    /// Back the arena with a memory file (`memfd`, `MAP_SHARED`) that another
    /// process may map: how a PyTorch DataLoader worker's batches reach the
    /// main process without a copy. Otherwise an anonymous private mapping.
    pub shared: bool,
}

/// The mapping itself. Its bytes are only reached through raw pointers: the
/// kernel writes into it (io_uring reads) while consumers read other parts.
pub struct Arena {
    _map: MmapMut,
    /// The memory file behind a shared arena.
    file: Option<std::fs::File>,
    base: *mut u8,
    len: usize,
    report: ArenaReport,
}

// SAFETY: the arena is a plain block of memory; which thread may touch which
// byte is decided by chunk ownership (ChunkRef), not by the Arena value.
unsafe impl Send for Arena {}
// SAFETY: as above; the Arena itself has no interior state besides the mapping.
unsafe impl Sync for Arena {}

const HUGE_2M: usize = 2 << 20;

impl Arena {
    pub fn new(len: usize, opts: ArenaOptions) -> Result<Arena> {
        let mut notes = Vec::new();
        let (mut map, kind, file) = if opts.shared {
            let (m, k, f) = map_shared(len, opts.kind, &mut notes)?;
            (m, k, Some(f))
        } else {
            let (m, k) = map_region(len, opts.kind, &mut notes)?;
            (m, k, None)
        };
        let locked = match opts.lock {
            Some(false) => false,
            want => match map.lock() {
                Ok(()) => true,
                Err(e) if want == Some(true) => {
                    return Err(Error::Memory(format!(
                        "mlock of {len} bytes failed ({e}); `lock_memory` is \"on\". \
                         Raise `ulimit -l`, grant CAP_IPC_LOCK, or set it to \"auto\""
                    )));
                }
                Err(e) => {
                    notes.push(format!(
                        "mlock refused ({e}): memory is not locked (ulimit -l or CAP_IPC_LOCK)"
                    ));
                    false
                }
            },
        };
        if opts.prefault && !locked {
            // mlock already faulted everything in. Otherwise ask the kernel to
            // populate writable pages, or touch one byte per page.
            if map.advise(Advice::PopulateWrite).is_err() {
                let page = if kind == MemoryKind::Normal {
                    4096
                } else {
                    HUGE_2M
                };
                for off in (0..len).step_by(page) {
                    map[off] = 0;
                }
            }
        }
        let base = map.as_mut_ptr();
        Ok(Arena {
            _map: map,
            file,
            base,
            len,
            report: ArenaReport {
                kind,
                bytes: len,
                locked,
                notes,
            },
        })
    }

    pub fn report(&self) -> &ArenaReport {
        &self.report
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory file of a shared arena (`ArenaOptions::shared`): mapping
    /// it (`MAP_SHARED`, offset 0) in another process shows the same bytes.
    pub fn shared_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.file.as_ref().map(|f| f.as_raw_fd())
    }
}

/// The kernel's transparent-huge-page mode for shared memory (the bracketed
/// word of `shmem_enabled`), when it can be read.
fn shmem_thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// A memory file of `len` bytes mapped `MAP_SHARED`: explicit huge pages
/// (`MFD_HUGETLB`) when reserved, else transparent huge pages when the
/// kernel gives them to shared memory, else normal pages.
fn map_shared(
    len: usize,
    want: Option<MemoryKind>,
    notes: &mut Vec<String>,
) -> Result<(MmapMut, MemoryKind, std::fs::File)> {
    use std::os::fd::FromRawFd;
    let memfd = |flags: libc::c_uint| -> std::io::Result<(MmapMut, std::fs::File)> {
        // SAFETY: a static NUL-terminated name and plain flags.
        let fd =
            unsafe { libc::memfd_create(c"ringfeed-arena".as_ptr(), libc::MFD_CLOEXEC | flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        // SAFETY: the file is ours alone until the arena hands its
        // descriptor out; its length was set above and never changes.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file) }?;
        Ok((map, file))
    };
    let mut want_huge = want.is_none() || want == Some(MemoryKind::Hugetlb);
    if want.is_none() && len % HUGE_2M != 0 {
        notes.push(format!(
            "{len} bytes is not a multiple of 2 MiB: no MFD_HUGETLB"
        ));
        want_huge = false;
    }
    if want_huge {
        match memfd(libc::MFD_HUGETLB) {
            Ok((m, f)) => return Ok((m, MemoryKind::Hugetlb, f)),
            Err(e) if want == Some(MemoryKind::Hugetlb) => {
                return Err(Error::Memory(format!(
                    "a shared arena of {len} bytes in huge pages failed ({e}); `memory_kind` is \
                     \"hugetlb\": reserve huge pages in /proc/sys/vm/nr_hugepages or choose \"auto\""
                )));
            }
            Err(e) => notes.push(format!("MFD_HUGETLB failed ({e}): no huge pages reserved")),
        }
    }
    let (map, file) = memfd(0)
        .map_err(|e| Error::Memory(format!("a shared arena of {len} bytes (memfd) failed: {e}")))?;
    if want == Some(MemoryKind::Normal) {
        return Ok((map, MemoryKind::Normal, file));
    }
    let mode = shmem_thp_mode();
    let thp = matches!(
        mode.as_deref(),
        Some("always" | "within_size" | "advise" | "force")
    );
    if thp && map.advise(Advice::HugePage).is_ok() {
        return Ok((map, MemoryKind::Thp, file));
    }
    let why = match mode {
        Some(m) if !thp => format!(
            "the kernel gives shared memory no transparent huge pages \
             (/sys/kernel/mm/transparent_hugepage/shmem_enabled is {m})"
        ),
        Some(_) => "MADV_HUGEPAGE refused on shared memory".to_string(),
        None => "shared memory THP mode unknown".to_string(),
    };
    if want == Some(MemoryKind::Thp) {
        return Err(Error::Memory(format!(
            "`memory_kind` is \"thp\" but {why}; `shared_arena` needs shared memory"
        )));
    }
    notes.push(format!("shared arena: normal pages: {why}"));
    Ok((map, MemoryKind::Normal, file))
}

fn map_region(
    len: usize,
    want: Option<MemoryKind>,
    notes: &mut Vec<String>,
) -> Result<(MmapMut, MemoryKind)> {
    let anon = |huge: bool| {
        let mut o = MmapOptions::new();
        o.len(len);
        if huge {
            o.huge(None);
        }
        o.map_anon()
    };
    let mut want_huge = want.is_none() || want == Some(MemoryKind::Hugetlb);
    if want.is_none() && len % HUGE_2M != 0 {
        notes.push(format!(
            "{len} bytes is not a multiple of 2 MiB: no MAP_HUGETLB"
        ));
        want_huge = false;
    }
    if want_huge {
        match anon(true) {
            Ok(m) => return Ok((m, MemoryKind::Hugetlb)),
            Err(e) if want == Some(MemoryKind::Hugetlb) => {
                return Err(Error::Memory(format!(
                    "MAP_HUGETLB of {len} bytes failed ({e}); `memory_kind` is \"hugetlb\": \
                     reserve huge pages in /proc/sys/vm/nr_hugepages or choose \"auto\""
                )));
            }
            Err(e) => notes.push(format!("MAP_HUGETLB failed ({e}): no huge pages reserved")),
        }
    }
    let map = anon(false).map_err(|e| Error::Memory(format!("mmap of {len} bytes failed: {e}")))?;
    if want == Some(MemoryKind::Normal) {
        return Ok((map, MemoryKind::Normal));
    }
    match map.advise(Advice::HugePage) {
        Ok(()) => Ok((map, MemoryKind::Thp)),
        Err(e) if want == Some(MemoryKind::Thp) => Err(Error::Memory(format!(
            "madvise(MADV_HUGEPAGE) failed ({e}); `memory_kind` is \"thp\""
        ))),
        Err(e) => {
            notes.push(format!("MADV_HUGEPAGE refused ({e}): normal pages"));
            Ok((map, MemoryKind::Normal))
        }
    }
}

/// Counters of chunk use.
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolUse {
    pub in_use: usize,
    pub peak: usize,
}

struct PoolState {
    free: Vec<bool>,
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

/// Reference-counted chunks over an [`Arena`].
pub struct ChunkPool {
    arena: Arena,
    chunk_size: usize,
    /// Reference count of each run, stored at the run's first chunk.
    refs: Box<[AtomicU32]>,
    state: Mutex<PoolState>,
    freed: Condvar,
    stop: AtomicBool,
    /// Batches alive anywhere (in the ring or held by a consumer). Decremented
    /// only after a batch's chunks went back (see `BatchGuard`), so a waiter
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
                free_count: n,
                peak_in_use: 0,
                running: 0,
                waiting: 0,
                reserve: 0,
                owner: vec![u32::MAX; n],
                used: Vec::new(),
                quota: 0,
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
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn usage(&self) -> PoolUse {
        let s = self.lock();
        PoolUse {
            in_use: self.chunk_count() - s.free_count,
            peak: s.peak_in_use,
        }
    }

    /// Whether the run starting at chunk `index` is back in the pool: the
    /// engine's tests check that no read lands in a returned chunk.
    #[cfg(test)]
    pub(crate) fn is_free(&self, index: usize) -> bool {
        self.lock().free[index]
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
        s.quota = quota;
        // Owners start spread over the arena and walk it from there.
        let n = self.chunk_count();
        s.next = (0..=owners).map(|o| o * n / (owners + 1)).collect();
    }

    /// The per-owner quota (0: none).
    pub fn quota(&self) -> usize {
        self.lock().quota
    }

    /// Chunks `owner` holds now.
    pub fn owner_used(&self, owner: usize) -> usize {
        self.lock().used.get(owner).copied().unwrap_or(0)
    }

    /// One chunk for read-ahead, only while more than the reserve is free
    /// and `owner` keeps `headroom` chunks of its quota; never waits.
    pub fn acquire_spare(self: &Arc<Self>) -> Result<Option<ChunkRef>> {
        self.acquire_spare_as(NO_OWNER, 0)
    }

    /// [`ChunkPool::acquire_spare`] for `owner`.
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
    pub fn acquire(self: &Arc<Self>, n: usize, wait: bool) -> Result<Option<ChunkRef>> {
        self.acquire_as(NO_OWNER, n, wait)
    }

    /// [`ChunkPool::acquire`] counted against `owner`'s quota.
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
        loop {
            let allowed = !owned || s.used[owner] + n <= s.quota;
            let hint = s.next.len() - 1;
            let slot = if owned { owner.min(hint) } else { hint };
            if let Some(start) = find_run_from(&s.free, n, s.next[slot]).filter(|_| allowed) {
                for f in &mut s.free[start..start + n] {
                    *f = false;
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
                            s.quota,
                            s.used.len(),
                            self.chunk_count(),
                            self.chunk_size
                        ),
                    });
                }
            } else {
                own_since = None;
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

    fn release_run(&self, start: usize, n: usize) {
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

/// A counted reference to a run of chunks. The bytes stay valid while any
/// reference lives.
pub struct ChunkRef {
    pool: Arc<ChunkPool>,
    start: u32,
    len: u32,
}

impl ChunkRef {
    /// First byte of the run.
    pub fn ptr(&self) -> *mut u8 {
        // SAFETY: start < chunk_count, so the offset is inside the mapping.
        unsafe {
            self.pool
                .arena
                .base
                .add(self.start as usize * self.pool.chunk_size)
        }
    }

    /// Bytes in the run.
    pub fn len(&self) -> usize {
        self.len as usize * self.pool.chunk_size
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the run's first chunk (the fixed-buffer index for io_uring).
    pub fn index(&self) -> u32 {
        self.start
    }

    pub fn pool(&self) -> &Arc<ChunkPool> {
        &self.pool
    }

    pub fn same_run(&self, other: &ChunkRef) -> bool {
        self.start == other.start && Arc::ptr_eq(&self.pool, &other.pool)
    }
}

impl Clone for ChunkRef {
    fn clone(&self) -> Self {
        // Relaxed: as Arc::clone, a new reference is made from an existing
        // one, so the count cannot reach zero concurrently.
        self.pool.refs[self.start as usize].fetch_add(1, Ordering::Relaxed);
        ChunkRef {
            pool: Arc::clone(&self.pool),
            start: self.start,
            len: self.len,
        }
    }
}

impl Drop for ChunkRef {
    fn drop(&mut self) {
        // Release: our reads and writes of the run happen before the run is
        // handed out again; the Acquire fence below completes the pair.
        if self.pool.refs[self.start as usize].fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            self.pool
                .release_run(self.start as usize, self.len as usize);
        }
    }
}

impl std::fmt::Debug for ChunkRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkRef({}+{})", self.start, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn each_memory_kind_can_be_forced_or_reports_why_not() {
        for kind in [MemoryKind::Thp, MemoryKind::Normal] {
            let a = Arena::new(
                4 << 20,
                ArenaOptions {
                    kind: Some(kind),
                    lock: None,
                    prefault: true,
                    shared: false,
                },
            )
            .unwrap();
            assert_eq!(a.report().kind, kind);
        }
        let auto = Arena::new(
            4 << 20,
            ArenaOptions {
                kind: None,
                lock: Some(false),
                prefault: true,
                shared: false,
            },
        )
        .unwrap();
        assert!(!auto.report().locked);
        if auto.report().kind != MemoryKind::Hugetlb {
            assert!(
                auto.report()
                    .notes
                    .iter()
                    .any(|n| n.contains("MAP_HUGETLB"))
            );
            let forced = Arena::new(
                4 << 20,
                ArenaOptions {
                    kind: Some(MemoryKind::Hugetlb),
                    lock: None,
                    prefault: false,
                    shared: false,
                },
            );
            match forced {
                Err(Error::Memory(m)) => assert!(m.contains("nr_hugepages"), "{m}"),
                other => panic!("expected a memory error, got {:?}", other.map(|_| ())),
            }
        }
    }
}
