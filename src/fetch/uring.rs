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
    /// Ranged HTTP reads on this ring.
    http: HttpDriver,
    /// Completions finished during `submit` (a range that failed at once).
    ready: Vec<Completion>,
    /// Direct reads given to the kernel widened to whole blocks, by id:
    /// their completions hand back only the bytes asked (the last read of
    /// each file, so a handful at a time).
    widened: std::collections::HashMap<u64, KernelRead>,
    /// https ranges: TLS is decrypted by rustls on blocking sockets, one
    /// range per `wait`, between io_uring completions.
    tls_queued: std::collections::VecDeque<ReadRequest>,
    tls_pool: super::http_sync::HttpPool,
    net: NetOptions,
    jitter: crate::net::retry::Jitter,
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

/// Whether io_uring can be set up here; the error says why not.
pub fn probe() -> io::Result<UringSetup> {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        && s.trim() == "2"
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "io_uring is disabled (/proc/sys/kernel/io_uring_disabled = 2)",
        ));
    }
    new_ring(8).map(|(_, setup)| setup)
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
            http: HttpDriver::new(net.clone(), seed),
            ready: Vec::new(),
            widened: Default::default(),
            tls_queued: Default::default(),
            tls_pool: super::http_sync::HttpPool::new(net.stall, std::sync::Arc::clone(&net.tls)),
            net,
            jitter: crate::net::retry::Jitter::new(seed ^ 0x7f4a_7c15),
        })
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
            Target::File(f) => *f,
            Target::Http(obj) if obj.tls => {
                self.tls_queued.push_back(req);
                return Ok(());
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
        if out.len() < goal
            && let Some(req) = self.tls_queued.pop_front()
        {
            match super::threads::run_blocking(
                &req,
                &mut self.tls_pool,
                &self.net,
                &mut self.jitter,
            ) {
                Some(c) => out.push(c),
                None => self.tls_queued.push_front(req),
            }
            return Ok(());
        }
        while out.len() < goal {
            // HTTP steps produce completions that finish no read; wait for
            // one at a time while reads are outstanding.
            let want = if self.http.in_flight() > 0 {
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
                });
            }
        }
        Ok(())
    }
}
