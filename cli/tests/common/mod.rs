//! What several CLI test binaries share: finding a command's metrics
//! endpoint in its stderr, and a plain HTTP GET.

use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

/// Reads `stderr` until the `metrics: http://ADDR/metrics` line a command
/// prints with `--metrics-port`; gives ADDR. The rest of `stderr` is read
/// on a thread to its end, so the command never writes into a closed pipe.
pub fn metrics_address(stderr: impl Read + Send + 'static) -> String {
    let mut err = BufReader::new(stderr);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no metrics address printed"
        );
        if let Some(url) = line.trim().strip_prefix("metrics: ") {
            let addr = url
                .trim_start_matches("http://")
                .trim_end_matches("/metrics")
                .to_string();
            std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
            return addr;
        }
    }
}

/// `GET path` from `addr`: the whole response, head and body.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp
}
