//! The io_uring backend: one ring per worker thread, created on that thread
//! (SINGLE_ISSUER, DEFER_TASKRUN where the kernel has them), many reads in
//! flight, `READ_FIXED` into the arena's chunks when they are registered.
//! Reads of direct files go to the kernel widened to whole blocks
//! (`direct::KernelRead`).

use std::io;
use std::sync::Arc;

use io_uring::{IoUring, opcode, types};

use super::direct::KernelRead;
use super::fixed::FixedBuffers;
use super::net_thread::{Inbox, NetLink};
use super::ring::new_ring;
use super::uring_http::{HttpDriver, TAG};
use super::{Completion, NetOptions, ReadFail, ReadRequest, Reader, Target};

pub struct UringReader {
    ring: IoUring,
    /// How many of the arena's chunks are registered (the first ones):
    /// reads into them are `READ_FIXED`.
    registered: u32,
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
        let mut registered = 0;
        if let Some(f) = fixed.as_ref().filter(|f| f.is_ready()) {
            // SAFETY: `FixedBuffers::new`'s caller keeps the buffers alive
            // while any ring that registered them lives.
            unsafe { ring.submitter().register_buffers(f.ready())? };
            registered = f.ready().len() as u32;
        }
        Ok(UringReader {
            ring,
            registered,
            fixed: if registered > 0 { None } else { fixed },
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
        self.registered = f.register(&self.ring);
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
        let entry = if req.buf_index < self.registered {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::direct::LocalFd;

    const CHUNK: usize = 1 << 20;

    /// Pages of `chunk` (of `base`'s) resident now.
    fn resident(base: *mut u8, chunk: usize) -> usize {
        let pages = CHUNK / 4096;
        let mut v = vec![0u8; pages];
        // SAFETY: the range is inside the mapping; `v` holds a byte a page.
        let r = unsafe { libc::mincore(base.add(chunk * CHUNK).cast(), CHUNK, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Eight chunks of fresh anonymous memory, the first `faulted` of them
    /// written (as the prefault thread does), registered as far as
    /// `ready`; then a file read into a registered chunk and one into a
    /// chunk past them. Gives the pages resident in each chunk after the
    /// registration, and checks both reads' bytes.
    fn register_some(faulted: usize, ready: usize) -> Vec<usize> {
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8 * CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_bytes(base, 1, faulted * CHUNK) };
        let iovecs = (0..8)
            .map(|i| libc::iovec {
                // SAFETY: inside the mapping.
                iov_base: unsafe { base.add(i * CHUNK) }.cast(),
                iov_len: CHUNK,
            })
            .collect();
        // SAFETY: the mapping outlives the ring (dropped before munmap).
        let fixed = Arc::new(unsafe { FixedBuffers::new(iovecs) });
        fixed.set_ready(ready);
        let mut r = UringReader::new(
            8,
            Some(fixed),
            NetOptions::for_config(&crate::config::Config::default()),
            0,
        )
        .unwrap();
        let after: Vec<usize> = (0..8).map(|c| resident(base, c)).collect();
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 + 3) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        for (id, chunk) in [(1u64, 0usize), (2, 6)] {
            let req = ReadRequest {
                id,
                target: Target::File(LocalFd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&f),
                    align: 0,
                }),
                offset: 0,
                // SAFETY: inside the mapping.
                buf: unsafe { base.add(chunk * CHUNK) },
                len: data.len(),
                buf_index: chunk as u32,
                open_end: false,
                pin: None,
            };
            // SAFETY: the buffer and the file live until the completion.
            unsafe { r.submit(req).unwrap() };
            let mut out = Vec::new();
            r.wait(1, &mut out).unwrap();
            assert_eq!(out[0].result.as_ref().ok(), Some(&data.len()));
            // SAFETY: the read completed into the mapping.
            let got = unsafe { std::slice::from_raw_parts(base.add(chunk * CHUNK), data.len()) };
            assert!(got == &data[..], "chunk {chunk}'s bytes");
        }
        drop(r);
        // SAFETY: the mapping made above; nothing refers to it now.
        unsafe { libc::munmap(base.cast(), 8 * CHUNK) };
        after
    }

    #[test]
    fn only_the_chunks_faulted_in_are_pinned_and_reads_past_them_are_plain() {
        let pages = CHUNK / 4096;
        // Two chunks faulted and ready: registering touches nothing more.
        assert_eq!(register_some(2, 2), [pages, pages, 0, 0, 0, 0, 0, 0]);
        // Control: all eight ready though two were faulted (the arena of
        // remote shards before): registering faults in every page.
        assert_eq!(register_some(2, 8), [pages; 8]);
    }
}
