//! https on the ring's steps: the TLS handshake driven to its next send
//! or receive, the body's records opened where io_uring received them
//! (in the destination chunk, or the small buffer for a record longer
//! than the destination's rest), and the response head opened out of the
//! small buffer's records. The records themselves are `uring_tls`'s.
//! Once the handshake is done the session goes to the kernel's TLS where
//! it has it (`ktls.rs`): the steps are then plain HTTP's, and a receive
//! that fails with `EIO` (a record other than data) has that record read
//! and done here.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use io_uring::{IoUring, opcode, squeue, types};

use super::uring_tls::{self, Opened, TlsConn, TlsNext};
use super::{HttpDriver, Step, io_fail, user_data};
use crate::fetch::Completion;
use crate::fetch::ktls::{self, Control, KtlsRefusal};
use crate::net::http::{self, FailKind, HttpFail};

impl HttpDriver {
    /// Drives the TLS handshake to its next send or receive.
    pub(super) fn handshake(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let conn = op.conn.as_mut().expect("connected");
        let fd = conn.fd.as_raw_fd();
        let tls = conn.tls.as_mut().expect("https");
        // Records half sent go out first; rustls is asked for more only
        // once they are all out.
        let next = if tls.out_sent < tls.out.len() {
            Ok(TlsNext::Send)
        } else {
            tls.handshake()
        };
        let e = match next {
            Err(f) => return self.fail(ring, slot, f),
            Ok(TlsNext::Open) => {
                if let Err(f) = self.session_opened(slot) {
                    return self.retry_or_fail(ring, slot, f);
                }
                return self.ready(ring, slot);
            }
            Ok(TlsNext::Send) => {
                op.step = Step::TlsSend;
                let rest = &tls.out[tls.out_sent..];
                opcode::Send::new(types::Fd(fd), rest.as_ptr(), rest.len() as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
            }
            Ok(TlsNext::Recv) => {
                op.step = Step::TlsRecv;
                let (ptr, len) = match tls.recv_room(uring_tls::MAX_RECORD) {
                    Ok(r) => r,
                    Err(f) => return self.fail(ring, slot, f),
                };
                opcode::Recv::new(types::Fd(fd), ptr, len as u32).build()
            }
        };
        let e = e
            .flags(squeue::Flags::IO_LINK)
            .user_data(user_data(slot, op.generation, op.step));
        let generation = op.generation;
        match self.push_with_stall(ring, &e, slot, generation) {
            Ok(()) => None,
            Err(f) => self.fail(ring, slot, f),
        }
    }

    /// The handshake is done: the session goes to the kernel's TLS where
    /// it has it and `kernel_tls` allows, else its records are opened
    /// here; counted either way.
    fn session_opened(&mut self, slot: usize) -> Result<(), HttpFail> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let conn = op.conn.as_mut().expect("connected");
        let setup = &self.net.tls;
        let keys = match conn.tls.as_deref() {
            Some(t) if setup.kernel_wanted() => t.kernel_keys(),
            _ => None,
        };
        if let Some((rx, tx)) = keys {
            match ktls::hand_over(conn.fd.as_raw_fd(), rx, tx) {
                Ok(()) => {
                    let tls = conn.tls.take().expect("https");
                    conn.kernel = tls.into_kernel().map(Box::new);
                    setup.sessions_kernel.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(KtlsRefusal::Off(why)) => {
                    crate::log::once("kernel_tls", crate::log::Level::Info, || why);
                }
                // The kernel has TLS but not for this session's suite:
                // this loader's next ones are not offered either.
                Err(KtlsRefusal::Key(why)) => setup.kernel_failed(&why),
                Err(KtlsRefusal::Broken(f)) => {
                    // Counted where it went, though it carries nothing.
                    setup.sessions_kernel.fetch_add(1, Ordering::Relaxed);
                    setup.kernel_failed(&f.message);
                    return Err(f);
                }
            }
        }
        setup.sessions_user.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A receive on a session the kernel's TLS took failed with `EIO`: the
    /// next record is not data. It is read and done; then the receive is
    /// asked again, or, after `close_notify`, the step goes on as at a FIN
    /// (`ud`: the step's completion).
    pub(super) fn kernel_record(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        ud: u64,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let server = format!("{}:{}", op.at.host, op.at.port);
        let conn = op.conn.as_mut().expect("connected");
        let fd = conn.fd.as_raw_fd();
        let k = conn.kernel.as_mut().expect("kernel TLS");
        match k.control(fd, &server) {
            Ok(Control::Again) => {
                let step = op.step;
                self.recv(ring, slot, step)
            }
            Ok(Control::Closed) => self.complete_step(ring, ud, 0),
            Err(f) => {
                if k.broken() {
                    self.net.tls.kernel_failed(&f.message);
                }
                self.retry_or_fail(ring, slot, f)
            }
        }
    }

    /// https body: opens the records received so far (in the small buffer,
    /// in the destination), then receives the next bytes where they fit:
    /// into the rest of the destination, or, for a record longer than that
    /// rest, into the small buffer.
    pub(super) fn tls_body(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let tls = op
            .conn
            .as_mut()
            .and_then(|c| c.tls.as_mut())
            .expect("https");
        // SAFETY: the destination is this op's until its completion (the
        // contract of `Reader::submit`); nothing else refers to it now.
        let dest = unsafe { std::slice::from_raw_parts_mut(op.buf, op.len) };
        let mut closed = false;
        // Whole records in the small buffer: copied into place.
        if op.pend == 0 {
            loop {
                match tls.open_buffered() {
                    Ok(Some(Opened::Data { start, len })) => {
                        if op.got + len > op.len {
                            let f = HttpFail::new(
                                FailKind::Protocol,
                                "the server sent more than the range",
                            );
                            return self.fail(ring, slot, f);
                        }
                        dest[op.got..op.got + len].copy_from_slice(tls.buffered(start, len));
                        op.got += len;
                        op.copied += len;
                    }
                    Ok(Some(Opened::Nothing)) => {}
                    Ok(Some(Opened::Closed)) => {
                        closed = true;
                        break;
                    }
                    Ok(None) => break,
                    Err(f) => return self.fail(ring, slot, f),
                }
            }
        }
        // Whole records in the destination: opened in place.
        if op.pend > 0 {
            let end = op.got + op.pend;
            match tls.open_in_place(dest, &mut op.got, end) {
                Ok(p) => {
                    op.pend = p.partial;
                    op.copied += p.moved;
                    closed = p.closed;
                }
                Err(f) => return self.fail(ring, slot, f),
            }
        }
        if op.got == op.len {
            if closed || op.pend > 0 {
                op.keep_alive = false;
            }
            return self.finish(slot);
        }
        if closed {
            let f = HttpFail::new(
                FailKind::Truncated,
                format!(
                    "{}: TLS closed after {} of {} bytes",
                    op.obj.url, op.got, op.len
                ),
            );
            return self.retry_or_fail(ring, slot, f);
        }
        let room = op.len - op.got;
        let next = if op.pend > 0 {
            uring_tls::record_len(&dest[op.got..op.got + op.pend])
        } else {
            tls.next_len()
        };
        let next = match next {
            Ok(n) => n,
            Err(f) => return self.fail(ring, slot, f),
        };
        let partial = op.pend.max(tls.pending());
        // The next record fits in the rest of the destination (its length
        // is known, or only its header is missing and there is room).
        let fits = match next {
            Some(n) => n <= room,
            None => partial < room,
        };
        if fits {
            if tls.pending() > 0 {
                op.pend = tls.drain_to(&mut dest[op.got..]);
                op.copied += op.pend;
            }
            op.small = false;
        } else {
            if op.pend > 0 {
                if let Err(f) = tls.refill(&dest[op.got..op.got + op.pend]) {
                    return self.fail(ring, slot, f);
                }
                op.copied += op.pend;
                op.pend = 0;
            }
            op.small = true;
        }
        self.recv(ring, slot, Step::Body)
    }
}

/// Opens the whole records of the small buffer into the head buffer, one
/// at a time, until the response head is complete. The head buffer holds
/// `MAX_HEAD` plus a whole record, so a record always fits.
pub(super) fn open_head(
    tls: &mut TlsConn,
    head: &mut [u8],
    head_got: &mut usize,
) -> Result<Result<Option<http::ResponseHead>, String>, HttpFail> {
    loop {
        match tls.open_buffered()? {
            Some(Opened::Data { start, len }) => {
                let room = head.len() - *head_got;
                if len > room {
                    return Ok(Err("the response head is too long".into()));
                }
                head[*head_got..*head_got + len].copy_from_slice(tls.buffered(start, len));
                *head_got += len;
                match http::parse_head(&head[..*head_got]) {
                    Ok(None) => {}
                    done => return Ok(done),
                }
            }
            Some(Opened::Nothing) => {}
            Some(Opened::Closed) => {
                return Err(HttpFail::new(
                    FailKind::Reset,
                    "the server closed TLS before the response head",
                ));
            }
            None => return Ok(Ok(None)),
        }
    }
}

impl HttpDriver {
    /// A handshake send's completion: the handshake goes on.
    pub(super) fn on_tls_sent(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if res < 0 {
            let f = io_fail(res, "send (TLS handshake)");
            return self.retry_or_fail(ring, slot, f);
        }
        let tls = op.tls_mut();
        tls.out_sent += res as usize;
        if tls.out_sent == tls.out.len() {
            tls.out.clear();
            tls.out_sent = 0;
        }
        self.handshake(ring, slot)
    }

    /// A handshake receive's completion: the handshake goes on with what came.
    pub(super) fn on_tls_received(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if res <= 0 {
            let f = if res == 0 {
                HttpFail::new(
                    FailKind::Reset,
                    format!(
                        "{}: the connection closed during the TLS handshake",
                        op.obj.url
                    ),
                )
            } else {
                io_fail(res, "receive (TLS handshake)")
            };
            return self.retry_or_fail(ring, slot, f);
        }
        let tls = op.tls_mut();
        tls.received(res as usize);
        self.handshake(ring, slot)
    }
}
