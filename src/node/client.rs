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
//! release ring. The mapping lives as long as any batch of it, so batches
//! stay valid after `close` or the engine's exit.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapOptions};
use serde_json::{Map, Value, json};

use super::shm::Rings;
use super::sock;
use super::wire::{self, Decoded, Record};
use crate::config::Toggle;
use crate::engine::Counts;
use crate::error::{Error, Result};
use crate::memory::{NO_SOURCE, RawField, RawSample, cuda};

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
    /// The engine's socket and this consumer's session there: with a
    /// batch's number, the batch's key (`NodeBatch::key`).
    socket: PathBuf,
    session: u64,
}

impl Link {
    fn release(&self, id: u64) {
        let _g = lock(&self.releasing);
        for _ in 0..1000 {
            if self.gone.load(Ordering::Acquire) {
                return;
            }
            if self.rings.push_release(id) {
                sock::notify(&self.wake);
                return;
            }
            // The engine is behind on releases: nudge it and give it time.
            sock::notify(&self.wake);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// What `next` returns when it does not fail.
#[derive(Debug)]
pub enum NodeNext {
    Batch(NodeBatch),
    EndOfEpoch(u64),
    Timeout,
    Finished,
}

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
    /// One request on the socket at a time.
    asking: Mutex<()>,
    link: Arc<Link>,
    ready: OwnedFd,
    taking: Mutex<Taking>,
    closed: AtomicBool,
    wait_ns: AtomicU64,
    /// The read-only descriptor of the arena's memory file.
    arena_fd: File,
    socket: PathBuf,
    pid: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NodeLoader {
    /// Attaches to the engine at `socket` with the consumer's configuration
    /// (its JSON keys).
    pub fn attach(
        socket: &Path,
        config: &Map<String, Value>,
        cuda_register: Toggle,
    ) -> Result<NodeLoader> {
        let conn = sock::connect(socket).map_err(|e| {
            Error::Node(format!(
                "cannot connect to `{}`: {e} (is `ringfeed node` running there?)",
                socket.display()
            ))
        })?;
        let hello = json!({"version": env!("CARGO_PKG_VERSION"), "config": config});
        sock::send(&conn, hello.to_string().as_bytes(), &[])
            .map_err(|e| Error::Node(format!("attach request: {e}")))?;
        let (msg, fds) = sock::recv(&conn)
            .map_err(|e| Error::Node(format!("attach reply: {e}")))?
            .ok_or_else(|| Error::Node("the engine closed the connection at attach".into()))?;
        let reply: Value = serde_json::from_slice(&msg)
            .map_err(|e| Error::Node(format!("attach reply is not JSON: {e}")))?;
        if let Some(e) = reply.get("error") {
            let status = e.get("status").and_then(Value::as_i64).unwrap_or(0) as i32;
            let message = e.get("message").and_then(Value::as_str).unwrap_or("");
            return Err(Error::Remote {
                status,
                message: message.to_string(),
            });
        }
        let ok = reply.get("ok").cloned().unwrap_or(Value::Null);
        let [arena_fd, rings_fd, ready, wake]: [OwnedFd; 4] = fds
            .try_into()
            .map_err(|_| Error::Node("the attach reply lacks its descriptors".into()))?;
        let arena_len = ok.get("arena_len").and_then(Value::as_u64).unwrap_or(0) as usize;
        let arena_fd = File::from(arena_fd);
        let have = arena_fd.metadata().map(|m| m.len()).unwrap_or(0);
        if arena_len == 0 || (arena_len as u64) > have {
            return Err(Error::Node(format!(
                "the arena is {have} bytes, the engine says {arena_len}"
            )));
        }
        // SAFETY: the engine's memory file is mapped read-only and shared;
        // its length never changes; its bytes are read only through batches
        // the engine handed over and has not taken back.
        let arena = unsafe { MmapOptions::new().len(arena_len).map(&arena_fd) }
            .map_err(|e| Error::Node(format!("mapping the arena: {e}")))?;
        let rings = Rings::attach(&File::from(rings_fd)).map_err(Error::Node)?;
        let (mut cuda, mut cuda_note) = (None, None);
        let registered_len = ok
            .get("budget_len")
            .and_then(Value::as_u64)
            .map_or(arena_len, |b| (b as usize).min(arena_len));
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
        Ok(NodeLoader {
            cuda,
            cuda_note,
            conn,
            asking: Mutex::new(()),
            link: Arc::new(Link {
                rings,
                wake,
                releasing: Mutex::new(()),
                arena,
                gone: AtomicBool::new(false),
                socket: socket.to_path_buf(),
                session: ok.get("session").and_then(Value::as_u64).unwrap_or(0),
            }),
            ready,
            taking: Mutex::new(Taking {
                buf: Vec::new(),
                state: ok.get("state").and_then(Value::as_str).unwrap_or("").into(),
                failure: None,
                finished: false,
            }),
            closed: AtomicBool::new(false),
            wait_ns: AtomicU64::new(0),
            arena_fd,
            socket: socket.to_path_buf(),
            pid: ok.get("pid").and_then(Value::as_u64).unwrap_or(0),
        })
    }

    fn gone(&self) -> Error {
        if self.closed.load(Ordering::Acquire) {
            return Error::Closed;
        }
        Error::Node(format!(
            "the engine at `{}` (process {}) exited or closed the connection",
            self.socket.display(),
            self.pid
        ))
    }

    /// The next batch, end of epoch, or time-out (`None`: wait for ever).
    pub fn next(&self, timeout: Option<Duration>) -> Result<NodeNext> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let t0 = Instant::now();
        let deadline = timeout.map(|t| t0 + t);
        let mut t = lock(&self.taking);
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
                    Some(wire::decode(&buf, base, link.arena.len()))
                }
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            };
            t.buf = buf;
            match rec {
                Some(Ok(Record::Batch(d))) => {
                    t.state = d.state.clone();
                    return Ok(NodeNext::Batch(NodeBatch {
                        d,
                        link: link.clone(),
                    }));
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
                    t.failure = Some(Error::Node(format!("a broken record from the engine: {e}")));
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
                        .map_err(|e| Error::Node(format!("waiting for the engine: {e}")))?;
                    if ready[0].readable {
                        sock::drain(&self.ready);
                    } else if ready[1].hangup {
                        if self.closed.load(Ordering::Acquire) {
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
        lock(&self.taking).state.clone()
    }

    fn ask(&self, req: Value) -> Result<Value> {
        let _g = lock(&self.asking);
        sock::send(&self.conn, req.to_string().as_bytes(), &[]).map_err(|_| self.gone())?;
        let (msg, _) = sock::recv(&self.conn)
            .map_err(|_| self.gone())?
            .ok_or_else(|| self.gone())?;
        serde_json::from_slice(&msg).map_err(|e| Error::Node(format!("a reply is not JSON: {e}")))
    }

    /// The engine's stats of this consumer's loader (JSON, with `node`
    /// added) and its counters; the consumer's own wait replaces the
    /// engine's.
    pub fn stats(&self) -> Result<(String, Counts)> {
        let reply = self.ask(json!({"stats": true}))?;
        let mut counts = Counts::default();
        let hex = reply.get("counts").and_then(Value::as_str).unwrap_or("");
        let size = std::mem::size_of::<Counts>();
        if hex.len() != size * 2 {
            return Err(Error::Node("the engine's stats have another layout".into()));
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
        let mut stats = reply.get("stats").cloned().unwrap_or(Value::Null);
        if let Some(m) = stats.as_object_mut() {
            m.insert("consumer_wait_ns".into(), json!(counts.consumer_wait_ns));
            let bytes = self.cuda.as_ref().map_or(0, |r| r.len());
            m.insert("cuda_registered".into(), json!(bytes));
            if let (Some(note), Some(Value::Array(notes))) = (&self.cuda_note, m.get_mut("notes")) {
                notes.push(json!(note));
            }
            let mut node = reply.get("node").cloned().unwrap_or(json!({}));
            if let Some(n) = node.as_object_mut() {
                n.insert("socket".into(), json!(self.socket));
            }
            m.insert("node".into(), node);
        }
        Ok((stats.to_string(), counts))
    }

    /// The name of shard `index` of the dataset.
    pub fn shard_name(&self, index: u32) -> Result<Option<String>> {
        if index == NO_SOURCE {
            return Ok(None);
        }
        let reply = self.ask(json!({"source": index}))?;
        Ok(reply
            .get("source")
            .and_then(Value::as_str)
            .map(str::to_string))
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
    /// valid until dropped. Threads waiting in `next` return `Closed`.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: shuts down a socket this value owns; the descriptor stays
        // open (and unique) until the value drops.
        unsafe { libc::shutdown(self.conn.as_raw_fd(), libc::SHUT_RDWR) };
        self.link.gone.store(true, Ordering::Release);
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
    /// The batch's key for [`keep`] and [`release`]: the engine's socket,
    /// this consumer's session, the batch's number (JSON).
    pub fn key(&self) -> String {
        json!({"socket": self.link.socket, "session": self.link.session, "id": self.d.id})
            .to_string()
    }

    /// The shard index of sample `i` (`NO_SOURCE` for a placeholder).
    pub fn source_index(&self, i: usize) -> Option<u32> {
        self.d.sources.get(i).copied()
    }
}

impl Drop for NodeBatch {
    fn drop(&mut self) {
        self.link.release(self.d.id);
    }
}

/// How long a one-off request waits for the engine's reply.
const ONE_OFF_WAIT: Duration = Duration::from_secs(10);

/// Sends one request about the batch of `key` on a connection of its own.
fn one_off(key: &str, op: &str, extra: Option<(&str, Value)>) -> Result<Value> {
    let k: Value = serde_json::from_str(key).map_err(|e| {
        Error::Node(format!(
            "not a batch key (from ringfeed_batch_node_key): {e}"
        ))
    })?;
    let (Some(socket), Some(session), Some(id)) = (
        k.get("socket").and_then(Value::as_str),
        k.get("session").and_then(Value::as_u64),
        k.get("id").and_then(Value::as_u64),
    ) else {
        return Err(Error::Node(
            "not a batch key: it needs `socket`, `session` and `id` (from ringfeed_batch_node_key)"
                .into(),
        ));
    };
    let conn = sock::connect(Path::new(socket)).map_err(|e| {
        Error::Node(format!(
            "cannot reach the node engine at `{socket}` to {op} a batch: {e}"
        ))
    })?;
    let mut body = json!({"session": session, "id": id});
    if let Some((k, v)) = extra {
        body[k] = v;
    }
    let req = json!({"version": env!("CARGO_PKG_VERSION"), op: body});
    sock::send(&conn, req.to_string().as_bytes(), &[])
        .map_err(|e| Error::Node(format!("{op} request: {e}")))?;
    let ready = sock::poll(&[(&conn, true)], Some(ONE_OFF_WAIT))
        .map_err(|e| Error::Node(format!("{op} request: {e}")))?;
    if !ready[0].readable {
        return Err(Error::Node(format!(
            "the node engine at `{socket}` did not answer a {op} request in {} s",
            ONE_OFF_WAIT.as_secs()
        )));
    }
    let (msg, _) = sock::recv(&conn)
        .map_err(|e| Error::Node(format!("{op} reply: {e}")))?
        .ok_or_else(|| Error::Node(format!("the node engine closed the connection at {op}")))?;
    let reply: Value = serde_json::from_slice(&msg)
        .map_err(|e| Error::Node(format!("{op} reply is not JSON: {e}")))?;
    if let Some(e) = reply.get("error") {
        return Err(Error::Remote {
            status: e.get("status").and_then(Value::as_i64).unwrap_or(0) as i32,
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
        });
    }
    Ok(reply.get("ok").cloned().unwrap_or(Value::Null))
}

/// Asks the engine to keep the batch of `key` for process `pid` after its
/// consumer lets go of it or leaves: until `release(key)` or `pid`'s exit.
/// The batch must still be held by its consumer (or kept already).
pub fn keep(key: &str, pid: i32) -> Result<()> {
    one_off(key, "keep", Some(("for", json!(pid)))).map(|_| ())
}

/// Frees a batch kept by [`keep`]. Returns false when it was not kept
/// (released already, or never kept).
pub fn release(key: &str) -> Result<bool> {
    let ok = one_off(key, "release", None)?;
    Ok(ok.get("released").and_then(Value::as_bool).unwrap_or(false))
}
