//! Whole objects: model weights read in with many ranged reads in flight,
//! checkpoints written out as objects that appear only once complete.
//!
//! - [`read`]: an object (S3, HTTP(S), a local file) read in parts of
//!   `part_size`, `parts_in_flight` at a time, on one io_uring (local reads
//!   and HTTP GETs alike, as a loader worker reads shards) or, where
//!   io_uring is refused, on as many threads; into memory of its own
//!   ([`ObjectBuf`], huge pages where the system gives them) or a caller's
//!   buffer.
//! - [`stream`]: the same reads through a window of reused part buffers,
//!   each part written to a sink (a file, stdout) in order once it is in:
//!   an object of any size in a few parts' memory (`ringfeed get`).
//! - [`write`]: an [`ObjectWriter`] that takes bytes in any amounts: to S3
//!   as one `PutObject` or a multipart upload with parts in flight in
//!   parallel, each carrying the configured checksum, aborted on any
//!   failure; to a local path through a temporary file renamed into place.
//!   Neither replaces an existing object unless `overwrite` is set.
//!
//! - [`exists`]: whether an object is there, absent only on S3's
//!   `NoSuchKey`.
//!
//! All take a [`Config`] (`Config::for_objects`): the loader's keys for
//! S3, retries, I/O backend and memory, and `part_size`, `parts_in_flight`,
//! `checksum`, `overwrite`.

pub mod read;
pub mod stream;
pub mod write;

use std::sync::atomic::{AtomicU64, Ordering};

pub use read::{ObjectBuf, ReadReport, read, read_into};
pub use stream::stream_shard;
pub use write::{ObjectWriter, write};

use crate::config::Config;
use crate::dataset::Shard;
use crate::error::Result;
use crate::fetch::{NetOptions, with_retries};
use crate::net::retry::Jitter;
use crate::net::s3::list::{S3Client, s3_error};
use crate::net::s3::{Env, S3Url};

/// Bytes done so far, for a progress line; shared with the thread that
/// draws it.
#[derive(Debug, Default)]
pub struct Progress {
    bytes: AtomicU64,
}

impl Progress {
    pub fn add(&self, n: u64) {
        // Relaxed: a counter read for display only.
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// The objects `urls` name, in order, each with its size: a file, an
/// `http(s)://` or `s3://` object, and every file in a directory or
/// object under an `s3://…/` prefix (one level), with brace expansion.
pub fn list(urls: &[String], cfg: &Config) -> Result<Vec<Shard>> {
    let net = NetOptions::for_config(cfg);
    crate::dataset::resolve_objects(urls, &net, &cfg.s3, &Env::process())
}

/// Whether the object at `url` (`s3://bucket/key`, a local path or
/// `file://` URL) exists. Absent only when S3 answers 404 `NoSuchKey` (or
/// the file is not there): `AccessDenied`, `ExpiredToken`, `NoSuchBucket`
/// and a 5xx past its retries are errors naming S3's code, never "absent"
/// (a checkpoint reader that took them for "no checkpoint" would start a
/// job over).
pub fn exists(url: &str, cfg: &Config) -> Result<bool> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(crate::error::Error::Url {
            url: url.to_string(),
            reason: "existence is asked of s3:// URLs and local paths".into(),
        });
    }
    if !url.starts_with("s3://") {
        let path = crate::dataset::parse::local_path(url)?;
        return match path.symlink_metadata() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(crate::error::Error::io(crate::error::IoOp::Open, &path, &e)),
        };
    }
    let u = S3Url::parse(url).map_err(|reason| crate::error::Error::Url {
        url: url.to_string(),
        reason,
    })?;
    if u.is_prefix() || u.key.is_empty() {
        return Err(crate::error::Error::Url {
            url: url.to_string(),
            reason: "names a prefix; give the object's key".into(),
        });
    }
    let client = S3Client::new(&cfg.s3, &Env::process())?;
    let net = NetOptions::for_config(cfg);
    // A fixed seed: the jitter only spreads this call's retries.
    let mut jitter = Jitter::new(0xe7157);
    let mut code = None;
    with_retries(&net, &mut jitter, &u.display(), || {
        client
            .present(&u.bucket, &u.key)
            .inspect_err(|f| code.clone_from(&f.code))
    })
    .map_err(|e| s3_error(e, &u.bucket, &u.key, code))
}

/// One object, sized (see [`list`]); a URL that names several is an error.
pub fn one(url: &str, cfg: &Config, net: &NetOptions) -> Result<Shard> {
    let mut found =
        crate::dataset::resolve_objects(&[url.to_string()], net, &cfg.s3, &Env::process())?;
    if found.len() != 1 {
        return Err(crate::error::Error::Url {
            url: url.to_string(),
            reason: format!(
                "names {} objects; read them one by one (`ringfeed get` or `list`)",
                found.len()
            ),
        });
    }
    Ok(found.remove(0))
}
