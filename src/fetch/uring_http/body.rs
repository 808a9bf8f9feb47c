//! The body's step: each receive into the destination chunk (or, for
//! https, into a record's room), and the range's end, which returns its
//! connection to the pool when it may be used again.

use io_uring::IoUring;

use super::{HttpDriver, Step, io_fail, pool_key};
use crate::fetch::{Answered, Completion};
use crate::net::http::{FailKind, HttpFail};

impl HttpDriver {
    /// A body receive's completion: more to receive, the range done, or a retry from the first byte missing.
    pub(super) fn on_body(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if res <= 0 {
            let f = if res == 0 {
                HttpFail::new(
                    FailKind::Truncated,
                    format!(
                        "{}: the body ended after {} of {} bytes",
                        op.obj.url, op.got, op.len
                    ),
                )
            } else {
                io_fail(
                    res,
                    &format!(
                        "{}: receive after {} of {} bytes",
                        op.obj.url, op.got, op.len
                    ),
                )
            };
            return self.retry_or_fail(ring, slot, f);
        }
        if let Some(tls) = op.conn.as_mut().and_then(|c| c.tls.as_mut()) {
            if op.small {
                tls.received(res as usize);
            } else {
                op.pend += res as usize;
            }
            return self.tls_body(ring, slot);
        }
        op.got += res as usize;
        if op.got == op.len {
            return self.finish(slot);
        }
        self.recv(ring, slot, Step::Body)
    }

    pub(super) fn finish(&mut self, slot: usize) -> Option<Completion> {
        let mut op = self.free_slot(slot);
        self.body_done(&op);
        if let Some(k) = op.conn.as_mut().and_then(|c| c.kernel.as_mut()) {
            k.used((op.len + op.head_got) as u64);
        }
        if let Some(c) = op.conn.take()
            && op.keep_alive
            && op.pend == 0
            && c.reusable()
        {
            self.idle.entry(pool_key(&op.at)).or_default().push(c);
        }
        let paced = Some(self.net.pace.rate(&op.at.url)).filter(|r| *r > 0.0);
        Some(Completion {
            id: op.req_id,
            result: Ok(op.len),
            copied: op.copied,
            total: op.total,
            timing: op
                .first_byte
                .zip(op.asked)
                .map(|(first_byte, asked)| Answered {
                    first_byte,
                    last_byte: asked.elapsed(),
                    paced,
                }),
        })
    }
}
