//! This process as a holder of a node engine's batches it did not read
//! itself: the main process of a DataLoader keeps what its workers shipped
//! (`NodeBatch::ship`), by the batches' keys.
//!
//! One link per engine and process ([`HolderLink`]), made at the first key
//! of that engine: a connection (checked like a consumer's) on which each
//! keep is a request and its answer — so a batch is known kept before any
//! of its bytes is read — the arena's memory file mapped read-only, and a
//! release ring. A release is one entry in the ring and a wake-up, never a
//! wait. What this process keeps is freed when it releases it or exits:
//! the engine follows the process (a pidfd), not the link.
//!
//! After `fork` the child makes its own link: the parent's is left alone
//! (its mapping and descriptors are not the child's to close, and its keeps
//! are the parent's).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use memmap2::{Mmap, MmapOptions};

use super::proto::{self, EngineId, Key, Reply, Request, Role};
use super::shm::Rings;
use super::sock;
use crate::error::{Error, NodeFailure, Result};
use crate::sync::Locked;

fn node(msg: impl Into<String>) -> Error {
    Error::node(NodeFailure::Protocol, msg)
}

/// This process's link to one engine.
pub struct HolderLink {
    socket: PathBuf,
    engine: EngineId,
    /// The process that made it (a forked child makes its own).
    pid: u32,
    /// The connection and the buffer its replies are received into; one
    /// request at a time.
    conn: Mutex<(OwnedFd, Vec<u8>)>,
    rings: Rings,
    wake: OwnedFd,
    arena: Mmap,
    _arena_fd: File,
    /// Keeps of each batch not yet released, by batch number.
    kept: Mutex<HashMap<u64, u32>>,
}

/// The links of this process (and, after a fork, the parent's, untouched).
static LINKS: Mutex<Vec<Arc<HolderLink>>> = Mutex::new(Vec::new());

impl HolderLink {
    fn open(socket: &Path) -> Result<HolderLink> {
        let conn = sock::connect_checked(socket).map_err(|e| {
            node(format!(
                "cannot reach the node engine at `{}` to keep a batch: {e}",
                socket.display()
            ))
        })?;
        sock::send(&conn, &proto::encode(&Request::hello(Role::Holder)), &[])
            .map_err(|e| node(format!("link request: {e}")))?;
        let mut buf = Vec::new();
        let fds = sock::recv(&conn, &mut buf)
            .map_err(|e| node(format!("link reply: {e}")))?
            .ok_or_else(|| node("the engine closed the connection at link"))?;
        let (engine, arena_len) = match proto::decode::<Reply>(&buf, "the link reply") {
            Ok(Reply::Linked {
                engine, arena_len, ..
            }) => (engine, arena_len as usize),
            Ok(Reply::Refused { status, message }) => {
                return Err(Error::Remote { status, message });
            }
            Ok(other) => return Err(node(format!("the engine answered a link with {other:?}"))),
            Err(e) => return Err(node(e.0)),
        };
        let [arena_fd, rings_fd, wake]: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| node("the link reply lacks its descriptors"))?;
        let arena_fd = File::from(arena_fd);
        let have = arena_fd.metadata().map(|m| m.len()).unwrap_or(0);
        if arena_len == 0 || arena_len as u64 > have {
            return Err(node(format!(
                "the arena is {have} bytes, the engine says {arena_len}"
            )));
        }
        // SAFETY: the engine's memory file, mapped read-only and shared; it
        // is sealed against resizing, and its bytes are read only through
        // batches this process kept.
        let arena = unsafe {
            MmapOptions::new()
                .len(arena_len)
                // A hugetlb arena is reserved only for its budget
                // (`Arena::new_backed`): no reservation asked here either.
                .no_reserve_swap()
                .map(&arena_fd)
        }
        .map_err(|e| node(format!("mapping the arena: {e}")))?;
        // The engine's arena stays out of this process's core dumps too.
        if let Err(e) = arena.advise(memmap2::Advice::DontDump) {
            crate::log::once("node-arena-dontdump", crate::log::Level::Warn, || {
                format!("madvise(MADV_DONTDUMP) of the node engine's arena refused ({e})")
            });
        }
        let rings = Rings::attach(&File::from(rings_fd))
            .map_err(|e| Error::node(NodeFailure::Protocol, e))?;
        Ok(HolderLink {
            socket: socket.to_path_buf(),
            engine,
            pid: std::process::id(),
            conn: Mutex::new((conn, buf)),
            rings,
            wake,
            arena,
            _arena_fd: arena_fd,
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// The link of this process to engine `engine` at `socket`, made if
    /// none is; an error when the engine there now is another one (the
    /// key's engine is gone, and its batches with it).
    fn to(socket: &Path, engine: EngineId) -> Result<Arc<HolderLink>> {
        let me = std::process::id();
        let mut links = LINKS.locked();
        let mine = |l: &&Arc<HolderLink>| l.pid == me && l.socket == socket;
        if let Some(l) = links.iter().find(|l| mine(l) && l.engine == engine) {
            return Ok(l.clone());
        }
        // Links of this process to engines gone from the socket go (their
        // batches went with their engine).
        links.retain(|l| !(l.pid == me && l.socket == socket && l.hung_up()));
        let l = match links.iter().find(mine) {
            Some(l) => l.clone(),
            None => {
                let l = Arc::new(HolderLink::open(socket)?);
                links.push(l.clone());
                l
            }
        };
        if l.engine != engine {
            return Err(node(format!(
                "the key is of engine {engine}, not of the one at `{}` now ({}): an earlier \
                 engine's batches are gone with it",
                socket.display(),
                l.engine
            )));
        }
        Ok(l)
    }

    /// Whether the engine closed this link (it exited).
    fn hung_up(&self) -> bool {
        let c = self.conn.locked();
        sock::poll(&[(&c.0, false)], Some(std::time::Duration::ZERO)).map_or(true, |r| r[0].hangup)
    }

    fn ask(&self, req: &Request) -> Result<Reply> {
        let mut c = self.conn.locked();
        let (conn, buf) = &mut *c;
        let gone = |e: std::io::Error| {
            node(format!(
                "the node engine at `{}` is gone ({e}): its batches are freed",
                self.socket.display()
            ))
        };
        sock::send(conn, &proto::encode(req), &[]).map_err(gone)?;
        sock::recv(conn, buf)
            .map_err(gone)?
            .ok_or_else(|| gone(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)))?;
        proto::decode(buf, "a reply").map_err(|e| node(e.0))
    }

    /// Keeps the batch of `key` for this process.
    fn claim(&self, key: &Key) -> Result<()> {
        match self.ask(&Request::Claim {
            engine: key.engine,
            batch: key.batch,
            cap: key.cap,
        })? {
            Reply::Claimed => {
                *self.kept.locked().entry(key.batch).or_insert(0) += 1;
                Ok(())
            }
            Reply::Refused { status, message } => Err(Error::Remote { status, message }),
            other => Err(node(format!("the engine answered a keep with {other:?}"))),
        }
    }

    /// Releases one keep of the batch of `key`.
    fn release(&self, key: &Key) -> Result<()> {
        {
            let mut kept = self.kept.locked();
            match kept.get_mut(&key.batch) {
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        kept.remove(&key.batch);
                    }
                }
                _ => {
                    return Err(node(format!(
                        "process {} keeps no batch {} of the engine at `{}`",
                        self.pid,
                        key.batch,
                        self.socket.display()
                    )));
                }
            }
        }
        // The ring is drained at each wake-up; a ring full for long is an
        // engine gone (and its batches with it).
        for _ in 0..200 {
            if self.rings.push_release(key.batch) {
                sock::notify(&self.wake);
                return Ok(());
            }
            sock::notify(&self.wake);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }
}

/// Keeps the batch of `key` (from `NodeBatch::ship` or `NodeBatch::key`)
/// for this process until [`release`] or its exit, and returns where this
/// process maps the engine's arena (its first byte and length): the
/// batch's bytes are at the offsets they have in the arena.
pub fn claim(key: &str) -> Result<(*const u8, usize)> {
    let key = Key::parse(key).map_err(|e| Error::node(NodeFailure::Protocol, e))?;
    let link = HolderLink::to(&key.socket, key.engine)?;
    link.claim(&key)?;
    Ok((link.arena.as_ptr(), link.arena.len()))
}

/// [`claim`], for a process that maps the arena itself. `pid` must be this
/// process's (or 0): a batch is kept by the process that reads it, never on
/// another's behalf.
pub fn keep(key: &str, pid: i32) -> Result<()> {
    let me = std::process::id() as i32;
    if pid != 0 && pid != me {
        return Err(node(format!(
            "process {me} asked to keep a batch for process {pid}: a batch is kept by the \
             process that reads it (which calls ringfeed_node_keep itself)"
        )));
    }
    claim(key).map(|_| ())
}

/// Releases one keep of the batch of `key` by this process; refused by name
/// when this process keeps no such batch.
pub fn release(key: &str) -> Result<()> {
    let key = Key::parse(key).map_err(|e| Error::node(NodeFailure::Protocol, e))?;
    let me = std::process::id();
    let link = LINKS
        .locked()
        .iter()
        .find(|l| l.pid == me && l.socket == key.socket && l.engine == key.engine)
        .cloned();
    match link {
        Some(l) => l.release(&key),
        None => Err(node(format!(
            "process {me} keeps no batch {} of the engine at `{}`",
            key.batch,
            key.socket.display()
        ))),
    }
}
