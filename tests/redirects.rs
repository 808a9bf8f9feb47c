//! HTTP redirects against real servers on 127.0.0.1 (tests/support): one
//! server answers 301, 302, 303, 307 or 308 (with absolute and relative
//! `Location`s) and another, or itself, serves the shards. Every sample
//! arrives with the generator's bytes on both backends; a shard's target
//! is remembered (one redirect per shard, whatever its ranges); a target
//! that expires (403) is resolved again once, then named; loops, chains
//! past the bound and `https` to `http` are named errors; credentials
//! (a SigV4 signature, user information) never reach another origin, and
//! do reach the same one (the control).

use ringfeed_test_support as support;

use std::path::Path;
use std::sync::atomic::Ordering;

use ringfeed::net::http::FailKind;
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Config, Error, Loader};
use support::{Server, stream};

const BACKENDS: [&str; 2] = ["io_uring", "threads"];

/// `shards` shards of about 1 MiB under `dir` (its `sub` folder when
/// given); their names, sizes and samples.
fn dataset(dir: &Path, shards: usize, seed: u64) -> (Vec<String>, Vec<u64>, usize) {
    let o = GenOptions {
        shards,
        shard_bytes: 1 << 20,
        sample_bytes: 40_000,
        spread: 0.9,
        fields: vec!["jpg".into(), "cls".into()],
        seed,
    };
    let r = synth::generate(dir, &o, |_| {}).unwrap();
    let names = r
        .paths
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    let sizes = r
        .paths
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .collect();
    (names, sizes, r.samples as usize)
}

/// One worker, one read in flight and no hedges: a shard's ranges go one
/// after the other, so every request count below is exact.
fn config(urls: Vec<String>, backend: &str, extra: serde_json::Value) -> Config {
    let mut m = serde_json::json!({
        "urls": urls,
        "memory_budget": "16MiB",
        "chunk_size": "256KiB",
        "reads_in_flight": 1,
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

/// A manifest of `urls` with their sizes: the loader opens without a
/// request, so the first request of each shard is a ranged GET.
fn manifest(dir: &Path, urls: &[String], sizes: &[u64]) -> String {
    let path = dir.join("redirected.manifest");
    let text: String = urls
        .iter()
        .zip(sizes)
        .map(|(u, s)| format!("{u} {s}\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The ranged GETs a shard of `size` bytes is read in, 256 KiB each.
fn ranges(size: u64) -> usize {
    size.div_ceil(256 << 10) as usize
}

/// Every status, each with an absolute `Location` to another server and
/// a relative one to the redirecting server itself: the bytes arrive
/// whole, and each shard is redirected once (the `HEAD` at open of the
/// first shard included), not once per range.
#[test]
fn every_redirect_status_is_followed_once_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (names, sizes, samples) = dataset(dir.path(), 2, 61);
    let content = Server::start(dir.path().to_path_buf());
    let front = Server::start(dir.path().to_path_buf());
    front.faults.record.store(true, Ordering::SeqCst);
    for status in [301, 302, 303, 307, 308] {
        for backend in BACKENDS {
            for relative in [false, true] {
                let case = format!("{status} {backend} relative {relative}");
                let urls: Vec<String> = names
                    .iter()
                    .map(|n| {
                        let path = format!("/r{status}/{backend}/{relative}/{n}");
                        let to = if relative {
                            format!("../../../{n}")
                        } else {
                            content.url(n)
                        };
                        front.faults.redirect(&path, status, &to);
                        format!("http://{}{path}", front.addr)
                    })
                    .collect();
                let content_gets = content.faults.gets.load(Ordering::SeqCst);
                let front_gets = front.faults.gets.load(Ordering::SeqCst);
                let loader =
                    Loader::open(config(urls.clone(), backend, serde_json::json!({}))).unwrap();
                assert_eq!(stream(&loader, 61), samples, "{case}");
                drop(loader);
                let all: usize = sizes.iter().map(|&s| ranges(s)).sum();
                let served = if relative {
                    front.faults.gets.load(Ordering::SeqCst) - front_gets
                } else {
                    content.faults.gets.load(Ordering::SeqCst) - content_gets
                };
                assert_eq!(served, all, "{case}: the ranges, each asked once");
                assert!(all >= 2 * names.len(), "{case}: several ranges a shard");
                for u in &urls {
                    let path = &u[u.find("/r").unwrap()..];
                    assert_eq!(front.faults.requests_of(path).len(), 1, "{case}: {path}");
                }
            }
        }
    }
}

/// `HEAD` (the sizes `ringfeed ls` shows) follows redirects too.
#[test]
fn heads_follow_redirects_to_the_size_at_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let (names, sizes, _) = dataset(dir.path(), 2, 62);
    let content = Server::start(dir.path().to_path_buf());
    let front = Server::start(dir.path().to_path_buf());
    for n in &names {
        front
            .faults
            .redirect(&format!("/h/{n}"), 307, &content.url(n));
    }
    let net = ringfeed::net::NetOptions::for_config(&Config::default());
    let urls: Vec<String> = names
        .iter()
        .map(|n| format!("http://{}/h/{n}", front.addr))
        .collect();
    let mut shards = ringfeed::dataset::resolve(&urls, &net).unwrap();
    ringfeed::dataset::head_sizes(&mut shards, &net).unwrap();
    let got: Vec<u64> = shards.iter().map(|s| s.size.unwrap()).collect();
    assert_eq!(got, sizes);
    assert_eq!(content.faults.heads.load(Ordering::SeqCst), names.len());
}

/// A remembered target that answers 403 (an expired signed URL) is
/// resolved again from the shard's URL, once: the read goes on. A second
/// 403 after that is the error, named.
#[test]
fn an_expired_target_is_resolved_again_once_then_named() {
    let dir = tempfile::tempdir().unwrap();
    let (names, sizes, samples) = dataset(dir.path(), 1, 63);
    assert!(ranges(sizes[0]) >= 3);
    for backend in BACKENDS {
        let content = Server::start(dir.path().to_path_buf());
        let front = Server::start(dir.path().to_path_buf());
        front.faults.record.store(true, Ordering::SeqCst);
        front
            .faults
            .redirect("/s.tar", 302, &content.url(&names[0]));
        let urls = vec![format!("http://{}/s.tar", front.addr)];
        let m = manifest(dir.path(), &urls, &sizes);
        // The second GET at the target (the shard's second range, asked
        // at the remembered target) is refused as expired.
        *content.faults.forbid.lock().unwrap() = vec![2];
        let loader = Loader::open(config(vec![m.clone()], backend, serde_json::json!({}))).unwrap();
        assert_eq!(stream(&loader, 63), samples, "{backend}");
        assert_eq!(front.faults.requests_of("/s.tar").len(), 2, "{backend}");
        assert_eq!(
            content.faults.gets.load(Ordering::SeqCst),
            ranges(sizes[0]) + 1,
            "{backend}"
        );
        drop(loader);

        // Refused again after the new redirect: named, after one more.
        let content = Server::start(dir.path().to_path_buf());
        let front = Server::start(dir.path().to_path_buf());
        front.faults.record.store(true, Ordering::SeqCst);
        front
            .faults
            .redirect("/s.tar", 302, &content.url(&names[0]));
        let urls = vec![format!("http://{}/s.tar", front.addr)];
        let m = manifest(dir.path(), &urls, &sizes);
        *content.faults.forbid.lock().unwrap() = vec![2, 3];
        let e = support::first_error(config(vec![m], backend, serde_json::json!({})));
        let text = e.to_string();
        assert!(
            matches!(
                e,
                Error::Http {
                    kind: FailKind::Client,
                    ..
                }
            ),
            "{backend}: {text}"
        );
        assert!(text.contains(&urls[0]), "{backend}: {text}");
        assert!(text.contains("403"), "{backend}: {text}");
        assert!(text.contains("resolved again once"), "{backend}: {text}");
        assert_eq!(front.faults.requests_of("/s.tar").len(), 2, "{backend}");
        assert_eq!(content.faults.gets.load(Ordering::SeqCst), 3, "{backend}");
    }
}

/// The error a loader over the shard at `url` ends in, on `backend`: at
/// open (the `HEAD` of the first shard), or with a manifest at its first
/// ranged GET.
fn errors(dir: &Path, url: &str, backend: &str, size: u64) -> [Error; 2] {
    let at_open = support::first_error(config(vec![url.into()], backend, serde_json::json!({})));
    let m = manifest(dir, &[url.to_string()], &[size]);
    let on_read = support::first_error(config(vec![m], backend, serde_json::json!({})));
    [at_open, on_read]
}

fn assert_redirect_error(e: &Error, url: &str, what: &str) {
    let text = e.to_string();
    assert!(
        matches!(
            e,
            Error::Http {
                kind: FailKind::Redirect,
                attempts: 1,
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains(url), "{text}");
    assert!(text.contains(what), "{text}");
    assert_eq!(e.status(), ringfeed::ffi::status::RINGFEED_ERR_DATASET);
}

/// A loop, and a chain one hop past the bound, are named errors at open
/// and on a ranged read; a chain of exactly the bound is read (the
/// control: the bound is where it is said to be).
#[test]
fn loops_and_chains_past_the_bound_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (names, sizes, samples) = dataset(dir.path(), 1, 64);
    let server = Server::start(dir.path().to_path_buf());
    let f = &server.faults;
    f.redirect("/loop-a.tar", 302, "/loop-b.tar");
    f.redirect("/loop-b.tar", 307, &server.url("loop-a.tar"));
    let bound = ringfeed::net::redirect::MAX_REDIRECTS;
    for i in 0..=bound {
        f.redirect(
            &format!("/long-{i}.tar"),
            301,
            &format!("/long-{}.tar", i + 1),
        );
    }
    for i in 0..bound {
        f.redirect(&format!("/ok-{i}.tar"), 308, &format!("/ok-{}.tar", i + 1));
    }
    f.redirect(&format!("/ok-{bound}.tar"), 302, &format!("/{}", names[0]));
    f.redirect(
        &format!("/long-{}.tar", bound + 1),
        302,
        &format!("/{}", names[0]),
    );
    for backend in BACKENDS {
        let url = server.url("loop-a.tar");
        for e in errors(dir.path(), &url, backend, sizes[0]) {
            assert_redirect_error(&e, &url, "redirect loop");
        }
        let url = server.url("long-0.tar");
        for e in errors(dir.path(), &url, backend, sizes[0]) {
            assert_redirect_error(&e, &url, &format!("more than {bound} redirects"));
        }
        // ok-1 .. ok-10 and the shard: exactly the bound.
        let loader = Loader::open(config(
            vec![server.url("ok-1.tar")],
            backend,
            serde_json::json!({}),
        ))
        .unwrap();
        assert_eq!(stream(&loader, 64), samples, "{backend}");
    }
}

/// `https` to `http` is refused by name; `https` to `https` (the
/// controls), within the host and to another TLS server (its own
/// certificate and name checked), is followed.
#[test]
fn https_to_http_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (names, sizes, samples) = dataset(dir.path(), 1, 65);
    let plain = Server::start(dir.path().to_path_buf());
    let (tls, pem) = Server::start_tls(dir.path().to_path_buf());
    let (other, other_pem) = Server::start_tls(dir.path().to_path_buf());
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, format!("{pem}{other_pem}")).unwrap();
    tls.faults.redirect("/down.tar", 302, &plain.url(&names[0]));
    tls.faults
        .redirect("/same.tar", 302, &format!("/{}", names[0]));
    tls.faults
        .redirect("/cross.tar", 307, &other.https_url("localhost", &names[0]));
    let ca = serde_json::json!({"ca_bundle": ca});
    for backend in BACKENDS {
        let url = tls.https_url("localhost", "down.tar");
        let at_open = support::first_error(config(vec![url.clone()], backend, ca.clone()));
        let m = manifest(dir.path(), std::slice::from_ref(&url), &sizes);
        let on_read = support::first_error(config(vec![m], backend, ca.clone()));
        for e in [at_open, on_read] {
            assert_redirect_error(&e, &url, "from https to http");
        }
        assert_eq!(plain.faults.gets.load(Ordering::SeqCst), 0);
        assert_eq!(plain.faults.heads.load(Ordering::SeqCst), 0);
        for path in ["same.tar", "cross.tar"] {
            let url = tls.https_url("localhost", path);
            let loader = Loader::open(config(vec![url], backend, ca.clone())).unwrap();
            assert_eq!(stream(&loader, 65), samples, "{backend} {path}");
        }
    }
    assert_eq!(
        other.faults.gets.load(Ordering::SeqCst),
        2 * ranges(sizes[0]),
        "the other server served every range, on both backends"
    );
}

/// An S3 object's request is signed; its redirect to another origin
/// carries no signature (no `Authorization`, no `x-amz-*` header) and a
/// `Location`'s user information is never sent. The control: a redirect
/// within the origin keeps the signature (signed again for the new path),
/// so the recording would see one.
#[test]
fn credentials_never_reach_another_origin() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bkt");
    let (names, _, samples) = dataset(&bucket, 1, 66);
    let s3 = Server::start(dir.path().to_path_buf());
    let other = Server::start(bucket.clone());
    for s in [&s3, &other] {
        s.faults.record.store(true, Ordering::SeqCst);
    }
    let n = &names[0];
    let elsewhere = format!("http://user:pw@{}/{n}", other.addr);
    s3.faults.redirect("/bkt/away.tar", 307, &elsewhere);
    s3.faults
        .redirect("/bkt/here.tar", 307, &format!("/bkt/{n}"));
    let s3_keys = serde_json::json!({
        "s3_endpoint": format!("http://{}", s3.addr),
        "s3_region": "us-east-1",
        "aws_access_key_id": "AKIDREDIRECTTEST",
        "aws_secret_access_key": "redirect-secret",
    });
    for backend in BACKENDS {
        for key in ["away.tar", "here.tar"] {
            let loader = Loader::open(config(
                vec![format!("s3://bkt/{key}")],
                backend,
                s3_keys.clone(),
            ))
            .unwrap();
            assert_eq!(stream(&loader, 66), samples, "{backend} {key}");
        }
        let asked = s3.faults.requests_of("/bkt/away.tar");
        assert!(
            !asked.is_empty()
                && asked
                    .iter()
                    .all(|h| h.contains("authorization: aws4-hmac-sha256"))
        );
        let at_other = other.faults.requests_of(&format!("/{n}"));
        assert!(!at_other.is_empty(), "{backend}");
        for h in &at_other {
            assert!(!h.contains("authorization"), "{backend}: {h}");
            assert!(!h.contains("x-amz-"), "{backend}: {h}");
            assert!(
                !h.contains("user:pw") && !h.contains("dxnlcjpwdw"),
                "{backend}: {h}"
            );
        }
        // The control: within the origin the signature goes along.
        let within = s3.faults.requests_of(&format!("/bkt/{n}"));
        assert!(!within.is_empty(), "{backend}");
        for h in &within {
            assert!(
                h.contains("authorization: aws4-hmac-sha256"),
                "{backend}: {h}"
            );
        }
        s3.faults.requests.lock().unwrap().clear();
        other.faults.requests.lock().unwrap().clear();
    }
}

/// The control plane's reqwest clients (a mounted HTTP source's listing
/// pages) hold to the same rules: a loop, a chain past the bound and
/// `https` to `http` are refused; a plain redirect is followed.
#[test]
fn the_listing_client_holds_to_the_same_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), b"<a href=x.tar>x</a>").unwrap();
    let server = Server::start(dir.path().to_path_buf());
    let (tls, _) = Server::start_tls(dir.path().to_path_buf());
    let f = &server.faults;
    f.redirect("/a/", 302, "/b/");
    f.redirect("/b/", 302, "/a/");
    f.redirect("/moved/", 301, "/index.html");
    for i in 0..=ringfeed::net::redirect::MAX_REDIRECTS {
        f.redirect(&format!("/l{i}/"), 302, &format!("/l{}/", i + 1));
    }
    tls.faults
        .redirect("/down/", 302, &server.url("index.html"));
    let client = reqwest::blocking::Client::builder()
        .redirect(ringfeed::net::redirect::reqwest_policy())
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let text = client
        .get(server.url("moved/"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(text.contains("x.tar"), "{text}");
    for (url, what) in [
        (server.url("a/"), "redirect loop"),
        (server.url("l0/"), "more than 10 redirects"),
        (tls.https_url("localhost", "down/"), "from https to http"),
    ] {
        let e = client.get(&url).send().unwrap_err();
        let chain = format!("{e:?}");
        assert!(e.is_redirect(), "{url}: {chain}");
        assert!(chain.contains(what), "{url}: {chain}");
    }
}
