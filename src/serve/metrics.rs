//! A scrape endpoint: metrics (Prometheus text, made when asked) served at
//! `http://127.0.0.1:PORT/metrics` (or another address: a node engine in
//! a pod is scraped from outside it) until the [`MetricsServer`] is
//! dropped — the CLI's `--metrics-port` for a running loader, and the node
//! engine's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

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
    let thread = std::thread::Builder::new()
        .name("ringfeed-metrics".into())
        .spawn(move || {
            // Blocks in accept until a scrape comes or the drop shuts the
            // socket down (accept then fails and the flag is set).
            // Relaxed: the flag is set before the shutdown that wakes us.
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => answer(conn, &text),
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

/// One request: `GET /metrics` gets the text, anything else a 404.
fn answer(mut conn: TcpStream, text: &impl Fn() -> String) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
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
}
