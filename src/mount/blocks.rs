//! A remote file's bytes, in blocks of `part_size` fetched with the
//! engine's ranged reads on network threads of its own (io_uring HTTP,
//! `crate::fetch::net_thread`): every handle and every process reading a
//! file through the mount shares its blocks, so an object is read from
//! the store once however many read it. Blocks live in memory up to the
//! mount's budget, the least recently used going first; a block still
//! being received is never dropped (the kernel writes into it).
//!
//! Each block is one ranged GET pinned to the version the listing gave
//! (`If-Match` with its ETag, the size checked), so a file rewritten in
//! the store while it is read is an error, never a mix of two versions.
//!
//! A file read from its start on (a stream) also fills the node's cache
//! entry for it (`cache_dir`, the loaders' entries), block after block in
//! order through the cache's spool thread; a file whose entry is there is
//! read from it instead, each piece checked against the entry's block
//! checksums (a bad entry is dropped, and the file read from the store).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use crate::cache::{Entry, Fill, Spool, SpoolFill};
use crate::dataset::{Shard, Source};
use crate::fetch::net_thread::{Inbox, NetLink};
use crate::fetch::{NetOptions, ReadFail, ReadRequest, Target};
use crate::net::object::HttpObject;
use crate::net::version::VersionPin;

use super::MountCounts;
use crate::sync::{Locked, Waits};

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Pending,
    Ready,
    Failed(String),
}

/// Freed blocks' memory, kept for the next blocks: a new block's pages
/// are then already faulted in, where fresh memory costs a fault per page
/// on the network thread's receive (the first touch cost more than the
/// transfer on a VM; see `ringfeed get`).
pub struct Spare {
    size: usize,
    most: usize,
    free: Mutex<Vec<Box<[u8]>>>,
}

impl Spare {
    fn take(&self) -> Box<[u8]> {
        self.free
            .locked()
            .pop()
            .unwrap_or_else(|| vec![0u8; self.size].into_boxed_slice())
    }

    fn give(&self, mem: Box<[u8]>) {
        let mut f = self.free.locked();
        if f.len() < self.most && mem.len() == self.size {
            f.push(mem);
        }
    }
}

/// One block's memory and whether its read is done.
pub struct Block {
    ptr: *mut u8,
    /// The block's bytes (the memory may be longer: a spare's).
    len: usize,
    cap: usize,
    spare: Option<Arc<Spare>>,
    state: Mutex<State>,
    done: Condvar,
    /// Its place in the store's least-recently-used order.
    stamp: AtomicU64,
}

// SAFETY: the memory at `ptr` is written only by the network thread while
// the block is `Pending` (nobody reads it then), and only read after it is
// `Ready`; the state's mutex orders the two.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    fn new(len: usize, spare: Option<&Arc<Spare>>) -> Block {
        let mem = match spare {
            Some(s) if len <= s.size => s.take(),
            _ => vec![0u8; len].into_boxed_slice(),
        };
        let cap = mem.len();
        Block {
            ptr: Box::into_raw(mem).cast(),
            len,
            cap,
            spare: spare.filter(|s| cap == s.size).cloned(),
            state: Mutex::new(State::Pending),
            done: Condvar::new(),
            stamp: AtomicU64::new(0),
        }
    }

    /// Waits for the read; its error, naming what failed.
    pub fn wait(&self) -> Result<(), String> {
        let mut s = self.state.locked();
        loop {
            match &*s {
                State::Pending => s = self.done.wait_locked(s),
                State::Ready => return Ok(()),
                State::Failed(why) => return Err(why.clone()),
            }
        }
    }

    fn is(&self, state: &State) -> bool {
        *self.state.locked() == *state
    }

    fn finish(&self, state: State) {
        *self.state.locked() = state;
        self.done.notify_all();
    }

    /// The block's bytes, once [`Block::wait`] said it is ready.
    pub fn bytes(&self) -> &[u8] {
        debug_assert!(self.is(&State::Ready));
        // SAFETY: `ptr` holds `len` bytes; once ready, nothing writes them.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` of a slice of `cap` bytes in
        // `new`; a block is dropped only when no read is in flight into
        // it (the store's pending map holds it until its completion).
        let mem = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.cap)) };
        match &self.spare {
            Some(s) => s.give(mem),
            None => drop(mem),
        }
    }
}

/// A cache fill under way: the blocks before `next` are written.
struct Filling {
    fill: SpoolFill,
    next: u64,
}

/// One version of a remote file.
pub struct RemoteFile {
    pub name: String,
    pub obj: Arc<HttpObject>,
    pub size: u64,
    /// The strong ETag the listing gave, if any: what reads are pinned
    /// to and the cache entry is keyed by.
    pub etag: Option<String>,
    /// The `Last-Modified` the listing gave, if any: pinned too while no
    /// strong ETag is (`VersionPin`).
    pub modified: Option<String>,
    /// The listing this version was made from (`tree::Node::listing`).
    pub listing: u64,
    pin: Arc<VersionPin>,
    blocks: Mutex<HashMap<u64, Arc<Block>>>,
    /// The node's cache entry of this version, once found or filled.
    entry: Mutex<Option<Arc<Entry>>>,
    filling: Mutex<Option<Filling>>,
    /// Whether the cache was asked for this file yet.
    consulted: AtomicBool,
}

impl RemoteFile {
    /// The version of `name` (read through `obj`) a listing showed:
    /// `size` bytes, its validators `etag` and `modified` (`Last-Modified`),
    /// from listing number `listing`.
    pub fn new(
        name: String,
        obj: Arc<HttpObject>,
        size: u64,
        etag: Option<String>,
        modified: Option<String>,
        listing: u64,
    ) -> RemoteFile {
        let etag = etag.filter(|t| crate::net::version::is_strong(t));
        RemoteFile {
            pin: Arc::new(
                VersionPin::planned(etag.clone(), Some(size)).with_modified(modified.clone()),
            ),
            name,
            obj,
            size,
            etag,
            modified,
            listing,
            blocks: Mutex::new(HashMap::new()),
            entry: Mutex::new(None),
            filling: Mutex::new(None),
            consulted: AtomicBool::new(false),
        }
    }

    /// The strong ETag of the version read: the listing's, else the one
    /// the first answer pinned.
    fn version(&self) -> Option<String> {
        self.etag
            .clone()
            .or_else(|| self.pin.strong().map(str::to_string))
    }

    fn identity(&self) -> Option<crate::cache::Identity> {
        let version = crate::dataset::cache_version(&self.version()?)?;
        let shard = Shard {
            name: self.name.clone(),
            source: Source::Http(Arc::clone(&self.obj)),
            size: Some(self.size),
            samples: None,
        };
        Some(crate::dataset::cache_identity(
            &shard, &self.obj, version, self.size,
        ))
    }
}

#[derive(Default)]
struct Lru {
    order: BTreeMap<u64, (Weak<RemoteFile>, u64)>,
    bytes: u64,
    clock: u64,
}

/// The blocks of every remote file, the network threads that fetch them
/// and the thread that takes their completions.
pub struct Store {
    block: u64,
    memory: u64,
    links: Vec<Arc<NetLink>>,
    turn: AtomicUsize,
    inbox: Arc<Inbox>,
    pending: Arc<Mutex<HashMap<u64, Arc<Block>>>>,
    /// Bytes of the blocks being received now: these cannot be dropped,
    /// so read-ahead stops while they fill half the budget
    /// ([`Store::may_read_ahead`]).
    receiving: Arc<AtomicU64>,
    next_id: AtomicU64,
    lru: Mutex<Lru>,
    spare: Arc<Spare>,
    spool: Option<Spool>,
    stall: std::time::Duration,
    counts: Arc<MountCounts>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Store {
    /// A store of `block`-byte blocks in at most `memory` bytes, with
    /// `net_threads` network threads and the cache's `spool`, if any.
    pub fn start(
        block: u64,
        memory: u64,
        net_threads: usize,
        net: &NetOptions,
        spool: Option<Spool>,
        counts: Arc<MountCounts>,
    ) -> std::io::Result<Store> {
        let inbox = Inbox::new()?;
        let pending: Arc<Mutex<HashMap<u64, Arc<Block>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut links = Vec::new();
        let mut threads = Vec::new();
        for i in 0..net_threads.max(1) {
            let link = NetLink::new()?;
            let (l, n) = (Arc::clone(&link), net.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rf-mount-net{i}"))
                    .spawn(move || l.run(n, 0x6d6f756e74 ^ i as u64, 256))?,
            );
            links.push(link);
        }
        let receiving = Arc::new(AtomicU64::new(0));
        let (ib, p, s, c, r) = (
            Arc::clone(&inbox),
            Arc::clone(&pending),
            Arc::clone(&stop),
            Arc::clone(&counts),
            Arc::clone(&receiving),
        );
        threads.push(
            std::thread::Builder::new()
                .name("rf-mount-done".into())
                .spawn(move || complete(&ib, &p, &s, &c, &r))?,
        );
        Ok(Store {
            block: block.max(4096),
            memory,
            links,
            turn: AtomicUsize::new(0),
            inbox,
            pending,
            receiving,
            next_id: AtomicU64::new(1),
            lru: Mutex::new(Lru::default()),
            spare: Arc::new(Spare {
                size: block.max(4096) as usize,
                // A quarter of the budget kept for reuse at most.
                most: (memory / block.max(4096) / 4).max(4) as usize,
                free: Mutex::new(Vec::new()),
            }),
            stall: net.stall,
            spool,
            counts,
            stop,
            threads: Mutex::new(threads),
        })
    }

    pub fn block_size(&self) -> u64 {
        self.block
    }

    /// Bytes of blocks held now.
    pub fn held(&self) -> u64 {
        self.lru.locked().bytes
    }

    /// Whether a block may be fetched ahead of what is read now: the
    /// blocks being received (which cannot be dropped) fill less than
    /// half the memory budget, the other half left to the blocks read.
    /// Without it, N streams each with `--read-ahead` in flight held N
    /// times that, whatever `--memory` said.
    pub fn may_read_ahead(&self) -> bool {
        // Relaxed: a bound checked per block, not ordered with the bytes.
        self.receiving.load(Ordering::Relaxed) + self.block <= self.memory / 2
    }

    /// Whether block `i` of `file` is held (read or being read).
    pub fn holds(&self, file: &RemoteFile, i: u64) -> bool {
        file.blocks.locked().contains_key(&i)
    }

    /// Block `i` of `file`: the one held, or a new one whose read starts.
    pub fn block(&self, file: &Arc<RemoteFile>, i: u64) -> Arc<Block> {
        let mut blocks = file.blocks.locked();
        if let Some(b) = blocks.get(&i) {
            let b = Arc::clone(b);
            drop(blocks);
            self.touch(file, i, &b, false);
            return b;
        }
        let off = i * self.block;
        let len = (file.size - off.min(file.size)).min(self.block) as usize;
        let b = Arc::new(Block::new(len, Some(&self.spare)));
        blocks.insert(i, Arc::clone(&b));
        drop(blocks);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Relaxed: see `may_read_ahead`.
        self.receiving.fetch_add(len as u64, Ordering::Relaxed);
        self.pending.locked().insert(id, Arc::clone(&b));
        let req = ReadRequest {
            id,
            target: Target::Http(Arc::clone(&file.obj)),
            offset: off,
            buf: b.ptr,
            len,
            buf_index: 0,
            open_end: false,
            pin: Some(Arc::clone(&file.pin)),
        };
        // Relaxed: a round-robin counter.
        let link = &self.links[self.turn.fetch_add(1, Ordering::Relaxed) % self.links.len()];
        link.hand(req, Arc::clone(&file.obj), &self.inbox);
        self.counts.add(&self.counts.gets, 1);
        self.touch(file, i, &b, true);
        b
    }

    /// Puts block `i` last in the eviction order (counted in when new),
    /// then evicts what is over the budget.
    fn touch(&self, file: &Arc<RemoteFile>, i: u64, b: &Arc<Block>, new: bool) {
        let mut lru = self.lru.locked();
        lru.clock += 1;
        let now = lru.clock;
        let old = b.stamp.swap(now, Ordering::Relaxed);
        if !new {
            lru.order.remove(&old);
        } else {
            lru.bytes += b.len as u64;
        }
        lru.order.insert(now, (Arc::downgrade(file), i));
        // Evict the oldest blocks that are done and that nobody holds but
        // the file; stop at the first one still needed.
        while lru.bytes > self.memory {
            let Some((&stamp, _)) = lru.order.iter().next() else {
                break;
            };
            if stamp == now {
                break;
            }
            let (f, idx) = lru.order.remove(&stamp).expect("just seen");
            let Some(f) = f.upgrade() else {
                continue;
            };
            let mut blocks = f.blocks.locked();
            let gone = match blocks.get(&idx) {
                Some(x) if x.is(&State::Pending) || Arc::strong_count(x) > 1 => false,
                Some(_) => true,
                None => continue,
            };
            if gone {
                if let Some(x) = blocks.remove(&idx) {
                    lru.bytes -= x.len as u64;
                    self.counts.add(&self.counts.evicted, 1);
                }
            } else {
                // Still being read or held: keep it, newest.
                lru.clock += 1;
                let c = lru.clock;
                if let Some(x) = blocks.get(&idx) {
                    x.stamp.store(c, Ordering::Relaxed);
                }
                lru.order.insert(c, (Arc::downgrade(&f), idx));
                break;
            }
        }
    }

    /// Drops a block that failed, so the next read asks again.
    pub fn forget(&self, file: &RemoteFile, i: u64, b: &Arc<Block>) {
        let mut blocks = file.blocks.locked();
        if blocks.get(&i).is_some_and(|x| Arc::ptr_eq(x, b)) {
            blocks.remove(&i);
            let mut lru = self.lru.locked();
            lru.order.remove(&b.stamp.load(Ordering::Relaxed));
            lru.bytes -= b.len as u64;
        }
    }

    /// The cache entry to read `file` from, if there is one: looked up
    /// once per version; a read from the start (`from_start`) that finds
    /// none starts the fill (or waits for another process's).
    pub fn entry(&self, file: &Arc<RemoteFile>, from_start: bool) -> Option<Arc<Entry>> {
        if let Some(e) = file.entry.locked().as_ref() {
            return Some(Arc::clone(e));
        }
        let spool = self.spool.as_ref()?;
        // No version yet (a listing without ETags): asked again once the
        // first answer pinned one.
        let id = file.identity()?;
        let cache = spool.cache();
        if !file.consulted.swap(true, Ordering::Relaxed) {
            if let Some(e) = cache.lookup(&id) {
                let e = Arc::new(e);
                *file.entry.locked() = Some(Arc::clone(&e));
                return Some(e);
            }
        }
        if !from_start || file.filling.locked().is_some() || !spool.admits() {
            return None;
        }
        match cache.fill(&id, self.stall) {
            Fill::Hit(e) => {
                let e = Arc::new(e);
                *file.entry.locked() = Some(Arc::clone(&e));
                Some(e)
            }
            Fill::Write(filler) => {
                if let Some(fill) = spool.take(filler, file.size) {
                    *file.filling.locked() = Some(Filling { fill, next: 0 });
                }
                None
            }
            Fill::Uncached(_) => None,
        }
    }

    /// Hands the blocks that arrived in order to the file's cache fill;
    /// completes it after the last; gives it up when a block it needs
    /// failed.
    pub fn advance_fill(&self, file: &Arc<RemoteFile>) {
        let mut f = file.filling.locked();
        let Some(filling) = f.as_mut() else { return };
        let count = file.size.div_ceil(self.block);
        while filling.next < count {
            let b = file.blocks.locked().get(&filling.next).cloned();
            match b {
                Some(b) if b.is(&State::Ready) => {
                    let (ptr, len) = (b.ptr.cast_const(), b.len);
                    // SAFETY: the block's memory stays alive and unwritten
                    // while `hold` (a reference to it) lives.
                    if !unsafe { filling.fill.append(ptr, len, Box::new(b)) } {
                        *f = None;
                        return;
                    }
                    filling.next += 1;
                }
                // Not asked for yet (the read-ahead has not come to it),
                // or on its way: later. (One evicted before its turn
                // leaves the fill to be dropped at the last close.)
                Some(b) if b.is(&State::Pending) => return,
                None => return,
                Some(_) => {
                    *f = None;
                    return;
                }
            }
        }
        if let Some(done) = f.take() {
            done.fill.finish(None);
            self.counts.add(&self.counts.cache_filled, 1);
        }
    }

    /// Drops a fill that will not complete (the last handle is closed
    /// before the end was read).
    pub fn drop_fill(&self, file: &RemoteFile) {
        file.filling.locked().take();
    }

    /// Reads `off..end` of `file` from its cache entry, checked; `None`
    /// when the entry fails (it is dropped: the caller reads the store).
    pub fn read_entry(&self, file: &RemoteFile, e: &Entry, off: u64, end: u64) -> Option<Vec<u8>> {
        let blk = crate::cache::entry::BLOCK as u64;
        let (a, b) = (
            off / blk * blk,
            end.next_multiple_of(blk).min(e.header.data_len),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        let ok = e
            .file
            .read_exact_at(&mut buf, e.header.data_offset as u64 + a)
            .map_err(|err| crate::cache::Bad::Corrupt(err.to_string()))
            .and_then(|()| e.check(a, &buf));
        match ok {
            Ok(()) => {
                self.counts.add(&self.counts.cache_hit_bytes, end - off);
                buf.truncate((end - a) as usize);
                buf.drain(..(off - a) as usize);
                Some(buf)
            }
            Err(why) => {
                if let (Some(s), Some(id)) = (&self.spool, file.identity()) {
                    s.cache().drop_corrupt(&id, &why);
                }
                file.entry.locked().take();
                None
            }
        }
    }

    /// Stops the threads (each ends once the reads it has are done, the
    /// network thread's after their retries: not waited for here, so a
    /// mount over a store that stalls still exits at once) and writes out
    /// the cache fills queued.
    pub fn stop(&self) {
        for l in &self.links {
            l.stop();
        }
        self.stop.store(true, Ordering::Relaxed);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to the inbox's eventfd, waking its thread.
        unsafe { libc::write(self.inbox.fd(), (&one as *const u64).cast(), 8) };
        self.threads.locked().clear();
        if let Some(s) = &self.spool {
            s.flush();
        }
    }
}

/// The completions' thread: marks each block done or failed and wakes
/// its readers.
fn complete(
    inbox: &Inbox,
    pending: &Mutex<HashMap<u64, Arc<Block>>>,
    stop: &AtomicBool,
    counts: &MountCounts,
    receiving: &AtomicU64,
) {
    let mut out = Vec::new();
    loop {
        let mut pfd = libc::pollfd {
            fd: inbox.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        let mut n = 0u64;
        // SAFETY: reads the eventfd's 8-byte counter (non-blocking).
        unsafe { libc::read(inbox.fd(), (&mut n as *mut u64).cast(), 8) };
        inbox.take(&mut out);
        for c in out.drain(..) {
            let Some(b) = pending.locked().remove(&c.id) else {
                continue;
            };
            // Relaxed: see `Store::may_read_ahead`.
            receiving.fetch_sub(b.len as u64, Ordering::Relaxed);
            let state = match c.result {
                Ok(n) if n == b.len => {
                    counts.add(&counts.bytes_fetched, n as u64);
                    State::Ready
                }
                Ok(n) => State::Failed(format!(
                    "a read of {} bytes gave {n}: the object changed",
                    b.len
                )),
                Err(ReadFail::Net(e)) => State::Failed(e.to_string()),
                Err(ReadFail::Io(e)) => State::Failed(e.to_string()),
            };
            if state != State::Ready {
                counts.add(&counts.read_errors, 1);
            }
            b.finish(state);
        }
        // Relaxed: the flag is checked once the links are stopped and
        // every read they had has come back.
        if stop.load(Ordering::Relaxed) && pending.locked().is_empty() {
            return;
        }
    }
}
