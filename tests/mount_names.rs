//! Hostile names in what a mount lists, through the mount's file system
//! (`ringfeed::mount::Fs`, what the FUSE adapter answers with): an HTTP
//! listing page and an S3 listing, served on 127.0.0.1 by this test, that
//! name `..`, `.`, empty names, names with `/` or NUL, names that are not
//! UTF-8 and keys outside the listed prefix. Each is left out (or shown
//! as the one safe name it stands for), never a panic, never an entry
//! that leads outside the directory; and a local source whose directory
//! is swapped for a symbolic link after listing refuses the open.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use ringfeed::mount::tree::TreeKind;
use ringfeed::mount::{Fs, MountOptions};
use serde_json::json;

/// The root directory's inode.
const ROOT: u64 = 1;

/// A server that answers every request with `answer(method, path)`:
/// (status, content type, body; a HEAD gets the head only).
fn serve(
    answer: impl Fn(&str, &str) -> (u16, &'static str, Vec<u8>) + Send + Sync + 'static,
) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                let mut r = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut first = String::new();
                    if r.read_line(&mut first).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; len];
                    let _ = r.read_exact(&mut body);
                    let mut parts = first.split_whitespace();
                    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                    let (status, ty, body) = answer(method, path);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: {ty}\r\nContent-Length: {}\r\n\
                         ETag: \"e1\"\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    if method != "HEAD" {
                        let _ = conn.write_all(&body);
                    }
                }
            });
        }
    });
    format!("127.0.0.1:{}", addr.port())
}

/// The names `Fs::readdir` shows in `dir`, without `.` and `..`.
fn names(fs: &Fs, dir: u64) -> Vec<(String, TreeKind)> {
    let mut v: Vec<(String, TreeKind)> = fs
        .readdir(dir)
        .unwrap()
        .into_iter()
        .skip(2)
        .map(|(_, k, n)| (n, k))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn config(extra: serde_json::Value) -> ringfeed::Config {
    let mut m = json!({"urls": ["unused.tar"]});
    m.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    ringfeed::Config::from_map(m.as_object().unwrap()).unwrap()
}

#[test]
fn a_listing_page_of_hostile_links_shows_only_safe_names() {
    let page = r#"<html><body>
<a href="../">../</a> <a href="..">up</a> <a href="./">here</a> <a href=".">dot</a>
<a href="">empty</a> <a href="/etc/passwd">abs</a> <a href="%2e%2e/">enc-up</a>
<a href="%2E%2E">enc-up2</a> <a href="a%2Fb">enc-slash</a> <a href="x%00y">nul</a>
<a href="%ff%fe">not-utf8</a> <a href="a/b">two</a> <a href="//evil/x">net</a>
<a href="http://elsewhere/f">abs-url</a> <a href="good.bin">good</a>
<a href="sp%20ace.bin">space</a> <a href="sub/">sub/</a> <a href="%2e">enc-dot</a>
</body></html>"#;
    let addr = serve(move |method, path| match (method, path) {
        ("GET", "/d/") => (200, "text/html", page.as_bytes().to_vec()),
        (_, "/d/good.bin" | "/d/sp%20ace.bin") => {
            (200, "application/octet-stream", b"bytes".to_vec())
        }
        _ => (404, "text/plain", b"no".to_vec()),
    });
    let fs = Fs::new(
        &format!("http://{addr}/d/"),
        &config(json!({})),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(
        names(&fs, ROOT),
        vec![
            ("good.bin".to_string(), TreeKind::File),
            ("sp ace.bin".to_string(), TreeKind::File),
            ("sub".to_string(), TreeKind::Dir),
        ]
    );
    for bad in ["..", ".", "", "a/b", "etc", "passwd", "x\0y"] {
        assert!(fs.lookup(ROOT, bad).is_err(), "{bad:?}");
    }
    assert_eq!(fs.lookup(ROOT, "good.bin").unwrap().size, 5);
}

#[test]
fn an_s3_listing_of_hostile_keys_shows_only_the_keys_beneath_its_prefix() {
    let key =
        |k: &str| format!("<Contents><Key>{k}</Key><Size>5</Size><ETag>\"e1\"</ETag></Contents>");
    let prefix = |p: &str| format!("<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>");
    let mut xml = String::from(
        r#"<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>data/</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"#,
    );
    for k in [
        "data/good.bin",
        "data/",
        "data/.",
        "data/..",
        "data/a/../b",
        "data//x",
        // Outside the prefix: a server that answers another directory's
        // keys, one as long as the prefix, one cut inside a character.
        "other/outside.bin",
        "zzzzzfake.bin",
        "dat",
        "dd\u{e9}\u{e9}.bin",
        "data/\u{e9}t\u{e9}.bin",
    ] {
        xml.push_str(&key(k));
    }
    for p in [
        "data/sub/",
        "data/../",
        "data/./",
        "data//",
        "other/x/",
        "\u{e9}\u{e9}\u{e9}/",
    ] {
        xml.push_str(&prefix(p));
    }
    xml.push_str("</ListBucketResult>");
    let addr = serve(move |method, path| match method {
        "GET" if path.starts_with("/b?") || path.starts_with("/b/?") => {
            (200, "application/xml", xml.clone().into_bytes())
        }
        _ => (
            404,
            "application/xml",
            b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
        ),
    });
    let cfg = config(
        json!({"s3_endpoint": format!("http://{addr}"), "s3_unsigned": true,
                           "s3_path_style": true, "s3_region": "us-east-1"}),
    );
    let fs = Fs::new("s3://b/data/", &cfg, MountOptions::default()).unwrap();
    assert_eq!(
        names(&fs, ROOT),
        vec![
            ("good.bin".to_string(), TreeKind::File),
            ("sub".to_string(), TreeKind::Dir),
            ("\u{e9}t\u{e9}.bin".to_string(), TreeKind::File),
        ]
    );
    for bad in ["..", ".", "", "a", "x", "fake.bin", "outside.bin"] {
        assert!(fs.lookup(ROOT, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_local_directory_swapped_for_a_link_after_listing_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), b"inside").unwrap();
    std::fs::create_dir(t.path().join("outside")).unwrap();
    std::fs::write(t.path().join("outside/f"), b"secret!").unwrap();
    let fs = Fs::new(
        root.to_str().unwrap(),
        &config(json!({})),
        MountOptions::default(),
    )
    .unwrap();
    let d = fs.lookup(ROOT, "d").unwrap().ino;
    let f = fs.lookup(d, "f").unwrap();
    assert_eq!(f.size, 6);
    let (fh, _) = fs.open(f.ino, libc::O_RDONLY).unwrap();
    fs.release(fh);
    // The swap, after the listing the mount keeps for its time-to-live.
    std::fs::rename(root.join("d"), t.path().join("old")).unwrap();
    std::os::unix::fs::symlink(t.path().join("outside"), root.join("d")).unwrap();
    // Control: the path rebuilt from the root's name reaches the secret.
    assert_eq!(std::fs::read(root.join("d/f")).unwrap(), b"secret!");
    let e = fs.open(f.ino, libc::O_RDONLY).unwrap_err();
    assert!(
        e.0 == libc::ELOOP || e.0 == libc::ENOTDIR,
        "the open through the link is refused: errno {}",
        e.0
    );
}
