//! Dataset URLs: WebDataset brace expansion and the local sources.
//!
//! A URL names one shard (`/data/a.tar`, `file:///data/a.tar`), a set of
//! shards by brace expansion (`shard-{000000..000127}.tar`, `{train,val}`), or
//! a directory whose `.tar` files are taken in name order. Network schemes
//! (`s3://`, `http(s)://`) are recognised and refused with a clear error until
//! their data plane exists.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::http::{FailKind, HttpObject};
use crate::io::http_sync::HttpPool;
use crate::io::{NetOptions, with_retries};
use crate::retry::Jitter;

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
}

/// Expands every URL and checks each shard exists (local files) or answers
/// `HEAD` with its size (HTTP), in order.
pub fn resolve(urls: &[String], net: &NetOptions) -> Result<Vec<Shard>> {
    let mut shards = Vec::new();
    let mut pool = HttpPool::new(net.stall, Arc::clone(&net.tls));
    let mut jitter = Jitter::new(0x5eed);
    for url in urls {
        for one in expand_braces(url)? {
            if one.starts_with("http://") || one.starts_with("https://") {
                shards.push(http_shard(&one, &mut pool, net, &mut jitter)?);
                continue;
            }
            let path = local_path(&one)?;
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
                        url: one,
                        reason: "the directory holds no .tar files".into(),
                    });
                }
                for p in found {
                    let m = std::fs::metadata(&p).map_err(|e| Error::io("open", &p, &e))?;
                    shards.push(Shard {
                        name: p.display().to_string(),
                        source: Source::File(p),
                        size: m.len(),
                    });
                }
            } else {
                shards.push(Shard {
                    name: one,
                    source: Source::File(path),
                    size: meta.len(),
                });
            }
        }
    }
    Ok(shards)
}

/// An HTTP shard: the URL parsed, its host resolved, its size from `HEAD`.
fn http_shard(
    url: &str,
    pool: &mut HttpPool,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<Shard> {
    let parsed = crate::http::parse_url(url).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?;
    let addrs = resolve_host(&parsed.host, parsed.port, url, net, jitter)?;
    let obj = Arc::new(HttpObject::new(url, addrs).map_err(|reason| Error::Url {
        url: url.to_string(),
        reason,
    })?);
    let size = with_retries(net, jitter, url, || pool.head(&obj))?;
    Ok(Shard {
        name: url.to_string(),
        source: Source::Http(obj),
        size,
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
                Err(crate::http::Fail::new(FailKind::Dns, msg))
            } else {
                permanent = Some(msg.clone());
                Err(crate::http::Fail::new(FailKind::Client, msg))
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
            "s3" => err(
                "s3:// sources are not supported by this version yet; use http(s):// or local paths",
            ),
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
                .contains("not supported")
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
}
