//! A fresh connection for a range: its TLS session (https), a socket to
//! one of the host's addresses with `TCP_NODELAY`, and the ring's connect
//! with its stall time-out; and the quick ACKs a request asks for
//! (`crate::net::quick_ack`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use io_uring::{IoUring, opcode, squeue, types};

use super::{Conn, HttpDriver, Step, TlsConn, io_fail, user_data};
use crate::fetch::Completion;
use crate::net::http::{FailKind, HttpFail};

impl HttpDriver {
    /// Opens a fresh connection for the range in `slot` (no idle one, or
    /// a hedge's own).
    pub(super) fn connect(&mut self, ring: &mut IoUring, slot: usize) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        let tls = if op.at.tls {
            let made = self
                .net
                .tls
                .config()
                .map_err(|e| HttpFail::new(FailKind::Tls, e))
                .and_then(|cfg| {
                    TlsConn::new(cfg, &op.at.host, op.at.port, self.net.tls.kernel_wanted())
                });
            match made {
                Ok(t) => Some(Box::new(t)),
                Err(f) => return self.fail(ring, slot, f),
            }
        } else {
            None
        };
        let Some(sa) = op.at.pick_addr() else {
            let f = HttpFail::new(FailKind::Dns, format!("`{}` has no address", op.at.host));
            return self.fail(ring, slot, f);
        };
        let (storage, len) = sockaddr(sa);
        op.addr = storage;
        op.addr_len = len;
        let family = if sa.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return self.fail(
                ring,
                slot,
                HttpFail::new(FailKind::Reset, format!("socket: {e}")),
            );
        }
        // SAFETY: `fd` is a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        // SAFETY: valid socket, option pointer and length.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        let raw = fd.as_raw_fd();
        op.conn = Some(Conn {
            fd,
            reused: false,
            tls,
            kernel: None,
        });
        op.step = Step::Connect;
        let e = opcode::Connect::new(
            types::Fd(raw),
            (&op.addr as *const libc::sockaddr_storage).cast(),
            op.addr_len,
        )
        .build()
        .flags(squeue::Flags::IO_LINK)
        .user_data(user_data(slot, op.generation, Step::Connect));
        let generation = op.generation;
        match self.push_with_stall(ring, &e, slot, generation) {
            Ok(()) => None,
            Err(f) => self.fail(ring, slot, f),
        }
    }

    /// The connection of the range in `slot` acknowledges what arrives
    /// at once, not on the delayed-ACK timer: asked once its request is
    /// sent, and again at each piece of the response head, which sends
    /// an ACK already pending (the kernel goes back to delaying on its
    /// own). A server with Nagle's algorithm holds back only its one
    /// short segment after the head, so the head's ACK is what matters.
    pub(super) fn quick_ack(&self, slot: usize) {
        let op = self.slots[slot].as_ref().expect("live slot");
        if let Some(c) = op.conn.as_ref() {
            crate::net::quick_ack(c.fd.as_raw_fd());
        }
    }
}

fn sockaddr(sa: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: plain data; zeroed is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match sa {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

impl HttpDriver {
    /// The connect step's completion: the connection is up, or the range fails.
    pub(super) fn on_connected(
        &mut self,
        ring: &mut IoUring,
        slot: usize,
        res: i32,
    ) -> Option<Completion> {
        let op = self.slots[slot].as_mut().expect("live slot");
        if res < 0 {
            let f = io_fail(res, &format!("connect to {}", op.obj.url));
            return self.fail(ring, slot, f);
        }
        self.ready(ring, slot)
    }
}
