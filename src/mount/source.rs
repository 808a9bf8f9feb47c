//! What a mount shows: an `s3://bucket/prefix/`, an `http(s)://` directory
//! whose server answers a listing page (an HTML index: nginx's
//! `autoindex`, Python's `http.server`, Apache's), or a local directory.
//! Each lists one directory at a time and names the object behind a path:
//! an [`HttpObject`] read with the engine's ranged reads, or a local file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::beneath::Root;
use super::tree::{Listed, TreeKind};
use crate::config::Config;
use crate::error::{Error, IoOp, Result};
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{NetOptions, with_retries};
use crate::net::hub::api::At;
use crate::net::hub::{HubClient, HubUrl};
use crate::net::object::HttpObject;
use crate::net::retry::Jitter;
use crate::net::s3::list::S3Client;
use crate::net::s3::{Env, S3Url};

/// Where a file's bytes are read from.
pub enum Object {
    /// A local file, opened beneath the root (or why not).
    Local(std::io::Result<std::fs::File>),
    Remote(Arc<HttpObject>),
}

pub enum MountSource {
    /// A local directory: every open starts from its descriptor
    /// (`beneath`).
    Local(Root),
    S3 {
        client: S3Client,
        bucket: String,
        /// Empty, or ending with `/`.
        prefix: String,
    },
    Http {
        /// Ending with `/`.
        base: String,
        addrs: Vec<SocketAddr>,
        client: reqwest::blocking::Client,
    },
    /// A Hugging Face Hub dataset (`hf://datasets/ORG/NAME[@REV][/PATH]`)
    /// at the commit its revision named when mounted: listed with the
    /// Hub's tree API, each file read at `resolve/{commit}/` with the
    /// token (read-only).
    Hub {
        client: HubClient,
        url: HubUrl,
        sha: String,
    },
}

impl MountSource {
    /// The source `url` names: `s3://bucket[/prefix/]`, an `http(s)://`
    /// URL of a directory (its listing page), a local directory.
    pub fn open(url: &str, cfg: &Config) -> Result<MountSource> {
        let bad = |reason: String| Error::Url {
            url: crate::redact::url(url).into_owned(),
            reason,
        };
        if url.starts_with(crate::net::hub::url::SCHEME) {
            let u = crate::net::hub::url::parse(url).map_err(bad)?;
            let client = HubClient::new(&Env::process(), url)?;
            let at = At {
                repo: &u.repo,
                revision: u.revision(),
                path: &u.path,
            };
            // The mount shows one commit for its life, as a loader reads
            // one: the revision is resolved once, here.
            let sha = client.commit(
                &at,
                &NetOptions::for_config(cfg),
                &mut Jitter::new(0x6875_626d_6e74),
            )?;
            return Ok(MountSource::Hub {
                client,
                url: u,
                sha,
            });
        }
        if url.starts_with("s3://") {
            let u = S3Url::parse(url).map_err(bad)?;
            let mut prefix = u.key.clone();
            if !prefix.is_empty() && !prefix.ends_with('/') {
                prefix.push('/');
            }
            let client = S3Client::new(&cfg.s3, &Env::process())?;
            return Ok(MountSource::S3 {
                client,
                bucket: u.bucket,
                prefix,
            });
        }
        if url.starts_with("http://") || url.starts_with("https://") {
            let p = crate::net::http::parse_url(url).map_err(bad)?;
            let addrs: Vec<SocketAddr> = (p.host.as_str(), p.port)
                .to_socket_addrs()
                .map_err(|e| bad(format!("cannot resolve `{}`: {e}", p.host)))?
                .collect();
            let base = if url.ends_with('/') {
                url.to_string()
            } else {
                format!("{url}/")
            };
            let client = reqwest::blocking::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(60))
                .redirect(crate::net::redirect::reqwest_policy())
                .build()
                .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
            return Ok(MountSource::Http {
                base,
                addrs,
                client,
            });
        }
        let path = PathBuf::from(url.strip_prefix("file://").unwrap_or(url));
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => Root::open(&path)
                .map(MountSource::Local)
                .map_err(|e| Error::io(IoOp::Open, &path, &e)),
            Ok(_) => Err(bad("is not a directory".into())),
            Err(e) => Err(Error::io(IoOp::Open, &path, &e)),
        }
    }

    /// The URL of the object at `rel` (a path from the mount's root), as
    /// a loader names it: the cache entries of both are the same.
    pub fn url(&self, rel: &str) -> String {
        match self {
            MountSource::Local(root) => root.join(rel).to_string_lossy().into_owned(),
            MountSource::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}{rel}"),
            MountSource::Http { base, .. } => format!("{base}{}", encode_path(rel)),
            MountSource::Hub { url, .. } => url.name_of(&hub_path(&url.path, rel)),
        }
    }

    /// Whether new files can be written here (not over HTTP, not to the
    /// Hub).
    pub fn writable(&self) -> bool {
        matches!(self, MountSource::Local(_) | MountSource::S3 { .. })
    }

    /// Whether every file's bytes are fixed for the mount's life whatever
    /// its listing says (the Hub's: read at one commit).
    pub fn pinned(&self) -> bool {
        matches!(self, MountSource::Hub { .. })
    }

    /// The object at `rel`.
    pub fn object(&self, rel: &str) -> Result<Object> {
        Ok(match self {
            MountSource::Local(root) => Object::Local(root.open_file(rel)),
            MountSource::S3 {
                client,
                bucket,
                prefix,
            } => Object::Remote(Arc::new(client.object(&S3Url {
                bucket: bucket.clone(),
                key: format!("{prefix}{rel}"),
            })?)),
            MountSource::Http { addrs, .. } => {
                let url = self.url(rel);
                let o = HttpObject::new(&url, addrs.clone())
                    .map_err(|reason| Error::Url { url, reason })?;
                Object::Remote(Arc::new(o))
            }
            MountSource::Hub { client, url, sha } => {
                let path = hub_path(&url.path, rel);
                let name = url.name_of(&path);
                Object::Remote(Arc::new(client.object(&url.repo, sha, &path, &name)?))
            }
        })
    }

    /// The directory at `rel` (empty: the root), one level.
    pub fn list(&self, rel: &str, net: &NetOptions, jitter: &mut Jitter) -> Result<Vec<Listed>> {
        match self {
            MountSource::Local(root) => list_local(root, rel),
            MountSource::S3 {
                client,
                bucket,
                prefix,
            } => {
                let dir = if rel.is_empty() {
                    prefix.clone()
                } else {
                    format!("{prefix}{rel}/")
                };
                let l = client.list_dir(bucket, &dir, net, jitter)?;
                let mut out = Vec::new();
                for (key, size, etag) in l.objects {
                    // A key outside the directory (a server that ignores
                    // the prefix) is no entry, wherever its bytes fall;
                    // the directory's own marker (`dir/` as an empty
                    // object) and names a file system cannot show neither.
                    let Some(name) = under(&key, &dir) else {
                        continue;
                    };
                    if usable(name) {
                        out.push(Listed {
                            name: name.to_string(),
                            kind: TreeKind::File,
                            size,
                            etag,
                            modified: None,
                            mtime: None,
                        });
                    }
                }
                for p in l.prefixes {
                    let Some(name) = under(&p, &dir) else {
                        continue;
                    };
                    let name = name.trim_end_matches('/');
                    if usable(name) {
                        out.push(Listed {
                            name: name.to_string(),
                            kind: TreeKind::Dir,
                            size: 0,
                            etag: None,
                            modified: None,
                            mtime: None,
                        });
                    }
                }
                Ok(out)
            }
            MountSource::Http {
                base,
                addrs,
                client,
            } => {
                let dir_url = if rel.is_empty() {
                    base.clone()
                } else {
                    format!("{base}{}/", encode_path(rel))
                };
                let page = with_retries(net, jitter, &dir_url, || get_text(client, &dir_url))?;
                let mut pool = HttpPool::new(net.stall, Arc::clone(&net.tls));
                let mut out = Vec::new();
                for (name, dir) in parse_index(&page) {
                    if dir {
                        out.push(Listed {
                            name,
                            kind: TreeKind::Dir,
                            size: 0,
                            etag: None,
                            modified: None,
                            mtime: None,
                        });
                        continue;
                    }
                    // An index page gives no sizes a program can trust:
                    // each file's `HEAD` does.
                    let url = format!("{dir_url}{}", encode_path(&name));
                    let obj = HttpObject::new(&url, addrs.clone())
                        .map_err(|reason| Error::Url { url, reason })?;
                    let (size, etag, modified) =
                        with_retries(net, jitter, &obj.url, || pool.head_validators(&obj))?;
                    out.push(Listed {
                        name,
                        kind: TreeKind::File,
                        size,
                        etag,
                        modified,
                        mtime: None,
                    });
                }
                Ok(out)
            }
            MountSource::Hub { client, url, sha } => {
                let dir = hub_path(&url.path, rel);
                let at = At {
                    repo: &url.repo,
                    revision: url.revision(),
                    path: &dir,
                };
                let entries = client.tree(&at, sha, &dir, false, net, jitter)?;
                let mut out = Vec::new();
                for e in entries {
                    let name = match e.path.strip_prefix(&dir) {
                        Some(n) if !dir.is_empty() => n.trim_start_matches('/'),
                        _ => e.path.as_str(),
                    };
                    if usable(name) {
                        out.push(Listed {
                            name: name.to_string(),
                            kind: if e.dir { TreeKind::Dir } else { TreeKind::File },
                            size: if e.dir { 0 } else { e.size },
                            // The content host's, learned by the first
                            // read (the file is pinned by the commit).
                            etag: None,
                            modified: None,
                            mtime: None,
                        });
                    }
                }
                Ok(out)
            }
        }
    }
}

/// The rest of `key` after the directory `dir` (a key prefix), or `None`
/// when `key` is not under it: a string comparison, never a cut at a byte
/// count, which inside a character of another key would panic.
fn under<'a>(key: &'a str, dir: &str) -> Option<&'a str> {
    key.strip_prefix(dir)
}

/// A name a directory entry can hold.
fn usable(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

fn list_local(root: &Root, rel: &str) -> Result<Vec<Listed>> {
    let entries = root
        .list(rel)
        .map_err(|e| Error::io(IoOp::Open, root.join(rel), &e))?;
    let dir = root.join(rel);
    Ok(entries
        .into_iter()
        // A killed mount's temporary files are never shown (and removed
        // once their writer is gone: leftovers.rs).
        .filter(|e| !super::leftovers::hide(&dir, &e.name, e.mtime))
        .map(|e| Listed {
            name: e.name,
            kind: if e.dir { TreeKind::Dir } else { TreeKind::File },
            size: e.size,
            etag: None,
            modified: None,
            mtime: e.mtime,
        })
        .collect())
}

fn get_text(
    client: &reqwest::blocking::Client,
    url: &str,
) -> std::result::Result<String, crate::net::http::HttpFail> {
    use crate::net::http::{FailKind, HttpFail};
    let r = client
        .get(url)
        .send()
        .map_err(|e| HttpFail::new(FailKind::Refused, format!("GET {url}: {e}")))?;
    let status = r.status().as_u16();
    if status != 200 {
        return Err(HttpFail::new(
            FailKind::of_status(status),
            format!("GET {url}: HTTP {status} (no listing page here)"),
        ));
    }
    r.text()
        .map_err(|e| HttpFail::new(FailKind::Protocol, format!("GET {url}: {e}")))
}

/// The entries an HTML index page links to: relative links of one path
/// segment (`name`, or `name/` for a directory), percent-decoded, in page
/// order, each once; parent links, absolute and query links (an index's
/// sort links) are not entries.
pub fn parse_index(html: &str) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    let lower = html.to_ascii_lowercase();
    let mut at = 0;
    while let Some(i) = lower[at..].find("href=") {
        let start = at + i + 5;
        at = start;
        let rest = &html[start..];
        let (quote, body) = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => (Some(q), &rest[1..]),
            _ => (None, rest),
        };
        let end = match quote {
            Some(q) => body.find(q),
            None => body.find(|c: char| c.is_whitespace() || c == '>'),
        };
        let Some(end) = end else { break };
        let link = html_unescape(&body[..end]);
        if link.is_empty()
            || link.starts_with(['/', '?', '#', '.'])
            || link.contains("://")
            || link.contains(['?', '#'])
        {
            continue;
        }
        let (seg, dir) = match link.strip_suffix('/') {
            Some(s) => (s, true),
            None => (link.as_str(), false),
        };
        let Ok(name) = percent_encoding::percent_decode_str(seg).decode_utf8() else {
            continue;
        };
        if usable(&name) && !out.iter().any(|(n, _)| *n == name) {
            out.push((name.into_owned(), dir));
        }
    }
    out
}

/// An attribute's text with its character references resolved (`&amp;`,
/// `&#39;`, `&#x27;`, ...), each on its own: one that cannot be resolved
/// (an HTML-only name such as `&nbsp;`, a bare `&`) stays as written and
/// the others are still resolved.
fn html_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        match tail[1..].find(['&', ';']).map(|j| j + 1) {
            Some(j) if tail.as_bytes()[j] == b';' => {
                let r = &tail[..=j];
                match quick_xml::escape::unescape(r) {
                    Ok(t) => out.push_str(&t),
                    Err(_) => out.push_str(r),
                }
                rest = &tail[j + 1..];
            }
            _ => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A relative path percent-encoded segment by segment.
fn encode_path(rel: &str) -> String {
    const SEG: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    rel.split('/')
        .map(|s| percent_encoding::utf8_percent_encode(s, SEG).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// When a local file was last changed, for its attributes.
pub fn local_mtime(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The path in a Hub repository of `rel` under the mounted `base`
/// (either may be empty).
fn hub_path(base: &str, rel: &str) -> String {
    match (base.is_empty(), rel.is_empty()) {
        (_, true) => base.to_string(),
        (true, false) => rel.to_string(),
        (false, false) => format!("{base}/{rel}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_pages_of_common_servers_list_their_entries() {
        // Python's http.server.
        let py = r#"<ul>
<li><a href="a%20b.tar">a b.tar</a></li>
<li><a href="sub/">sub/</a></li>
<li><a href="x&amp;y.bin">x&amp;y.bin</a></li>
</ul>"#;
        assert_eq!(
            parse_index(py),
            vec![
                ("a b.tar".to_string(), false),
                ("sub".to_string(), true),
                ("x&y.bin".to_string(), false)
            ]
        );
        // nginx autoindex, Apache (sort links, parent, absolute links).
        let nginx = r#"<h1>Index of /d/</h1><hr><pre><a href="../">../</a>
<a href="?C=N;O=D">Name</a> <a href="/icons/x.gif">
<a href='m.safetensors'>m.safetensors</a>  04-Dec-2026 10:00  1234
<a href=http://elsewhere/x>x</a> <a href=plain.txt>plain</a>
<a href="m.safetensors">again</a></pre>"#;
        assert_eq!(
            parse_index(nginx),
            vec![
                ("m.safetensors".to_string(), false),
                ("plain.txt".to_string(), false)
            ]
        );
    }

    #[test]
    fn character_references_are_resolved_once() {
        // `&amp;lt;` is the text `&lt;`, not `<`; numeric references too;
        // a name HTML alone knows stays as written.
        let page = r#"<a href="a&amp;lt;b">1</a><a href="it&#39;s&#x21;">2</a>
<a href="sp&nbsp;ace">3</a><a href="x&amp;y&nbsp;z">4</a><a href="p&q&amp;r;">5</a>"#;
        assert_eq!(
            parse_index(page),
            vec![
                ("a&lt;b".to_string(), false),
                ("it's!".to_string(), false),
                ("sp&nbsp;ace".to_string(), false),
                // One reference it cannot resolve leaves the others resolved.
                ("x&y&nbsp;z".to_string(), false),
                ("p&q&r;".to_string(), false)
            ]
        );
    }

    #[test]
    fn garbage_pages_give_no_entries_and_no_panic() {
        for page in [
            "",
            "href=",
            "href=\"",
            "<a href=\"%ff%fe\">",
            "<a href=\"a/b/c\">",
            "<a href=\"%2F\">",
            "HREF='..'",
        ] {
            assert!(parse_index(page).is_empty(), "{page:?}");
        }
    }

    #[test]
    fn a_listed_key_outside_the_directory_is_no_entry() {
        // `dir/` is 4 bytes; `éa` cut at 4 bytes would split `é` (bytes
        // 3-4 of `abcé...`): the old cut by length panicked there.
        assert_eq!(under("abcéa", "dir/"), None);
        assert!(std::panic::catch_unwind(|| &"abcéa"[4..]).is_err());
        assert_eq!(under("dir/x.bin", "dir/"), Some("x.bin"));
        assert_eq!(under("dir/", "dir/"), Some(""));
        assert_eq!(under("di", "dir/"), None);
        assert_eq!(under("other/x", "dir/"), None);
        assert_eq!(under("x", ""), Some("x"));
    }

    #[test]
    fn paths_are_encoded_segment_by_segment() {
        assert_eq!(encode_path("a b/c+d.tar"), "a%20b/c%2Bd.tar");
    }
}
