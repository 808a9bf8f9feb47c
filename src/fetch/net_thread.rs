//! Network threads: ranged HTTP reads for several workers driven by one
//! io_uring on a thread of its own.
//!
//! A worker is a plan stream (it fixes the sample order), so how many there
//! are cannot follow the machine; where the bytes are received can. The
//! kernel's copy from the socket into the arena is most of what a network
//! read costs, and it runs on the thread that reaps the ring: with 4 workers
//! on 2 CPUs each receiving its own ranges, that copy was spread over 4
//! threads taking turns on 2 CPUs and cost more per GB than one thread
//! receiving the same ranges (docs/decisions.md, "Network threads receive
//! for the workers"). Here the workers hand their HTTP reads to a network
//! thread and get the completions back; they parse, it receives. How many
//! network threads run is placement (`net_threads`), like pinning: it never
//! changes the order.
//!
//! The hand-off is two eventfds and two mutexes per read, nothing per byte:
//! - worker → network thread: the read goes into the link's queue and the
//!   link's eventfd is written; the network thread keeps a read of that
//!   eventfd on its ring, so it wakes for new reads and for completions
//!   alike;
//! - network thread → worker: the completion goes into the worker's inbox and
//!   the inbox's eventfd is written; the worker keeps a read of it on its own
//!   ring (see `uring.rs`), so its `wait` wakes for local and remote
//!   completions alike.
//!
//! A link that is stopped finishes the reads it has, then its thread exits;
//! a read handed to a link whose thread is gone (stopped, or it panicked)
//! fails at once, so no worker ever waits on a thread that is not there.
//!
//! A node engine's threads read local files too ([`NetLink::hand_file`]):
//! there every consumer's streams hand all their reads to the engine's one
//! set of I/O threads, and parse what comes back.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use io_uring::{opcode, types};

use super::direct::KernelRead;
use super::fixed::FixedBuffers;
use super::ring::new_ring;
use super::uring_http::{HttpDriver, TAG};
use super::{Completion, NetOptions, ReadFail, ReadRequest, Target};
use crate::error::{Error, Fault};
use crate::net::object::HttpObject;
use crate::sync::Locked;

/// The `user_data` of the network thread's read of its link's eventfd.
const WAKE: u64 = 1;

/// The bit of a file read's `user_data` (the thread's read number below it;
/// HTTP steps carry `TAG`, the top bit).
const FILE: u64 = 1 << 62;

/// An eventfd, made non-blocking so a write never blocks (the counter would
/// have to reach 2^64 - 2 first).
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain eventfd(2) call.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter, waking whoever waits on it.
fn poke(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64. The only failure on a
    // non-blocking eventfd is EAGAIN at a counter near 2^64, when the reader
    // has a wake-up pending anyway.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Where a worker's completions from a network thread arrive.
pub struct Inbox {
    done: Mutex<Vec<Completion>>,
    wake: OwnedFd,
}

impl Inbox {
    pub fn new() -> io::Result<Arc<Inbox>> {
        Ok(Arc::new(Inbox {
            done: Mutex::new(Vec::new()),
            wake: eventfd()?,
        }))
    }

    /// The eventfd written when completions arrive.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Moves the completions that arrived into `out`; returns how many.
    pub fn take(&self, out: &mut Vec<Completion>) -> usize {
        let mut d = self.done.locked();
        let n = d.len();
        out.append(&mut d);
        n
    }

    fn deliver(&self, c: Completion) {
        self.done.locked().push(c);
        poke(self.fd());
    }
}

/// A read handed to a network thread: of an HTTP object, or (`obj` is
/// `None`) of the local file `req.target` names.
struct Handed {
    req: ReadRequest,
    obj: Option<Arc<HttpObject>>,
    inbox: Arc<Inbox>,
}

// SAFETY: `ReadRequest` holds the raw pointer of its destination, which the
// worker that handed it over leaves untouched until the completion comes
// back (the contract of `Reader::submit`); the network thread is the only
// one writing there meanwhile.
unsafe impl Send for Handed {}

struct LinkState {
    queue: Vec<Handed>,
    stop: bool,
    /// Set when the thread has left its loop: why no read can be handed
    /// over any more.
    gone: Option<String>,
}

/// The way to one network thread, shared by the workers it serves.
pub struct NetLink {
    state: Mutex<LinkState>,
    wake: OwnedFd,
    /// Chunks the thread registers with its ring once they are ready: its
    /// file reads into them are `READ_FIXED` (a node engine's budget).
    fixed: Option<Arc<FixedBuffers>>,
}

impl NetLink {
    pub fn new() -> io::Result<Arc<NetLink>> {
        NetLink::with_fixed(None)
    }

    /// A link whose thread registers `fixed` with its ring once they are
    /// ready, and reads files into them with `READ_FIXED` from then on.
    pub fn with_fixed(fixed: Option<Arc<FixedBuffers>>) -> io::Result<Arc<NetLink>> {
        Ok(Arc::new(NetLink {
            state: Mutex::new(LinkState {
                queue: Vec::new(),
                stop: false,
                gone: None,
            }),
            wake: eventfd()?,
            fixed,
        }))
    }

    /// Hands a read to the thread. When the thread is gone, the read fails
    /// at once (its completion is in the inbox).
    pub fn hand(&self, req: ReadRequest, obj: Arc<HttpObject>, inbox: &Arc<Inbox>) {
        self.hand_any(req, Some(obj), inbox);
    }

    /// Hands a read of a local file (`req.target` is `Target::File`), under
    /// the same contract as [`crate::fetch::Reader::submit`]: its buffer and
    /// descriptor stay valid until its completion is in the inbox.
    pub fn hand_file(&self, req: ReadRequest, inbox: &Arc<Inbox>) {
        self.hand_any(req, None, inbox);
    }

    fn hand_any(&self, req: ReadRequest, obj: Option<Arc<HttpObject>>, inbox: &Arc<Inbox>) {
        let mut s = self.state.locked();
        if let Some(why) = &s.gone {
            let c = failed(req.id, obj.as_deref(), why);
            drop(s);
            inbox.deliver(c);
            return;
        }
        s.queue.push(Handed {
            req,
            obj,
            inbox: Arc::clone(inbox),
        });
        drop(s);
        poke(self.wake.as_raw_fd());
    }

    /// Asks the thread to finish the reads it has and exit.
    pub fn stop(&self) {
        self.state.locked().stop = true;
        poke(self.wake.as_raw_fd());
    }

    /// Runs the network thread until `stop` (and every read it took is
    /// done). `seed` seeds the retry jitter.
    pub fn run(&self, net: NetOptions, seed: u64, entries: u32) {
        let mut owners: HashMap<u64, (u64, Arc<Inbox>)> = HashMap::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.serve(net, seed, entries, &mut owners)
        }));
        let why = match result {
            Ok(Ok(())) => "the loader is closing".to_string(),
            Ok(Err(e)) => format!("the network thread's io_uring failed: {e}"),
            Err(p) => format!(
                "the network thread panicked: {}",
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            ),
        };
        // Whatever is left fails, so no worker waits on this thread.
        let queued = {
            let mut s = self.state.locked();
            s.gone = Some(why.clone());
            std::mem::take(&mut s.queue)
        };
        for h in queued {
            h.inbox.deliver(failed(h.req.id, h.obj.as_deref(), &why));
        }
        for (_, (id, inbox)) in owners {
            inbox.deliver(Completion {
                id,
                result: Err(ReadFail::Net(Error::internal(Fault::Thread, why.clone()))),
                copied: 0,
                total: None,
                timing: None,
            });
        }
    }

    fn serve(
        &self,
        net: NetOptions,
        seed: u64,
        entries: u32,
        owners: &mut HashMap<u64, (u64, Arc<Inbox>)>,
    ) -> io::Result<()> {
        // Declared before the ring: the kernel may write here until the ring
        // is gone, and locals drop in reverse order.
        let mut counter = Box::new(0u64);
        let (mut ring, _) = new_ring(entries)?;
        let mut http = HttpDriver::new(net, seed);
        let mut next_id = 0u64;
        let mut armed = false;
        let mut stopping = false;
        let mut cqes: Vec<(u64, i32)> = Vec::new();
        // File reads widened to whole blocks (direct files), by read number.
        let mut widened: HashMap<u64, KernelRead> = HashMap::new();
        // The fixed buffers registered (the first ones), and those still to
        // register once ready.
        let mut registered = 0u32;
        let mut to_register = self.fixed.clone();
        loop {
            if let Some(f) = to_register.take_if(|f| f.is_ready()) {
                registered = f.register(&ring);
            }
            if !armed {
                let e = opcode::Read::new(
                    types::Fd(self.wake.as_raw_fd()),
                    (&mut *counter as *mut u64).cast(),
                    8,
                )
                .build()
                .user_data(WAKE);
                // SAFETY: `counter` outlives the ring (see above).
                while unsafe { ring.submission().push(&e) }.is_err() {
                    ring.submit()?;
                }
                armed = true;
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            // Taken off the ring first: completing a step pushes new
            // entries. One buffer for the thread's life.
            cqes.clear();
            cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            let mut woken = false;
            for &(ud, res) in &cqes {
                if ud == WAKE {
                    armed = false;
                    woken = true;
                    continue;
                }
                if ud & TAG != 0 {
                    if let Some(c) = http.complete(&mut ring, ud, res) {
                        route(owners, c);
                    }
                    continue;
                }
                if ud & FILE != 0 {
                    let id = ud & !FILE;
                    let result = match (res, widened.remove(&id)) {
                        (r, _) if r < 0 => Err(ReadFail::Io(io::Error::from_raw_os_error(-r))),
                        (r, Some(k)) => Ok(k.delivered(r as usize)),
                        (r, None) => Ok(r as usize),
                    };
                    route(
                        owners,
                        Completion {
                            id,
                            result,
                            copied: 0,
                            total: None,
                            timing: None,
                        },
                    );
                }
            }
            if woken {
                let (queue, stop) = {
                    let mut s = self.state.locked();
                    (std::mem::take(&mut s.queue), s.stop)
                };
                stopping |= stop;
                for h in queue {
                    next_id += 1;
                    owners.insert(next_id, (h.req.id, h.inbox));
                    let req = ReadRequest {
                        id: next_id,
                        ..h.req
                    };
                    let c = match h.obj {
                        Some(obj) => http.start(&mut ring, &req, obj),
                        None => start_file(&mut ring, &req, registered, &mut widened)?,
                    };
                    if let Some(c) = c {
                        route(owners, c);
                    }
                }
            }
            // Reads handed over after the last wake-up have poked the
            // eventfd again: the loop comes back for them before leaving.
            // The losers of hedged ranges are awaited too: their buffers
            // are the driver's until their cancels complete.
            if stopping
                && owners.is_empty()
                && http.in_flight() == 0
                && self.state.locked().queue.is_empty()
            {
                return Ok(());
            }
        }
    }
}

/// Sends a finished read back to the worker that handed it over, under the
/// worker's own id.
fn route(owners: &mut HashMap<u64, (u64, Arc<Inbox>)>, mut c: Completion) {
    if let Some((id, inbox)) = owners.remove(&c.id) {
        c.id = id;
        inbox.deliver(c);
    }
}

/// Puts a file read on the ring (widened to whole blocks for a direct
/// file; `READ_FIXED` into a chunk among the first `registered`); a read
/// that cannot be made is its completion, failed.
fn start_file(
    ring: &mut io_uring::IoUring,
    req: &ReadRequest,
    registered: u32,
    widened: &mut HashMap<u64, KernelRead>,
) -> io::Result<Option<Completion>> {
    let Target::File(file) = &req.target else {
        return Ok(Some(Completion {
            id: req.id,
            result: Err(ReadFail::Io(io::Error::other("not a file read"))),
            copied: 0,
            total: None,
            timing: None,
        }));
    };
    let k = match KernelRead::new(req.offset, req.buf, req.len, file.align) {
        Ok(k) => k,
        Err(e) => {
            return Ok(Some(Completion {
                id: req.id,
                result: Err(ReadFail::Io(e)),
                copied: 0,
                total: None,
                timing: None,
            }));
        }
    };
    let Ok(len) = u32::try_from(k.len) else {
        return Ok(Some(Completion {
            id: req.id,
            result: Err(ReadFail::Io(io::Error::from(io::ErrorKind::InvalidInput))),
            copied: 0,
            total: None,
            timing: None,
        }));
    };
    let fd = types::Fd(file.fd);
    let entry = if req.buf_index < registered {
        // A widened read stays inside its chunk (`Reader::submit`), so
        // inside the fixed buffer `buf_index`.
        opcode::ReadFixed::new(fd, k.buf, len, req.buf_index as u16)
            .offset(k.offset)
            .build()
    } else {
        opcode::Read::new(fd, k.buf, len).offset(k.offset).build()
    }
    .user_data(FILE | req.id);
    if k.widened() {
        widened.insert(req.id, k);
    }
    // SAFETY: the worker that handed the read keeps its buffer and
    // descriptor valid until the completion is in its inbox
    // (`NetLink::hand_file`).
    while unsafe { ring.submission().push(&entry) }.is_err() {
        ring.submit()?;
    }
    Ok(None)
}

fn failed(id: u64, obj: Option<&HttpObject>, why: &str) -> Completion {
    let what = obj.map_or("a file read".to_string(), |o| o.url.clone());
    Completion {
        id,
        result: Err(ReadFail::Net(Error::internal(
            Fault::Thread,
            format!("{what}: no I/O thread to read it: {why}"),
        ))),
        copied: 0,
        total: None,
        timing: None,
    }
}

#[cfg(test)]
mod tests;
