//! A scrape endpoint: metrics (Prometheus text, made when asked) served at
//! `http://127.0.0.1:PORT/metrics` (or another address: a node engine in
//! a pod is scraped from outside it) until the [`MetricsServer`] is
//! dropped — the CLI's `--metrics-port` for a running loader, and the node
//! engine's. Each connection is answered on a thread of its own, given
//! [`HEAD_TIME`] in all to send its request: a client that is slow, or
//! sends its request a byte at a time, holds up only itself; past
//! [`MAX_CLIENTS`] at once, a new connection is closed unanswered.

use crate::sync::Locked;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The time a client has to send its request, all of it: a scraper sends
/// one line at once; 2 s covers a loaded machine.
pub const HEAD_TIME: Duration = Duration::from_secs(2);

/// Connections answered at once: a few scrapers and a person's `curl`;
/// more is a client gone wrong, not a reason for more threads.
pub const MAX_CLIENTS: usize = 16;

/// The scrape endpoint; stopped when dropped.
pub struct MetricsServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
    /// The listening socket (a second descriptor of it, owned here so it
    /// stays open until the drop), shut down to wake the thread's
    /// `accept`.
    wake: TcpListener,
}

/// Serves `text()` at `/metrics` on 127.0.0.1:`port` (0: any free port);
/// the error names the port.
pub fn serve(
    port: u16,
    text: impl Fn() -> String + Send + 'static,
) -> std::io::Result<MetricsServer> {
    serve_on(std::net::Ipv4Addr::LOCALHOST.into(), port, text)
}

/// Serves `text()` at `/metrics` on `ip`:`port` (0: any free port); the
/// error names the address.
pub fn serve_on(
    ip: std::net::IpAddr,
    port: u16,
    text: impl Fn() -> String + Send + 'static,
) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind((ip, port)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("--metrics-port {port}: cannot listen on {ip}: {e}"),
        )
    })?;
    let addr: SocketAddr = listener.local_addr()?;
    let wake = listener.try_clone()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    // Behind a lock: the text is made for one client at a time (a few
    // counters' worth), and the function need not be `Sync`.
    let text = Arc::new(std::sync::Mutex::new(text));
    let clients = Arc::new(AtomicUsize::new(0));
    let thread = std::thread::Builder::new()
        .name("ringfeed-metrics".into())
        .spawn(move || {
            // Blocks in accept until a scrape comes or the drop shuts the
            // socket down (accept then fails and the flag is set).
            // Relaxed: the flag is set before the shutdown that wakes us.
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        // Relaxed: a count of threads, ordered with nothing.
                        if clients.fetch_add(1, Ordering::Relaxed) >= MAX_CLIENTS {
                            clients.fetch_sub(1, Ordering::Relaxed);
                            continue;
                        }
                        let (text, held) = (Arc::clone(&text), Arc::clone(&clients));
                        let spawned = std::thread::Builder::new()
                            .name("ringfeed-metrics-c".into())
                            .spawn(move || {
                                answer(conn, &|| {
                                    let f = text.locked();
                                    f()
                                });
                                held.fetch_sub(1, Ordering::Relaxed);
                            });
                        if spawned.is_err() {
                            clients.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    // Out of descriptors and the like: try again soon.
                    Err(_) if !s.load(Ordering::Relaxed) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(_) => {}
                }
            }
        })?;
    Ok(MetricsServer {
        stop,
        thread: Some(thread),
        addr,
        wake,
    })
}

impl MetricsServer {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// One request: `GET /metrics` gets the text, anything else a 404. The
/// request has [`HEAD_TIME`] in all, whatever pace its bytes come at.
fn answer(mut conn: TcpStream, text: &impl Fn() -> String) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_write_timeout(Some(HEAD_TIME));
    let until = Instant::now() + HEAD_TIME;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let (status, ctype, body) = if line.starts_with("GET ") && target == "/metrics" {
        ("200 OK", "text/plain; version=0.0.4", text())
    } else {
        (
            "404 Not Found",
            "text/plain",
            "only GET /metrics is served\n".to_string(),
        )
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Shutting the listening socket down (through our own descriptor
        // of it, open until this struct is gone) makes a blocked accept
        // return EINVAL on Linux.
        // SAFETY: `wake` is an open socket owned by `self`.
        unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&self.wake), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_text_refuses_other_paths_and_stops_when_dropped() {
        let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let m = {
            let n = Arc::clone(&n);
            serve(0, move || {
                format!("x_total {}\n", n.fetch_add(1, Ordering::Relaxed))
            })
        }
        .unwrap();
        let addr = m.addr();
        assert!(get(addr, "/metrics").ends_with("\r\n\r\nx_total 0\n"));
        assert!(get(addr, "/metrics").ends_with("\r\n\r\nx_total 1\n"));
        assert!(get(addr, "/other").starts_with("HTTP/1.1 404"));
        // The thread blocks in accept: the drop wakes it and returns, and
        // the port no longer answers.
        drop(m);
        assert!(TcpStream::connect(addr).is_err());
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_slow_client_holds_up_no_other() {
        // One client sends its request a byte at a time, on and on (each
        // byte well within any per-read time-out); another's scrape is
        // answered meanwhile, and the slow one has had no answer yet.
        let m = serve(0, || "x_total 1\n".to_string()).unwrap();
        let addr = m.addr();
        let stop = Arc::new(AtomicBool::new(false));
        let mut slow = TcpStream::connect(addr).unwrap();
        let trickle = {
            let (mut c, stop) = (slow.try_clone().unwrap(), Arc::clone(&stop));
            std::thread::spawn(move || {
                for b in b"GET /metrics HTTP/1.1\r\nX-Slow: "
                    .iter()
                    .chain([b'a'; 8000].iter())
                {
                    if stop.load(Ordering::Relaxed) || c.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.ends_with("\r\n\r\nx_total 1\n"), "{out}");
        slow.set_nonblocking(true).unwrap();
        let mut one = [0u8; 1];
        let early = slow.read(&mut one);
        stop.store(true, Ordering::Relaxed);
        trickle.join().unwrap();
        assert!(
            matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the slow client was answered first: {early:?}"
        );
    }
}
