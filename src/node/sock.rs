//! The system calls of the node transport, each wrapped once: a Unix
//! `SOCK_SEQPACKET` socket (messages keep their bounds, a closed peer shows
//! as a hang-up), descriptors passed with `SCM_RIGHTS`, the peer's
//! credentials (`SO_PEERCRED`) and process (`SO_PEERPIDFD`, a pidfd that
//! stays that process), the checks a consumer makes of a socket before it
//! speaks to it, seals on memory files, eventfds for wake-ups, and `poll`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use std::os::unix::fs::MetadataExt;

use super::proto::MAX_MESSAGE;

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid empty address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path `{}` is longer than {} bytes or holds a NUL",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain arguments.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens at `path` (which must not exist), readable and writable
/// by this user only.
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: a valid address of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    // SAFETY: a bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Room for one message of [`MAX_MESSAGE`] in the socket's send buffer: a
/// `SOCK_SEQPACKET` message must fit it whole, and the default (212 KiB on
/// most systems) is less. The kernel caps it at `net.core.wmem_max`; past
/// that a message fails to send with EMSGSIZE, which the caller reports.
fn room_for_a_message(fd: &OwnedFd) {
    let want = (MAX_MESSAGE + (64 << 10)) as libc::c_int;
    // SAFETY: a valid int and its length; a refusal leaves the default.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const want).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Connects to the socket at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: a valid address of `len` bytes.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    room_for_a_message(&fd);
    Ok(fd)
}

/// Accepts one connection.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: a listening socket; no address wanted.
    let fd = cvt(unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: a new descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    room_for_a_message(&fd);
    Ok(fd)
}

/// The user and process at the other end of a Unix socket.
pub fn peer(fd: &OwnedFd) -> io::Result<(u32, i32)> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid ucred buffer and its length.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    })?;
    Ok((cred.uid, cred.pid))
}

/// Sends one message with `fds` attached.
pub fn send(fd: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let space = if fds.is_empty() {
        0
    } else {
        // SAFETY: a pure size computation.
        unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize }
    };
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds one header with room for `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: msg points at live buffers of the lengths it says.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EMSGSIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a message of {} bytes is more than this system's socket buffers take \
                     (net.core.wmem_max); list many shards in a manifest instead",
                    bytes.len()
                ),
            ));
        }
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` (`None`: the peer closed), with the
/// descriptors that came with it (at most 8; more are closed). `buf` keeps
/// its room from call to call: a message costs no allocation.
pub fn recv(fd: &OwnedFd, buf: &mut Vec<u8>) -> io::Result<Option<Vec<OwnedFd>>> {
    buf.clear();
    // One byte more than a message may have: a longer one shows as
    // truncated (MSG_TRUNC), whatever its length.
    buf.reserve(MAX_MESSAGE + 1);
    let spare = buf.spare_capacity_mut();
    let mut iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: msg points at live buffers of the lengths it says.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 || n > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message longer than the protocol's {MAX_MESSAGE} bytes"),
        ));
    }
    // SAFETY: recvmsg wrote `n` bytes into the spare capacity.
    unsafe { buf.set_len(n) };
    Ok(Some(fds))
}

/// `SO_PEERPIDFD` (Linux 6.5): the value of asm-generic, which x86-64 and
/// aarch64 use; where it differs or is missing the call fails and
/// [`peer_pidfd`] falls back.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd for the process at the other end of a Unix socket: the one that
/// connected (or listened), which stays that process even once its number
/// is reused. Through `SO_PEERPIDFD` where the kernel has it; else opened
/// from the peer's process number, which is that process as long as the
/// connection it made is open and the number was not reused before
/// (checked: the peer is still there after the pidfd is made).
pub fn peer_pidfd(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let mut got: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid int buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut got).cast(),
            &mut len,
        )
    };
    if rc == 0 && got >= 0 {
        // SAFETY: a new descriptor the kernel gave us.
        return Ok(unsafe { OwnedFd::from_raw_fd(got) });
    }
    let (_, pid) = peer(fd)?;
    let made = pidfd(pid)?;
    // The peer's socket is still open (it is ours to poll): had its
    // process exited before `pidfd`, the connection would show a hang-up.
    let ready = poll(&[(fd, false)], Some(Duration::ZERO))?;
    if ready[0].hangup && exited(&made) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(made)
}

/// Why the socket at `path` may not be spoken to, if it may not: a
/// consumer sends its configuration, and a holder takes batches from it,
/// so the socket must be this user's own, where no other user can have put
/// it. It must be a socket owned by this user (root's for root) that no
/// other user may open, in a folder of this user or root that no other
/// user may write unless it is sticky (as /tmp: there others cannot
/// replace an entry they do not own). [`connect_checked`] then checks the
/// process that listens.
pub fn check_socket(path: &Path) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_socket() {
        return Err(format!("`{}` is not a socket", path.display()));
    }
    if meta.uid() != me {
        return Err(format!(
            "`{}` belongs to user {}, not to this user ({me}): refusing to send it anything",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "`{}` may be opened by other users (mode {:o}): refusing to send it anything; \
             `ringfeed node` makes its socket 0600",
            path.display(),
            meta.mode() & 0o777
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let d = std::fs::metadata(dir).map_err(|e| format!("`{}`: {e}", dir.display()))?;
    if d.uid() != me && d.uid() != 0 {
        return Err(format!(
            "the socket's folder `{}` belongs to user {}: another user could have put the \
             socket there; use a folder of your own",
            dir.display(),
            d.uid()
        ));
    }
    if d.mode() & 0o022 != 0 && d.mode() & 0o1000 == 0 {
        return Err(format!(
            "the socket's folder `{}` may be written by other users (mode {:o}) and is not \
             sticky: another user could have put the socket there; use a folder only you may \
             write",
            dir.display(),
            d.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Connects to the socket at `path` after [`check_socket`], and checks that
/// the process listening runs as this user: only then may anything be sent.
pub fn connect_checked(path: &Path) -> Result<OwnedFd, String> {
    check_socket(path)?;
    let conn = connect(path).map_err(|e| format!("cannot connect to `{}`: {e}", path.display()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    match peer(&conn) {
        Ok((uid, _)) if uid == me => Ok(conn),
        Ok((uid, pid)) => Err(format!(
            "the process listening at `{}` (pid {pid}) runs as user {uid}, not as this user \
             ({me}): refusing to send it anything",
            path.display()
        )),
        Err(e) => Err(format!(
            "the credentials of the process at `{}` cannot be read ({e})",
            path.display()
        )),
    }
}

/// Adds `seals` to a memory file.
pub fn seal(fd: RawFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns; plain arguments.
    cvt(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }).map(|_| ())
}

/// A new eventfd (non-blocking).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain arguments.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd, waking its poller.
pub fn notify(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: 8 readable bytes. A full counter (EAGAIN) is already a wake-up.
    unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Resets an eventfd to 0.
pub fn drain(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: 8 writable bytes; EAGAIN (nothing pending) is fine.
    unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
}

/// A pidfd for process `pid`: it stays that process (a reused number is
/// another), and polls readable once it exited.
pub fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: plain arguments; a new descriptor on success.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process behind `pidfd` has exited.
pub fn exited(pidfd: &OwnedFd) -> bool {
    poll(&[(pidfd, true)], Some(Duration::ZERO)).is_ok_and(|r| r[0].readable || r[0].hangup)
}

/// What `poll` saw on each descriptor: readable, and hung up (or failed).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ready {
    pub readable: bool,
    pub hangup: bool,
}

/// Waits until one of `fds` (`true`: wanted readable; `false`: only its
/// hang-up) is ready, or `timeout` passes (`None`: for ever).
pub fn poll(fds: &[(&OwnedFd, bool)], timeout: Option<Duration>) -> io::Result<Vec<Ready>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|(fd, read)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: if *read { libc::POLLIN } else { 0 },
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: `p` is a valid array of its length.
    let rc = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok(vec![Ready::default(); fds.len()]);
    }
    Ok(p.iter()
        .map(|p| Ready {
            readable: p.revents & libc::POLLIN != 0,
            hangup: p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL | libc::POLLRDHUP)
                != 0,
        })
        .collect())
}

/// Opens `fd`'s file again, read-only: a descriptor through which the
/// receiver can map the memory but never write it (`mmap` with `PROT_WRITE`
/// and `MAP_SHARED` fails with EACCES, and so does `mprotect` later).
pub fn reopen_read_only(fd: RawFd) -> io::Result<std::fs::File> {
    std::fs::File::open(format!("/proc/self/fd/{fd}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_descriptors_cross_and_a_closed_peer_shows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = listen(&path).unwrap();
        let c = connect(&path).unwrap();
        let s = accept(&l).unwrap();
        // SAFETY: geteuid cannot fail.
        assert_eq!(peer(&s).unwrap().0, unsafe { libc::geteuid() });
        let e = eventfd().unwrap();
        send(&c, b"hello", &[e.as_raw_fd()]).unwrap();
        let mut msg = Vec::new();
        let fds = recv(&s, &mut msg).unwrap().unwrap();
        assert_eq!(msg, b"hello");
        assert_eq!(fds.len(), 1);
        // The passed eventfd is the same object: a notify on one is seen on
        // the other.
        notify(&fds[0]);
        assert!(poll(&[(&e, true)], Some(Duration::ZERO)).unwrap()[0].readable);
        drain(&e);
        assert!(!poll(&[(&e, true)], Some(Duration::ZERO)).unwrap()[0].readable);
        drop(c);
        assert!(poll(&[(&s, false)], Some(Duration::from_secs(5))).unwrap()[0].hangup);
        assert!(recv(&s, &mut msg).unwrap().is_none());
        // A pidfd follows its process until it exits.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pf = pidfd(child.id() as i32).unwrap();
        assert!(!exited(&pf));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(exited(&pf));
        assert!(pidfd(0).is_err());
        let long = dir.path().join("x".repeat(200));
        assert!(
            listen(&long)
                .unwrap_err()
                .to_string()
                .contains("longer than")
        );
    }

    #[test]
    fn a_message_too_long_is_an_error_and_the_next_one_crosses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = listen(&path).unwrap();
        let c = connect(&path).unwrap();
        let s = accept(&l).unwrap();
        send(&c, &vec![b'x'; MAX_MESSAGE + 5], &[]).unwrap();
        send(&c, b"after", &[]).unwrap();
        let mut buf = Vec::new();
        let e = recv(&s, &mut buf).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        recv(&s, &mut buf).unwrap().unwrap();
        assert_eq!(buf, b"after");
        // The peer's process, as a pidfd: this one, running.
        let pf = peer_pidfd(&s).unwrap();
        assert!(!exited(&pf));
    }

    #[test]
    fn a_socket_that_is_not_this_users_own_is_not_spoken_to() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let _l = listen(&path).unwrap();
        assert!(check_socket(&path).is_ok());
        assert!(connect_checked(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_socket(&path).unwrap_err();
        assert!(e.contains("may be opened by other users"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_socket(&path).unwrap_err();
        assert!(e.contains("may be written by other users"), "{e}");
        // Sticky, as /tmp: others cannot replace the socket.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(check_socket(&path).is_ok());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(check_socket(&file).unwrap_err().contains("not a socket"));
        assert!(check_socket(&dir.path().join("none")).is_err());
    }
}
