//! The response head's step: the head is received into the op's small
//! buffer (for https, opened out of its records there), parsed, followed
//! when it redirects (`redirect.rs`), and checked against the range asked
//! for and the version pinned; the first
//! head of a raced range wins; body bytes that came with the head are
//! copied to the destination, and the body's receives begin.

use std::time::Instant;

use io_uring::IoUring;

use super::tls::open_head;
use super::{HttpDriver, Step, io_fail, pool_key};
use crate::fetch::Completion;
use crate::net::hop::Turn;
use crate::net::http::{self, FailKind, HttpFail};

impl HttpDriver {
    /// The head's receive of `slot` completed with `res`.
    pub(super) fn on_head(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        if res <= 0 {
            let f = if res == 0 {
                HttpFail::new(
                    FailKind::Reset,
                    "the connection closed before the response head",
                )
            } else {
                io_fail(res, "receive")
            };
            return self.retry_or_fail(ring, slot, f);
        }
        self.quick_ack(slot);
        let op = self.slots[slot].as_mut().expect("live slot");
        let parsed = match op.conn.as_mut().and_then(|c| c.tls.as_mut()) {
            Some(tls) => {
                tls.received(res as usize);
                match open_head(tls, &mut op.head, &mut op.head_got) {
                    Ok(p) => p,
                    Err(f) => return self.retry_or_fail(ring, slot, f),
                }
            }
            None => {
                op.head_got += res as usize;
                http::parse_head(&op.head[..op.head_got])
            }
        };
        let h = match parsed {
            Ok(Some(h)) => h,
            Ok(None) => return self.recv(ring, slot, Step::Head),
            Err(e) => return self.fail(ring, slot, HttpFail::new(FailKind::Protocol, e)),
        };
        op.conn.as_mut().expect("connected").reused = false;
        // A redirect, or a remembered target that expired: the request
        // goes again (`redirect.rs`).
        let key = pool_key(&op.at);
        match op.route.answered(&op.obj, &h) {
            Ok(Turn::Final) => {}
            Ok(Turn::Again) => return self.hop(ring, slot, &h, key),
            Err(f) => return self.fail(ring, slot, f),
        }
        // Another version's answer is never taken (its body is not
        // read, so the connection goes).
        if let Some(Err(f)) = op.pin.as_deref().map(|p| p.check(&op.obj.url, &h)) {
            return self.fail(ring, slot, f);
        }
        let at = op.start + op.got as u64;
        let want = (op.len - op.got) as u64;
        let body = match http::check_range_response(&h, at, want, op.open_end) {
            Ok(b) => {
                self.net.pace.answered(&op.at.url, op.sent_at, None);
                // The object's later ranges go where this one's chain
                // ended, and those parked behind it go now.
                op.route.arrived(&op.obj);
                self.resolved(slot);
                b
            }
            Err(mut f) => {
                f.message = format!("{}: {}", op.obj.url, f.message);
                return self.retry_or_fail(ring, slot, f);
            }
        };
        // The first head of a raced range wins: the other request
        // is cancelled before this one writes a byte of the body.
        self.head_arrived(ring, slot);
        let op = self.slots[slot].as_mut().expect("live slot");
        if op.first_byte.is_none() {
            op.first_byte = op.asked.map(|a| a.elapsed());
        }
        op.total = body.total.or(op.total);
        // Less than asked only with `open_end`, at the object's end.
        let want = body.len;
        op.len = op.got + want as usize;
        if h.status == 416 {
            // An empty object: the connection is reused only when
            // no error body follows.
            op.keep_alive =
                h.keep_alive && h.content_length == Some(0) && op.head_got == h.head_len;
            return self.finish(slot);
        }
        op.body_at = Some((Instant::now(), op.got));
        self.watch_body(ring, slot);
        let op = self.slots[slot].as_mut().expect("live slot");
        let extra = op.head_got - h.head_len;
        if extra as u64 > want {
            let f = HttpFail::new(FailKind::Protocol, "the server sent more than the range");
            return self.fail(ring, slot, f);
        }
        // SAFETY: `extra` <= the rest of the destination; the head
        // buffer and the chunk do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                op.head.as_ptr().add(h.head_len),
                op.buf.add(op.got),
                extra,
            )
        };
        op.got += extra;
        op.copied += extra;
        op.keep_alive = h.keep_alive;
        if op.conn.as_ref().is_some_and(|c| c.tls.is_some()) {
            return self.tls_body(ring, slot);
        }
        if op.got == op.len {
            return self.finish(slot);
        }
        self.recv(ring, slot, Step::Body)
    }
}
