//! Web-identity credentials (IRSA on EKS: a projected service-account
//! token in a file, exchanged at STS by AssumeRoleWithWebIdentity) that
//! expire every few seconds, over a minute of streaming. A local STS
//! answers with keys the S3 test server takes for 6 s each and then
//! refuses with `ExpiredToken`; the token file is rotated every 4 s, as
//! the kubelet rotates it, and the STS accepts only the current token and
//! the one before. A loader reading slowly for a minute refreshes many
//! times, reading the file anew each time, and delivers every sample
//! once, every byte checked, with no request refused. The control: the
//! STS refuses a token two rotations old, by name.
//!
//! The loader finds its credentials through the process environment, so
//! this binary holds this one test, which sets the environment before any
//! other thread starts.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ringfeed_test_support as support;

use support::refresh::{AWS_VARS, config, dataset, stream_slowly};
use support::s3::S3Server;

use ringfeed::Loader;

/// Each key's life on the server.
const LIFETIME: Duration = Duration::from_secs(6);
/// How often the token file is replaced.
const ROTATION: Duration = Duration::from_secs(4);
const ROLE: &str = "arn:aws:iam::123456789012:role/ringfeed-training";

/// The STS's view: the tokens written so far (the last is current) and
/// the tokens it was shown.
#[derive(Default)]
struct Tokens {
    written: Vec<String>,
    shown: Vec<String>,
}

/// `query`'s parameter `name`, percent-decoded.
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            let mut out = Vec::new();
            let b = v.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' && i + 2 < b.len() {
                    out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap_or(b'?'));
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        })
    })
}

/// Writes token `n` to `file` as the kubelet does (a new file renamed
/// over the old). The STS knows the token before the file shows it, as a
/// token is valid once issued: recorded after the rename, a loader that
/// read the new file at once had it refused as unknown (seen once, on a
/// busy machine).
fn write_token(file: &Path, tokens: &Mutex<Tokens>, n: usize) {
    let token = format!("eyJhbGciOiJSUzI1NiJ9.token-{n}.signature");
    tokens.lock().unwrap().written.push(token.clone());
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, &token).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// A local STS: AssumeRoleWithWebIdentity of `ROLE` with the current or
/// the previous token gets a new key from `s3`, living `LIFETIME`; any
/// other token an `InvalidIdentityToken` error. Returns its URL and the
/// count of keys issued.
fn sts(s3: Arc<S3Server>, tokens: Arc<Mutex<Tokens>>) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let issued = Arc::new(AtomicU64::new(0));
    let n = Arc::clone(&issued);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut b = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&b[..k]),
                }
            }
            let head = String::from_utf8_lossy(&head);
            let target = head.split(' ').nth(1).unwrap_or("");
            let query = target.split_once('?').map_or("", |(_, q)| q);
            let token = param(query, "WebIdentityToken").unwrap_or_default();
            let ok = {
                let mut t = tokens.lock().unwrap();
                t.shown.push(token.clone());
                let w = &t.written;
                param(query, "Action").as_deref() == Some("AssumeRoleWithWebIdentity")
                    && param(query, "RoleArn").as_deref() == Some(ROLE)
                    && w.iter().rev().take(2).any(|x| *x == token)
            };
            let (status, body) = if ok {
                let i = n.fetch_add(1, Ordering::Relaxed);
                let (id, secret) = s3.issue_key(i, LIFETIME);
                let expires = support::iso(SystemTime::now() + LIFETIME);
                (
                    "200 OK",
                    format!(
                        "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
                         <AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{id}</AccessKeyId>\
                         <SecretAccessKey>{secret}</SecretAccessKey><SessionToken>session-{i}</SessionToken>\
                         <Expiration>{expires}</Expiration></Credentials></AssumeRoleWithWebIdentityResult>\
                         </AssumeRoleWithWebIdentityResponse>"
                    ),
                )
            } else {
                (
                    "400 Bad Request",
                    "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>\
                     <Message>The web identity token is not valid</Message></Error></ErrorResponse>"
                        .to_string(),
                )
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, issued)
}

#[test]
fn web_identity_credentials_are_refreshed_with_the_rotated_token_over_a_minute_of_streaming() {
    let home = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let samples = dataset(root.path());
    let s3 = Arc::new(S3Server::start(root.path()));
    let tokens = Arc::new(Mutex::new(Tokens::default()));
    let token_file: PathBuf = home.path().join("token");
    write_token(&token_file, &tokens, 0);
    let (url, issued) = sts(Arc::clone(&s3), Arc::clone(&tokens));
    // The kubelet's rotation, until the test ends.
    let done = Arc::new(AtomicBool::new(false));
    let rotator = {
        let (file, tokens, done) = (token_file.clone(), Arc::clone(&tokens), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut n = 1;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(ROTATION);
                write_token(&file, &tokens, n);
                n += 1;
            }
        })
    };
    // Only web identity is configured.
    // SAFETY: the only test of this binary, before any thread of its own
    // reads the environment (the servers' threads never do).
    unsafe {
        for k in AWS_VARS {
            std::env::remove_var(k);
        }
        std::env::set_var("HOME", home.path());
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file);
        std::env::set_var("AWS_ROLE_ARN", ROLE);
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT_URL_STS", &url);
    }

    let loader = Loader::open(config(&s3, serde_json::json!({}))).unwrap();
    let seen = stream_slowly(&loader);
    let t = tokens.lock().unwrap();
    let mut distinct = t.shown.clone();
    distinct.sort();
    distinct.dedup();
    eprintln!(
        "{seen} samples; {} STS exchanges, {} keys issued, {} used; {} tokens written, {} of them shown",
        t.shown.len(),
        issued.load(Ordering::Relaxed),
        s3.keys_used(),
        t.written.len(),
        distinct.len()
    );
    assert_eq!(seen, samples);
    // Refreshed all along, with the token of the moment, each key used,
    // none past its life, and the STS never refused.
    assert!(
        issued.load(Ordering::Relaxed) >= 10,
        "{} keys",
        issued.load(Ordering::Relaxed)
    );
    assert_eq!(
        t.shown.len() as u64,
        issued.load(Ordering::Relaxed),
        "a token refused"
    );
    assert!(
        distinct.len() >= 5,
        "the token file was not read anew: {distinct:?}"
    );
    assert!(s3.keys_used() >= 10, "{} keys used", s3.keys_used());
    assert_eq!(s3.expired_refusals(), 0);
    let stale = t.written[0].clone();
    drop(t);
    done.store(true, Ordering::Relaxed);
    rotator.join().unwrap();

    // Control: a token two rotations old is refused by the STS, and the
    // loader says so by name.
    std::fs::write(&token_file, stale).unwrap();
    let e = support::first_error(config(&s3, serde_json::json!({})));
    let m = e.to_string();
    assert!(m.contains("InvalidIdentityToken"), "{m}");
}
