//! What the cache tier does for one remote shard's read (`consult`): its
//! `HEAD` gives the size and version, and the read then comes from a
//! current entry, fills a new one, or goes uncached (counted, with the
//! reason). The worker (`worker.rs`) reads by what it says.

use std::sync::Arc;

use crate::cache::{Entry, Fill, Identity, SpoolFill};
use crate::dataset::Shard;
use crate::engine::shared::Shared;
use crate::error::{Error, IoOp};
use crate::fetch::direct::LocalFd;
use crate::fetch::http_sync::HttpPool;
use crate::fetch::{Target, with_retries};
use crate::net::object::HttpObject;
use crate::net::retry::Jitter;
use crate::plan::Segment;

/// What the cache tier does for one remote shard's read.
pub(super) enum Tier {
    /// Nothing: no cache, a local shard, or read uncached.
    None,
    /// Read from the cache entry (`target` is its file, at `base`), each
    /// read checked against the entry's block checksums; a read that
    /// fails is read again from `net`, and so is the rest of the shard.
    Hit {
        entry: Entry,
        id: Identity,
        base: u64,
        net: Target,
        dropped: bool,
    },
    /// Read from the network and copied to a new entry in the background.
    Fill(SpoolFill),
}

impl Tier {
    /// Whether new reads go to the cache entry.
    pub(super) fn reads_entry(&self) -> bool {
        matches!(self, Tier::Hit { dropped: false, .. })
    }
}

/// A cache consultation's outcome: the tier, the entry's file when it is
/// read, the shard's size where known, and the ETag its `HEAD` gave (what
/// the read is pinned to, so a fill holds the version its entry is keyed by).
pub(super) type Consulted = (
    Tier,
    Option<(std::fs::File, LocalFd)>,
    Option<u64>,
    Option<String>,
);

/// What the cache does for the remote shard `obj`: its `HEAD` gives
/// the size and version; a current entry is read instead of the
/// network (its file, O_DIRECT where it takes it); a shard read from
/// its start to its end without one is filled (unless another process
/// fills it: then it is waited for). Anything that keeps the cache from
/// serving (no version, no `HEAD`, an entry that will not open) reads
/// the shard as without a cache, and is counted.
pub(super) fn consult(
    sh: &Arc<Shared>,
    heads: &mut Option<(HttpPool, Jitter)>,
    stream: usize,
    shard: &Shard,
    obj: &Arc<HttpObject>,
    seg: &Segment,
) -> Consulted {
    let Some(spool) = &sh.cache else {
        return (Tier::None, None, shard.size, None);
    };
    let cache = spool.cache();
    let (pool, jitter) = heads.get_or_insert_with(|| {
        let seed = (std::process::id() as u64) << 32 ^ (stream as u64) << 8 ^ 0xcac4e;
        (
            HttpPool::new(sh.net.stall, Arc::clone(&sh.net.tls)),
            Jitter::new(seed),
        )
    });
    let head = with_retries(&sh.net, jitter, &obj.url, || pool.head_version(obj));
    let (size, etag, version) = match head {
        Ok((size, Some(etag))) => match crate::dataset::cache_version(&etag) {
            Some(v) => (size, etag, v),
            None => {
                cache.not_cached(&format!(
                    "`{}` has only a weak ETag ({etag}), which cannot pin a read to \
                     one version: not cached",
                    shard.name
                ));
                return (Tier::None, None, Some(size), Some(etag));
            }
        },
        // No version to key an entry by, or no `HEAD` (a URL signed
        // for GET only): the reads themselves say what is wrong, if
        // anything.
        Ok((size, None)) => {
            cache.not_cached(&format!(
                "`{}` has no ETag, so a read of it cannot be pinned to one version: not \
                 cached",
                shard.name
            ));
            return (Tier::None, None, Some(size), None);
        }
        Err(e) => {
            cache.not_cached(&format!("no HEAD for `{}`: {e}", shard.name));
            return (Tier::None, None, shard.size, None);
        }
    };
    let id = crate::dataset::cache_identity(shard, obj, version, size);
    let etag = Some(etag);
    let entry = match cache.lookup(&id) {
        Some(e) => e,
        // A segment that ends inside the shard reads part of it: it
        // fills nothing.
        None if seg.to.is_some() => return (Tier::None, None, Some(size), etag),
        None if !spool.admits() => {
            cache.not_cached(&format!(
                "`{}`: the disk was behind the reads when it started (`cache_fill` \
                 \"spare\"); a later read fills it",
                shard.name
            ));
            return (Tier::None, None, Some(size), etag);
        }
        None => match cache.fill(&id, sh.net.stall) {
            Fill::Hit(e) => e,
            Fill::Write(filler) => {
                let tier = spool.take(filler, size).map_or(Tier::None, Tier::Fill);
                return (tier, None, Some(size), etag);
            }
            Fill::Uncached(_) => return (Tier::None, None, Some(size), etag),
        },
    };
    let path = cache.dir().join(id.file_name());
    let opened = entry
        .file
        .try_clone()
        .map_err(|e| Error::io(IoOp::Open, &path, &e))
        .and_then(|f| sh.cache_direct.adopt(f, &path, sh.layout()));
    let (file, fd) = match opened {
        Ok((file, fd, _)) => (file, fd),
        Err(e) => {
            cache.not_cached(&e.to_string());
            return (Tier::None, None, Some(size), etag);
        }
    };
    let base = entry.header.data_offset as u64;
    let tier = Tier::Hit {
        entry,
        id,
        base,
        net: Target::Http(Arc::clone(obj)),
        dropped: false,
    };
    (tier, Some((file, fd)), Some(size), etag)
}

/// A chunk the engine hands the cache's writer: shared while a batch (or
/// the reads) still hold it. Here, above both parts (the cache and the
/// arena are of one rank and name neither: docs/architecture.md).
impl crate::cache::Held for crate::memory::ChunkRef {
    fn shared(&self) -> bool {
        crate::memory::ChunkRef::shared(self)
    }
}
