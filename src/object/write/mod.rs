//! Writing a whole object, visible only once complete, never replacing one
//! unless asked.
//!
//! To S3: bytes fill a part of `part_size`; the first full part starts a
//! multipart upload, and each part goes to one of `parts_in_flight` upload
//! threads through a bounded queue (so a fast producer waits, and at most
//! `2 × parts_in_flight + 1` parts are in memory). Each part carries the
//! configured checksum, which S3 verifies before it keeps the part, and is
//! retried by the network policy. `finish` sends the last part and
//! completes the upload with `If-None-Match: *` (unless `overwrite`); an
//! object smaller than one part is a single conditional `PutObject`. Any
//! failure, a refused completion, or a writer dropped unfinished aborts the
//! upload, so S3 keeps neither an object nor parts. A completion whose
//! answer was lost (the connection dropped after S3 completed it) meets
//! `PreconditionFailed` or `NoSuchUpload` on its retry; the object then at
//! the key is compared with this upload's (its multipart ETag and size):
//! this upload's is success, another writer's is [`Error::Exists`]. A
//! process killed before its completion leaves the upload's parts to the
//! bucket's lifecycle rule (`AbortIncompleteMultipartUpload`), and no object.
//!
//! To a local path: a temporary file beside it, synced, then renamed into
//! place (`RENAME_NOREPLACE` unless `overwrite`), the directory synced; a
//! writer dropped unfinished removes its temporary file.
//!
//! - `local`: the temporary file renamed into place;
//! - `s3`: the single `PutObject`, and the multipart upload with its part
//!   threads and its completion.

mod local;
mod s3;

use std::sync::Arc;

use super::Progress;
use crate::config::Config;
use crate::error::{Error, Result};

use local::Local;
use s3::S3Upload;

/// S3's smallest part (all but the last), and most parts per upload.
pub const S3_MIN_PART: u64 = 5 << 20;
pub const S3_MAX_PARTS: u32 = 10_000;

/// Writes `data` to `url` as one object (see [`ObjectWriter`]).
pub fn write(url: &str, data: &[u8], cfg: &Config, progress: Option<Arc<Progress>>) -> Result<()> {
    let mut w = ObjectWriter::open(url, cfg, progress)?;
    w.write(data)?;
    w.finish()
}

/// An object being written. Bytes go in with [`ObjectWriter::write`]; the
/// object appears with [`ObjectWriter::finish`]. Dropped before that, or
/// after any error, nothing of it remains.
pub struct ObjectWriter {
    name: String,
    dest: Dest,
    written: u64,
    /// A failure already returned: later calls repeat it.
    failed: Option<Error>,
}

enum Dest {
    Local(Local),
    S3(Box<S3Upload>),
    /// Finished or aborted.
    Done,
}

impl std::fmt::Debug for ObjectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWriter")
            .field("name", &self.name)
            .field("written", &self.written)
            .finish()
    }
}

impl ObjectWriter {
    /// Starts an object at `url` (`s3://bucket/key`, a local path or
    /// `file://` URL). Fails at once when the object exists and
    /// `overwrite` is false (checked again when it is committed).
    pub fn open(url: &str, cfg: &Config, progress: Option<Arc<Progress>>) -> Result<ObjectWriter> {
        let progress = progress.unwrap_or_default();
        let dest = if url.starts_with("s3://") {
            Dest::S3(Box::new(S3Upload::open(url, cfg, progress)?))
        } else if url.starts_with("http://") || url.starts_with("https://") {
            return Err(Error::Url {
                url: url.to_string(),
                reason:
                    "writes go to s3:// URLs or local paths; an http(s):// server takes no uploads"
                        .into(),
            });
        } else {
            let path = crate::dataset::parse::local_path(url)?;
            Dest::Local(Local::open(&path, cfg.overwrite, progress)?)
        };
        Ok(ObjectWriter {
            name: url.to_string(),
            dest,
            written: 0,
            failed: None,
        })
    }

    /// Bytes taken so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `data`. An error aborts the write: nothing is kept, and
    /// every later call returns the same error.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = match &mut self.dest {
            Dest::Local(l) => l.write(data),
            Dest::S3(u) => u.write(data),
            Dest::Done => Err(Error::Closed),
        };
        match r {
            Ok(()) => {
                self.written += data.len() as u64;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Makes the object visible, whole. On error nothing is kept.
    pub fn finish(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = match std::mem::replace(&mut self.dest, Dest::Done) {
            Dest::Local(mut l) => l.finish(),
            Dest::S3(mut u) => u.finish(),
            Dest::Done => Err(Error::Closed),
        };
        r.map_err(|e| self.fail(e))
    }

    /// Drops what was written: no object, no parts left behind.
    pub fn abort(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.dest, Dest::Done) {
            Dest::Local(l) => drop(l),
            Dest::S3(mut u) => u.abort()?,
            Dest::Done => {}
        }
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        // Aborting is best effort here: the write's own error is the one
        // to report (an S3 upload left behind by a failed abort is also
        // removed by a bucket's lifecycle rule, which S3 recommends).
        let _ = self.abort();
        self.failed = Some(e.clone());
        e
    }
}
