//! Where shards' sample counts come from without a pass over the data: a
//! manifest (`URL [size [samples]]` lines; `ringfeed index` writes one) or
//! WebDataset's shard index (`shardindex.json`, `shardindex.rs`), given as
//! the dataset or found beside the shards ([`counts_beside`]). Either may be
//! a local file or a remote one (`http(s)://`, `s3://`), read with a GET or
//! two.
//!
//! What is found beside the shards is the same for every consumer of a job
//! (it lies with the data), so a split planned from it is the same on every
//! rank; that is why a node's cache is not such a source (see
//! `crate::engine` planning).

use std::collections::HashMap;
use std::sync::Arc;

use super::parse::{local_path, parse_manifest};
use super::resolve::Resolver;
use super::shardindex::{folder_of, join, parse_shardindex};
use super::{Shard, Source};
use crate::error::{Error, IoOp, Result};
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{NetOptions, with_retries};
use crate::net::http::FailKind;
use crate::net::object::HttpObject;
use crate::net::retry::Jitter;
use crate::net::s3::S3Url;

/// The names looked for beside the shards, in this order: WebDataset's
/// shard index (as `widsindex create` names it), then a manifest under the
/// name `ringfeed index` documents for the purpose.
pub const BESIDE: [&str; 2] = ["shardindex.json", "ringfeed.manifest"];

/// The largest manifest or index read: 64 MiB holds about a million
/// entries, past the largest public WebDataset sets; a bigger file is more
/// likely a mistake than an index.
const MAX_TEXT: usize = 64 << 20;

/// The first read of a remote manifest or index: most fit in it, and its
/// answer gives the size of the rest.
const FIRST_READ: usize = 1 << 20;

/// Folders probed for indexes at most: a dataset spread over more folders
/// than this is not one that an index beside it describes, and each probe
/// is a request.
const MAX_FOLDERS: usize = 8;

impl Resolver<'_> {
    /// Each line of a manifest: `URL [size [samples]]`; `#` starts a
    /// comment. Relative names are taken from the manifest's folder.
    pub(super) fn manifest(&mut self, m: &str) -> Result<()> {
        let text = self.text(m, false)?.unwrap_or_default();
        let entries = parse_manifest(&text).map_err(|reason| Error::Url {
            url: crate::redact::url(m).into_owned(),
            reason,
        })?;
        if entries.is_empty() {
            return Err(Error::Url {
                url: crate::redact::url(m).into_owned(),
                reason: "the manifest lists no shards".into(),
            });
        }
        let folder = folder_of(&location(m)?);
        for (url, size, samples) in entries {
            let url = join(&folder, &url);
            let before = self.shards.len();
            self.one(&url, size)?;
            if samples.is_some() {
                if self.shards.len() != before + 1 {
                    return Err(Error::Url {
                        url: crate::redact::url(m).into_owned(),
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

    /// The shards of a WebDataset shard index, with their counts and sizes.
    pub(super) fn shardindex(&mut self, m: &str) -> Result<()> {
        let text = self.text(m, false)?.unwrap_or_default();
        let entries = parse_shardindex(&text, &location(m)?).map_err(|reason| Error::Url {
            url: crate::redact::url(m).into_owned(),
            reason,
        })?;
        for e in entries {
            let before = self.shards.len();
            self.one(&e.url, e.size)?;
            if self.shards.len() != before + 1 {
                return Err(Error::Url {
                    url: crate::redact::url(m).into_owned(),
                    reason: format!(
                        "`{}` names {} shards; an index entry is one shard",
                        e.url,
                        self.shards.len() - before
                    ),
                });
            }
            self.shards[before].samples = Some(e.samples);
        }
        Ok(())
    }

    /// The text of a small file: a local one, or a remote one read with
    /// GETs (retried as any request). With `optional`, a remote server's
    /// 4xx answer (not found, or refused, as S3 answers for a missing key
    /// to a client that may not list) is `None`.
    fn text(&mut self, url: &str, optional: bool) -> Result<Option<String>> {
        let shown = crate::redact::url(url).into_owned();
        let bad = |reason: String| Error::Url {
            url: shown.clone(),
            reason,
        };
        let bytes = if !url.contains("://") || url.starts_with("file://") {
            let path = local_path(url)?;
            let m = std::fs::metadata(&path).map_err(|e| Error::io(IoOp::Open, &path, &e))?;
            if m.len() > MAX_TEXT as u64 {
                return Err(bad(format!("{} bytes, more than {MAX_TEXT}", m.len())));
            }
            std::fs::read(&path).map_err(|e| Error::io(IoOp::Read, &path, &e))?
        } else {
            let obj: Arc<HttpObject> = if url.starts_with("s3://") {
                let u = S3Url::parse(url).map_err(bad)?;
                Arc::new(self.s3_client()?.object(&u)?)
            } else if url.starts_with(crate::net::hub::url::SCHEME) {
                // The Hub's file at the commit its revision names.
                let before = self.shards.len();
                self.one(url, None)?;
                let found = self.shards.split_off(before);
                match found.into_iter().next().map(|s| s.source) {
                    Some(Source::Http(obj)) => obj,
                    _ => return Err(bad("names no file".into())),
                }
            } else {
                Arc::new(self.http_object(url)?)
            };
            match remote_bytes(&obj, self.net, &mut self.jitter, optional)? {
                Some(b) => b,
                None => return Ok(None),
            }
        };
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| bad("not UTF-8 text".into()))
    }
}

/// A small remote file's bytes, read with one GET or two (retried as any
/// request), at most `MAX_TEXT`; with `optional`, `None` for a 4xx answer
/// (not found, or refused as S3 answers for a missing key to a client that
/// may not list).
fn remote_bytes(
    obj: &HttpObject,
    net: &NetOptions,
    jitter: &mut Jitter,
    optional: bool,
) -> Result<Option<Vec<u8>>> {
    let bad = |reason: String| Error::Url {
        url: obj.url.clone(),
        reason,
    };
    let mut pool = HttpPool::new(net.stall, Arc::clone(&net.tls));
    let mut absent = false;
    let mut buf = vec![0u8; FIRST_READ];
    let first = with_retries(net, jitter, &obj.url, || {
        pool.fetch(obj, 0, &mut buf, true, None).inspect_err(|f| {
            absent = optional && f.kind == FailKind::Client;
        })
    });
    let first = match first {
        Ok(f) => f,
        Err(_) if absent => return Ok(None),
        Err(e) => return Err(e),
    };
    let total = first.total.unwrap_or(first.len as u64);
    if total > MAX_TEXT as u64 {
        return Err(bad(format!("{total} bytes, more than {MAX_TEXT}")));
    }
    buf.truncate(first.len);
    if (first.len as u64) < total {
        let mut rest = vec![0u8; total as usize - first.len];
        let at = first.len as u64;
        let more = with_retries(net, jitter, &obj.url, || {
            pool.fetch(obj, at, &mut rest, false, None)
        })?;
        if more.total.is_some_and(|t| t != total) {
            return Err(bad("it changed while it was read".into()));
        }
        buf.extend_from_slice(&rest);
    }
    Ok(Some(buf))
}

/// Where a manifest or index lies, for joining the names it lists: a URL
/// as given, a local file's path.
fn location(m: &str) -> Result<String> {
    Ok(if m.contains("://") && !m.starts_with("file://") {
        m.to_string()
    } else {
        local_path(m)?.display().to_string()
    })
}

/// Counts of remote shards that have none, from a shard index or a
/// manifest found beside them (`BESIDE`, in each folder that holds such
/// shards, up to `MAX_FOLDERS`): a shard gets the count of the entry that
/// names it, and its size too where it had none. The files are asked for
/// beside a shard of the folder, with its origin and credentials (so an
/// `hf://` dataset's at its pinned commit). Returns the files that
/// gave counts. A file that is there but cannot be read as what its name
/// says gives none (a warning names it).
pub fn counts_beside(shards: &mut [Shard], net: &NetOptions) -> Result<Vec<String>> {
    // Each folder once, with a shard of it to ask beside (its origin and
    // its credentials: an S3 signature, a Hub token).
    let mut folders: Vec<(String, Arc<HttpObject>)> = Vec::new();
    for s in shards.iter() {
        if let (None, Source::Http(obj)) = (s.samples, &s.source) {
            let f = folder_of(&s.name);
            if !folders.iter().any(|(g, _)| *g == f) {
                folders.push((f, Arc::clone(obj)));
            }
        }
    }
    if folders.is_empty() || folders.len() > MAX_FOLDERS {
        return Ok(Vec::new());
    }
    let mut jitter = Jitter::new(0x5eed ^ 7);
    let mut used = Vec::new();
    for (folder, shard) in folders {
        for name in BESIDE {
            let obj = shard.beside(name);
            let Some(bytes) = remote_bytes(&obj, net, &mut jitter, true)? else {
                continue;
            };
            // Entries are named as the shards are (an `hf://` name, an
            // `s3://` one), from the shards' folder.
            let url = format!("{folder}/{name}");
            let parsed: std::result::Result<HashMap<String, (u64, Option<u64>)>, String> =
                match String::from_utf8(bytes) {
                    Err(_) => Err("not UTF-8 text".into()),
                    Ok(text) if name.ends_with(".json") => {
                        parse_shardindex(&text, &url).map(|entries| {
                            entries
                                .into_iter()
                                .map(|e| (e.url, (e.samples, e.size)))
                                .collect()
                        })
                    }
                    Ok(text) => parse_manifest(&text).map(|lines| {
                        lines
                            .into_iter()
                            .filter_map(|(u, size, n)| n.map(|n| (join(&folder, &u), (n, size))))
                            .collect()
                    }),
                };
            // Not a file the user named: one that cannot be read as what
            // its name says (a server's "not found" page answered 200, an
            // old format) is passed over, said once.
            let counts = match parsed {
                Ok(c) => c,
                Err(why) => {
                    let shown = crate::redact::url(&url).into_owned();
                    crate::log::once(&format!("beside {shown}"), crate::log::Level::Warn, || {
                        format!("{shown} is beside the shards but gives no counts: {why}")
                    });
                    break;
                }
            };
            let mut found = 0;
            for s in shards.iter_mut().filter(|s| s.samples.is_none()) {
                if let Some(&(n, size)) = counts.get(&s.name) {
                    s.samples = Some(n);
                    s.size = s.size.or(size);
                    found += 1;
                }
            }
            if found > 0 {
                used.push(crate::redact::url(&url).into_owned());
            }
            // The first file of a folder is the one read, found or not.
            break;
        }
    }
    Ok(used)
}
