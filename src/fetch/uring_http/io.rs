//! The socket steps of a range on the ring: a request's send, and the
//! receives of its head and body (into the head buffer, the destination
//! chunk, or for https a record's room), each pushed with its linked stall
//! time-out in the same submission.

use std::os::fd::AsRawFd;

use io_uring::{IoUring, opcode, squeue, types};

use super::uring_tls;
use super::{HEAD_RECV, HttpDriver, Step, io_fail, push, user_data};
use crate::fetch::Completion;
use crate::net::http::{FailKind, HttpFail};

impl HttpDriver {
    pub(super) fn send(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        op.step = Step::Send;
        let fd = op.conn.as_ref().expect("connected").fd.as_raw_fd();
        let rest = &op.request[op.sent..];
        let e = opcode::Send::new(types::Fd(fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(user_data(slot, op.generation, Step::Send));
        let generation = op.generation;
        match self.push_with_stall(ring, &e, slot, generation) {
            Ok(()) => None,
            Err(f) => self.fail(ring, slot, f),
        }
    }

    pub(super) fn recv(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        step: Step,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        op.step = step;
        let conn = op.conn.as_mut().expect("connected");
        let fd = conn.fd.as_raw_fd();
        let (ptr, len) = match (step, conn.tls.as_mut()) {
            // https: the head's records come into the small buffer, a whole
            // record at a time once its header is in (so that little of the
            // body comes with it).
            (Step::Head, Some(tls)) => {
                let want = match tls.next_len() {
                    Ok(Some(n)) => n - tls.pending(),
                    Ok(None) => HEAD_RECV,
                    Err(f) => return self.fail(ring, slot, f),
                };
                match tls.recv_room(want) {
                    Ok(r) => r,
                    Err(f) => return self.fail(ring, slot, f),
                }
            }
            // https, the end of a record that does not fit in the rest of
            // the destination: its header, then exactly the rest of it.
            (_, Some(tls)) if op.small => {
                let want = match tls.next_len() {
                    Ok(Some(n)) => n - tls.pending(),
                    Ok(None) => uring_tls::HEADER - tls.pending(),
                    Err(f) => return self.fail(ring, slot, f),
                };
                match tls.recv_room(want) {
                    Ok(r) => r,
                    Err(f) => return self.fail(ring, slot, f),
                }
            }
            // https: ciphertext into the rest of the destination, after the
            // partial record already there.
            // SAFETY: got + pend < len.
            (_, Some(_)) => (
                unsafe { op.buf.add(op.got + op.pend) },
                op.len - op.got - op.pend,
            ),
            (Step::Head, None) => {
                let room = (op.head.len() - op.head_got).min(HEAD_RECV);
                // SAFETY: head_got < head.len().
                (unsafe { op.head.as_mut_ptr().add(op.head_got) }, room)
            }
            // SAFETY: got < len: the rest of the destination.
            _ => (unsafe { op.buf.add(op.got) }, op.len - op.got),
        };
        // The body is received with MSG_WAITALL: one completion for the whole
        // range instead of one per socket-buffer's worth, which is what the
        // receiving thread's CPU goes into besides the copy. When the stall
        // time-out cancels it, the kernel reports the bytes it did receive
        // (positive), and the next receive carries on from there; only a
        // receive that gets nothing at all fails as stalled.
        let flags = if step == Step::Body && !op.small {
            libc::MSG_WAITALL
        } else {
            0
        };
        let e = opcode::Recv::new(types::Fd(fd), ptr, len.min(u32::MAX as usize) as u32)
            .flags(flags)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(user_data(slot, op.generation, step));
        let generation = op.generation;
        match self.push_with_stall(ring, &e, slot, generation) {
            Ok(()) => None,
            Err(f) => self.fail(ring, slot, f),
        }
    }

    /// Pushes step `e` (flagged IO_LINK) and its linked stall time-out.
    pub(super) fn push_with_stall(
        &self,
        ring: &mut IoUring,
        e: &squeue::Entry,
        slot: usize,
        generation: u32,
    ) -> Result<(), HttpFail> {
        let t = opcode::LinkTimeout::new(&*self.stall)
            .build()
            .user_data(user_data(slot, generation, Step::Timer));
        // Both must be in the same submission: make room for two first.
        let room = {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        if room < 2 {
            ring.submit()
                .map_err(|e| HttpFail::new(FailKind::Reset, format!("io_uring submit: {e}")))?;
        }
        push(ring, e)?;
        push(ring, &t)
    }
}

impl HttpDriver {
    /// A request send's completion: the rest of it, or the head's receive.
    pub(super) fn on_sent(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if res < 0 {
            let f = io_fail(res, "send");
            return self.retry_or_fail(ring, slot, f);
        }
        op.sent += res as usize;
        if op.sent < op.request.len() {
            return self.send(ring, slot);
        }
        self.quick_ack(slot);
        self.recv(ring, slot, Step::Head)
    }
}
