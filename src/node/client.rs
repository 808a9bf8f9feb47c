//! A consumer attached to a node engine ([`NodeLoader`]): the same calls as
//! an engine in the process (`next`, `state`, stats, `close`), over the
//! transport the engine hands over at attach — its arena mapped read-only,
//! the rings, two eventfds — and the socket, whose hang-up is how either
//! side learns the other is gone.
//!
//! `next` reads the record ring; when it is empty it waits in `poll` on the
//! engine's eventfd and on the socket, so an engine that exits or crashes is
//! an error at once (after the batches it had already handed over), never a
//! hang. A batch ([`NodeBatch`]) is rebuilt in this process's memory with
//! pointers into its own mapping; dropping it writes its number into the
//! release ring (with the shipped bit once [`NodeBatch::ship`] gave its key
//! to another process). The mapping lives as long as any batch of it, and
//! the engine frees none of this consumer's batches before it releases them
//! or its process exits: batches stay valid after `close` or the engine's
//! exit.
//!
//! Before anything is sent, the socket is checked (`sock::connect_checked`:
//! this user's own socket, in a folder no other user may put one in, with
//! an engine of this user listening), and what is sent is the keys that
//! fix this consumer's batches, never credentials.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};
use serde_json::{Map, Value, json};

use super::proto::record::{self, Decoded, Record};
use super::proto::{self, Cap, EngineId, Key, Reply, Request, Role, SHIPPED};
use super::shm::Rings;
use super::sock;
use crate::config::Toggle;
use crate::engine::Counts;
use crate::error::{Error, NodeFailure, Result};
use crate::memory::{NO_SOURCE, RawField, RawSample, cuda};
use crate::sync::Locked;

/// What the consumer and its batches share.
struct Link {
    rings: Rings,
    /// Wakes the engine's session: records read, batches released.
    wake: OwnedFd,
    /// One writer of the release ring at a time.
    releasing: Mutex<()>,
    arena: Mmap,
    /// Set once the engine is known gone: releases stop.
    gone: AtomicBool,
    /// The engine's socket and identity: with a batch's number and
    /// capability, the batch's key (`NodeBatch::key`).
    socket: PathBuf,
    engine: EngineId,
    /// The connection to the engine (a duplicate): polled for its hang-up
    /// (whether the engine is still there), and where requests go.
    conn: OwnedFd,
    /// One request on the connection at a time, and the buffer its reply
    /// is received into.
    asking: Mutex<Vec<u8>>,
    /// The consumer closed its loader.
    closed: AtomicBool,
    /// The engine's process, for messages.
    pid: u64,
}

/// How long a release waits for room in a full ring before it asks
/// whether the engine is still there, and says (once a process) that
/// releases wait: the engine drains the ring at every wake-up, so a ring
/// full for this long is an engine far behind, or gone.
const RELEASE_PATIENCE: Duration = Duration::from_millis(200);

impl Link {
    /// Writes a release into the ring, waiting for room while the engine
    /// lives: a release is never dropped while its engine could still take
    /// it. Once the engine is gone its batches are nobody's, and the
    /// release is moot.
    fn release(&self, entry: u64) {
        let _g = self.releasing.locked();
        let mut since = Instant::now();
        loop {
            if self.gone.load(Ordering::Acquire) {
                return;
            }
            if self.rings.push_release(entry) {
                sock::notify(&self.wake);
                return;
            }
            if since.elapsed() >= RELEASE_PATIENCE {
                if self.engine_gone() {
                    self.gone.store(true, Ordering::Release);
                    return;
                }
                crate::log::once("node-release-wait", crate::log::Level::Warn, || {
                    format!(
                        "a batch release waits: the node engine at {} has not drained this \
                         consumer's release ring for {} ms; waiting while it runs",
                        self.socket.display(),
                        RELEASE_PATIENCE.as_millis()
                    )
                });
                since = Instant::now();
            }
            // The engine is behind on releases: nudge it and give it time.
            sock::notify(&self.wake);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether the engine's end of the connection hung up (its process
    /// exited, or it closed this consumer).
    fn engine_gone(&self) -> bool {
        sock::poll(&[(&self.conn, false)], Some(Duration::ZERO))
            .map_or(true, |r| r.first().is_none_or(|r| r.hangup))
    }

    /// What a request that found the connection gone fails with.
    fn gone(&self) -> Error {
        if self.closed.load(Ordering::Acquire) {
            return Error::Closed;
        }
        Error::node(
            NodeFailure::Gone,
            format!(
                "the engine at `{}` (process {}) exited or closed the connection",
                self.socket.display(),
                self.pid
            ),
        )
    }

    /// Asks the engine `req` and waits for its reply.
    fn ask(&self, req: &Request) -> Result<Reply> {
        let mut buf = self.asking.locked();
        sock::send(&self.conn, &proto::encode(req), &[]).map_err(|_| self.gone())?;
        sock::recv(&self.conn, &mut buf)
            .map_err(|_| self.gone())?
            .ok_or_else(|| self.gone())?;
        let reply: Reply =
            proto::decode(&buf, "a reply").map_err(|e| Error::node(NodeFailure::Protocol, e.0))?;
        match reply {
            Reply::Refused { status, message } => Err(Error::Remote { status, message }),
            r => Ok(r),
        }
    }

    /// The name of shard `index` of the dataset.
    fn shard_name(&self, index: u32) -> Result<Option<String>> {
        if index == NO_SOURCE {
            return Ok(None);
        }
        match self.ask(&Request::Source { shard: index })? {
            Reply::Source { name } => Ok(name),
            other => Err(Error::node(
                NodeFailure::Protocol,
                format!("the engine answered a source request with {other:?}"),
            )),
        }
    }
}

/// A sample's shard name for the engine to give: asked with
/// [`ShardName::ask`] (a round trip), away from any lock of the caller's.
pub struct ShardName {
    link: Arc<Link>,
    index: u32,
}

impl ShardName {
    pub fn ask(&self) -> Result<Option<String>> {
        self.link.shard_name(self.index)
    }
}

/// What `next` returns when it does not fail.
pub type NodeNext = crate::engine::Next<NodeBatch>;

struct Taking {
    buf: Vec<u8>,
    /// The resume state after the last record taken.
    state: String,
    /// The engine's error, or its loss, returned to every later call.
    failure: Option<Error>,
    finished: bool,
}

/// A loader whose engine is the node engine.
pub struct NodeLoader {
    /// The arena's mapping registered with CUDA (dropped first: before the
    /// mapping can go).
    cuda: Option<cuda::Registration>,
    /// Why the mapping is not registered, under `cuda_register: "auto"`.
    cuda_note: Option<String>,
    conn: OwnedFd,
    link: Arc<Link>,
    ready: OwnedFd,
    taking: Mutex<Taking>,
    wait_ns: AtomicU64,
    /// The read-only descriptor of the arena's memory file.
    arena_fd: File,
}

impl NodeLoader {
    /// Attaches to the engine at `socket` with the consumer's keys (the
    /// job's and its own: see `Role::Consumer`).
    pub fn attach(
        socket: &Path,
        config: &Map<String, Value>,
        cuda_register: Toggle,
    ) -> Result<NodeLoader> {
        let conn = sock::connect_checked(socket).map_err(|e| {
            Error::node(
                NodeFailure::Unreachable,
                format!("{e} (is `ringfeed node` running there?)"),
            )
        })?;
        let hello = Request::hello(Role::Consumer {
            config: config.clone(),
        });
        sock::send(&conn, &proto::encode(&hello), &[])
            .map_err(|e| Error::node(NodeFailure::Gone, format!("attach request: {e}")))?;
        let mut msg = Vec::new();
        let fds = sock::recv(&conn, &mut msg)
            .map_err(|e| Error::node(NodeFailure::NoReply, format!("attach reply: {e}")))?
            .ok_or_else(|| {
                Error::node(
                    NodeFailure::Gone,
                    "the engine closed the connection at attach",
                )
            })?;
        let reply: Reply = proto::decode(&msg, "the attach reply")
            .map_err(|e| Error::node(NodeFailure::Protocol, e.0))?;
        let (session, engine, arena_len, budget_len, state, pid) = match reply {
            Reply::Attached {
                session,
                engine,
                arena_len,
                budget_len,
                state,
                pid,
            } => (
                session,
                engine,
                arena_len as usize,
                budget_len as usize,
                state,
                pid,
            ),
            Reply::Refused { status, message } => return Err(Error::Remote { status, message }),
            other => {
                return Err(Error::node(
                    NodeFailure::Protocol,
                    format!("the engine answered an attach with {other:?}"),
                ));
            }
        };
        let _ = session;
        let [arena_fd, rings_fd, ready, wake]: [OwnedFd; 4] = fds.try_into().map_err(|_| {
            Error::node(
                NodeFailure::Protocol,
                "the attach reply lacks its descriptors",
            )
        })?;
        let arena_fd = File::from(arena_fd);
        let have = arena_fd.metadata().map(|m| m.len()).unwrap_or(0);
        if arena_len == 0 || (arena_len as u64) > have {
            return Err(Error::node(
                NodeFailure::Protocol,
                format!("the arena is {have} bytes, the engine says {arena_len}"),
            ));
        }
        // SAFETY: the engine's memory file is mapped read-only and shared;
        // its length never changes; its bytes are read only through batches
        // the engine handed over and has not taken back.
        let arena = unsafe {
            MmapOptions::new()
                .len(arena_len)
                // A hugetlb arena is reserved only for its budget
                // (`Arena::new_backed`): no reservation asked here either.
                .no_reserve_swap()
                .map(&arena_fd)
        }
        .map_err(|e| Error::node(NodeFailure::Local, format!("mapping the arena: {e}")))?;
        // The engine's arena stays out of this process's core dumps too.
        if let Err(e) = arena.advise(memmap2::Advice::DontDump) {
            crate::log::once("node-arena-dontdump", crate::log::Level::Warn, || {
                format!("madvise(MADV_DONTDUMP) of the node engine's arena refused ({e})")
            });
        }
        let rings = Rings::attach(&File::from(rings_fd))
            .map_err(|e| Error::node(NodeFailure::Protocol, e))?;
        let (mut cuda, mut cuda_note) = (None, None);
        let registered_len = budget_len.min(arena_len);
        if cuda_register != Toggle::Off {
            // Read-only: the consumer's mapping is.
            let registered = cuda::runtime()
                .map_err(|e| format!("CUDA runtime not found: {e}"))
                .and_then(|rt| rt.register(arena.as_ptr().cast_mut(), registered_len, true));
            match registered {
                Ok(r) => cuda = Some(r),
                Err(e) if cuda_register == Toggle::On => {
                    return Err(Error::Memory(format!(
                        "`cuda_register` is \"on\" but registering the arena failed: {e}"
                    )));
                }
                Err(e) => cuda_note = Some(cuda::not_registered(&e)),
            }
        }
        let hangup = conn.try_clone().map_err(|e| {
            Error::node(
                NodeFailure::Local,
                format!("duplicating the connection: {e}"),
            )
        })?;
        Ok(NodeLoader {
            cuda,
            cuda_note,
            conn,
            link: Arc::new(Link {
                rings,
                wake,
                releasing: Mutex::new(()),
                arena,
                gone: AtomicBool::new(false),
                socket: socket.to_path_buf(),
                engine,
                conn: hangup,
                asking: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
                pid: pid as u64,
            }),
            ready,
            taking: Mutex::new(Taking {
                buf: Vec::new(),
                state,
                failure: None,
                finished: false,
            }),
            wait_ns: AtomicU64::new(0),
            arena_fd,
        })
    }

    fn gone(&self) -> Error {
        self.link.gone()
    }

    /// The next batch, end of epoch, or time-out (`None`: wait for ever).
    pub fn next(&self, timeout: Option<Duration>) -> Result<NodeNext> {
        if self.link.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let t0 = Instant::now();
        let deadline = timeout.map(|t| t0 + t);
        let mut t = self.taking.locked();
        let got = self.take(&mut t, deadline);
        self.wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        got
    }

    fn take(&self, t: &mut Taking, deadline: Option<Instant>) -> Result<NodeNext> {
        let link = &self.link;
        loop {
            if let Some(e) = &t.failure {
                return Err(e.clone());
            }
            if t.finished {
                return Ok(NodeNext::Finished);
            }
            let mut buf = std::mem::take(&mut t.buf);
            let popped = link.rings.pop_record(&mut buf);
            let rec = match popped {
                Ok(true) => {
                    sock::notify(&link.wake);
                    let base = link.arena.as_ptr();
                    Some(record::decode(&buf, base, link.arena.len()))
                }
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            };
            t.buf = buf;
            match rec {
                Some(Ok(Record::Batch(d))) => {
                    let b = NodeBatch {
                        d,
                        link: link.clone(),
                        shipped: AtomicBool::new(false),
                    };
                    // SeqCst, with the store in `close`: if this load sees
                    // the loader open, the record's read (published above)
                    // came before the close, hence before the engine counts
                    // what this consumer took; else the batch is let go
                    // here (dropping it releases it) and never handed out.
                    if self.link.closed.load(Ordering::SeqCst) {
                        drop(b);
                        return Err(Error::Closed);
                    }
                    t.state = b.d.state.clone();
                    return Ok(NodeNext::Batch(b));
                }
                Some(Ok(Record::EndOfEpoch(e, state))) => {
                    t.state = state;
                    return Ok(NodeNext::EndOfEpoch(e));
                }
                Some(Ok(Record::Finished)) => t.finished = true,
                Some(Ok(Record::Failed(status, message))) => {
                    t.failure = Some(Error::Remote { status, message });
                }
                Some(Err(e)) => {
                    t.failure = Some(Error::node(
                        NodeFailure::Protocol,
                        format!("a broken record from the engine: {e}"),
                    ));
                }
                None => {
                    let left = match deadline {
                        Some(d) => {
                            let now = Instant::now();
                            if now >= d {
                                return Ok(NodeNext::Timeout);
                            }
                            Some(d - now)
                        }
                        None => None,
                    };
                    let ready = sock::poll(&[(&self.ready, true), (&self.conn, false)], left)
                        .map_err(|e| {
                            Error::node(NodeFailure::Gone, format!("waiting for the engine: {e}"))
                        })?;
                    if ready[0].readable {
                        sock::drain(&self.ready);
                    } else if ready[1].hangup {
                        if self.link.closed.load(Ordering::Acquire) {
                            return Err(Error::Closed);
                        }
                        // Records written before the hang-up are read first.
                        if !link.rings.pending() {
                            link.gone.store(true, Ordering::Release);
                            t.failure = Some(self.gone());
                        }
                    }
                }
            }
        }
    }

    /// The resume state after the batches taken so far.
    pub fn state_hex(&self) -> String {
        self.taking.locked().state.clone()
    }

    fn ask(&self, req: &Request) -> Result<Reply> {
        self.link.ask(req)
    }

    /// The engine's stats of this consumer's loader (JSON, with `node`
    /// added) and its counters; the consumer's own wait replaces the
    /// engine's.
    pub fn stats(&self) -> Result<(String, Counts)> {
        let Reply::Stats {
            stats,
            counts: hex,
            node,
        } = self.ask(&Request::Stats)?
        else {
            return Err(Error::node(
                NodeFailure::Protocol,
                "the engine answered stats with something else",
            ));
        };
        let mut counts = Counts::default();
        let hex = hex.unwrap_or_default();
        let size = std::mem::size_of::<Counts>();
        if hex.len() != size * 2 || !hex.is_ascii() {
            return Err(Error::node(
                NodeFailure::Protocol,
                "the engine's stats have another layout",
            ));
        }
        let bytes: Vec<u8> = (0..size)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        // SAFETY: Counts is repr(C) plain integers, of `size` bytes; every
        // bit pattern is a valid value.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&raw mut counts).cast::<u8>(), size);
        }
        counts.consumer_wait_ns = self.wait_ns.load(Ordering::Relaxed);
        let mut stats = stats;
        if let Some(m) = stats.as_object_mut() {
            m.insert("consumer_wait_ns".into(), json!(counts.consumer_wait_ns));
            let bytes = self.cuda.as_ref().map_or(0, |r| r.len());
            m.insert("cuda_registered".into(), json!(bytes));
            if let (Some(note), Some(Value::Array(notes))) = (&self.cuda_note, m.get_mut("notes")) {
                notes.push(json!(note));
            }
            let mut node = serde_json::to_value(&node).unwrap_or(json!({}));
            if let Some(n) = node.as_object_mut() {
                n.insert("socket".into(), json!(self.link.socket));
            }
            m.insert("node".into(), node);
        }
        Ok((stats.to_string(), counts))
    }

    /// The arena as this process maps it: the read-only descriptor of its
    /// memory file, the mapping's first byte, its length.
    pub fn arena(&self) -> (i32, *const u8, usize) {
        (
            self.arena_fd.as_raw_fd(),
            self.link.arena.as_ptr(),
            self.link.arena.len(),
        )
    }

    /// Detaches: the engine closes this consumer's loader. Batches taken stay
    /// valid until dropped (the engine keeps taking their releases). Threads
    /// waiting in `next` return `Closed`.
    pub fn close(&self) {
        // SeqCst: see `take` — the engine frees the batches whose records
        // this consumer had not read when it saw the close.
        if self.link.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // SAFETY: shuts down a socket this value owns; the descriptor stays
        // open (and unique) until the value drops.
        unsafe { libc::shutdown(self.conn.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl Drop for NodeLoader {
    fn drop(&mut self) {
        self.close();
    }
}

/// A batch from the node engine, in this process's memory with pointers into
/// its mapping of the arena. Dropping it releases it to the engine.
#[derive(Debug)]
pub struct NodeBatch {
    d: Decoded,
    link: Arc<Link>,
    /// Its key went to another process ([`NodeBatch::ship`]).
    shipped: AtomicBool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Link")
    }
}

impl NodeBatch {
    pub fn epoch(&self) -> u64 {
        self.d.epoch
    }
    pub fn index(&self) -> u64 {
        self.d.index
    }
    pub fn bytes(&self) -> u64 {
        self.d.bytes
    }
    pub fn len(&self) -> usize {
        self.d.samples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.d.samples.is_empty()
    }
    pub fn raw_samples(&self) -> &[RawSample] {
        &self.d.samples
    }
    pub fn raw_fields(&self) -> &[RawField] {
        &self.d.fields
    }

    /// The batch's key (`proto::Key`, as text): what another process shows
    /// the engine to keep the batch for itself (`holder::claim`).
    pub fn key(&self) -> String {
        Key {
            socket: self.link.socket.clone(),
            engine: self.link.engine,
            batch: self.d.id,
            cap: Cap(self.d.cap),
        }
        .to_text()
    }

    /// The key, for a batch handed to another process: once this consumer
    /// releases it, the engine keeps it in transit until a receiver keeps
    /// it (or this process exits), instead of freeing it.
    pub fn ship(&self) -> String {
        self.shipped.store(true, Ordering::Release);
        self.key()
    }

    /// The shard index of sample `i` (`NO_SOURCE` for a placeholder).
    pub fn source_index(&self, i: usize) -> Option<u32> {
        self.d.sources.get(i).copied()
    }

    /// The name of the shard sample `i` came from, for the engine to give
    /// (`None`: no such sample).
    pub fn source(&self, i: usize) -> Option<ShardName> {
        Some(ShardName {
            link: Arc::clone(&self.link),
            index: self.source_index(i)?,
        })
    }
}

impl Drop for NodeBatch {
    fn drop(&mut self) {
        let shipped = if self.shipped.load(Ordering::Acquire) {
            SHIPPED
        } else {
            0
        };
        self.link.release(self.d.id | shipped);
    }
}
