//! Credentials that expire every few seconds, over a minute of streaming:
//! a container credentials endpoint (as ECS and EKS Pod Identity serve)
//! hands out keys that the S3 test server takes for 6 s each and then
//! refuses with `ExpiredToken`; a loader reading slowly for a minute
//! refreshes them many times and delivers every sample once, every byte
//! checked, with no request refused. The control: the first key, given as
//! fixed credentials once it has expired, is refused by name.
//!
//! The loader finds its credentials through the process environment, so
//! this binary holds this one test, which sets the environment before any
//! other thread starts.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ringfeed_test_support as support;

use support::refresh::{AWS_VARS, config, dataset, stream_slowly};
use support::s3::S3Server;

use ringfeed::{Error, Loader};

/// Each key's life on the server: a few seconds, so a minute of streaming
/// needs about twenty refreshes (each due at half the life).
const LIFETIME: Duration = Duration::from_secs(6);

/// The keys an endpoint issued, in order: (access key id, secret).
type Issued = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A container credentials endpoint: each request gets a new key from
/// `s3`, living `LIFETIME` (its `Expiration` rounded down to the second,
/// so the loader never thinks a key lives longer than the server does).
/// Returns its URL and the keys issued, in order.
fn credentials_endpoint(s3: Arc<S3Server>) -> (String, Issued) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/creds", listener.local_addr().unwrap());
    let issued = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&issued);
    let n = AtomicU64::new(0);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&b[..k]),
                }
            }
            let i = n.fetch_add(1, Ordering::Relaxed);
            let expires = SystemTime::now() + LIFETIME;
            let (id, secret) = s3.issue_key(i, LIFETIME);
            log.lock().unwrap().push((id.clone(), secret.clone()));
            let body = format!(
                r#"{{"AccessKeyId":"{id}","SecretAccessKey":"{secret}","Token":"token-{i}","Expiration":"{}"}}"#,
                support::iso(expires)
            );
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, issued)
}

#[test]
fn credentials_expiring_every_few_seconds_are_refreshed_over_a_minute_of_streaming() {
    let home = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let samples = dataset(root.path());
    let s3 = Arc::new(S3Server::start(root.path()));
    let (url, issued) = credentials_endpoint(Arc::clone(&s3));
    // Only the container source is configured: no keys, profile or web
    // identity from the machine running the test.
    // SAFETY: the only test of this binary, before any thread of its own
    // reads the environment (the servers' threads never do).
    unsafe {
        for k in AWS_VARS {
            std::env::remove_var(k);
        }
        std::env::set_var("HOME", home.path());
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_CONTAINER_CREDENTIALS_FULL_URI", &url);
    }

    let loader = Loader::open(config(&s3, serde_json::json!({}))).unwrap();
    let seen = stream_slowly(&loader);
    assert_eq!(seen, samples);
    let keys = issued.lock().unwrap().clone();
    eprintln!(
        "{} samples; {} keys issued, {} used",
        seen,
        keys.len(),
        s3.keys_used()
    );
    // Refreshed all along, each key used, none used past its life.
    assert!(keys.len() >= 10, "{} keys issued", keys.len());
    assert!(s3.keys_used() >= 10, "{} keys used", s3.keys_used());
    assert_eq!(s3.expired_refusals(), 0);

    // Control: the first key, long expired, as fixed credentials: the
    // server refuses it, by name.
    let (id, secret) = keys[0].clone();
    let e = support::first_error(config(
        &s3,
        serde_json::json!({"aws_access_key_id": id, "aws_secret_access_key": secret,
                           "aws_session_token": "token-0"}),
    ));
    assert!(
        matches!(&e, Error::S3 { code, .. } if code == "ExpiredToken"),
        "{e}"
    );
    assert!(s3.expired_refusals() > 0);
}
