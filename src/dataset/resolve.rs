//! The resolver: the half of naming a dataset that touches the world. It
//! expands each URL (`parse.rs`), then stats local files and lists
//! directories, resolves each HTTP or S3 host once, lists S3 prefixes and
//! Hub datasets (`hub.rs`; both give sizes), so that every shard comes out
//! with a source before the plan is made.
//!
//! A remote shard named one by one (an `http(s)://` URL, a brace expansion
//! of them, an `s3://bucket/key` object) is not sized here: its first ranged
//! read learns its size from the response (`Content-Range`), when the shard
//! comes due (`crate::engine` worker). So open costs one lookup per host and
//! one `HEAD` of the first such shard on each host, whatever the number of
//! shards: an unreachable server, a refused certificate, a wrong bucket or a
//! missing first shard still fail at open, and a missing later shard fails
//! when it comes due, named. A manifest's sizes are kept (and spare the
//! `HEAD`). Listings that show sizes (`ringfeed ls`) ask for the rest with
//! [`head_sizes`]: `HEAD`s in parallel.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;

use super::glob::{Glob, is_glob};
use super::hub::HubResolver;
use super::parse::{expand_braces, local_path};
use super::{Shard, Source};
use crate::cache::{Cache, Identity};
use crate::error::{Error, Fault, IoOp, Result};
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{NetOptions, with_retries};
use crate::net::http::FailKind;
use crate::net::object::HttpObject;
use crate::net::retry::Jitter;
use crate::net::s3::list::{LIST_PAGE, S3Client, s3_error};
use crate::net::s3::{Env, S3Config, S3Url};

/// Expands every URL and checks each shard exists (local files, the first
/// remote shard on each host), in order. S3 settings come from the process
/// environment; see [`resolve_with`].
pub fn resolve(urls: &[String], net: &NetOptions) -> Result<Vec<Shard>> {
    resolve_with(urls, None, net, &S3Config::default(), &Env::process())
}

/// Resolves a loader's configuration: the `manifest` first, then `urls`.
pub fn resolve_config(cfg: &crate::config::Config, net: &NetOptions) -> Result<Vec<Shard>> {
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
    let mut r = Resolver::new(net, s3, env, false);
    if let Some(m) = manifest {
        r.manifest(m)?;
    }
    for url in urls {
        if url.ends_with(".manifest") {
            r.manifest(url)?;
            continue;
        }
        if url.ends_with(".json") && !is_glob(url) {
            r.shardindex(url)?;
            continue;
        }
        for one in expand_braces(url)? {
            r.one(&one, None)?;
        }
    }
    probe_hosts(&mut r.shards, net)?;
    Ok(r.shards)
}

/// The whole objects `urls` name (`crate::object`), each sized: files,
/// objects, every file of a directory or object directly under an S3
/// prefix (one level: they are written into one folder by their names),
/// and every object a key pattern matches, whatever their names (unless
/// `s3_suffix` is set).
pub fn resolve_objects(
    urls: &[String],
    net: &NetOptions,
    s3: &S3Config,
    env: &Env,
) -> Result<Vec<Shard>> {
    let mut r = Resolver::new(net, s3, env, true);
    for url in urls {
        for one in expand_braces(url)? {
            r.one(&one, None)?;
        }
    }
    let mut shards = r.shards;
    head_sizes(&mut shards, net)?;
    Ok(shards)
}

/// Sizes every shard the resolver left unsized, with `HEAD`s sent in
/// parallel (`ringfeed ls` and `index` print sizes; a loader does not need
/// them). The first failure in the list's order is the error.
pub fn head_sizes(shards: &mut [Shard], net: &NetOptions) -> Result<()> {
    let todo: Vec<usize> = (0..shards.len())
        .filter(|&i| shards[i].size.is_none())
        .collect();
    size_these(shards, todo, net)
}

/// The samples of each remote shard without a count that a cache entry
/// of its current version holds: learned by an earlier run that read the
/// shard whole (`crate::cache`). Its `HEAD`s go out in parallel; a shard
/// whose `HEAD` fails keeps no count (the plan then names it).
pub fn learn_counts(shards: &mut [Shard], cache: &Cache, net: &NetOptions) -> Result<()> {
    let todo: Vec<usize> = (0..shards.len())
        .filter(|&i| shards[i].samples.is_none() && matches!(shards[i].source, Source::Http(_)))
        .collect();
    let counts = parallel_sizes(&todo, net, |i, pool, jitter| {
        let Source::Http(obj) = &shards[i].source else {
            return Ok(None);
        };
        let head = with_retries(net, jitter, &obj.url, || pool.head_version(obj));
        Ok(match head {
            Ok((size, Some(etag))) => cache_version(&etag)
                .and_then(|v| cache.count(&cache_identity(&shards[i], obj, v, size))),
            _ => None,
        })
    })?;
    for (i, n) in todo.into_iter().zip(counts) {
        if n.is_some() {
            shards[i].samples = n;
        }
    }
    Ok(())
}

/// The version a cache entry of an object is keyed by: its strong ETag.
/// `None` for a weak one (`W/"..."`, which may stay the same when the bytes
/// change) or one that is not a quoted string: such an object is never
/// cached, as no read of it can be pinned to one version (`If-Match` needs
/// a strong tag). `Last-Modified` is no version either: one second of
/// resolution, and a rollback brings an old one back.
pub fn cache_version(etag: &str) -> Option<String> {
    crate::net::version::is_strong(etag).then(|| format!("etag {etag}"))
}

/// What keys a remote shard's cache entry: the server (scheme, host,
/// port), the shard's URL, the version its `HEAD` gave, the whole object.
pub fn cache_identity(shard: &Shard, obj: &HttpObject, version: String, size: u64) -> Identity {
    Identity {
        endpoint: format!(
            "{}://{}:{}",
            if obj.tls { "https" } else { "http" },
            obj.host,
            obj.port
        ),
        object: shard.name.clone(),
        version,
        offset: 0,
        len: size,
    }
}

/// Sizes the shards at `todo` with parallel `HEAD`s.
fn size_these(shards: &mut [Shard], todo: Vec<usize>, net: &NetOptions) -> Result<()> {
    let sizes = parallel_sizes(&todo, net, |i, pool, jitter| {
        head_size(&shards[i], pool, net, jitter)
    })?;
    for (i, size) in todo.into_iter().zip(sizes) {
        shards[i].size = Some(size);
    }
    Ok(())
}

/// One `HEAD` of the first unsized shard on each host (in parallel when
/// there are several hosts), which keeps its size: so the errors a user
/// makes once for the whole dataset (a wrong host, port, bucket, path or
/// certificate) still fail at open, in a few round trips.
fn probe_hosts(shards: &mut [Shard], net: &NetOptions) -> Result<()> {
    let mut seen = HashSet::new();
    let todo: Vec<usize> = (0..shards.len())
        .filter(|&i| match (&shards[i].source, shards[i].size) {
            (Source::Http(obj), None) => seen.insert((obj.host.clone(), obj.port, obj.tls)),
            _ => false,
        })
        .collect();
    size_these(shards, todo, net)
}

/// A remote shard's size from `HEAD` (an S3 object's with S3's error code
/// when refused); a local file's from its metadata.
fn head_size(
    shard: &Shard,
    pool: &mut HttpPool,
    net: &NetOptions,
    jitter: &mut Jitter,
) -> Result<u64> {
    match &shard.source {
        Source::File(path) => Ok(std::fs::metadata(path)
            .map_err(|e| Error::io(IoOp::Open, path, &e))?
            .len()),
        Source::Http(obj) => match S3Url::parse(&shard.name) {
            Ok(url) if shard.name.starts_with("s3://") => s3_size(obj, &url, pool, net, jitter),
            _ => with_retries(net, jitter, &obj.url, || pool.head(obj)),
        },
    }
}

/// `HEAD`s in flight at once when many shards are sized: about n /
/// HEADS_IN_FLIGHT round trips instead of n (20,000 shards at 10 ms a
/// response: 6 s, not 200 s). More would only queue at a server that serves
/// a client a few dozen connections.
const HEADS_IN_FLIGHT: usize = 32;

/// The size of each of `todo` by `size(i, ..)` (a `HEAD`),
/// `HEADS_IN_FLIGHT` at once, each thread with its own connections; in
/// order. The first failure in the list's order is the error, and after any
/// failure no new request starts.
pub(super) fn parallel_sizes<T: Send + Sync>(
    todo: &[usize],
    net: &NetOptions,
    size: impl Fn(usize, &mut HttpPool, &mut Jitter) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let sizes: Vec<std::sync::OnceLock<Result<T>>> =
        todo.iter().map(|_| std::sync::OnceLock::new()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for t in 0..HEADS_IN_FLIGHT.min(todo.len()) {
            let (sizes, next, failed, size) = (&sizes, &next, &failed, &size);
            scope.spawn(move || {
                let mut pool = HttpPool::new(net.stall, Arc::clone(&net.tls));
                let mut jitter = Jitter::new(0x5eed ^ (t as u64) << 20);
                // Relaxed: the counter only hands out distinct indices, and
                // the flag only stops new work early (results are read
                // after the scope joins every thread).
                while !failed.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(slot) = sizes.get(k) else {
                        break;
                    };
                    let r = size(todo[k], &mut pool, &mut jitter);
                    if r.is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    let _ = slot.set(r);
                }
            });
        }
    });
    // Indices are handed out in order, so every object before a failed one
    // was tried: the first missing result comes after an error.
    let mut out = Vec::with_capacity(todo.len());
    for s in sizes {
        match s.into_inner() {
            Some(r) => out.push(r?),
            None => break,
        }
    }
    if out.len() < todo.len() {
        return Err(Error::internal(
            Fault::Invariant,
            "resolving: a request failed but its error was not found",
        ));
    }
    Ok(out)
}

pub(super) struct Resolver<'a> {
    pub(super) net: &'a NetOptions,
    s3_config: &'a S3Config,
    env: &'a Env,
    s3: Option<S3Client>,
    /// Each HTTP host's addresses, looked up once.
    hosts: HashMap<(String, u16), Vec<SocketAddr>>,
    pub(super) jitter: Jitter,
    pub(super) shards: Vec<Shard>,
    /// Whole objects: directories and prefixes give every file, not only
    /// `.tar` ones.
    objects: bool,
    /// The Hub's client, commits and listings, for `hf://` URLs.
    hub: HubResolver,
}

impl<'a> Resolver<'a> {
    pub(super) fn new(
        net: &'a NetOptions,
        s3: &'a S3Config,
        env: &'a Env,
        objects: bool,
    ) -> Resolver<'a> {
        Resolver {
            net,
            s3_config: s3,
            env,
            s3: None,
            hosts: HashMap::new(),
            jitter: Jitter::new(0x5eed ^ 3),
            shards: Vec::new(),
            objects,
            hub: HubResolver::default(),
        }
    }

    /// Whether a listed name is one to keep: a `.tar` shard, or any file
    /// when reading whole objects.
    fn keeps(&self, name: &str) -> bool {
        self.objects || name.ends_with(".tar")
    }

    /// What an empty directory or prefix is said to lack.
    fn wanted(&self) -> &'static str {
        if self.objects { "files" } else { ".tar files" }
    }
}

impl Resolver<'_> {
    /// One expanded URL; `size` from a manifest.
    pub(super) fn one(&mut self, one: &str, size: Option<u64>) -> Result<()> {
        if one.starts_with("s3://") {
            return self.s3_url(one, size);
        }
        if one.starts_with(crate::net::hub::url::SCHEME) {
            let objects = self.objects;
            let keeps = move |name: &str| objects || name.ends_with(".tar");
            let wanted = self.wanted();
            let found = self.hub.shards(
                one,
                size,
                &keeps,
                wanted,
                self.env,
                self.net,
                &mut self.jitter,
            )?;
            self.shards.extend(found);
            return Ok(());
        }
        if one.starts_with("http://") || one.starts_with("https://") {
            let obj = self.http_object(one)?;
            self.shards.push(Shard {
                // Errors, stats and the cache's headers name the shard by
                // this: a presigned URL's credentials stay out of them.
                name: crate::redact::url(one).into_owned(),
                source: Source::Http(Arc::new(obj)),
                size,
                samples: None,
            });
            return Ok(());
        }
        let path = local_path(one)?;
        let meta = std::fs::metadata(&path).map_err(|e| Error::io(IoOp::Open, &path, &e))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&path)
                .map_err(|e| Error::io(IoOp::List, &path, &e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| self.keeps(&n.to_string_lossy()))
                        && p.is_file()
                })
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(Error::Url {
                    url: one.to_string(),
                    reason: format!("the directory holds no {}", self.wanted()),
                });
            }
            for p in found {
                let m = std::fs::metadata(&p).map_err(|e| Error::io(IoOp::Open, &p, &e))?;
                self.shards.push(Shard {
                    name: p.display().to_string(),
                    source: Source::File(p),
                    size: Some(m.len()),
                    samples: None,
                });
            }
        } else {
            self.shards.push(Shard {
                name: one.to_string(),
                source: Source::File(path),
                size: Some(meta.len()),
                samples: None,
            });
        }
        Ok(())
    }

    /// The object at an `http(s)://` URL, its host looked up once.
    pub(super) fn http_object(&mut self, url: &str) -> Result<HttpObject> {
        let bad = |reason| Error::Url {
            url: url.to_string(),
            reason,
        };
        let parsed = crate::net::http::parse_url(url).map_err(bad)?;
        let key = (parsed.host.clone(), parsed.port);
        let addrs = match self.hosts.get(&key) {
            Some(a) => a.clone(),
            None => {
                let a = resolve_host(&parsed.host, parsed.port, url, self.net, &mut self.jitter)?;
                self.hosts.insert(key, a.clone());
                a
            }
        };
        HttpObject::new(url, addrs).map_err(bad)
    }

    pub(super) fn s3_client(&mut self) -> Result<&S3Client> {
        if self.s3.is_none() {
            self.s3 = Some(S3Client::new(self.s3_config, self.env)?);
        }
        Ok(self.s3.as_ref().expect("set above"))
    }

    /// An object (sized by the manifest, or later), a prefix to list, or a
    /// key pattern (its literal start listed, the keys matched).
    fn s3_url(&mut self, one: &str, size: Option<u64>) -> Result<()> {
        let bad = |reason| Error::Url {
            url: one.to_string(),
            reason,
        };
        let url = S3Url::parse(one).map_err(bad)?;
        let pattern = if is_glob(&url.key) {
            Some(Glob::parse(&url.key).map_err(|why| bad(format!("bad key pattern: {why}")))?)
        } else {
            None
        };
        if pattern.is_none() && !url.is_prefix() {
            let obj = self.s3_client()?.object(&url)?;
            self.shards.push(Shard {
                name: url.display(),
                source: Source::Http(Arc::new(obj)),
                size,
                samples: None,
            });
            return Ok(());
        }
        // Shards: every depth under a prefix. Whole objects (`get`, `cat`)
        // land in one directory by their last name, so a plain prefix gives
        // its direct children there; a pattern says itself how deep it goes.
        let recursive = !self.objects || pattern.is_some();
        let suffix = match &self.s3_config.suffix {
            Some(s) => s.clone(),
            None if self.objects => String::new(),
            None => ".tar".to_string(),
        };
        let prefix = pattern.as_ref().map_or(url.key.as_str(), Glob::prefix);
        let (net, page) = (self.net, LIST_PAGE);
        let mut jitter = Jitter::new(0x5eed ^ 3);
        let client = self.s3_client()?;
        let listed = client.list(&url.bucket, prefix, recursive, page, net, &mut jitter)?;
        let total = listed.len();
        let mut matched = 0;
        let mut found = Vec::new();
        for (key, size) in listed {
            // A key ending in `/` is a folder marker made by consoles, not data.
            if key.ends_with('/') || !pattern.as_ref().is_none_or(|p| p.matches(&key)) {
                continue;
            }
            matched += 1;
            if !key.ends_with(&suffix) {
                continue;
            }
            let u = S3Url {
                bucket: url.bucket.clone(),
                key,
            };
            found.push(Shard {
                name: u.display(),
                source: Source::Http(Arc::new(client.object(&u)?)),
                size: Some(size),
                samples: None,
            });
        }
        if found.is_empty() {
            let listed = format!("s3://{}/{prefix}", url.bucket);
            let ends = if suffix.is_empty() {
                String::new()
            } else {
                format!(" ending in `{suffix}` (`s3_suffix`; \"\" takes every key)")
            };
            return Err(bad(match &pattern {
                None => format!("the prefix holds no objects{ends}"),
                Some(_) if matched > 0 => format!(
                    "{matched} key(s) match the pattern `{}` but none ends in `{suffix}` (set `s3_suffix`; \"\" takes every key)",
                    url.key
                ),
                Some(_) => format!(
                    "no key matches the pattern `{}` ({total} keys listed under {listed})",
                    url.key
                ),
            }));
        }
        self.shards.extend(found);
        Ok(())
    }
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
            match pool.fetch(obj, 0, &mut one, false, None) {
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
                Err(crate::net::http::HttpFail::new(FailKind::Dns, msg))
            } else {
                permanent = Some(msg.clone());
                Err(crate::net::http::HttpFail::new(FailKind::Client, msg))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_shards_and_empty_directories_are_named() {
        let net = NetOptions {
            stall: std::time::Duration::from_secs(1),
            retry: Default::default(),
            stats: Default::default(),
            tls: Default::default(),
            pace: Default::default(),
        };
        let e = resolve(&["/nonexistent/shard-{0..1}.tar".into()], &net).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/shard-0.tar"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let e = resolve(&[d.path().display().to_string()], &net).unwrap_err();
        assert!(e.to_string().contains("no .tar files"), "{e}");
    }

    #[test]
    fn manifests_name_shards_from_their_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.tar"), b"0123").unwrap();
        let mp = d.path().join("set.manifest");
        std::fs::write(&mp, "x.tar\n").unwrap();
        let net = NetOptions {
            stall: std::time::Duration::from_secs(1),
            retry: Default::default(),
            stats: Default::default(),
            tls: Default::default(),
            pace: Default::default(),
        };
        let shards = resolve(&[mp.display().to_string()], &net).unwrap();
        assert_eq!((shards.len(), shards[0].size), (1, Some(4)));
        std::fs::write(&mp, "# nothing\n").unwrap();
        let e = resolve(&[mp.display().to_string()], &net).unwrap_err();
        assert!(e.to_string().contains("lists no shards"), "{e}");
    }
}
