//! Response bodies: a byte range of a file written to a socket.
//!
//! `sendfile(2)` moves the bytes from the page cache to the socket inside the
//! kernel: no user-space buffer, no copy through it, one system call per
//! socket-buffer-full instead of a read and a write. That keeps the server's
//! CPU out of the way when `ringfeed demo` measures the client on the same
//! cores. Where the kernel refuses (`EINVAL`/`ENOSYS`: a file system without
//! splice support), the range is read with `pread` in large pieces and written.

use std::fs::File;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Bytes one sendfile call may move. Linux moves at most 0x7ffff000 per call
/// anyway; 1 GiB keeps the count well inside `ssize_t` on every target.
const SENDFILE_MAX: u64 = 1 << 30;

/// Piece size of the fallback: 1 MiB amortises the system calls (curl and
/// nginx use 16–512 KiB buffers; more than this gains nothing measurable).
const FALLBACK_PIECE: usize = 1 << 20;

/// Writes bytes `start..start + len` of `file` to `sock`. An error after
/// some bytes went out leaves the response truncated: the caller closes the
/// connection, which the client sees as a short body.
pub fn send_range(sock: &TcpStream, file: &File, start: u64, len: u64) -> io::Result<()> {
    let mut off = libc::off_t::try_from(start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off_t"))?;
    let mut left = len;
    while left > 0 {
        let want = left.min(SENDFILE_MAX) as usize;
        // SAFETY: both descriptors are open for the duration of the call (we
        // hold `sock` and `file` by reference) and `off` is a valid, writable
        // off_t that the kernel advances by the bytes it sent.
        let n = unsafe { libc::sendfile(sock.as_raw_fd(), file.as_raw_fd(), &mut off, want) };
        if n > 0 {
            left -= n as u64;
            continue;
        }
        if n == 0 {
            // The file ended before the range: it shrank after we sized it.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while being sent",
            ));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // SO_SNDTIMEO expired: the client stopped reading.
            Some(libc::EAGAIN) => return Err(io::Error::new(io::ErrorKind::TimedOut, e)),
            Some(libc::EINVAL | libc::ENOSYS) if left == len => {
                return copy_range(sock, file, start, len);
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// The fallback: `pread` into a buffer, then write it.
fn copy_range(mut sock: &TcpStream, file: &File, start: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; FALLBACK_PIECE.min(len as usize)];
    let mut pos = start;
    let end = start + len;
    while pos < end {
        let want = buf.len().min((end - pos) as usize);
        let n = file.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while being sent",
            ));
        }
        sock.write_all(&buf[..n])?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn roundtrip(
        send: impl FnOnce(&TcpStream, &File) -> io::Result<()> + Send + 'static,
    ) -> Vec<u8> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let t = std::thread::spawn(move || {
            let r = send(&server, &f);
            drop(server);
            r
        });
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        t.join().unwrap().unwrap();
        got
    }

    #[test]
    fn both_paths_send_exactly_the_range() {
        let want: Vec<u8> = (1000..2_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(roundtrip(|s, f| send_range(s, f, 1000, 2_499_000)), want);
        assert_eq!(roundtrip(|s, f| copy_range(s, f, 1000, 2_499_000)), want);
    }

    #[test]
    fn a_range_past_the_end_is_an_error_not_a_hang() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"short").unwrap();
        let e = send_range(&server, &f, 0, 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
