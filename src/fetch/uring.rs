//! The io_uring backend: one ring per worker thread, created on that thread
//! (SINGLE_ISSUER, DEFER_TASKRUN where the kernel has them), many reads in
//! flight, `READ_FIXED` into the arena's chunks when they are registered.

use std::io;

use io_uring::{IoUring, opcode, types};

use super::uring_http::{HttpDriver, TAG};
use super::{Completion, NetOptions, ReadFail, ReadRequest, Reader, Target};

/// How a ring was set up, for the stats.
#[derive(Debug, Clone)]
pub struct UringSetup {
    /// Setup flags that the kernel accepted.
    pub flags: &'static str,
}

pub struct UringReader {
    ring: IoUring,
    registered: bool,
    /// Ranged HTTP reads on this ring.
    http: HttpDriver,
    /// Completions finished during `submit` (a range that failed at once).
    ready: Vec<Completion>,
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
    /// A ring for a worker; with `buffers`, registers them as fixed buffers.
    ///
    /// # Safety
    /// Every buffer in `buffers` must stay valid for the life of the reader.
    pub unsafe fn new(
        entries: u32,
        buffers: Option<&[libc::iovec]>,
        net: NetOptions,
        seed: u64,
    ) -> io::Result<UringReader> {
        let (ring, _) = new_ring(entries)?;
        let mut registered = false;
        if let Some(bufs) = buffers {
            // SAFETY: the caller keeps the buffers alive while the ring lives.
            unsafe { ring.submitter().register_buffers(bufs)? };
            registered = true;
        }
        Ok(UringReader {
            ring,
            registered,
            http: HttpDriver::new(net.clone(), seed),
            ready: Vec::new(),
            tls_queued: Default::default(),
            tls_pool: super::http_sync::HttpPool::new(net.stall, std::sync::Arc::clone(&net.tls)),
            net,
            jitter: crate::net::retry::Jitter::new(seed ^ 0x7f4a_7c15),
        })
    }
}

impl Reader for UringReader {
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()> {
        let fd = match &req.target {
            Target::File(fd) => types::Fd(*fd),
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
        let len =
            u32::try_from(req.len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let entry = if self.registered {
            opcode::ReadFixed::new(fd, req.buf, len, req.buf_index as u16)
                .offset(req.offset)
                .build()
        } else {
            opcode::Read::new(fd, req.buf, len)
                .offset(req.offset)
                .build()
        }
        .user_data(req.id);
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
                out.push(Completion {
                    id: ud,
                    result: if r < 0 {
                        Err(ReadFail::Io(io::Error::from_raw_os_error(-r)))
                    } else {
                        Ok(r as usize)
                    },
                    copied: 0,
                });
            }
        }
        Ok(())
    }
}
