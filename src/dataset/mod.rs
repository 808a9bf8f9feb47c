//! Dataset URLs: WebDataset brace expansion and the local sources.
//!
//! A URL names one shard (`/data/a.tar`, `file:///data/a.tar`), a set of
//! shards by brace expansion (`shard-{000000..000127}.tar`, `{train,val}`), or
//! a directory whose `.tar` files are taken in name order, an `http(s)://`
//! URL (size from `HEAD`), an `s3://bucket/key` object or an
//! `s3://bucket/prefix/` to list (see `crate::net::s3`), or a manifest
//! (`*.manifest`, or the `manifest` key): one `URL [size [samples]]` per
//! line, so a job starts without listing or `HEAD`s, and the plan knows each
//! shard's sample count without reading it (`ringfeed index` writes one).

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{NetOptions, with_retries};
use crate::net::http::{FailKind, HttpObject};
use crate::net::retry::Jitter;
use crate::net::s3::list::{LIST_PAGE, S3Client, s3_error};
use crate::net::s3::{Env, S3Config, S3Url};

/// Upper bound on what one URL may expand to; a typo such as
/// `{0..99999999}` must fail fast, not allocate gigabytes of names.
pub const MAX_EXPANSION: usize = 10_000_000;

/// Where a shard's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Http(Arc<HttpObject>),
}

/// One shard to read.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The name used in errors and stats: the path or URL as given.
    pub name: String,
    pub source: Source,
    pub size: u64,
    /// Samples in the shard, when a manifest gave them or the loader
    /// counted them (see `crate::plan`: splitting among consumers needs them).
    pub samples: Option<u64>,
}

/// Expands every URL and checks each shard exists (local files) or answers
/// `HEAD` with its size (HTTP), in order. S3 settings come from the process
/// environment; see [`resolve_with`].
pub fn resolve(urls: &[String], net: &NetOptions) -> Result<Vec<Shard>> {
    resolve_with(urls, None, net, &S3Config::default(), &Env::process())
}

/// Resolves a loader's configuration: the `manifest` first, then `urls`.
pub fn resolve_config(cfg: &crate::Config, net: &NetOptions) -> Result<Vec<Shard>> {
    resolve_with(
        &cfg.urls,
        cfg.manifest.as_deref(),
        net,
        &cfg.s3,
        &Env::process(),
    )
}

/// [`resolve`] with the manifest, the S3 settings and the environment given.
/// The S3 client (and so the credential chain) is only set up when an
/// `s3://` URL appears.
pub fn resolve_with(
    urls: &[String],
    manifest: Option<&str>,
    net: &NetOptions,
    s3: &S3Config,
    env: &Env,
) -> Result<Vec<Shard>> {
    let mut r = Resolver {
        net,
        pool: HttpPool::new(net.stall, Arc::clone(&net.tls)),
        jitter: Jitter::new(0x5eed),
        s3_config: s3,
        env,
        s3: None,
        shards: Vec::new(),
    };
    if let Some(m) = manifest {
        r.manifest(m)?;
    }
    for url in urls {
        if url.ends_with(".manifest") {
            r.manifest(url)?;
            continue;
        }
        for one in expand_braces(url)? {
            r.one(&one, None)?;
        }
    }
    Ok(r.shards)
}

struct Resolver<'a> {
    net: &'a NetOptions,
    pool: HttpPool,
    jitter: Jitter,
    s3_config: &'a S3Config,
    env: &'a Env,
    s3: Option<S3Client>,
    shards: Vec<Shard>,
}

impl Resolver<'_> {
    /// One expanded URL; `size` from a manifest spares the `HEAD`.
    fn one(&mut self, one: &str, size: Option<u64>) -> Result<()> {
        if one.starts_with("s3://") {
            return self.s3_url(one, size);
        }
        if one.starts_with("http://") || one.starts_with("https://") {
            let shard = http_shard(one, size, &mut self.pool, self.net, &mut self.jitter)?;
            self.shards.push(shard);
            return Ok(());
        }
        let path = local_path(one)?;
        let meta = std::fs::metadata(&path).map_err(|e| Error::io("open", &path, &e))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&path)
                .map_err(|e| Error::io("list", &path, &e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "tar"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(Error::Url {
                    url: one.to_string(),
                    reason: "the directory holds no .tar files".into(),
                });
            }
            for p in found {
                let m = std::fs::metadata(&p).map_err(|e| Error::io("open", &p, &e))?;
                self.shards.push(Shard {
                    name: p.display().to_string(),
                    source: Source::File(p),
                    size: m.len(),
                    samples: None,
                });
            }
        } else {
            self.shards.push(Shard {
                name: one.to_string(),
                source: Source::File(path),
                size: meta.len(),
                samples: None,
            });
        }
        Ok(())
    }

    fn s3_client(&mut self) -> Result<&S3Client> {
        if self.s3.is_none() {
            self.s3 = Some(S3Client::new(self.s3_config, self.env)?);
        }
        Ok(self.s3.as_ref().expect("set above"))
    }

    /// An object (size from the manifest or `HEAD`), or a prefix to list.
    fn s3_url(&mut self, one: &str, size: Option<u64>) -> Result<()> {
        let url = S3Url::parse(one).map_err(|reason| Error::Url {
            url: one.to_string(),
            reason,
        })?;
        let (net, page) = (self.net, LIST_PAGE);
        let mut jitter = Jitter::new(0x5eed ^ 3);
        if url.is_prefix() {
            let client = self.s3_client()?;
            let listed = client.list(&url.bucket, &url.key, page, net, &mut jitter)?;
            let mut found = Vec::new();
            for (key, size) in listed.into_iter().filter(|(k, _)| k.ends_with(".tar")) {
                let u = S3Url {
                    bucket: url.bucket.clone(),
                    key,
                };
                found.push(Shard {
                    name: u.display(),
                    source: Source::Http(Arc::new(client.object(&u)?)),
                    size,
                    samples: None,
                });
            }
            if found.is_empty() {
                return Err(Error::Url {
                    url: one.to_string(),
                    reason: "the prefix holds no .tar objects".into(),
                });
            }
            self.shards.extend(found);
            return Ok(());
        }
        let obj = Arc::new(self.s3_client()?.object(&url)?);
        let size = match size {
            Some(s) => s,
            None => s3_size(&obj, &url, &mut self.pool, net, &mut self.jitter)?,
        };
        self.shards.push(Shard {
            name: url.display(),
            source: Source::Http(obj),
            size,
            samples: None,
        });
        Ok(())
    }

    /// Each line of a manifest: `URL [size]`; `#` starts a comment. Relative
    /// local paths are taken from the manifest's directory.
    fn manifest(&mut self, m: &str) -> Result<()> {
        if m.contains("://") && !m.starts_with("file://") {
            return Err(Error::Url {
                url: m.to_string(),
                reason: "manifests are read from local files (a path or file://); copy it first"
                    .into(),
            });
        }
        let path = local_path(m)?;
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("open", &path, &e))?;
        let entries = parse_manifest(&text).map_err(|reason| Error::Url {
            url: m.to_string(),
            reason,
        })?;
        if entries.is_empty() {
            return Err(Error::Url {
                url: m.to_string(),
                reason: "the manifest lists no shards".into(),
            });
        }
        let dir = path.parent().map(PathBuf::from).unwrap_or_default();
        for (url, size, samples) in entries {
            let url = if !url.contains("://") && !url.starts_with('/') {
                dir.join(&url).display().to_string()
            } else {
                url
            };
            let before = self.shards.len();
            self.one(&url, size)?;
            if samples.is_some() {
                if self.shards.len() != before + 1 {
                    return Err(Error::Url {
                        url: m.to_string(),
                        reason: format!(
                            "`{url}` names {} shards; a sample count belongs to one",
                            self.shards.len() - before
                        ),
                    });
                }
                self.shards[before].samples = samples;
            }
        }
        Ok(())
    }
}

/// A manifest line: URL, size in bytes, samples.
pub type ManifestEntry = (String, Option<u64>, Option<u64>);

/// The lines of a manifest: `URL [size [samples]]`, blank lines and `#`
/// comments skipped; the error names the line.
pub fn parse_manifest(text: &str) -> std::result::Result<Vec<ManifestEntry>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split_once('#').map_or(raw, |(a, _)| a).trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let url = fields.next().unwrap_or_default().to_string();
        let size = match fields.next() {
            None => None,
            Some(f) => Some(
                f.parse::<u64>()
                    .map_err(|_| format!("line {}: the size `{f}` is not a byte count", i + 1))?,
            ),
        };
        let samples =
            match fields.next() {
                None => None,
                Some(f) => Some(f.parse::<u64>().map_err(|_| {
                    format!("line {}: the sample count `{f}` is not a number", i + 1)
                })?),
            };
        if fields.next().is_some() {
            return Err(format!(
                "line {}: expected `URL [size [samples]]`, got more fields",
                i + 1
            ));
        }
        out.push((url, size, samples));
    }
    Ok(out)
}

/// An S3 object's size from `HEAD`; when that is refused, one ranged GET
/// reads the XML error body (a `HEAD` answer has none) for S3's code, so the
/// error says NoSuchKey, NoSuchBucket or AccessDenied.
fn s3_size(
    obj: &HttpObject,
    url: &S3Url,
    pool: &mut HttpPool,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<u64> {
    match with_retries(net, jitter, &obj.url, || pool.head(obj)) {
        Ok(size) => Ok(size),
        Err(
            e @ Error::Http {
                kind: FailKind::Client,
                ..
            },
        ) => {
            let mut one = [0u8; 1];
            match pool.fetch(obj, 0, &mut one) {
                Err(f) if f.code.is_some() => Err(s3_error(
                    Error::Http {
                        url: obj.url.clone(),
                        kind: f.kind,
                        message: f.message,
                        attempts: 1,
                    },
                    &url.bucket,
                    &url.key,
                    f.code,
                )),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// An HTTP shard: the URL parsed, its host resolved, its size from `HEAD`
/// unless a manifest gave it.
fn http_shard(
    url: &str,
    size: Option<u64>,
    pool: &mut HttpPool,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<Shard> {
    let parsed = crate::net::http::parse_url(url).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?;
    let addrs = resolve_host(&parsed.host, parsed.port, url, net, jitter)?;
    let obj = Arc::new(HttpObject::new(url, addrs).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?);
    let size = match size {
        Some(s) => s,
        None => with_retries(net, jitter, url, || pool.head(&obj))?,
    };
    Ok(Shard {
        name: url.to_string(),
        source: Source::Http(obj),
        size,
        samples: None,
    })
}

/// Every address of `host`. A name that does not exist fails at once; a
/// temporary resolver failure (EAI_AGAIN) is retried like any network fault.
fn resolve_host(
    host: &str,
    port: u16,
    url: &str,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<Vec<std::net::SocketAddr>> {
    let mut permanent = None;
    let result = with_retries(net, jitter, url, || match (host, port).to_socket_addrs() {
        Ok(a) => Ok(a.collect::<Vec<_>>()),
        Err(e) => {
            let msg = format!("cannot resolve `{host}`: {e}");
            // std reports getaddrinfo's text; only EAI_AGAIN is worth a retry.
            if e.to_string().contains("Temporary failure") {
                Err(crate::net::http::Fail::new(FailKind::Dns, msg))
            } else {
                permanent = Some(msg.clone());
                Err(crate::net::http::Fail::new(FailKind::Client, msg))
            }
        }
    });
    match (result, permanent) {
        (Ok(a), _) => Ok(a),
        (Err(_), Some(message)) => Err(Error::Http {
            url: url.to_string(),
            kind: FailKind::Dns,
            message,
            attempts: 1,
        }),
        (Err(e), None) => Err(e),
    }
}

/// Maps a local URL to a path; refuses other schemes with the reason.
pub fn local_path(url: &str) -> Result<PathBuf> {
    let err = |reason: &str| Error::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(err(
                "a file:// URL needs an absolute path (file:///data/a.tar); hosts are not supported",
            ));
        }
        return Ok(PathBuf::from(rest));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(match scheme {
            "s3" | "http" | "https" => err("not a local path (resolved as a network URL)"),
            _ => err(&format!(
                "unsupported scheme `{scheme}`; use a local path or file://"
            )),
        });
    }
    if url.starts_with("pipe:") {
        return Err(err(
            "`pipe:` URLs run a shell command; ringfeed reads shards itself: give the path",
        ));
    }
    Ok(PathBuf::from(url))
}

/// WebDataset brace expansion: `{a,b}` alternatives, `{000..127}` numeric
/// ranges (zero-padded to the width of the first bound, optional `..step`),
/// nested and repeated groups. `\{` and `\}` are literal braces.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let err = |reason: String| Error::Url {
        url: pattern.to_string(),
        reason,
    };
    let mut out = Vec::new();
    expand_into(pattern, &mut String::new(), &mut out).map_err(err)?;
    Ok(out)
}

fn expand_into(
    rest: &str,
    prefix: &mut String,
    out: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let Some((open, close)) = find_group(rest)? else {
        out.push(format!("{prefix}{}", unescape(rest)));
        if out.len() > MAX_EXPANSION {
            return Err(format!("expands to more than {MAX_EXPANSION} names"));
        }
        return Ok(());
    };
    let head = unescape(&rest[..open]);
    let body = &rest[open + 1..close];
    let tail = &rest[close + 1..];
    let alternatives = group_alternatives(body)?;
    let keep = prefix.len();
    for alt in alternatives {
        prefix.push_str(&head);
        // An alternative may itself hold groups: expand it with the tail.
        let combined = format!("{alt}{tail}");
        expand_into(&combined, prefix, out)?;
        prefix.truncate(keep);
    }
    Ok(())
}

fn unescape(s: &str) -> String {
    s.replace("\\{", "{").replace("\\}", "}")
}

/// Finds the first top-level `{...}` group: byte offsets of its braces.
fn find_group(s: &str) -> std::result::Result<Option<(usize, usize)>, String> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    let mut open = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => {
                if depth == 0 {
                    open = Some(i);
                }
                depth += 1;
            }
            b'}' => {
                if depth == 0 {
                    return Err(format!("unmatched `}}` at byte {i}"));
                }
                depth -= 1;
                if depth == 0 {
                    return Ok(open.map(|o| (o, i)));
                }
            }
            _ => {}
        }
        i += 1;
    }
    match open {
        Some(o) => Err(format!("unmatched `{{` at byte {o}")),
        None => Ok(None),
    }
}

fn group_alternatives(body: &str) -> std::result::Result<Vec<String>, String> {
    // Top-level commas split alternatives; a group without one is a range.
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(body[start..i].to_string());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if !parts.is_empty() {
        parts.push(body[start..].to_string());
        return Ok(parts);
    }
    numeric_range(body)
}

fn numeric_range(body: &str) -> std::result::Result<Vec<String>, String> {
    let fields: Vec<&str> = body.split("..").collect();
    let bad =
        || format!("`{{{body}}}` is neither a list `{{a,b}}` nor a numeric range `{{000..127}}`");
    if !(2..=3).contains(&fields.len()) || fields.iter().any(|f| f.is_empty()) {
        return Err(bad());
    }
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (lo, hi) = (num(fields[0])?, num(fields[1])?);
    let step = if fields.len() == 3 {
        num(fields[2])?
    } else {
        1
    };
    if step == 0 {
        return Err(format!("`{{{body}}}` has a step of 0"));
    }
    let count = lo.abs_diff(hi) / step + 1;
    if count as usize > MAX_EXPANSION {
        return Err(format!(
            "`{{{body}}}` expands to more than {MAX_EXPANSION} names"
        ));
    }
    let width = if fields[0].len() > 1 && fields[0].starts_with('0') {
        fields[0].len()
    } else {
        0
    };
    Ok((0..count)
        .map(|k| {
            let v = if lo <= hi {
                lo + k * step
            } else {
                lo - k * step
            };
            format!("{v:0width$}")
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webdataset_brace_forms() {
        assert_eq!(
            expand_braces("s-{000..003}.tar").unwrap(),
            ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
        );
        assert_eq!(
            expand_braces("{a,b}-{1..2}").unwrap(),
            ["a-1", "a-2", "b-1", "b-2"]
        );
        assert_eq!(expand_braces("x{0..6..3}").unwrap(), ["x0", "x3", "x6"]);
        assert_eq!(expand_braces("{3..1}").unwrap(), ["3", "2", "1"]);
        assert_eq!(expand_braces("{a,{b,c}d}").unwrap(), ["a", "bd", "cd"]);
        assert_eq!(expand_braces("plain.tar").unwrap(), ["plain.tar"]);
        assert_eq!(expand_braces("lit\\{x\\}").unwrap(), ["lit{x}"]);
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (p, want) in [
            ("a{0..3", "unmatched `{`"),
            ("a}b", "unmatched `}`"),
            ("{abc}", "neither a list"),
            ("{1..x}", "neither a list"),
            ("{0..9..0}", "step of 0"),
            ("{0..99999999999}", "more than"),
        ] {
            let e = expand_braces(p).unwrap_err().to_string();
            assert!(e.contains(want), "{p}: {e}");
        }
    }

    #[test]
    fn schemes() {
        assert_eq!(
            local_path("file:///d/a.tar").unwrap(),
            PathBuf::from("/d/a.tar")
        );
        assert!(
            local_path("file://host/a.tar")
                .unwrap_err()
                .to_string()
                .contains("absolute")
        );
        assert!(
            local_path("s3://b/k")
                .unwrap_err()
                .to_string()
                .contains("not a local path")
        );
        assert!(
            local_path("gopher://x")
                .unwrap_err()
                .to_string()
                .contains("unsupported scheme `gopher`")
        );
        assert!(
            local_path("pipe:curl x")
                .unwrap_err()
                .to_string()
                .contains("pipe:")
        );
    }

    #[test]
    fn missing_shards_and_empty_directories_are_named() {
        let net = NetOptions {
            stall: std::time::Duration::from_secs(1),
            retry: Default::default(),
            stats: Default::default(),
            tls: Default::default(),
        };
        let e = resolve(&["/nonexistent/shard-{0..1}.tar".into()], &net).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/shard-0.tar"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let e = resolve(&[d.path().display().to_string()], &net).unwrap_err();
        assert!(e.to_string().contains("no .tar files"), "{e}");
    }

    #[test]
    fn manifests_list_urls_with_optional_sizes() {
        let m = "# shards\n\ns3://b/a.tar 100\n  http://h/b.tar   # no size\n/d/c.tar\t7 3\n";
        assert_eq!(
            parse_manifest(m).unwrap(),
            vec![
                ("s3://b/a.tar".to_string(), Some(100), None),
                ("http://h/b.tar".to_string(), None, None),
                ("/d/c.tar".to_string(), Some(7), Some(3)),
            ]
        );
        assert!(
            parse_manifest("a.tar ten\n")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            parse_manifest("a.tar 10 some\n")
                .unwrap_err()
                .contains("the sample count `some` is not a number")
        );
        assert!(
            parse_manifest("\na.tar 1 2 3\n")
                .unwrap_err()
                .contains("line 2")
        );
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.tar"), b"0123").unwrap();
        let mp = d.path().join("set.manifest");
        std::fs::write(&mp, "x.tar\n").unwrap();
        let net = NetOptions {
            stall: std::time::Duration::from_secs(1),
            retry: Default::default(),
            stats: Default::default(),
            tls: Default::default(),
        };
        let shards = resolve(&[mp.display().to_string()], &net).unwrap();
        assert_eq!((shards.len(), shards[0].size), (1, 4));
        let e = resolve(&["s3://b/x.manifest".into()], &net).unwrap_err();
        assert!(e.to_string().contains("local files"), "{e}");
        std::fs::write(&mp, "# nothing\n").unwrap();
        let e = resolve(&[mp.display().to_string()], &net).unwrap_err();
        assert!(e.to_string().contains("lists no shards"), "{e}");
    }
}
