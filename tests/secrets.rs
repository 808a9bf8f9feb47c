//! No secret out. Shards named by presigned-style URLs (an access key id,
//! a session token and a signature in the query string) stream through a
//! server that injects faults (so retries are logged) into a cache; then a
//! missing shard and a URL with a password fail. Every log line (at the
//! most detailed level), every error message, the stats (JSON, notes), the
//! Prometheus text and every byte of every file the cache wrote are
//! searched for the secrets. The control: the same texts do quote those
//! URLs (their paths, and the parameters' names with `REDACTED`), so a
//! search that finds nothing means the values were taken out, not that the
//! URLs were never printed.
//!
//! And out of core dumps: the arena's pages and the pages of the
//! credentials' secrets carry `dd` (`MADV_DONTDUMP`) in
//! `/proc/self/smaps`; the control is a heap allocation, which does not.

use ringfeed_test_support as support;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringfeed::log::Level;
use ringfeed::synth::{GenOptions, generate};
use ringfeed::{Config, Loader, Next};
use support::Server;

const KEY_ID: &str = "AKIASECRETKEYID0TEST";
const TOKEN: &str = "FwoGZXIvYXdzSECRETSESSIONTOKEN";
const SIGNATURE: &str = "5ecre7519e0f4a8c3d2b1a0fedcba9876543210";
const PASSWORD: &str = "hunter2secretpw";

fn presigned(base: &str) -> String {
    format!(
        "{base}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={KEY_ID}%2F20261201%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20261201T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token={TOKEN}\
         &X-Amz-SignedHeaders=host&X-Amz-Signature={SIGNATURE}"
    )
}

/// Every secret that must not appear, with its name for the message.
const SECRETS: &[(&str, &str)] = &[
    ("access key id", KEY_ID),
    ("session token", TOKEN),
    ("signature", SIGNATURE),
    ("password", PASSWORD),
];

fn assert_clean(what: &str, text: &str) {
    for (name, secret) in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} holds the {name}: {}",
            text.chars().take(2000).collect::<String>()
        );
    }
}

fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
}

fn open(v: serde_json::Value) -> ringfeed::Result<Loader> {
    Config::from_map(v.as_object().unwrap()).and_then(Loader::open)
}

#[test]
fn no_credential_of_a_presigned_url_reaches_a_message_a_stat_or_the_cache() {
    let data = tempfile::tempdir().unwrap();
    let seed = 41;
    let opts = GenOptions {
        shards: 3,
        shard_bytes: 400 << 10,
        sample_bytes: 5000,
        spread: 0.3,
        fields: vec!["bin".into(), "cls".into()],
        seed,
    };
    let made = generate(data.path(), &opts, |_| {}).unwrap();
    // Two answers of 503 and a reset mid-body: retries, each logged.
    let server = Server::start(data.path().to_path_buf());
    server.faults.throttle.store(2, Ordering::SeqCst);
    server.faults.reset.store(1, Ordering::SeqCst);
    let urls: Vec<String> = made
        .paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            presigned(&format!("http://{}/{name}", server.addr))
        })
        .collect();

    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let lines = lines.clone();
        ringfeed::log::set(
            Some(Box::new(move |_, msg| {
                lines.lock().unwrap().push(msg.to_string())
            })),
            Level::Debug,
        );
    }
    let cache = tempfile::tempdir().unwrap();
    let loader = open(serde_json::json!({
        "urls": urls,
        "batch_size": 8,
        "cache_dir": cache.path(),
        "cache_fill": "always",
        // The machine's free space is not this test's concern.
        "cache_min_free": "1MiB",
        "stall_timeout_ms": 2000,
    }))
    .unwrap();
    let samples = support::stream(&loader, seed);
    assert_eq!(
        samples as u64, made.samples,
        "every sample, once, its bytes checked"
    );
    let json = serde_json::to_string(&loader.stats()).unwrap();
    let prometheus = ringfeed::engine::prometheus(&json).unwrap();
    loader.close();
    drop(loader);

    // A shard that is not there: an error naming the presigned URL.
    let missing = presigned(&format!("http://{}/no-such-shard.tar", server.addr));
    let not_found = match open(serde_json::json!({"urls": [missing], "batch_size": 8})) {
        Err(e) => e.to_string(),
        Ok(l) => match l.next(Some(Duration::from_secs(60))) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a missing shard gave no error"),
        },
    };
    // A URL with a password before the host.
    let with_password = open(serde_json::json!({
        "urls": [format!("http://reader:{PASSWORD}@{}/x.tar", server.addr)],
        "batch_size": 8,
    }))
    .err()
    .expect("a URL with user information is refused")
    .to_string();
    ringfeed::log::set(None, Level::Error);
    let lines = lines.lock().unwrap().clone();

    let retried = lines.iter().filter(|l| l.contains("retrying")).count();
    assert!(
        retried >= 3,
        "{retried} retries logged of the 3 faults; stats {json}"
    );
    for l in &lines {
        assert_clean("a log line", l);
    }
    assert_clean("the missing shard's error", &not_found);
    assert_clean("the refused URL's error", &with_password);
    assert_clean("the stats", &json);
    assert_clean("the Prometheus text", &prometheus);
    let mut files = Vec::new();
    files_under(cache.path(), &mut files);
    assert!(!files.is_empty(), "the cache wrote nothing");
    let mut named = false;
    for (path, bytes) in &files {
        let text = String::from_utf8_lossy(bytes);
        assert_clean(&format!("cache file {path}"), &text);
        assert_clean("a cache file's name", path);
        named |= text.contains("X-Amz-Signature=REDACTED");
    }

    // The control: the URLs were quoted, their secrets replaced.
    assert!(
        not_found.contains("no-such-shard.tar?") && not_found.contains("X-Amz-Signature=REDACTED"),
        "{not_found}"
    );
    assert!(with_password.contains("REDACTED@"), "{with_password}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("retrying") && l.contains("X-Amz-Security-Token=REDACTED")),
        "no retry line quotes the URL: {lines:?}"
    );
    assert!(
        named,
        "no cache entry names its object by the URL: {:?}; stats {json}",
        files.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>()
    );
}

/// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
fn vm_flags(addr: usize) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            inside = (a..b).contains(&addr);
            continue;
        }
        if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return flags.trim().to_string();
        }
    }
    panic!("no mapping holds {addr:#x}");
}

fn dontdump(addr: usize) -> bool {
    vm_flags(addr).split_whitespace().any(|f| f == "dd")
}

#[test]
fn the_arena_and_the_credentials_stay_out_of_core_dumps() {
    let data = tempfile::tempdir().unwrap();
    let opts = GenOptions {
        shards: 1,
        shard_bytes: 200 << 10,
        sample_bytes: 3000,
        spread: 0.0,
        fields: vec!["bin".into()],
        seed: 2,
    };
    let made = generate(data.path(), &opts, |_| {}).unwrap();
    let loader = open(serde_json::json!({"urls": made.paths, "batch_size": 4})).unwrap();
    let Next::Batch(b) = loader.next(Some(Duration::from_secs(60))).unwrap() else {
        panic!("no batch");
    };
    let sample = b.samples().next().unwrap();
    let at = sample.fields().next().unwrap().1.as_ptr() as usize;
    assert!(dontdump(at), "the arena's pages: {}", vm_flags(at));

    let creds = ringfeed::net::s3::creds::Credentials::new(
        "AKIDEXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        Some("session-token"),
        None,
        "test",
    );
    let secret = creds.secret_storage();
    assert!(secret.in_own_pages());
    let at = secret.as_str().as_ptr() as usize;
    assert!(dontdump(at), "the secret key's pages: {}", vm_flags(at));
    assert_eq!(
        creds.secret_access_key(),
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    );
    let copy = creds.clone();
    assert_eq!(copy, creds);
    assert!(dontdump(copy.secret_storage().as_str().as_ptr() as usize));

    // The control: ordinary heap memory is dumped.
    let heap = vec![7u8; 1 << 20];
    assert!(
        !dontdump(heap.as_ptr() as usize),
        "{}",
        vm_flags(heap.as_ptr() as usize)
    );
}
