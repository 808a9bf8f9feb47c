//! The thread backend: each worker thread performs its own reads with
//! `pread`, one at a time. It needs nothing but the read system call, so it
//! runs wherever io_uring is refused.

use std::collections::VecDeque;
use std::io;

use super::{Completion, ReadRequest, Reader};

#[derive(Default)]
pub struct ThreadReader {
    queued: VecDeque<ReadRequest>,
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
            // SAFETY: `submit`'s contract keeps the buffer valid and ours.
            let n =
                unsafe { libc::pread(req.fd, req.buf.cast(), req.len, req.offset as libc::off_t) };
            let result = if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            };
            if let Err(e) = &result
                && e.kind() == io::ErrorKind::Interrupted
            {
                self.queued.push_front(req);
                continue;
            }
            out.push(Completion { id: req.id, result });
            done += 1;
        }
        Ok(())
    }
}
