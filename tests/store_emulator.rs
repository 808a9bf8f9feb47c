//! The object-store emulator (`support::store`) over 127.0.0.1, driven by
//! ringfeed itself and by plain requests, checked by counts and bytes,
//! never by timing: ringfeed streams every sample of shards over S3 and
//! plain HTTP through it and the bytes it served are the files'; a prefix
//! lists; a low request-rate limit answers some of a burst with 503
//! SlowDown (S3's XML; a plain 503 without `Retry-After` over HTTP) and no
//! limit answers none; the GET named to stall is counted and the others
//! are not; ETag, `If-Match` and 412; `Range`, 206 and 416; HEAD; the
//! counters at `/_emulator/stats` and their reset; a small share whose
//! far reads are at their most still streams every sample.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ringfeed_test_support as support;

use support::store::stats::Snapshot;
use support::store::{Options, StoreEmulator};

use ringfeed::net::NetOptions;
use ringfeed::net::retry::Jitter;
use ringfeed::net::s3::list::S3Client;
use ringfeed::net::s3::{Env, S3Config};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Loader};

const BUCKET: &str = "emu-data";
/// Any signature passes: the emulator models performance, not auth.
const AUTH: &str = "AWS4-HMAC-SHA256 Credential=AKIANOTCHECKED/20260101/us-east-1/s3/aws4_request, \
                    SignedHeaders=host, Signature=00";

/// Three shards of 1 MiB in `root/BUCKET/train/`; their sizes and the
/// samples they hold.
fn dataset(root: &Path, seed: u64) -> (Vec<(String, u64)>, usize) {
    let dir = root.join(BUCKET).join("train");
    let o = GenOptions {
        shards: 3,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(&dir, &o, |_| {}).unwrap();
    let names = r
        .paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, std::fs::metadata(p).unwrap().len())
        })
        .collect();
    (names, r.samples as usize)
}

fn config(emu: &StoreEmulator, url: String) -> Config {
    let m = serde_json::json!({
        "urls": [url],
        "memory_budget": "16MiB",
        "chunk_size": "256KiB",
        "batch_size": 5,
        "workers": 2,
        "s3_endpoint": emu.endpoint(),
        "aws_access_key_id": "AKIANOTCHECKED",
        "aws_secret_access_key": "not-checked-either",
    });
    let serde_json::Value::Object(m) = m else {
        unreachable!()
    };
    Config::from_map(&m).unwrap()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn served(emu: &StoreEmulator) -> Snapshot {
    let text = client()
        .get(format!("{}/_emulator/stats", emu.endpoint()))
        .send()
        .unwrap()
        .text()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn ringfeed_reads_through_it_and_the_bytes_served_are_the_files() {
    let root = tempfile::tempdir().unwrap();
    let (names, samples) = dataset(root.path(), 41);
    let total: u64 = names.iter().map(|(_, s)| s).sum();
    // S3's shape (90 MB/s a connection, 1250 MB/s an object, 5,500
    // requests a second) with a short latency: every model in the path.
    let mut o = Options::default();
    o.set("--latency", "1ms:5ms").unwrap();
    let emu = StoreEmulator::start(root.path(), o).unwrap();
    let urls = [
        format!("s3://{BUCKET}/train/shard-{{000000..000002}}.tar"),
        format!(
            "{}/{BUCKET}/train/shard-{{000000..000002}}.tar",
            emu.endpoint()
        ),
        // A prefix, listed with ListObjectsV2.
        format!("s3://{BUCKET}/train/"),
    ];
    for url in urls {
        emu.reset();
        let loader = Loader::open(config(&emu, url.clone())).unwrap();
        assert_eq!(support::stream(&loader, 41), samples, "{url}");
        assert!(loader.stats().retries.values().all(|&n| n == 0), "{url}");
        drop(loader);
        let s = served(&emu);
        assert_eq!(s.bytes, total, "{url}: {s:?}");
        assert!(s.gets >= 3, "{url}: {s:?}");
        assert_eq!(s.lists, u64::from(url.ends_with('/')), "{url}: {s:?}");
        assert_eq!(
            (s.slow_down, s.stalls, s.transfers_now),
            (0, 0, 0),
            "{url}: {s:?}"
        );
        assert!(s.transfers_max >= 1, "{url}: {s:?}");
    }
}

#[test]
fn the_loader_measures_the_first_byte_latency_the_server_holds_its_answers_for() {
    // 3 shards of 1 MiB in reads of 64 KiB (48 reads, windows of 8) on
    // io_uring, behind 40 ms of first-byte latency: the stats' median
    // first byte is at least that. Control: the same without the latency
    // model measures less (a loopback answer).
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), 43);
    let mut seen = Vec::new();
    for latency in [Some("40ms:40ms"), None] {
        let mut o = Options::unlimited();
        if let Some(l) = latency {
            o.set("--latency", l).unwrap();
        }
        let emu = StoreEmulator::start(root.path(), o).unwrap();
        let mut cfg = config(
            &emu,
            format!("s3://{BUCKET}/train/shard-{{000000..000002}}.tar"),
        );
        cfg.chunk_size = 64 << 10;
        cfg.io_backend = ringfeed::config::IoBackend::IoUring;
        let loader = Loader::open(cfg).unwrap();
        assert_eq!(support::stream(&loader, 43), samples, "{latency:?}");
        let s = loader.stats();
        assert!(s.net_first_byte_us > 0, "{latency:?}: {s:?}");
        seen.push(s.net_first_byte_us);
    }
    assert!(seen[0] >= 40_000, "{seen:?}");
    assert!(seen[1] < seen[0], "{seen:?}");
}

#[test]
fn ringfeed_lists_a_prefix_page_by_page() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 42);
    std::fs::write(root.path().join(BUCKET).join("top.txt"), b"top").unwrap();
    let emu = StoreEmulator::start(root.path(), Options::unlimited()).unwrap();
    let cfg = S3Config {
        endpoint: Some(emu.endpoint()),
        access_key_id: Some("AKIANOTCHECKED".into()),
        secret_access_key: Some("not-checked".into()),
        ..Default::default()
    };
    let s3 = S3Client::new(&cfg, &Env::default()).unwrap();
    let net = NetOptions {
        stall: Duration::from_secs(5),
        retry: Default::default(),
        stats: Default::default(),
        tls: Default::default(),
        pace: Default::default(),
    };
    let listed = s3
        .list(BUCKET, "train/", false, 1, &net, &mut Jitter::new(1))
        .unwrap();
    let want: Vec<(String, u64)> = names
        .iter()
        .map(|(n, s)| (format!("train/{n}"), *s))
        .collect();
    assert_eq!(listed, want);
    // One key a page: three pages, two continuation tokens followed.
    assert_eq!(net.stats.requests.load(Ordering::Relaxed), 3);
    assert_eq!(emu.stats().lists, 3);
}

#[test]
fn a_list_objects_v1_client_pages_by_marker() {
    // A V1 client (rclone's and s3fs's default off AWS) asks the next page
    // with `marker`, the last key it saw. Control: the same request
    // without it is the first page again (what a V1 client looped on when
    // the marker was ignored).
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 44);
    let emu = StoreEmulator::start(root.path(), Options::unlimited()).unwrap();
    let c = client();
    let page = |marker: Option<&str>| {
        let mut url = format!("{}/{BUCKET}?prefix=train/&max-keys=1", emu.endpoint());
        if let Some(m) = marker {
            url.push_str(&format!("&marker={m}"));
        }
        let r = c.get(url).header("Authorization", AUTH).send().unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().unwrap();
        let key = text
            .split("<Key>")
            .nth(1)
            .and_then(|k| k.split("</Key>").next());
        (
            key.map(str::to_string),
            text.contains("<IsTruncated>true</IsTruncated>"),
        )
    };
    let mut seen = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let (key, more) = page(marker.as_deref());
        let Some(key) = key else { break };
        seen.push(key.clone());
        marker = Some(key);
        if !more {
            break;
        }
        assert!(seen.len() <= names.len(), "paging does not end: {seen:?}");
    }
    let want: Vec<String> = names.iter().map(|(n, _)| format!("train/{n}")).collect();
    assert_eq!(seen, want);
    assert_eq!(page(None).0.as_deref(), Some(want[0].as_str()));
    // With a delimiter a page of common prefixes has no key to go on
    // from: V1 clients take the page's NextMarker.
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(root.path().join(BUCKET).join(d)).unwrap();
        std::fs::write(root.path().join(BUCKET).join(d).join("x"), b"x").unwrap();
    }
    let mut dirs = Vec::new();
    let mut marker = String::new();
    loop {
        let url = format!(
            "{}/{BUCKET}?delimiter=/&max-keys=1&marker={marker}",
            emu.endpoint()
        );
        let text = c
            .get(url)
            .header("Authorization", AUTH)
            .send()
            .unwrap()
            .text()
            .unwrap();
        let tag = |t: &str| {
            text.split(&format!("<{t}>"))
                .nth(1)
                .and_then(|x| x.split(&format!("</{t}>")).next())
                .map(str::to_string)
        };
        let prefix = text
            .split("<CommonPrefixes><Prefix>")
            .nth(1)
            .and_then(|x| x.split("</Prefix>").next());
        dirs.extend(prefix.map(str::to_string));
        if tag("IsTruncated").as_deref() != Some("true") {
            break;
        }
        marker = tag("NextMarker").expect("a truncated V1 page names its NextMarker");
        assert!(dirs.len() <= 4, "paging does not end: {dirs:?}");
    }
    assert_eq!(dirs, ["a/", "b/", "c/", "train/"]);
}

/// `n` GETs of one byte of `url` one after the other (S3's when `s3`);
/// the 503s' bodies and whether any carried `Retry-After`.
fn burst(url: &str, n: usize, s3: bool) -> (Vec<String>, bool) {
    let c = client();
    let mut bodies = Vec::new();
    let mut retry_after = false;
    for _ in 0..n {
        let mut req = c.get(url).header("Range", "bytes=0-0");
        if s3 {
            req = req.header("Authorization", AUTH);
        }
        let r = req.send().unwrap();
        if r.status() == 503 {
            retry_after |= r.headers().contains_key("retry-after");
            bodies.push(r.text().unwrap());
        } else {
            assert_eq!(r.status(), 206);
        }
    }
    (bodies, retry_after)
}

#[test]
fn past_the_rate_limit_requests_get_slow_down_and_without_one_none_do() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path(), 43);
    let url = |emu: &StoreEmulator| format!("{}/{BUCKET}/train/shard-000000.tar", emu.endpoint());
    // One request a second with a burst of two: of 20 in a row, two are
    // admitted, and one more for each second the burst takes.
    let mut o = Options::unlimited();
    o.set("--rate-limit", "1/s:2").unwrap();
    let emu = StoreEmulator::start(root.path(), o.clone()).unwrap();
    let (bodies, retry_after) = burst(&url(&emu), 20, true);
    assert!(bodies.len() >= 10, "{} of 20 throttled", bodies.len());
    for b in &bodies {
        assert!(
            b.contains("<Error><Code>SlowDown</Code>"),
            "not S3's SlowDown: {b}"
        );
    }
    assert!(!retry_after);
    assert!(emu.stats().slow_down >= 10);
    // Plain HTTP: a plain 503, no XML, no Retry-After.
    emu.reset();
    let (bodies, retry_after) = burst(&url(&emu), 20, false);
    assert!(bodies.len() >= 10, "{} of 20 throttled", bodies.len());
    assert!(bodies.iter().all(|b| !b.contains('<')), "{bodies:?}");
    assert!(!retry_after);
    // The control: the same burst with no limit gets no 503.
    let emu = StoreEmulator::start(root.path(), Options::unlimited()).unwrap();
    let (bodies, _) = burst(&url(&emu), 20, true);
    assert!(bodies.is_empty(), "{bodies:?}");
    assert_eq!(emu.stats().slow_down, 0);
}

#[test]
fn the_get_named_to_stall_stalls_and_is_counted_and_the_others_do_not() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 44);
    let file = root.path().join(BUCKET).join("train").join(&names[0].0);
    let want = std::fs::read(&file).unwrap();
    let mut o = Options::unlimited();
    o.set("--stall-get", "2:200ms").unwrap();
    let emu = StoreEmulator::start(root.path(), o).unwrap();
    let url = format!("{}/{BUCKET}/train/{}", emu.endpoint(), names[0].0);
    let c = client();
    let mut stalls = Vec::new();
    for _ in 0..3 {
        let body = c.get(&url).send().unwrap().bytes().unwrap();
        assert!(
            body[..] == want[..],
            "the stalled body is the file's all the same"
        );
        stalls.push(emu.stats().stalls);
    }
    // The 2nd GET stalled; the 1st and 3rd, the control, did not.
    assert_eq!(stalls, [0, 1, 1]);
    // Every GET stalls with probability 1, none with 0.
    for (p, n) in [("1", 2), ("0", 0)] {
        let mut o = Options::unlimited();
        o.set("--stall", &format!("{p}:1ms")).unwrap();
        let emu = StoreEmulator::start(root.path(), o).unwrap();
        let url = format!("{}/{BUCKET}/train/{}", emu.endpoint(), names[0].0);
        for _ in 0..2 {
            assert_eq!(
                c.get(&url).send().unwrap().bytes().unwrap().len(),
                want.len()
            );
        }
        assert_eq!(emu.stats().stalls, n, "p = {p}");
    }
}

#[test]
fn etag_if_match_range_head_and_missing_keys_are_answered_as_s3_does() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 45);
    let file = root.path().join(BUCKET).join("train").join(&names[0].0);
    let want = std::fs::read(&file).unwrap();
    let size = want.len();
    let emu = StoreEmulator::start(root.path(), Options::unlimited()).unwrap();
    let url = format!("{}/{BUCKET}/train/{}", emu.endpoint(), names[0].0);
    let c = client();

    let head = c.head(&url).send().unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-length"], size.to_string().as_str());
    let etag = head.headers()["etag"].to_str().unwrap().to_string();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong: {etag}"
    );
    assert_eq!(emu.stats().bytes, 0, "HEAD sends no body");

    let r = c.get(&url).header("If-Match", &etag).send().unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().unwrap()[..] == want[..]);
    for s3 in [true, false] {
        let mut req = c.get(&url).header("If-Match", "\"another\"");
        if s3 {
            req = req.header("Authorization", AUTH);
        }
        let r = req.send().unwrap();
        assert_eq!(r.status(), 412);
        let body = r.text().unwrap();
        assert_eq!(
            body.contains("<Code>PreconditionFailed</Code>"),
            s3,
            "{body}"
        );
    }

    let r = c.get(&url).header("Range", "bytes=10-19").send().unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 10-19/{size}").as_str()
    );
    assert!(r.bytes().unwrap()[..] == want[10..20]);
    let r = c
        .get(&url)
        .header("Range", format!("bytes={}-", size - 5))
        .send()
        .unwrap();
    assert!(r.bytes().unwrap()[..] == want[size - 5..]);
    let r = c
        .get(&url)
        .header("Range", format!("bytes={size}-"))
        .header("Authorization", AUTH)
        .send()
        .unwrap();
    assert_eq!(r.status(), 416);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes */{size}").as_str()
    );
    assert!(r.text().unwrap().contains("<Code>InvalidRange</Code>"));

    let missing = |path: &str| {
        let r = c
            .get(format!("{}/{path}", emu.endpoint()))
            .header("Authorization", AUTH)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (status, body) = missing(&format!("{BUCKET}/train/nothing.tar"));
    assert_eq!(status, 404);
    assert!(body.contains("<Code>NoSuchKey</Code>"), "{body}");
    let (status, body) = missing("no-bucket/key");
    assert_eq!(status, 404);
    assert!(body.contains("<Code>NoSuchBucket</Code>"), "{body}");

    // The counters: one full body, ten bytes, five, and what was refused.
    let s = served(&emu);
    assert_eq!(s.bytes, size as u64 + 15, "{s:?}");
    assert_eq!(
        (s.precondition_failed, s.range_not_satisfiable, s.not_found),
        (2, 1, 2)
    );
    let text = c
        .post(format!("{}/_emulator/reset", emu.endpoint()))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let before: Snapshot = serde_json::from_str(&text).unwrap();
    assert_eq!(before.bytes, s.bytes);
    assert_eq!(served(&emu).requests, 0);
}

#[test]
fn transfers_in_flight_are_counted_while_they_wait_for_their_first_byte() {
    let root = tempfile::tempdir().unwrap();
    let (names, _) = dataset(root.path(), 46);
    // Every request waits 1 s before its head: four sent at once are all
    // in flight together.
    let mut o = Options::unlimited();
    o.set("--latency", "1s:1s").unwrap();
    let emu = StoreEmulator::start(root.path(), o).unwrap();
    let url = format!("{}/{BUCKET}/train/{}", emu.endpoint(), names[0].0);
    let go = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let c = client();
                go.wait();
                c.get(&url).send().unwrap().bytes().unwrap()
            });
        }
    });
    let s = emu.stats();
    assert_eq!(
        (s.gets, s.transfers_max, s.transfers_now),
        (4, 4, 0),
        "{s:?}"
    );
    assert!(s.transfers_mean > 1.0, "{s:?}");
}

#[test]
fn a_whole_objects_reads_in_flight_go_from_8_to_the_most_at_a_far_store_and_a_fixed_count_holds() {
    // 64 parts of 256 KiB behind 150 ms of first-byte latency: by Little's
    // law 8 in flight carry ~13 MB/s. The found count's first judged
    // window (after 16 parts) says a far store by its first bytes, and
    // the count goes to its most (64): the 48 parts left go out at once,
    // whatever the machine's speed, each held 150 ms by the server.
    // `parts_in_flight: 8` (the control) keeps 8. Hedges are off: on a
    // loaded machine a part held past its peers' p99 is asked again (a
    // CI run saw 68 GETs), and this test counts reads in flight, not tails.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(BUCKET);
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("weights.bin"), &data).unwrap();
    let mut o = Options::unlimited();
    o.set("--latency", "150ms:150ms").unwrap();
    let emu = StoreEmulator::start(root.path(), o).unwrap();
    let url = format!("{}/{BUCKET}/weights.bin", emu.endpoint());
    let mut most = Vec::new();
    for parts in [r#""auto""#, "8"] {
        emu.reset();
        let cfg = Config::for_objects(&format!(
            r#"{{"part_size": "256KiB", "parts_in_flight": {parts}, "io_backend": "io_uring", "hedge": false}}"#
        ))
        .unwrap();
        let got = ringfeed::object::read::read(&url, &cfg, None).unwrap();
        assert!(
            got.as_slice() == &data[..],
            "parts_in_flight {parts}: bytes differ"
        );
        let s = emu.stats();
        assert_eq!(s.gets, 64, "{s:?}");
        most.push(s.transfers_max);
    }
    assert!(most[0] >= 40, "auto: at most {} in flight", most[0]);
    // The emulator counts a transfer until its last byte is written, and
    // the client asks for the next part as soon as it has that byte: one
    // more than the count may overlap at the server (CI's run saw 9).
    assert!(most[1] <= 9, "fixed 8: at most {} in flight", most[1]);
}

#[test]
fn a_far_stores_reads_at_their_most_leave_a_small_shares_batches_room() {
    // 3 shards of 1 MiB in 64 KiB reads, a share of 64 chunks a worker,
    // behind S3's first byte (a lognormal: reads end out of order). The
    // count at the most the found count may reach (half a share: given
    // here, so that a loaded machine's judgement cannot undo it), and
    // the reads done and waiting behind a slower one on top: every
    // sample still arrives, with no `BudgetTooSmall`.
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), 47);
    let mut o = Options::unlimited();
    o.set("--latency", "20ms:120ms").unwrap();
    let emu = StoreEmulator::start(root.path(), o).unwrap();
    let mut cfg = config(
        &emu,
        format!("s3://{BUCKET}/train/shard-{{000000..000002}}.tar"),
    );
    cfg.memory_budget = 8 << 20;
    cfg.chunk_size = 64 << 10;
    cfg.io_backend = ringfeed::config::IoBackend::IoUring;
    cfg.reads_in_flight = 32;
    let loader = Loader::open(cfg).unwrap();
    assert_eq!(support::stream(&loader, 47), samples);
    assert_eq!(loader.stats().net_reads_in_flight, 64);
}
