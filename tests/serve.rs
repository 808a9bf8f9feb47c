//! The static-file server (`ringfeed::serve`) against real sockets: whole
//! files and byte ranges, `If-Match` (412 once a file changed), HEAD, 404
//! and 416, traversal attempts (plain and
//! percent-encoded), garbage and oversized heads, keep-alive and pipelining,
//! the connection limit, time-outs, shutdown on drop, and ringfeed's own
//! HTTP client streaming a dataset from it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use ringfeed::serve::{ServeOptions, Server};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Loader, Next};

/// A raw HTTP/1.1 client on one connection, keeping bytes read past a response.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    fn connect(server: &Server) -> Client {
        let s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        Client { s, buf: Vec::new() }
    }

    fn send(&mut self, raw: &str) {
        self.s.write_all(raw.as_bytes()).unwrap();
    }

    fn get(&mut self, path: &str, extra: &str) -> Response {
        self.send(&format!("GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n"));
        self.response(false)
    }

    /// Reads what the server sent next; 0 when it closed (EOF or reset).
    /// Waiting out the read time-out is a failure, never a close: a server
    /// that neither answers nor closes must not pass for one that closed.
    fn fill(&mut self) -> usize {
        let mut tmp = [0u8; 65536];
        let n = match self.s.read(&mut tmp) {
            Ok(n) => n,
            Err(e) if closed_by_peer(&e) => 0,
            Err(e) if timed_out(&e) => {
                panic!("the server neither answered nor closed within {READ_TIMEOUT:?}")
            }
            Err(e) => panic!("read: {e}"),
        };
        self.buf.extend_from_slice(&tmp[..n]);
        n
    }

    /// Reads one response; `head_only` for answers to HEAD.
    fn response(&mut self, head_only: bool) -> Response {
        loop {
            let mut hs = [httparse::EMPTY_HEADER; 32];
            let mut r = httparse::Response::new(&mut hs);
            if let httparse::Status::Complete(n) = r.parse(&self.buf).unwrap() {
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let status = r.code.unwrap();
                self.buf.drain(..n);
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .map(|(_, v)| v.parse().unwrap())
                    .unwrap();
                let len = if head_only { 0 } else { len };
                while self.buf.len() < len {
                    assert!(self.fill() > 0, "body cut short");
                }
                let body = self.buf.drain(..len).collect();
                return Response {
                    status,
                    headers,
                    body,
                };
            }
            assert!(self.fill() > 0, "connection closed before a response");
        }
    }

    /// True when the server closed the connection (EOF or reset) with
    /// nothing more sent; false when it sent more bytes instead. Panics
    /// when the read time-out passes first: the server kept the connection
    /// open, which is exactly what the callers assert it does not.
    fn closed(&mut self) -> bool {
        let mut tmp = [0u8; 1];
        match self.s.read(&mut tmp) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if closed_by_peer(&e) => true,
            Err(e) if timed_out(&e) => {
                panic!("the server kept the connection open for {READ_TIMEOUT:?}")
            }
            Err(e) => panic!("read: {e}"),
        }
    }

    /// True once the server has closed the connection, without waiting:
    /// false while it is open with nothing to read.
    fn closed_now(&mut self) -> bool {
        self.s.set_nonblocking(true).unwrap();
        let mut tmp = [0u8; 1];
        let r = self.s.peek(&mut tmp);
        self.s.set_nonblocking(false).unwrap();
        match r {
            Ok(0) => true,
            Ok(_) => panic!("the server sent bytes nobody asked for"),
            Err(e) if closed_by_peer(&e) => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(e) => panic!("peek: {e}"),
        }
    }
}

/// How long a client waits for any answer. Generous: only a server that
/// never answers (or never closes) runs into it, and a loaded CI machine
/// must not.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// A read or write error that means the server closed the connection.
fn closed_by_peer(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

/// What a read returns when `set_read_timeout` expires (EAGAIN on Linux).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn content(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 253) as u8).collect()
}

/// A root with `data.bin` (100 000 bytes), `empty.bin`, `sub/x.tar`, and a
/// `secret.txt` beside (outside) the root.
fn fixture() -> (tempfile::TempDir, std::path::PathBuf) {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("data.bin"), content(100_000)).unwrap();
    std::fs::write(root.join("empty.bin"), b"").unwrap();
    std::fs::write(root.join("sub/x.tar"), b"tar bytes").unwrap();
    std::fs::write(top.path().join("secret.txt"), b"TOP SECRET").unwrap();
    (top, root)
}

fn start(root: &Path, opts: ServeOptions) -> Server {
    Server::bind("127.0.0.1:0", root, opts).unwrap()
}

#[test]
fn whole_files_and_byte_ranges() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let data = content(100_000);
    let mut c = Client::connect(&server);
    let r = c.get("/data.bin", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, data);
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert!(r.header("date").unwrap().ends_with(" GMT"));
    for (range, start, end) in [
        ("bytes=10-19", 10, 19),
        ("bytes=0-0", 0, 0),
        ("bytes=99990-", 99_990, 99_999),
        ("bytes=-5", 99_995, 99_999),
        ("bytes=50000-200000", 50_000, 99_999),
    ] {
        let r = c.get("/data.bin", &format!("Range: {range}\r\n"));
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.header("content-range").unwrap(),
            format!("bytes {start}-{end}/100000"),
            "{range}"
        );
        assert_eq!(r.body, &data[start..=end], "{range}");
    }
    // Several ranges are allowed to be answered with the whole file.
    let r = c.get("/data.bin", "Range: bytes=0-1,5-6\r\n");
    assert_eq!((r.status, r.body.len()), (200, 100_000));
    let r = c.get("/sub/x.tar", "");
    assert_eq!(r.body, b"tar bytes");
    assert_eq!(r.header("content-type"), Some("application/x-tar"));
    let r = c.get("/empty.bin", "");
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(server.stats().connections, 1);
}

/// A client reading a file in several ranges pins them to its ETag: a
/// rewrite of the same size between two ranges gets 412, not the new bytes.
#[test]
fn if_match_answers_412_once_the_file_changed() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let mut c = Client::connect(&server);
    let r = c.get("/data.bin", "Range: bytes=0-9\r\n");
    let etag = r.header("etag").unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let pinned = format!("Range: bytes=10-19\r\nIf-Match: {etag}\r\n");
    let r = c.get("/data.bin", &pinned);
    assert_eq!((r.status, &r.body[..]), (206, &content(100_000)[10..20]));
    let r = c.get("/data.bin", "Range: bytes=10-19\r\nIf-Match: *\r\n");
    assert_eq!(r.status, 206);
    // Rewritten whole, as a store replaces an object: same size, new bytes.
    let tmp = root.join("data.bin.new");
    std::fs::write(&tmp, vec![7u8; 100_000]).unwrap();
    std::fs::rename(&tmp, root.join("data.bin")).unwrap();
    let r = c.get("/data.bin", &pinned);
    assert_eq!(r.status, 412);
    assert!(!r.body.contains(&7), "bytes of the new version");
    let weak = format!("Range: bytes=10-19\r\nIf-Match: W/{etag}\r\n");
    assert_eq!(c.get("/data.bin", &weak).status, 412);
    let r = c.get("/data.bin", "Range: bytes=10-19\r\n");
    assert_eq!((r.status, &r.body[..]), (206, &[7u8; 10][..]));
    assert_ne!(r.header("etag").unwrap(), etag);
}

#[test]
fn head_gives_the_size_without_a_body() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let mut c = Client::connect(&server);
    c.send("HEAD /data.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.response(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100000"));
    // No body followed: the next response starts right away.
    let r = c.get("/sub/x.tar", "");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"tar bytes"[..]));
    c.send("HEAD /missing HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.response(true).status, 404);
    assert_eq!(c.get("/data.bin", "Range: bytes=0-3\r\n").body.len(), 4);
}

#[test]
fn missing_files_are_404_and_unsatisfiable_ranges_416() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let mut c = Client::connect(&server);
    let r = c.get("/nope.tar", "");
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(&r.body).contains("Not Found"));
    assert_eq!(c.get("/sub", "").status, 404, "a directory is not a file");
    assert_eq!(c.get("/data.bin/x", "").status, 404);
    for range in ["bytes=100000-100010", "bytes=100000-", "bytes=-0"] {
        let r = c.get("/data.bin", &format!("Range: {range}\r\n"));
        assert_eq!(r.status, 416, "{range}");
        assert_eq!(r.header("content-range"), Some("bytes */100000"));
    }
    assert_eq!(c.get("/empty.bin", "Range: bytes=0-0\r\n").status, 416);
    // Errors with a well-framed request keep the connection.
    assert_eq!(c.get("/data.bin", "").status, 200);
    assert_eq!(server.stats().connections, 1);
}

#[test]
fn traversal_attempts_are_refused() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    for target in [
        "/../secret.txt",
        "/sub/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E%2Fsecret.txt",
        "/sub/..%2f..%2fsecret.txt",
        "/sub/%2e%2e/%2e%2e/secret.txt",
        "/..",
        "/data.bin%00.tar",
    ] {
        let mut c = Client::connect(&server);
        let r = c.get(target, "");
        assert_eq!(r.status, 403, "{target}");
        assert!(!String::from_utf8_lossy(&r.body).contains("TOP SECRET"));
    }
    for target in ["secret.txt", "http://t/../secret.txt", "/%zz", "/a%2"] {
        let mut c = Client::connect(&server);
        let r = c.get(target, "");
        assert_eq!(r.status, 400, "{target}");
        assert!(c.closed(), "{target}");
    }
    // Encoded names that stay inside are served.
    std::fs::write(root.join("a b.tar"), b"spaced").unwrap();
    let mut c = Client::connect(&server);
    assert_eq!(c.get("/sub/./../a%20b.tar", "").status, 403);
    assert_eq!(c.get("/./a%20b.tar?v=1", "").body, b"spaced");
}

#[test]
fn garbage_gets_400_and_a_closed_connection() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    for raw in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"[..],
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET /data.bin HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /data.bin HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /data.bin HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let mut c = Client::connect(&server);
        c.s.write_all(raw).unwrap();
        let r = c.response(false);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(raw));
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed());
    }
    let mut c = Client::connect(&server);
    c.send("DELETE /data.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.response(false);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[test]
fn oversized_heads_get_431() {
    let (_top, root) = fixture();
    let server = start(
        &root,
        ServeOptions {
            max_head: 4096,
            ..ServeOptions::default()
        },
    );
    let mut c = Client::connect(&server);
    c.send(&format!(
        "GET /data.bin HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    ));
    assert_eq!(c.response(false).status, 431);
    assert!(c.closed());
    // Also when the head never ends.
    let mut c = Client::connect(&server);
    c.send(&format!("GET /{}", "a".repeat(5000)));
    assert_eq!(c.response(false).status, 431);
    let mut c = Client::connect(&server);
    let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
    c.send(&format!("GET / HTTP/1.1\r\n{many}\r\n"));
    assert_eq!(c.response(false).status, 431);
    // A head just under the limit is fine.
    let mut c = Client::connect(&server);
    let r = c.get("/sub/x.tar", &format!("X-Pad: {}\r\n", "p".repeat(3900)));
    assert_eq!(r.status, 200);
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let data = content(100_000);
    let mut c = Client::connect(&server);
    for i in 0..3 {
        let r = c.get("/data.bin", &format!("Range: bytes={i}-{}\r\n", i + 999));
        assert_eq!(r.body, &data[i..i + 1000]);
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    // Pipelined: two requests in one write, answered in order.
    c.send(
        "GET /sub/x.tar HTTP/1.1\r\nHost: t\r\n\r\n\
         GET /data.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=5-9\r\n\r\n",
    );
    assert_eq!(c.response(false).body, b"tar bytes");
    assert_eq!(c.response(false).body, &data[5..10]);
    let s = server.stats();
    assert_eq!((s.connections, s.requests), (1, 5));
    // `Connection: close` and HTTP/1.0 end the connection after the answer.
    let r = c.get("/sub/x.tar", "Connection: close\r\n");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
    let mut c = Client::connect(&server);
    c.send("GET /sub/x.tar HTTP/1.0\r\n\r\n");
    assert_eq!(c.response(false).body, b"tar bytes");
    assert!(c.closed());
}

#[test]
fn idle_and_slow_clients_are_dropped() {
    let (_top, root) = fixture();
    let server = start(
        &root,
        ServeOptions {
            idle_timeout: Duration::from_millis(200),
            head_timeout: Duration::from_millis(300),
            ..ServeOptions::default()
        },
    );
    let mut c = Client::connect(&server);
    assert_eq!(c.get("/sub/x.tar", "").status, 200);
    assert!(c.closed(), "idle keep-alive connection closed");
    // A head trickled in: one byte every 50 ms keeps every gap under both
    // time-outs, so only the head's total time (300 ms) can end it. A
    // server that restarted the clock on each byte would take the whole
    // 10 s trickle without closing.
    let mut c = Client::connect(&server);
    c.send("GET /sub/x.tar HTTP/1.1\r\nX-Slow: ");
    let mut closed = false;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(50));
        if c.closed_now() {
            closed = true;
            break;
        }
        match c.s.write_all(b"a") {
            Ok(()) => {}
            Err(e) if closed_by_peer(&e) => {
                closed = true;
                break;
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(closed, "a head trickled in for 10 s was not cut off");
}

#[test]
fn connections_over_the_limit_get_503_until_a_slot_frees() {
    let (_top, root) = fixture();
    let server = start(
        &root,
        ServeOptions {
            max_connections: 1,
            ..ServeOptions::default()
        },
    );
    let mut first = Client::connect(&server);
    assert_eq!(first.get("/sub/x.tar", "").status, 200);
    let mut second = Client::connect(&server);
    let r = second.get("/sub/x.tar", "");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(server.stats().refused_busy, 1);
    drop(first);
    // The slot frees once the first connection's thread has seen the close.
    let mut status = 0;
    for _ in 0..1000 {
        status = Client::connect(&server).get("/sub/x.tar", "").status;
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(status, 200);
}

#[test]
fn dropping_the_server_closes_connections_and_the_port() {
    let (_top, root) = fixture();
    let server = start(&root, ServeOptions::default());
    let addr = server.addr();
    let mut idle = Client::connect(&server);
    assert_eq!(idle.get("/sub/x.tar", "").status, 200);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(server);
        tx.send(()).unwrap();
    });
    // Generous: only a hang fails this.
    rx.recv_timeout(Duration::from_secs(20))
        .expect("drop returned");
    assert!(idle.closed());
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn bind_errors_name_the_problem() {
    let (_top, root) = fixture();
    let e = Server::bind("127.0.0.1:0", root.join("missing"), ServeOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("missing"), "{e}");
    let server = start(&root, ServeOptions::default());
    let taken = server.addr().to_string();
    let e = Server::bind(&taken, &root, ServeOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains(&taken), "{e}");
}

#[test]
fn ringfeed_streams_a_dataset_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = GenOptions {
        shards: 3,
        shard_bytes: 2 << 20,
        sample_bytes: 50_000,
        seed: 5,
        ..GenOptions::default()
    };
    let r = synth::generate(dir.path(), &o, |_| {}).unwrap();
    let server = start(dir.path(), ServeOptions::default());
    let url = format!("{}shard-{{000000..000002}}.tar", server.url());
    let loader = Loader::open_json(
        &serde_json::json!({
            "urls": url, "memory_budget": "16MiB", "chunk_size": "512KiB",
            "workers": 2, "batch_size": 8,
        })
        .to_string(),
    )
    .unwrap();
    let mut samples = 0;
    loop {
        match loader.next(Some(Duration::from_secs(60))).unwrap() {
            Next::Batch(b) => {
                for s in b.samples() {
                    for (name, data) in s.fields() {
                        assert!(synth::verify(5, s.key(), name, data));
                    }
                    samples += 1;
                }
            }
            Next::EndOfEpoch(_) => {}
            Next::Finished => break,
            Next::Timeout => panic!("stalled"),
        }
    }
    assert_eq!(samples, r.samples);
    let s = server.stats();
    assert!(s.requests >= 3 + 12, "HEADs and ranged GETs: {s:?}");
    assert!(s.body_bytes >= r.file_bytes, "{s:?}");
}
