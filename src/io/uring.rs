//! The io_uring backend: one ring per worker thread, created on that thread
//! (SINGLE_ISSUER, DEFER_TASKRUN where the kernel has them), many reads in
//! flight, `READ_FIXED` into the arena's chunks when they are registered.

use std::io;

use io_uring::{IoUring, opcode, types};

use super::http_sync::HttpPool;
use super::threads::run_blocking;
use super::{Completion, NetOptions, ReadFail, ReadRequest, Reader, Target};
use crate::retry::Jitter;

/// How a ring was set up, for the stats.
#[derive(Debug, Clone)]
pub struct UringSetup {
    /// Setup flags that the kernel accepted.
    pub flags: &'static str,
}

pub struct UringReader {
    ring: IoUring,
    registered: bool,
    queued: usize,
    /// HTTP ranges: run on blocking sockets until the io_uring HTTP path
    /// lands (the stats say so).
    http: HttpPool,
    http_queued: Vec<ReadRequest>,
    net: NetOptions,
    jitter: Jitter,
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
            queued: 0,
            http: HttpPool::new(net.stall),
            http_queued: Vec::new(),
            net,
            jitter: Jitter::new(seed),
        })
    }
}

impl Reader for UringReader {
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()> {
        let fd = match &req.target {
            Target::File(fd) => types::Fd(*fd),
            Target::Http(_) => {
                self.http_queued.push(req);
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
                self.queued += 1;
                return Ok(());
            }
            // Submission queue full: hand what is queued to the kernel.
            self.ring.submit()?;
        }
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()> {
        if !self.http_queued.is_empty() {
            let req = self.http_queued.remove(0);
            if let Some(c) = run_blocking(&req, &mut self.http, &self.net, &mut self.jitter) {
                out.push(c);
            }
            return Ok(());
        }
        loop {
            match self.ring.submit_and_wait(min) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY: the completion queue is full; reap below, then retry.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(e) => return Err(e),
            }
        }
        self.queued = 0;
        for cqe in self.ring.completion() {
            let r = cqe.result();
            out.push(Completion {
                id: cqe.user_data(),
                result: if r < 0 {
                    Err(ReadFail::Io(io::Error::from_raw_os_error(-r)))
                } else {
                    Ok(r as usize)
                },
                copied: 0,
            });
        }
        Ok(())
    }
}
