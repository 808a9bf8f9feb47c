//! The thread backend: each worker thread performs its own reads with
//! `pread`, one at a time. It needs nothing but the read system call, so it
//! runs wherever io_uring is refused. Direct files' reads are widened to
//! whole blocks (`direct::KernelRead`) like the ring's.

use std::collections::VecDeque;
use std::io;

use super::direct::KernelRead;
use super::http_sync::HttpPool;
use super::{Completion, NetOptions, ReadFail, ReadRequest, Reader, Target, fetch_retrying};
use crate::net::retry::Jitter;

pub struct ThreadReader {
    queued: VecDeque<ReadRequest>,
    http: HttpPool,
    net: NetOptions,
    jitter: Jitter,
}

impl ThreadReader {
    pub fn new(net: NetOptions, seed: u64) -> ThreadReader {
        ThreadReader {
            queued: VecDeque::new(),
            http: HttpPool::new(net.stall, std::sync::Arc::clone(&net.tls)),
            net,
            jitter: Jitter::new(seed),
        }
    }
}

/// Runs one request on the calling thread.
pub(crate) fn run_blocking(
    req: &ReadRequest,
    http: &mut HttpPool,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Option<Completion> {
    match &req.target {
        Target::File(f) => {
            let read = KernelRead::new(req.offset, req.buf, req.len, f.align).and_then(|k| {
                // SAFETY: `submit`'s contract keeps the buffer, widened to
                // whole blocks for a direct file, valid and ours.
                let n = unsafe { libc::pread(f.fd, k.buf.cast(), k.len, k.offset as libc::off_t) };
                match n {
                    n if n < 0 => Err(io::Error::last_os_error()),
                    n => Ok(k.delivered(n as usize)),
                }
            });
            match read {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
                r => Some(Completion {
                    id: req.id,
                    result: r.map_err(ReadFail::Io),
                    copied: 0,
                    total: None,
                    timing: None,
                }),
            }
        }
        Target::Http(obj) => {
            // SAFETY: as above: `len` writable bytes at `buf`, ours until completion.
            let buf = unsafe { std::slice::from_raw_parts_mut(req.buf, req.len) };
            let pin = req.pin.as_deref();
            let r = fetch_retrying(http, obj, req.offset, buf, req.open_end, pin, net, jitter);
            Some(match r {
                Ok(f) => Completion {
                    id: req.id,
                    result: Ok(f.len),
                    copied: f.copied,
                    total: f.total,
                    timing: None,
                },
                Err(e) => Completion {
                    id: req.id,
                    result: Err(ReadFail::Net(e)),
                    copied: 0,
                    total: None,
                    timing: None,
                },
            })
        }
    }
}

impl Reader for ThreadReader {
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()> {
        self.queued.push_back(req);
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()> {
        // Run reads until `min` completions are out; the rest stay queued so
        // the worker can parse between reads.
        let mut done = 0;
        while done < min.max(1) {
            let Some(req) = self.queued.pop_front() else {
                break;
            };
            match run_blocking(&req, &mut self.http, &self.net, &mut self.jitter) {
                Some(c) => {
                    out.push(c);
                    done += 1;
                }
                None => self.queued.push_front(req),
            }
        }
        Ok(())
    }
}
