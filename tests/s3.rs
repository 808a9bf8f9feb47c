//! S3 end to end against a real S3-compatible server started in this
//! process (s3s with the s3s-fs backend, SigV4 verification on): signed
//! ranged GETs of `s3://` shards with brace expansion, a prefix listed with
//! ListObjectsV2 (paginated), a manifest, and the errors a user meets
//! (wrong secret, missing key, missing bucket) named with S3's code, never
//! with a credential. The server is `support::s3`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ringfeed_test_support as support;

use support::s3::{ACCESS_KEY, S3Server, SECRET_KEY};
use support::stream;

use ringfeed::net::NetOptions;
use ringfeed::net::retry::Jitter;
use ringfeed::net::s3::list::S3Client;
use ringfeed::net::s3::{Env, S3Config};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};

const BUCKET: &str = "ringfeed-data";

#[path = "s3/split.rs"]
mod split;

/// Three shards in `root/BUCKET/` and the same three under
/// `root/BUCKET/train/` next to a file that is not a shard.
fn dataset(root: &Path, seed: u64) -> (Vec<(String, u64)>, usize) {
    let bucket = root.join(BUCKET);
    let o = GenOptions {
        shards: 3,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(&bucket, &o, |_| {}).unwrap();
    std::fs::create_dir_all(bucket.join("train")).unwrap();
    let mut names = Vec::new();
    for p in &r.paths {
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        std::fs::copy(p, bucket.join("train").join(&name)).unwrap();
        names.push((name, std::fs::metadata(p).unwrap().len()));
    }
    std::fs::write(bucket.join("train/README.txt"), b"not a shard").unwrap();
    (names, r.samples as usize)
}

fn config(server: &S3Server, urls: &[String], extra: serde_json::Value) -> Config {
    let mut m = serde_json::Map::new();
    m.insert("urls".into(), serde_json::json!(urls));
    m.insert("memory_budget".into(), serde_json::json!("16MiB"));
    m.insert("chunk_size".into(), serde_json::json!("256KiB"));
    m.insert("batch_size".into(), serde_json::json!(5));
    m.insert("workers".into(), serde_json::json!(2));
    m.insert("s3_endpoint".into(), serde_json::json!(server.endpoint()));
    if extra.get("s3_unsigned").is_none() {
        m.insert("aws_access_key_id".into(), serde_json::json!(ACCESS_KEY));
        m.insert(
            "aws_secret_access_key".into(),
            serde_json::json!(SECRET_KEY),
        );
    }
    if let serde_json::Value::Object(e) = extra {
        m.extend(e);
    }
    Config::from_map(&m).unwrap()
}

fn open_err(cfg: Config) -> Error {
    support::first_error(cfg)
}

#[test]
fn s3_shards_by_braces_listing_and_manifest_stream_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let (names, samples) = dataset(root.path(), 31);
    let server = S3Server::start(root.path());

    // Brace expansion, signed HEADs and ranged GETs, on both backends.
    for backend in ["threads", "io_uring"] {
        let url = format!("s3://{BUCKET}/shard-{{000000..000002}}.tar");
        let loader = Loader::open(config(
            &server,
            &[url],
            serde_json::json!({"io_backend": backend}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 31), samples, "{backend}");
        assert!(loader.stats().retries.values().all(|&n| n == 0));
    }

    // A prefix: listed, only the .tar keys, sizes from the listing.
    let loader = Loader::open(config(
        &server,
        &[format!("s3://{BUCKET}/train/")],
        serde_json::json!({}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 31), samples);

    // A manifest with sizes (no HEAD) and one without.
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("train.manifest");
    let mut text = String::from("# three shards\n");
    for (i, (name, size)) in names.iter().enumerate() {
        if i == 0 {
            text.push_str(&format!("s3://{BUCKET}/train/{name}\n"));
        } else {
            text.push_str(&format!("s3://{BUCKET}/train/{name} {size}  # sized\n"));
        }
    }
    std::fs::write(&manifest, text).unwrap();
    let loader = Loader::open(config(
        &server,
        &[manifest.display().to_string()],
        serde_json::json!({}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 31), samples);
    let mut m = serde_json::Map::new();
    m.insert(
        "manifest".into(),
        serde_json::json!(manifest.display().to_string()),
    );
    let loader = Loader::open(config(&server, &[], serde_json::Value::Object(m))).unwrap();
    assert_eq!(stream(&loader, 31), samples);
}

#[test]
fn keys_that_need_encoding_are_signed_as_s3_verifies_them() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 34);
    let odd = root.path().join(BUCKET).join("odd dir=1");
    std::fs::create_dir_all(&odd).unwrap();
    let src = root.path().join(BUCKET).join(&names[0].0);
    std::fs::copy(&src, odd.join("a b+c~ü.tar")).unwrap();
    // The samples the copied shard holds, by its own members (one `.jpg`
    // each).
    let expected = tar::Archive::new(std::fs::File::open(&src).unwrap())
        .entries()
        .unwrap()
        .filter(|e| {
            let e = e.as_ref().unwrap();
            e.path().unwrap().to_string_lossy().ends_with(".jpg")
        })
        .count();
    let server = S3Server::start(root.path());
    let one = |url: String| {
        let loader = Loader::open(config(&server, &[url], serde_json::json!({}))).unwrap();
        let n = stream(&loader, 34);
        assert_eq!(n, expected);
        n
    };
    let direct = one(format!("s3://{BUCKET}/odd dir=1/a b+c~ü.tar"));
    let listed = one(format!("s3://{BUCKET}/odd dir=1/"));
    assert_eq!(direct, listed);
}

#[test]
fn listing_follows_continuation_tokens() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 32);
    let server = S3Server::start(root.path());
    let cfg = S3Config {
        endpoint: Some(server.endpoint()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..Default::default()
    };
    let client = S3Client::new(&cfg, &Env::default()).unwrap();
    let debug = format!("{client:?}");
    assert!(!debug.contains(SECRET_KEY), "{debug}");
    let net = NetOptions {
        stall: Duration::from_secs(5),
        retry: Default::default(),
        stats: Default::default(),
        tls: Default::default(),
        pace: Default::default(),
    };
    let listed = client
        .list(BUCKET, "train/", false, 1, &net, &mut Jitter::new(1))
        .unwrap();
    let mut want: Vec<(String, u64)> = names
        .iter()
        .map(|(n, s)| (format!("train/{n}"), *s))
        .collect();
    want.push(("train/README.txt".into(), 11));
    want.sort();
    assert_eq!(listed, want);
    // One key per page: four pages, three continuation tokens.
    assert_eq!(net.stats.requests.load(Ordering::Relaxed), 4);
}

/// Keys at several depths, and what each URL form takes of them.
#[test]
fn prefixes_list_every_depth_and_patterns_pick_keys_in_name_order() {
    let root = tempfile::tempdir().unwrap();
    let b = root.path().join(BUCKET);
    for key in [
        "train/s-3.tar",
        "train/s-3.idx",
        "train/a/s-0.tar",
        "train/a/s-1.tar",
        "train/a/b/s-2.tar",
        "train/x/other.tar",
        "val/s-9.tar",
    ] {
        let p = b.join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, key.as_bytes()).unwrap();
    }
    let server = S3Server::start(root.path());
    let resolve = |url: &str, suffix: Option<&str>| {
        let cfg = S3Config {
            endpoint: Some(server.endpoint()),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
            suffix: suffix.map(str::to_string),
            ..Default::default()
        };
        let net = NetOptions {
            stall: Duration::from_secs(5),
            retry: Default::default(),
            stats: Default::default(),
            tls: Default::default(),
            pace: Default::default(),
        };
        ringfeed::dataset::resolve_with(&[url.to_string()], None, &net, &cfg, &Env::default())
    };
    let keys = |url: &str, suffix: Option<&str>| -> Vec<String> {
        let shards = resolve(url, suffix).unwrap_or_else(|e| panic!("{url}: {e}"));
        let strip = format!("s3://{BUCKET}/");
        shards
            .iter()
            .map(|s| s.name.strip_prefix(&strip).unwrap().to_string())
            .collect()
    };
    let u = |k: &str| format!("s3://{BUCKET}/{k}");
    // A prefix: every depth, `.tar` only, in key order (as S3 lists).
    assert_eq!(
        keys(&u("train/"), None),
        [
            "train/a/b/s-2.tar",
            "train/a/s-0.tar",
            "train/a/s-1.tar",
            "train/s-3.tar",
            "train/x/other.tar"
        ]
    );
    // `*` stays in its directory; `**/` spans any number of them, none included.
    assert_eq!(keys(&u("train/*.tar"), None), ["train/s-3.tar"]);
    assert_eq!(
        keys(&u("train/**/s-*.tar"), None),
        [
            "train/a/b/s-2.tar",
            "train/a/s-0.tar",
            "train/a/s-1.tar",
            "train/s-3.tar"
        ]
    );
    assert_eq!(keys(&u("train/a/s-[!0].tar"), None), ["train/a/s-1.tar"]);
    assert_eq!(
        keys(&u("{train,val}/**/s-?.tar"), None).len(),
        5,
        "braces expand first, each pattern is listed"
    );
    // The suffix filter: `.tar` by default, any key with "".
    assert_eq!(keys(&u("train/s-3.*"), None), ["train/s-3.tar"]);
    assert_eq!(
        keys(&u("train/s-3.*"), Some("")),
        ["train/s-3.idx", "train/s-3.tar"]
    );
    assert_eq!(keys(&u("train/"), Some(".idx")), ["train/s-3.idx"]);

    // Nothing matches: the error names the URL, the pattern and what was listed.
    let e = resolve(&u("train/**/shard-*.tar"), None).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Url { .. }), "{text}");
    assert!(
        text.contains("no key matches the pattern `train/**/shard-*.tar`")
            && text.contains(&format!("6 keys listed under s3://{BUCKET}/train/")),
        "{text}"
    );
    // Keys match but the suffix filter drops them: the message says so.
    let text = resolve(&u("train/*.idx"), None).unwrap_err().to_string();
    assert!(
        text.contains("1 key(s) match the pattern `train/*.idx` but none ends in `.tar`")
            && text.contains("s3_suffix"),
        "{text}"
    );
    let text = resolve(&u("empty/"), None).unwrap_err().to_string();
    assert!(
        text.contains("the prefix holds no objects ending in `.tar`"),
        "{text}"
    );
    // Bad patterns are refused before any request, naming the fault.
    for (pattern, want) in [
        ("train/[0-9", "`[` at position 7 is not closed by `]`"),
        ("train/***.tar", "`***` at position 7"),
        (
            "train/[z-a].tar",
            "the range `z-a` at position 8 is reversed",
        ),
    ] {
        let e = resolve(&u(pattern), None).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, Error::Url { .. })
                && text.contains("bad key pattern")
                && text.contains(want),
            "{pattern}: {text}"
        );
    }
}

#[test]
fn denied_and_missing_objects_fail_at_once_naming_bucket_key_and_code() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path(), 33);
    let server = S3Server::start(root.path());
    let wrong = "wrong-secret-value-9876543210";
    let cfg = config(
        &server,
        &[format!("s3://{BUCKET}/shard-000000.tar")],
        serde_json::json!({"aws_secret_access_key": wrong}),
    );
    let t = std::time::Instant::now();
    let e = open_err(cfg.clone());
    assert!(t.elapsed() < Duration::from_secs(10), "not immediate");
    match &e {
        Error::S3 {
            bucket,
            key,
            status: 403,
            code,
            ..
        } => {
            assert_eq!(
                (bucket.as_str(), key.as_str()),
                (BUCKET, "shard-000000.tar")
            );
            assert_eq!(code, "SignatureDoesNotMatch");
        }
        other => panic!("{other}"),
    }
    // No credential in any rendering of the error or the configuration.
    for text in [
        e.to_string(),
        format!("{e:?}"),
        format!("{cfg:?}"),
        format!("{:?}", cfg.s3),
    ] {
        assert!(
            !text.contains(wrong) && !text.contains(SECRET_KEY),
            "{text}"
        );
    }

    let e = open_err(config(
        &server,
        &[format!("s3://{BUCKET}/missing.tar")],
        serde_json::json!({}),
    ));
    let text = e.to_string();
    assert!(
        matches!(&e, Error::S3 { status: 404, code, key, .. } if code == "NoSuchKey" && key == "missing.tar"),
        "{text}"
    );
    assert!(
        text.contains(BUCKET) && text.contains("missing.tar"),
        "{text}"
    );

    for url in ["s3://no-such-bucket/a.tar", "s3://no-such-bucket/prefix/"] {
        let e = open_err(config(&server, &[url.to_string()], serde_json::json!({})));
        assert!(
            matches!(&e, Error::S3 { code, bucket, .. } if code == "NoSuchBucket" && bucket == "no-such-bucket"),
            "{url}: {e}"
        );
    }

    // A listing with the wrong secret is refused the same way.
    let e = open_err(config(
        &server,
        &[format!("s3://{BUCKET}/train/")],
        serde_json::json!({"aws_secret_access_key": wrong}),
    ));
    assert!(
        matches!(&e, Error::S3 { status: 403, code, .. } if code == "SignatureDoesNotMatch"),
        "{e}"
    );
    assert!(!format!("{e} {e:?}").contains(wrong));

    // An object missing among others named one by one: open checks the
    // first only, and the missing one fails when it comes due, named.
    for backend in ["threads", "io_uring"] {
        let e = open_err(config(
            &server,
            &[format!(
                "s3://{BUCKET}/{{shard-000000,gone,shard-000001}}.tar"
            )],
            serde_json::json!({"io_backend": backend, "workers": 1}),
        ));
        match &e {
            Error::Http {
                kind: ringfeed::net::http::FailKind::Client,
                attempts: 1,
                url,
                message,
            } => {
                assert_eq!(url, &format!("s3://{BUCKET}/gone.tar"), "{backend}");
                assert!(message.contains("404"), "{backend}: {message}");
            }
            other => panic!("{backend}: {other}"),
        }
    }

    // Unsigned requests to a server that wants signatures are denied.
    let e = open_err(config(
        &server,
        &[format!("s3://{BUCKET}/shard-000000.tar")],
        serde_json::json!({"s3_unsigned": true}),
    ));
    assert!(matches!(&e, Error::S3 { status: 403, .. }), "{e}");
}

/// Faults injected by a proxy between the engine and the S3 server: signed
/// requests pass through unchanged (the signature covers the proxy's host,
/// which is what the client dialled), and each fault is retried by range.
#[test]
fn faults_between_the_engine_and_s3_lose_nothing() {
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), 33);
    let server = S3Server::start(root.path());
    let proxy = support::Proxy::start(server.addr);
    for backend in ["io_uring", "threads"] {
        let f = &proxy.faults;
        f.throttle.store(3, Ordering::SeqCst);
        f.reset.store(1, Ordering::SeqCst);
        f.truncate.store(1, Ordering::SeqCst);
        f.stall.store(1, Ordering::SeqCst);
        f.stall_ms.store(3000, Ordering::SeqCst);
        let url = format!("s3://{BUCKET}/shard-{{000000..000002}}.tar");
        let loader = Loader::open(config(
            &server,
            &[url],
            serde_json::json!({
                "s3_endpoint": format!("http://{}", proxy.addr),
                "stall_timeout_ms": 1000,
                "max_attempts": 10,
                "io_backend": backend,
            }),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 33), samples, "{backend}");
        let s = loader.stats();
        assert_eq!(s.retries["throttled"], 3, "{backend}");
        // The injected stall always shows: as a stall retry, or, on
        // io_uring, as a hedge that took the stalled range's rest to a fresh
        // connection first. A loaded machine may add more (a slow answer
        // is indistinguishable from a stall), each a harmless retry.
        assert!(
            s.retries["stalled"] + s.hedges_sent >= 1,
            "{backend}: {:?}, {} hedges",
            s.retries,
            s.hedges_sent
        );
        assert_eq!(
            s.retries["reset"] + s.retries["truncated"],
            2,
            "{backend}: {:?}",
            s.retries
        );
    }
}
