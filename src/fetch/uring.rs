//! The io_uring backend: one ring per worker thread, created on that thread
//! (SINGLE_ISSUER, DEFER_TASKRUN where the kernel has them), many reads in
//! flight, `READ_FIXED` into the arena's chunks when they are registered.
//! Reads of direct files go to the kernel widened to whole blocks
//! (`direct::KernelRead`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, opcode, types};

use super::direct::KernelRead;
use super::net_thread::{Inbox, NetLink};
use super::uring_http::{HttpDriver, TAG};
use super::{Completion, NetOptions, ReadFail, ReadRequest, Reader, Target};

/// How a ring was set up, for the stats.
#[derive(Debug, Clone)]
pub struct UringSetup {
    /// Setup flags that the kernel accepted.
    pub flags: &'static str,
}

/// The arena's chunks as io_uring fixed buffers, shared by a loader's
/// rings. Each ring registers them once `ready` is set: when their memory is
/// in (registering pins every page, so done at open it would fault the whole
/// arena in before the first read). Reads before that are plain `READ`s.
pub struct FixedBuffers {
    iovecs: Vec<libc::iovec>,
    ready: AtomicBool,
    /// Why a ring could not register them, the first time one could not.
    refused: Mutex<Option<String>>,
}

// SAFETY: the iovecs only describe arena memory; they are read, never
// written, and the arena itself is Send + Sync.
unsafe impl Send for FixedBuffers {}
// SAFETY: as above.
unsafe impl Sync for FixedBuffers {}

impl std::fmt::Debug for FixedBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedBuffers")
            .field("buffers", &self.iovecs.len())
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl FixedBuffers {
    /// The buffers `iovecs`, not yet ready.
    ///
    /// # Safety
    /// Every buffer must stay valid while any ring that registered them
    /// lives (the arena outlives the loader's readers).
    pub unsafe fn new(iovecs: Vec<libc::iovec>) -> FixedBuffers {
        FixedBuffers {
            iovecs,
            ready: AtomicBool::new(false),
            refused: Mutex::new(None),
        }
    }

    pub fn iovecs(&self) -> &[libc::iovec] {
        &self.iovecs
    }

    /// Rings may register the buffers from now on.
    pub fn set_ready(&self) {
        // Release: pairs with the Acquire in `is_ready`; the pages were
        // populated before.
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        // Acquire: pairs with the Release in `set_ready`.
        self.ready.load(Ordering::Acquire)
    }

    /// Why a ring could not register the buffers, if one could not.
    pub fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub struct UringReader {
    ring: IoUring,
    registered: bool,
    /// Buffers to register once they are ready (and not yet registered).
    fixed: Option<Arc<FixedBuffers>>,
    /// Ranged HTTP(S) reads on this ring.
    http: HttpDriver,
    /// Completions finished during `submit` (a range that failed at once).
    ready: Vec<Completion>,
    /// Direct reads given to the kernel widened to whole blocks, by id:
    /// their completions hand back only the bytes asked (the last read of
    /// each file, so a handful at a time).
    widened: std::collections::HashMap<u64, KernelRead>,
    /// HTTP ranges go to a network thread instead of `http`.
    remote: Option<Remote>,
}

/// `user_data` of a worker ring's read of its inbox's eventfd: no TAG bit
/// (not an HTTP step) and far above the worker's read ids.
const INBOX: u64 = 1 << 62;

/// A worker's side of a network thread (`net_thread.rs`).
struct Remote {
    link: Arc<NetLink>,
    inbox: Arc<Inbox>,
    /// Reads handed over whose completions have not come back.
    out: usize,
    /// A read of the inbox's eventfd is on the ring.
    armed: bool,
    /// Where that read lands; boxed so its address stays put, and leaked
    /// if the reader goes while the read is armed (see `Drop`).
    counter: Box<u64>,
    /// File reads go to the link too.
    files: bool,
}

/// Creates a ring with `entries` slots, with the best flags the kernel takes.
pub fn new_ring(entries: u32) -> io::Result<(IoUring, UringSetup)> {
    // SINGLE_ISSUER + DEFER_TASKRUN (6.1+): completions run when this thread
    // asks for them, not as interrupts to it. Fall back to plain rings.
    if let Ok(r) = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
    {
        return Ok((
            r,
            UringSetup {
                flags: "single_issuer,defer_taskrun",
            },
        ));
    }
    if let Ok(r) = IoUring::builder().setup_coop_taskrun().build(entries) {
        return Ok((
            r,
            UringSetup {
                flags: "coop_taskrun",
            },
        ));
    }
    IoUring::new(entries).map(|r| (r, UringSetup { flags: "none" }))
}

/// Whether io_uring can be used here; the error says why not.
///
/// A ring that is set up is not yet a ring that works: a seccomp filter may
/// refuse `io_uring_enter` alone (allowing `io_uring_setup`), and then every
/// read would fail. So the probe also runs one no-op through the ring.
pub fn probe() -> io::Result<UringSetup> {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        && s.trim() == "2"
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "io_uring is disabled (/proc/sys/kernel/io_uring_disabled = 2)",
        ));
    }
    let (mut ring, setup) = new_ring(8)?;
    let nop = opcode::Nop::new().build().user_data(0);
    // SAFETY: a no-op refers to no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("a new ring's submission queue is full"))?;
    ring.submit_and_wait(1)
        .map_err(|e| io::Error::new(e.kind(), format!("io_uring_enter: {e}")))?;
    match ring.completion().next() {
        Some(c) if c.result() >= 0 => Ok(setup),
        Some(c) => Err(io::Error::from_raw_os_error(-c.result())),
        None => Err(io::Error::other("a no-op on a new ring did not complete")),
    }
}

impl UringReader {
    /// A ring for a worker; with `fixed`, it registers them as fixed
    /// buffers as soon as they are ready (at once when they already are, and
    /// then a failure is this call's error).
    pub fn new(
        entries: u32,
        fixed: Option<Arc<FixedBuffers>>,
        net: NetOptions,
        seed: u64,
    ) -> io::Result<UringReader> {
        let (ring, _) = new_ring(entries)?;
        let mut registered = false;
        if let Some(f) = fixed.as_ref().filter(|f| f.is_ready()) {
            // SAFETY: `FixedBuffers::new`'s caller keeps the buffers alive
            // while any ring that registered them lives.
            unsafe { ring.submitter().register_buffers(f.iovecs())? };
            registered = true;
        }
        Ok(UringReader {
            ring,
            registered,
            fixed: if registered { None } else { fixed },
            http: HttpDriver::new(net, seed),
            ready: Vec::new(),
            widened: Default::default(),
            remote: None,
        })
    }

    /// Hands this reader's HTTP(S) ranges to the network thread behind
    /// `link` (and its file reads too, with `files`: a node engine's one
    /// set of I/O threads); its completions come back through an inbox of
    /// its own.
    pub fn with_net_thread(mut self, link: Arc<NetLink>, files: bool) -> io::Result<UringReader> {
        self.remote = Some(Remote {
            link,
            inbox: Inbox::new()?,
            out: 0,
            armed: false,
            counter: Box::new(0),
            files,
        });
        Ok(self)
    }

    /// Puts a read of the inbox's eventfd on the ring, unless one is there.
    fn arm_inbox(&mut self) -> io::Result<()> {
        let Some(r) = self.remote.as_mut().filter(|r| !r.armed) else {
            return Ok(());
        };
        let e = opcode::Read::new(
            types::Fd(r.inbox.fd()),
            (&mut *r.counter as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(INBOX);
        // SAFETY: `counter` stays valid until the read completes, or for
        // ever if the reader goes first (`Drop`); the inbox (and so its
        // eventfd) lives as long as `remote`.
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            self.ring.submit()?;
        }
        r.armed = true;
        Ok(())
    }
}

impl Drop for UringReader {
    fn drop(&mut self) {
        // A read of the inbox's eventfd still on the ring may land in
        // `counter` until the ring is torn down: 8 bytes are left to it.
        if let Some(r) = self.remote.as_mut().filter(|r| r.armed) {
            std::mem::forget(std::mem::replace(&mut r.counter, Box::new(0)));
        }
    }
}

impl UringReader {
    /// Registers the fixed buffers once they are ready. Plain reads in
    /// flight are not affected; a refusal leaves the ring on plain reads
    /// and is kept for the stats.
    fn register_when_ready(&mut self) {
        let Some(f) = self.fixed.as_ref().filter(|f| f.is_ready()) else {
            return;
        };
        // SAFETY: `FixedBuffers::new`'s caller keeps the buffers alive while
        // any ring that registered them lives.
        match unsafe { self.ring.submitter().register_buffers(f.iovecs()) } {
            Ok(()) => self.registered = true,
            Err(e) => {
                let mut r = f.refused.lock().unwrap_or_else(|p| p.into_inner());
                r.get_or_insert_with(|| format!("register_buffers refused ({e})"));
            }
        }
        self.fixed = None;
    }
}

impl Reader for UringReader {
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()> {
        self.register_when_ready();
        let file = match &req.target {
            Target::File(_) if self.remote.as_ref().is_some_and(|r| r.files) => {
                let r = self.remote.as_mut().expect("checked above");
                r.out += 1;
                r.link.hand_file(req, &r.inbox);
                return self.arm_inbox();
            }
            Target::File(f) => *f,
            Target::Http(obj) if self.remote.is_some() => {
                let obj = Arc::clone(obj);
                let r = self.remote.as_mut().expect("checked above");
                r.out += 1;
                r.link.hand(req, obj, &r.inbox);
                return self.arm_inbox();
            }
            Target::Http(obj) => {
                let obj = std::sync::Arc::clone(obj);
                if let Some(c) = self.http.start(&mut self.ring, &req, obj) {
                    self.ready.push(c);
                }
                return Ok(());
            }
        };
        let k = KernelRead::new(req.offset, req.buf, req.len, file.align)?;
        let fd = types::Fd(file.fd);
        let len = u32::try_from(k.len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let entry = if self.registered {
            // A widened read stays inside its chunk (`Reader::submit`), so
            // inside the fixed buffer `buf_index`.
            opcode::ReadFixed::new(fd, k.buf, len, req.buf_index as u16)
                .offset(k.offset)
                .build()
        } else {
            opcode::Read::new(fd, k.buf, len).offset(k.offset).build()
        }
        .user_data(req.id);
        if k.widened() {
            self.widened.insert(req.id, k);
        }
        loop {
            // SAFETY: the caller keeps the buffer and fd valid until the
            // completion is reaped (the contract of `Reader::submit`).
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            // Submission queue full: hand what is queued to the kernel.
            self.ring.submit()?;
        }
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()> {
        let goal = out.len() + min;
        out.append(&mut self.ready);
        while out.len() < goal {
            // HTTP steps (and inbox wake-ups) produce completions that
            // finish no read; wait for one at a time while they may come.
            let remote_out = self.remote.as_ref().is_some_and(|r| r.out > 0);
            let want = if self.http.in_flight() > 0 || remote_out {
                1
            } else {
                goal - out.len()
            };
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY: the completion queue is full; reap below, then retry.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            let cqes: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, r) in cqes {
                if ud == INBOX {
                    let rem = self.remote.as_mut().expect("only armed with a remote");
                    rem.armed = false;
                    rem.out -= rem.inbox.take(out);
                    if rem.out > 0 {
                        self.arm_inbox()?;
                    }
                    continue;
                }
                if ud & TAG != 0 {
                    if let Some(c) = self.http.complete(&mut self.ring, ud, r) {
                        out.push(c);
                    }
                    continue;
                }
                let widened = self.widened.remove(&ud);
                out.push(Completion {
                    id: ud,
                    result: match (r, widened) {
                        (r, _) if r < 0 => Err(ReadFail::Io(io::Error::from_raw_os_error(-r))),
                        (r, Some(k)) => Ok(k.delivered(r as usize)),
                        (r, None) => Ok(r as usize),
                    },
                    copied: 0,
                    total: None,
                    timing: None,
                });
            }
        }
        Ok(())
    }
}
