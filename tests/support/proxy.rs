//! A fault-injecting HTTP proxy in front of any test server (`Proxy`).

use super::*;

/// A fault-injecting HTTP proxy on 127.0.0.1 in front of any HTTP server
/// (the S3 test server too): requests go upstream unchanged; the responses
/// to GETs come back with the faults in `faults` (503 bursts without asking
/// upstream, resets and truncation mid-body, stalls, slow drip).
pub struct Proxy {
    pub addr: SocketAddr,
    pub faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let faults = Arc::new(Faults::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (Arc::clone(&faults), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    let _ = proxy_conn(conn, upstream, &f);
                });
            }
        });
        Proxy { addr, faults, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn proxy_conn(mut client: TcpStream, upstream: SocketAddr, f: &Faults) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut up = TcpStream::connect(upstream)?;
    let mut req = Vec::new();
    loop {
        let Some(n) = read_head(&mut client, &mut req, false) else {
            return Ok(());
        };
        let head: Vec<u8> = req.drain(..n).collect();
        let is_get = head.starts_with(b"GET ");
        if is_get {
            f.gets.fetch_add(1, Ordering::SeqCst);
        }
        let (drawn, stall_ms) = match f.random.lock().unwrap().as_mut() {
            Some(r) if is_get => (r.draw(), r.stall_ms),
            _ => (None, 0),
        };
        let stall = || std::thread::sleep(Duration::from_millis(stall_ms));
        match drawn {
            Some("slow_down_503") => {
                error_answer(&mut client, "503 Slow Down", SLOW_DOWN)?;
                continue;
            }
            Some("internal_error_500") => {
                let body = b"<Error><Code>InternalError</Code></Error>";
                error_answer(&mut client, "500 Internal Server Error", body)?;
                continue;
            }
            Some("reset_before_head") => {
                reset_on_close(client.as_raw_fd());
                return Ok(());
            }
            Some("stalled_before_head") => {
                stall();
                return Ok(());
            }
            _ => {}
        }
        if is_get && take(&f.throttle) {
            error_answer(&mut client, "503 Slow Down", SLOW_DOWN)?;
            continue;
        }
        up.write_all(&head)?;
        let mut resp = Vec::new();
        let Some(hn) = read_head(&mut up, &mut resp, true) else {
            return Ok(());
        };
        let len = if head.starts_with(b"HEAD ") {
            0
        } else {
            content_length(&resp[..hn])
        };
        while resp.len() < hn + len {
            let mut tmp = vec![0u8; 1 << 16];
            let n = up.read(&mut tmp)?;
            if n == 0 {
                break;
            }
            resp.extend_from_slice(&tmp[..n]);
        }
        let (rhead, body) = resp.split_at(hn);
        let body = &body[..len.min(body.len())];
        let half = body.len() / 2;
        match drawn {
            Some("reset_before_body") => {
                client.write_all(rhead)?;
                reset_on_close(client.as_raw_fd());
                return Ok(());
            }
            Some("reset_mid_body") => {
                client.write_all(rhead)?;
                client.write_all(&body[..half])?;
                reset_on_close(client.as_raw_fd());
                return Ok(());
            }
            Some("truncated_body") => {
                client.write_all(rhead)?;
                client.write_all(&body[..half])?;
                return client.shutdown(std::net::Shutdown::Both);
            }
            Some("stalled_mid_body") => {
                client.write_all(rhead)?;
                client.write_all(&body[..half])?;
                stall();
                return Ok(());
            }
            Some("slow_drip") => {
                client.write_all(rhead)?;
                for piece in body.chunks(16 << 10) {
                    client.write_all(piece)?;
                    std::thread::sleep(Duration::from_micros(200));
                }
                continue;
            }
            Some(kind @ ("wrong_content_range" | "wrong_content_length")) => {
                // The head with one header changed, then the whole body; the
                // connection is closed after (its framing is not to be trusted).
                let text = String::from_utf8_lossy(rhead).into_owned();
                let changed: Vec<String> = text
                    .split("\r\n")
                    .map(|line| {
                        let lower = line.to_ascii_lowercase();
                        if kind == "wrong_content_range" && lower.starts_with("content-range:") {
                            shift_range(line)
                        } else if kind == "wrong_content_length"
                            && lower.starts_with("content-length:")
                        {
                            format!("Content-Length: {}", body.len() + 1)
                        } else {
                            line.to_string()
                        }
                    })
                    .collect();
                client.write_all(changed.join("\r\n").as_bytes())?;
                client.write_all(body)?;
                return client.shutdown(std::net::Shutdown::Both);
            }
            _ => {}
        }
        client.write_all(rhead)?;
        if is_get && take(&f.reset) {
            client.write_all(&body[..half])?;
            reset_on_close(client.as_raw_fd());
            return Ok(());
        }
        if is_get && take(&f.truncate) {
            client.write_all(&body[..half])?;
            return client.shutdown(std::net::Shutdown::Both);
        }
        if is_get && take(&f.stall) {
            client.write_all(&body[..half])?;
            std::thread::sleep(Duration::from_millis(
                f.stall_ms.load(Ordering::SeqCst) as u64
            ));
            return Ok(());
        }
        if f.drip.load(Ordering::SeqCst) {
            for piece in body.chunks(4096) {
                client.write_all(piece)?;
                std::thread::sleep(Duration::from_micros(100));
            }
        } else {
            client.write_all(body)?;
        }
    }
}
