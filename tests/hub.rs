//! `hf://` datasets against the Hub emulator (tests/support/hub): an API
//! host and a content host on 127.0.0.1. Every sample arrives with the
//! generator's bytes on both backends, for every form of URL and
//! revision, each read pinned to its revision's commit, each shard
//! redirected once however many ranges it is read in; a private dataset
//! needs the token, which never reaches the content host, a message, a
//! log line, a stat, the cache or the resume state (the controls: it was
//! sent to the API host, and with `--same-host` to the content too); 429
//! is waited out for its `Retry-After` (the control: without the pacer it
//! is not); an expired redirect is resolved again once, then named; the
//! API's refusals and its garbage are named errors, not hangs.
//!
//! The loader reads the Hub's settings from the process environment, so
//! the tests that open loaders run one at a time under `ENV`; those that
//! only resolve give the resolver an environment of their own.

use ringfeed_test_support as support;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use ringfeed::net::s3::{Env, S3Config};
use ringfeed::net::{NetOptions, set_pacing};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};
use support::hub::{Garbage, HubEmulator, Options};
use support::stream;

const TOKEN: &str = "hf_EmulatorTokenSecret0123456789abcdWXYZ";
const REPO: &str = "org/shards";
const BACKENDS: [&str; 2] = ["io_uring", "threads"];

/// The shards of `repo` under `root`: `shards` of about 1 MiB in its
/// `train/` folder (and a README beside it); their sizes and samples.
fn dataset(root: &Path, repo: &str, shards: usize, seed: u64) -> (Vec<u64>, usize) {
    let dir = root.join(repo).join("train");
    let o = GenOptions {
        shards,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(&dir, &o, |_| {}).unwrap();
    std::fs::write(root.join(repo).join("README.md"), b"# shards\n").unwrap();
    let sizes = r
        .paths
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .collect();
    (sizes, r.samples as usize)
}

/// The ranged GETs a shard of `size` bytes is read in, 256 KiB each.
fn ranges(size: u64) -> u64 {
    size.div_ceil(256 << 10)
}

fn config(urls: Vec<String>, backend: &str, extra: serde_json::Value) -> Config {
    let mut m = serde_json::json!({
        "urls": urls,
        "memory_budget": "16MiB",
        "chunk_size": "256KiB",
        "batch_size": 5,
        "workers": 1,
        "hedge": false,
        "io_backend": backend,
    });
    if let (Some(m), serde_json::Value::Object(e)) = (m.as_object_mut(), extra) {
        m.extend(e);
    }
    Config::from_map(m.as_object().unwrap()).unwrap()
}

/// The process environment of the tests that open loaders (which read
/// it): one such test at a time.
static ENV: Mutex<()> = Mutex::new(());

/// Holds `ENV` with the Hub's variables set: the emulator's endpoint, the
/// token or none, and an empty `HF_HOME` (no token of the machine's).
struct HubEnv {
    _lock: MutexGuard<'static, ()>,
    _home: tempfile::TempDir,
}

fn hub_env(hub: &HubEmulator, token: Option<&str>) -> HubEnv {
    let lock = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let home = tempfile::tempdir().unwrap();
    // SAFETY: every test that sets or reads the environment holds `ENV`
    // for its whole run, so no other thread of this binary reads it
    // meanwhile (the previous test's loaders are closed and joined).
    unsafe {
        for k in [
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_TOKEN_PATH",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
        ] {
            std::env::remove_var(k);
        }
        std::env::set_var("HF_ENDPOINT", hub.endpoint());
        std::env::set_var("HF_HOME", home.path());
        if let Some(t) = token {
            std::env::set_var("HF_TOKEN", t);
        }
    }
    HubEnv {
        _lock: lock,
        _home: home,
    }
}

/// An environment of its own for the resolver (no process variables).
fn env_of(hub: &HubEmulator, token: Option<&str>, home: &Path) -> Env {
    let env = Env::with_home(Some(home.to_path_buf())).set("HF_ENDPOINT", &hub.endpoint());
    match token {
        Some(t) => env.set("HF_TOKEN", t),
        None => env,
    }
}

fn net() -> NetOptions {
    NetOptions::for_config(&Config {
        retry_deadline_s: 30,
        ..Config::default()
    })
}

fn resolve(
    hub: &HubEmulator,
    token: Option<&str>,
    urls: &[&str],
) -> ringfeed::Result<Vec<ringfeed::dataset::Shard>> {
    let home = tempfile::tempdir().unwrap();
    let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
    ringfeed::dataset::resolve_with(
        &urls,
        None,
        &net(),
        &S3Config::default(),
        &env_of(hub, token, home.path()),
    )
}

fn start(root: &Path, opts: Options) -> HubEmulator {
    HubEmulator::start(root, opts).unwrap()
}

fn n(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::SeqCst)
}

/// Every form of URL and revision, on both backends: the generator's
/// bytes, every `resolve/` at the revision's commit, one redirect per
/// shard and each range asked once at the content host (io_uring keeps
/// several ranges of a shard in flight: all but one wait for its target).
#[test]
fn datasets_stream_byte_identical_pinned_to_their_commit() {
    let root = tempfile::tempdir().unwrap();
    let (sizes, samples) = dataset(root.path(), REPO, 4, 71);
    let hub = start(root.path(), Options::default());
    let _env = hub_env(&hub, None);
    let all_ranges: u64 = sizes.iter().map(|&s| ranges(s)).sum();
    let forms = [
        (
            "hf://datasets/org/shards/train/shard-{000000..000003}.tar",
            "main",
        ),
        ("hf://datasets/org/shards/train", "main"),
        ("hf://datasets/org/shards", "main"),
        ("hf://datasets/org/shards@v1.0/**/*.tar", "v1.0"),
        (
            "hf://datasets/org/shards@refs%2Fconvert%2Fparquet/train/*.tar",
            "refs/convert/parquet",
        ),
        ("hf://datasets/org/shards@refs/pr/1/train", "refs/pr/1"),
    ];
    for backend in BACKENDS {
        for (url, revision) in forms {
            let case = format!("{backend} {url}");
            let sha = HubEmulator::commit(REPO, revision);
            let (resolves, served) = (n(&hub.stats().resolves), n(&hub.stats().served));
            hub.stats().resolved_revisions.lock().unwrap().clear();
            let loader =
                Loader::open(config(vec![url.into()], backend, serde_json::json!({}))).unwrap();
            assert_eq!(stream(&loader, 71), samples, "{case}");
            drop(loader);
            assert_eq!(
                n(&hub.stats().resolves) - resolves,
                4,
                "{case}: one redirect a shard"
            );
            assert_eq!(
                n(&hub.stats().served) - served,
                all_ranges,
                "{case}: each range once"
            );
            assert!(all_ranges >= 4 * 4, "several ranges a shard");
            let asked = hub.stats().resolved_revisions.lock().unwrap().clone();
            assert!(
                asked.iter().all(|r| *r == sha),
                "{case}: {asked:?}, not all {sha}"
            );
        }
        // A commit named by its id is read at it.
        let sha = HubEmulator::commit(REPO, "v1.0");
        let url = format!("hf://datasets/org/shards@{sha}/train");
        let loader = Loader::open(config(vec![url], backend, serde_json::json!({}))).unwrap();
        assert_eq!(stream(&loader, 71), samples, "{backend} by commit");
    }
    assert_eq!(n(&hub.stats().bad_signature) + n(&hub.stats().expired), 0);
    assert_eq!(
        n(&hub.stats().content_heads),
        0,
        "sizes come from the tree: no HEAD"
    );
}

/// What the resolver makes of each form: the files, in name order, with
/// the tree's sizes, named by the URL as written, across pages of two.
#[test]
fn urls_list_through_the_tree_api_across_pages() {
    let root = tempfile::tempdir().unwrap();
    let (sizes, _) = dataset(root.path(), REPO, 5, 72);
    std::fs::create_dir_all(root.path().join(REPO).join("train/extra")).unwrap();
    std::fs::write(root.path().join(REPO).join("train/extra/notes.txt"), b"x").unwrap();
    let hub = start(
        root.path(),
        Options {
            page: 2,
            ..Options::default()
        },
    );
    let names = |shards: &[ringfeed::dataset::Shard]| -> Vec<(String, Option<u64>)> {
        shards.iter().map(|s| (s.name.clone(), s.size)).collect()
    };
    let want = |prefix: &str| -> Vec<(String, Option<u64>)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (format!("{prefix}/train/shard-{i:06}.tar"), Some(s)))
            .collect()
    };
    for url in [
        "hf://datasets/org/shards",
        "hf://datasets/org/shards/train/",
        "hf://datasets/org/shards/train/shard-{000000..000004}.tar",
        "hf://datasets/org/shards/**/shard-*.tar",
    ] {
        let trees = n(&hub.stats().trees);
        let got = resolve(&hub, None, &[url]).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(names(&got), want("hf://datasets/org/shards"), "{url}");
        assert!(n(&hub.stats().trees) - trees >= 2, "{url}: pages of two");
    }
    let got = resolve(
        &hub,
        None,
        &["hf://datasets/org/shards@refs%2Fconvert%2Fparquet/train"],
    )
    .unwrap();
    assert_eq!(
        names(&got),
        want("hf://datasets/org/shards@refs%2Fconvert%2Fparquet")
    );
    // The brace expansion asks one listing of its directory, not one per
    // name, and one commit.
    let (trees, revisions) = (n(&hub.stats().trees), n(&hub.stats().revisions));
    resolve(
        &hub,
        None,
        &["hf://datasets/org/shards/train/shard-{000000..000004}.tar"],
    )
    .unwrap();
    assert_eq!(
        n(&hub.stats().trees) - trees,
        3,
        "five entries and a directory in pages of two"
    );
    assert_eq!(n(&hub.stats().revisions) - revisions, 1);
    // `ringfeed ls` asks no size of a Hub shard: the tree gave them.
    let mut shards = resolve(&hub, None, &["hf://datasets/org/shards/train"]).unwrap();
    ringfeed::dataset::head_sizes(&mut shards, &net()).unwrap();
    assert_eq!(n(&hub.stats().resolves), 0);
}

fn hub_error(e: &Error) -> (u16, Option<String>, String) {
    match e {
        Error::Hub { status, code, .. } => (*status, code.clone(), e.to_string()),
        other => panic!("not a Hub error: {other}"),
    }
}

/// The Hub's refusals, named with the repository, the revision, the path
/// and the Hub's code; and what the resolver finds missing itself.
#[test]
fn refusals_and_missing_things_are_named() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path(), REPO, 2, 73);
    dataset(root.path(), "org/private", 1, 73);
    dataset(root.path(), "org/gated", 1, 73);
    let hub = start(
        root.path(),
        Options {
            token: Some(TOKEN.into()),
            private: vec!["org/private".into()],
            gated: vec!["org/gated".into()],
            ..Options::default()
        },
    );
    for (url, token, status, code, says) in [
        (
            "hf://datasets/org/private/train",
            None,
            401,
            Some("RepoNotFound"),
            "no token was sent",
        ),
        (
            "hf://datasets/org/private/train",
            Some("hf_wrong"),
            401,
            Some("RepoNotFound"),
            "the token from $HF_TOKEN was sent",
        ),
        (
            "hf://datasets/org/gated/train",
            None,
            401,
            Some("GatedRepo"),
            "no token was sent",
        ),
        (
            "hf://datasets/org/gated/train",
            Some(TOKEN),
            403,
            Some("GatedRepo"),
            "must be accepted",
        ),
        (
            "hf://datasets/org/nothing/train",
            Some(TOKEN),
            404,
            Some("RepoNotFound"),
            "Repository not found",
        ),
        (
            "hf://datasets/org/shards@v9/train",
            None,
            404,
            Some("RevisionNotFound"),
            "Invalid rev id: v9",
        ),
        (
            "hf://datasets/org/shards/valid",
            None,
            404,
            None,
            "no such file or directory",
        ),
        (
            "hf://datasets/org/shards/train/x/y.tar",
            None,
            404,
            Some("EntryNotFound"),
            "does not exist",
        ),
        (
            "hf://datasets/org/shards/train/*.json",
            None,
            404,
            None,
            "no file matches the pattern",
        ),
        (
            "hf://datasets/org/shards/*.md",
            None,
            404,
            None,
            "none is one of the .tar files",
        ),
    ] {
        let e = resolve(&hub, token, &[url]).unwrap_err();
        let (got_status, got_code, text) = hub_error(&e);
        assert_eq!(
            (got_status, got_code.as_deref()),
            (status, code),
            "{url}: {text}"
        );
        assert!(text.contains(says), "{url}: {text}");
        let u = ringfeed::net::hub::url::parse(url).unwrap();
        assert!(
            text.contains(&u.repo) && text.contains(u.revision()),
            "{url}: {text}"
        );
        assert!(text.contains(&u.path), "{url}: {text}");
        assert_eq!(
            e.status(),
            ringfeed::ffi::status::RINGFEED_ERR_DATASET,
            "{url}"
        );
        assert!(
            !text.contains(TOKEN) && !text.contains("hf_wrong"),
            "{url}: {text}"
        );
    }
    // The README is a file, not a shard: as a whole object it is one.
    let home = tempfile::tempdir().unwrap();
    let objects = ringfeed::dataset::resolve_objects(
        &["hf://datasets/org/shards/README.md".into()],
        &net(),
        &S3Config::default(),
        &env_of(&hub, None, home.path()),
    )
    .unwrap();
    assert_eq!(objects[0].size, Some(9));
    // Offline: named, and nothing asked.
    let before = n(&hub.stats().revisions) + n(&hub.stats().trees);
    for var in ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"] {
        let env = env_of(&hub, None, home.path()).set(var, "1");
        let e = ringfeed::dataset::resolve_with(
            &["hf://datasets/org/shards".into()],
            None,
            &net(),
            &S3Config::default(),
            &env,
        )
        .unwrap_err();
        assert!(e.to_string().contains(&format!("{var} is set")), "{e}");
    }
    assert_eq!(n(&hub.stats().revisions) + n(&hub.stats().trees), before);
    // URLs the resolver refuses itself.
    for (url, says) in [
        ("hf://models/org/m/x.tar", "datasets only"),
        ("hf://datasets/org/shards@/x.tar", "empty revision"),
        ("hf://datasets/org/sh..ards/x.tar", "`--` or `..`"),
    ] {
        let e = resolve(&hub, None, &[url]).unwrap_err();
        assert!(
            matches!(e, Error::Url { .. }) && e.to_string().contains(says),
            "{url}: {e}"
        );
    }
}

/// Answers the API does not document: each a named error, at once.
#[test]
fn garbage_from_the_api_is_named() {
    let root = tempfile::tempdir().unwrap();
    dataset(root.path(), REPO, 2, 74);
    let hub = start(
        root.path(),
        Options {
            page: 1,
            ..Options::default()
        },
    );
    for (garbage, says) in [
        (Garbage::NotJson, "the revision API's answer is not JSON"),
        (
            Garbage::WrongShape,
            "the revision API's answer is not the JSON it documents",
        ),
        (Garbage::BadSha, "which is not a commit id"),
        (Garbage::TreeNotJson, "the tree API's answer is not JSON"),
        (
            Garbage::TreeWrongShape,
            "the tree API's answer is not the JSON it documents",
        ),
        (Garbage::Huge, "longer than 16777216 bytes"),
        (Garbage::PageLoop, "name a page already read as the next"),
        (Garbage::EmptyPages, "go on after an empty page"),
        (
            Garbage::OutsidePath,
            "the tree API listed `/../../../etc/passwd`, which is no path",
        ),
    ] {
        *hub.controls().garbage.lock().unwrap() = Some(garbage);
        let e = resolve(&hub, None, &["hf://datasets/org/shards/train/"]).unwrap_err();
        let (status, _, text) = hub_error(&e);
        assert_eq!(status, 200, "{garbage:?}: {text}");
        assert!(text.contains(says), "{garbage:?}: {text}");
        assert!(text.contains(REPO), "{garbage:?}: {text}");
        assert_eq!(e.status(), ringfeed::ffi::status::RINGFEED_ERR_NETWORK);
    }
    // The control: the same URL resolves once the answers are sound.
    *hub.controls().garbage.lock().unwrap() = None;
    assert_eq!(
        resolve(&hub, None, &["hf://datasets/org/shards/train/"])
            .unwrap()
            .len(),
        2
    );
}

/// A private dataset with the token: read whole; the token went to the
/// API host with every request and to the content host with none. The
/// control: served by the API host itself (`same_host`), the content
/// requests carry it.
#[test]
fn the_token_goes_to_the_endpoint_only() {
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), "org/private", 2, 75);
    for same_host in [false, true] {
        let hub = start(
            root.path(),
            Options {
                token: Some(TOKEN.into()),
                private: vec!["org/private".into()],
                same_host,
                ..Options::default()
            },
        );
        let _env = hub_env(&hub, Some(TOKEN));
        for backend in BACKENDS {
            let loader = Loader::open(config(
                vec!["hf://datasets/org/private/train".into()],
                backend,
                serde_json::json!({}),
            ))
            .unwrap();
            assert_eq!(
                stream(&loader, 75),
                samples,
                "{backend} same host {same_host}"
            );
        }
        let bearer = format!("Bearer {TOKEN}");
        let api = hub.stats().api_authorization.lock().unwrap().clone();
        assert!(!api.is_empty());
        assert!(
            api.iter().all(|a| a.as_deref() == Some(bearer.as_str())),
            "{api:?}"
        );
        let content = hub.stats().content_headers.lock().unwrap().clone();
        assert!(!content.is_empty());
        for headers in &content {
            let sent = headers.iter().any(|h| h.starts_with("authorization:"));
            assert_eq!(sent, same_host, "same host {same_host}: {headers:?}");
        }
    }
}

/// The token reaches no message, log line (at the most detailed level,
/// over retries and errors), stat, cache file (name or bytes) or resume
/// state, even where the server echoes it. The control: it was sent (the
/// API host recorded it), and the texts searched do name the dataset.
#[test]
fn the_token_appears_nowhere() {
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), "org/private", 2, 76);
    let hub = start(
        root.path(),
        Options {
            token: Some(TOKEN.into()),
            private: vec!["org/private".into()],
            ..Options::default()
        },
    );
    let _env = hub_env(&hub, Some(TOKEN));
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let lines = lines.clone();
        ringfeed::log::set(
            Some(Box::new(move |_, msg| {
                lines.lock().unwrap().push(msg.to_string())
            })),
            ringfeed::log::Level::Debug,
        );
    }
    // A throttled resolve: a retry, logged.
    hub.controls().throttle_resolves.store(1, Ordering::SeqCst);
    let cache = tempfile::tempdir().unwrap();
    let loader = Loader::open(config(
        vec!["hf://datasets/org/private/train".into()],
        "io_uring",
        serde_json::json!({
            // The cache's checksum blocks need whole MiBs.
            "chunk_size": "1MiB",
            "cache_dir": cache.path(),
            "cache_fill": "always",
            "cache_min_free": "1MiB",
        }),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 76), samples);
    let stats = serde_json::to_string(&loader.stats()).unwrap();
    let prometheus = ringfeed::engine::prometheus(&stats).unwrap();
    let state = loader.state();
    let resume = format!(
        "{} {:?}",
        state.to_hex(),
        String::from_utf8_lossy(&state.encode())
    );
    loader.close();
    drop(loader);
    // Refused, with the token echoed by the server's message.
    hub.controls().echo_token.store(true, Ordering::SeqCst);
    let wrong = "hf_WrongTokenEchoedBack0123456789";
    let home = tempfile::tempdir().unwrap();
    let echoed = ringfeed::dataset::resolve_with(
        &["hf://datasets/org/private/train".into()],
        None,
        &net(),
        &S3Config::default(),
        &env_of(&hub, Some(wrong), home.path()),
    )
    .unwrap_err()
    .to_string();
    let refused = support::first_error(config(
        vec!["hf://datasets/org/private/nothing.tar".into()],
        "threads",
        serde_json::json!({}),
    ))
    .to_string();
    ringfeed::log::set(None, ringfeed::log::Level::Error);
    let lines = lines.lock().unwrap().clone();

    let clean = |what: &str, text: &str| {
        assert!(!text.contains(TOKEN), "{what} holds the token: {text}");
        assert!(
            !text.contains(wrong),
            "{what} holds the echoed token: {text}"
        );
    };
    for l in &lines {
        clean("a log line", l);
    }
    clean("the stats", &stats);
    clean("the Prometheus text", &prometheus);
    clean("the resume state", &resume);
    clean("the echoed refusal", &echoed);
    clean("the refusal", &refused);
    let mut files = Vec::new();
    files_under(cache.path(), &mut files);
    assert!(!files.is_empty(), "the cache wrote nothing: {stats}");
    for (path, bytes) in &files {
        clean("a cache file's name", path);
        clean(
            &format!("cache file {path}"),
            &String::from_utf8_lossy(bytes),
        );
    }
    // The controls: the token was in use, the server did echo one, and
    // the texts searched do name the dataset and its retries.
    let sent = hub.stats().api_authorization.lock().unwrap().clone();
    assert!(
        sent.iter()
            .any(|a| a.as_deref() == Some(format!("Bearer {TOKEN}").as_str()))
    );
    assert!(
        echoed.contains("REDACTED") && echoed.contains("org/private"),
        "{echoed}"
    );
    assert!(
        refused.contains("org/private") && refused.contains("nothing.tar"),
        "{refused}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("retrying") && l.contains("hf://datasets/org/private")),
        "no retry line names the shard: {lines:?}"
    );
}

fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p: PathBuf = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
}

/// 429 with `Retry-After` to the API and to `resolve/`: the reads wait
/// it out (no request while it runs) and complete. The control: without
/// the pacer, the retries come after their own backoffs, inside the wait.
#[test]
fn retry_after_is_waited_out() {
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), REPO, 2, 77);
    let hub = start(
        root.path(),
        Options {
            retry_after: 2,
            ..Options::default()
        },
    );
    let _env = hub_env(&hub, None);
    for backend in BACKENDS {
        let early = n(&hub.stats().early);
        let throttled = n(&hub.stats().throttled);
        hub.controls().throttle_api.store(1, Ordering::SeqCst);
        hub.controls().throttle_resolves.store(1, Ordering::SeqCst);
        let loader = Loader::open(config(
            vec!["hf://datasets/org/shards/train".into()],
            backend,
            serde_json::json!({}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 77), samples, "{backend}");
        drop(loader);
        assert_eq!(n(&hub.stats().throttled) - throttled, 2, "{backend}");
        assert_eq!(
            n(&hub.stats().early) - early,
            0,
            "{backend}: a request inside Retry-After"
        );
    }
    // The control: the same without the pacer (which is what honours
    // `Retry-After`): the backoff of a throttled retry is at most 400 ms
    // (jittered), so the first retry comes inside the 2 s wait. How many
    // come inside it depends on the jitter: at least one.
    struct Pacing;
    impl Drop for Pacing {
        fn drop(&mut self) {
            set_pacing(true);
        }
    }
    let _restore = Pacing;
    set_pacing(false);
    let early = n(&hub.stats().early);
    hub.controls().throttle_resolves.store(1, Ordering::SeqCst);
    let loader = Loader::open(config(
        vec!["hf://datasets/org/shards/train".into()],
        "io_uring",
        serde_json::json!({}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 77), samples);
    assert!(
        n(&hub.stats().early) > early,
        "no retry came early without the pacer"
    );
}

/// A shard read in ranges, one at a time: its target expires after the
/// second; the third range's request is refused 403 and the shard's URL
/// resolved again, once, and the read goes on. Refused again after that:
/// the named error, after exactly one more resolve.
#[test]
fn an_expired_redirect_is_resolved_again_once() {
    let root = tempfile::tempdir().unwrap();
    let (sizes, samples) = dataset(root.path(), REPO, 1, 78);
    let r = ranges(sizes[0]);
    assert!(r >= 3);
    let hub = start(root.path(), Options::default());
    let _env = hub_env(&hub, None);
    let url = "hf://datasets/org/shards/train/shard-000000.tar";
    let one_at_a_time = serde_json::json!({"reads_in_flight": 1});
    for backend in BACKENDS {
        let s = hub.stats();
        let (resolves, gets, expired) = (n(&s.resolves), n(&s.content_gets), n(&s.expired));
        hub.controls()
            .expire_after
            .store(gets + 2, Ordering::SeqCst);
        let loader =
            Loader::open(config(vec![url.into()], backend, one_at_a_time.clone())).unwrap();
        assert_eq!(stream(&loader, 78), samples, "{backend}");
        drop(loader);
        assert_eq!(n(&s.resolves) - resolves, 2, "{backend}");
        assert_eq!(n(&s.expired) - expired, 1, "{backend}");
        assert_eq!(n(&s.content_gets) - gets, r + 1, "{backend}");
        hub.controls().expire_after.store(0, Ordering::SeqCst);

        let (resolves, gets) = (n(&s.resolves), n(&s.content_gets));
        hub.controls().deny_after.store(gets + 1, Ordering::SeqCst);
        let e = support::first_error(config(vec![url.into()], backend, one_at_a_time.clone()));
        hub.controls().deny_after.store(0, Ordering::SeqCst);
        let text = e.to_string();
        assert!(
            text.contains(url) && text.contains("403"),
            "{backend}: {text}"
        );
        assert!(text.contains("resolved again once"), "{backend}: {text}");
        assert_eq!(n(&s.resolves) - resolves, 2, "{backend}");
        assert_eq!(n(&s.content_gets) - gets, 3, "{backend}");
    }
}

/// A renamed repository answers 307 to its new name (relative): the API
/// calls and the `resolve/` requests follow it, the token kept (the same
/// origin).
#[test]
fn a_renamed_repository_is_followed() {
    let root = tempfile::tempdir().unwrap();
    let (_, samples) = dataset(root.path(), "org/private", 2, 79);
    let hub = start(
        root.path(),
        Options {
            token: Some(TOKEN.into()),
            private: vec!["org/private".into()],
            renamed: vec![("org/old-name".into(), "org/private".into())],
            ..Options::default()
        },
    );
    let _env = hub_env(&hub, Some(TOKEN));
    for backend in BACKENDS {
        let loader = Loader::open(config(
            vec!["hf://datasets/org/old-name/train".into()],
            backend,
            serde_json::json!({}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 79), samples, "{backend}");
    }
    assert_eq!(n(&hub.stats().denied) + n(&hub.stats().bad_signature), 0);
}

/// Many shards, default reads in flight on several workers: the `resolve/`
/// requests are one a shard, whatever the ranges (the count the hot path
/// is held to).
#[test]
fn redirects_cost_one_request_a_shard() {
    let root = tempfile::tempdir().unwrap();
    let (sizes, samples) = dataset(root.path(), REPO, 8, 80);
    let hub = start(root.path(), Options::default());
    let _env = hub_env(&hub, None);
    let loader = Loader::open(config(
        vec!["hf://datasets/org/shards/train".into()],
        "io_uring",
        serde_json::json!({"workers": 2}),
    ))
    .unwrap();
    assert_eq!(stream(&loader, 80), samples);
    let all: u64 = sizes.iter().map(|&s| ranges(s)).sum();
    assert_eq!(n(&hub.stats().resolves), 8);
    assert_eq!(n(&hub.stats().served), all);
}

/// Two ranks over a private Hub dataset with no counts split its shards
/// whole (a nominal epoch, equal and at most once); a `shardindex.json`
/// beside the shards, read like them (the token, the pinned commit, the
/// content host's redirect), makes the split exact.
#[test]
fn ranks_split_a_hub_dataset_by_shard_and_exactly_with_a_shardindex() {
    let root = tempfile::tempdir().unwrap();
    let repo = "org/private";
    let dir = root.path().join(repo).join("train");
    let o = GenOptions {
        shards: 4,
        shard_bytes: 300_000,
        sample_bytes: 4_000,
        spread: 0.5,
        fields: vec!["jpg".into(), "cls".into()],
        seed: 75,
    };
    let counts = synth::generate(&dir, &o, |_| {}).unwrap().shard_samples;
    let total: u64 = counts.iter().sum();
    let hub = start(
        root.path(),
        Options {
            token: Some(TOKEN.into()),
            private: vec![repo.into()],
            ..Options::default()
        },
    );
    let _env = hub_env(&hub, Some(TOKEN));
    let url = "hf://datasets/org/private/train/shard-{000000..000003}.tar";
    let ranks = || -> (Vec<usize>, Vec<Vec<u8>>, Vec<Vec<String>>) {
        let (mut lengths, mut keys, mut notes) = (Vec::new(), Vec::new(), Vec::new());
        for rank in 0..2 {
            let cfg = config(
                vec![url.into()],
                "io_uring",
                serde_json::json!({"world_size": 2, "rank": rank, "remainder": "drop"}),
            );
            let loader = Loader::open(cfg).unwrap();
            let mut batches = 0;
            loop {
                match loader
                    .next(Some(std::time::Duration::from_secs(60)))
                    .unwrap()
                {
                    ringfeed::Next::Batch(b) => {
                        batches += 1;
                        for s in b.samples() {
                            for (name, data) in s.fields() {
                                assert!(synth::verify(75, s.key(), name, data), "bad bytes");
                            }
                            keys.push(s.key().to_vec());
                        }
                    }
                    ringfeed::Next::EndOfEpoch(_) => {}
                    ringfeed::Next::Finished => break,
                    ringfeed::Next::Timeout => panic!("stalled"),
                }
            }
            lengths.push(batches);
            notes.push(loader.stats().notes);
        }
        (lengths, keys, notes)
    };
    let split = |notes: &[Vec<String>]| {
        notes
            .iter()
            .all(|n| n.iter().any(|n| n.contains("split by shard")))
    };
    // No counts: by shard, equal, no sample twice.
    let (lengths, keys, notes) = ranks();
    assert!(split(&notes), "{notes:?}");
    assert_eq!(lengths[0], lengths[1]);
    let unique: std::collections::BTreeSet<_> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "a sample twice");
    // A shard index beside the shards, as `ringfeed index` writes one.
    let list: Vec<serde_json::Value> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"url": synth::shard_name(i, 4), "nsamples": n}))
        .collect();
    std::fs::write(
        dir.join("shardindex.json"),
        serde_json::json!({"wids_version": 1, "shardlist": list}).to_string(),
    )
    .unwrap();
    hub.stats().resolved_revisions.lock().unwrap().clear();
    let (lengths, keys, notes) = ranks();
    assert!(
        !notes.iter().flatten().any(|n| n.contains("split by shard")),
        "{notes:?}"
    );
    assert_eq!(lengths[0], lengths[1]);
    let unique: std::collections::BTreeSet<_> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "a sample twice");
    assert_eq!(
        keys.len() as u64,
        total / 2 * 2,
        "every sample but the odd one"
    );
    let sha = HubEmulator::commit(repo, "main");
    let asked = hub.stats().resolved_revisions.lock().unwrap().clone();
    assert!(asked.iter().all(|r| *r == sha), "{asked:?}, not all {sha}");
    assert_eq!(n(&hub.stats().bad_signature) + n(&hub.stats().expired), 0);
}
