//! A range's failures on the ring: a step that failed closes its
//! connection, and the rest of the range is retried from its first byte
//! not yet received (at once for a keep-alive connection the server had
//! closed, after a backoff that is an io_uring timer otherwise), or the
//! range fails with what the retry policy says; one of a raced pair that
//! fails leaves the range to its twin.

use std::time::Instant;

use io_uring::{IoUring, opcode, types};

use super::{HttpDriver, Step, push, user_data};
use crate::fetch::{Completion, ReadFail};
use crate::net::http::{FailKind, HttpFail};
use crate::net::retry::GiveUp;

impl HttpDriver {
    /// A step failed: close the connection and retry the rest of the range
    /// after a backoff, or fail it.
    pub(super) fn retry_or_fail(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        f: HttpFail,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        // A keep-alive connection the server had closed meanwhile fails
        // before any byte of the answer: not a failure, retried at once on a
        // fresh one. A stall, or an answer begun, is the server's failure
        // (counted, and backed off from), as on the threads backend.
        let stale = op.conn.as_ref().is_some_and(|c| c.reused)
            && op.step != Step::Body
            && op.head_got == 0
            && f.kind != FailKind::Stalled;
        op.conn = None;
        if stale {
            return self.begin(ring, slot);
        }
        self.fail(ring, slot, f)
    }

    pub(super) fn fail(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        f: HttpFail,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        op.conn = None;
        if f.kind == FailKind::Throttled {
            self.net
                .pace
                .answered(&op.at.url, op.sent_at, Some(f.retry_after));
        }
        // One of a raced pair failed: the other carries the range on.
        if self.twin_carries_on(slot) {
            return None;
        }
        let op = self.slots[slot].as_mut().expect("live slot");
        op.tries.record(f.kind);
        let failing_for = op.first_failure.get_or_insert_with(Instant::now).elapsed();
        match self
            .net
            .retry
            .decide(&op.tries, f.kind, failing_for, self.jitter.draw())
        {
            Ok(d) => {
                self.net.stats.retried(&op.obj.url, &f);
                let d = crate::net::retry_wait(&self.net, &op.at.url, &f, d);
                if d.is_zero() {
                    return self.begin(ring, slot);
                }
                self.sleep_then_begin(ring, slot, d)
            }
            Err(why) => self.give_up(slot, f, why),
        }
    }

    /// Starts the request of `slot` again after `d`, on an io_uring timer.
    pub(super) fn sleep_then_begin(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        d: std::time::Duration,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        op.step = Step::Backoff;
        op.backoff = types::Timespec::from(d);
        let e = opcode::Timeout::new(&op.backoff)
            .build()
            .user_data(user_data(slot, op.generation, Step::Backoff));
        match push(ring, &e) {
            Ok(()) => None,
            Err(f2) => self.give_up(slot, f2, GiveUp::Final),
        }
    }

    pub(super) fn give_up(&mut self, slot: usize, f: HttpFail, why: GiveUp) -> Option<Completion> {
        if self.twin_carries_on(slot) {
            return None;
        }
        let op = self.free_slot(slot);
        let failing_for = op.first_failure.map(|t| t.elapsed()).unwrap_or_default();
        Some(Completion {
            id: op.req_id,
            result: Err(ReadFail::Net(crate::net::gave_up(
                &op.obj.url,
                f,
                &op.tries,
                failing_for,
                why,
                &self.net.retry,
            ))),
            copied: op.copied,
            total: op.total,
            timing: None,
        })
    }
}
