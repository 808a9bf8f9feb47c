//! An S3 object: one conditional `PutObject` below a part, else a
//! multipart upload whose parts go to upload threads through a bounded
//! queue, each retried by the network policy, and whose completion is
//! conditional; a completion whose answer was lost is checked against the
//! object then at the key (see the module above). Any failure, or a drop
//! unfinished, aborts the upload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;

use super::Progress;
use super::{S3_MAX_PARTS, S3_MIN_PART};
use crate::config::{Checksum, Config};
use crate::error::{Error, Fault, Result};
use crate::fetch::{NetOptions, with_retries};
use crate::log::Level;
use crate::net::http::{FailKind, HttpFail};
use crate::net::retry::Jitter;
use crate::net::s3::list::{S3Client, s3_error};
use crate::net::s3::upload::{DonePart, multipart_etag};
use crate::net::s3::{Env, S3Url};
use crate::sync::Locked;

/// What an S3 upload's threads share with the writer.
struct UploadShared {
    client: S3Client,
    bucket: String,
    key: String,
    name: String,
    checksum: Checksum,
    net: NetOptions,
    part_timeout: Duration,
    done: Mutex<Vec<DonePart>>,
    /// The first part that failed for good.
    error: Mutex<Option<Error>>,
    failed: AtomicBool,
    progress: Arc<Progress>,
}

impl UploadShared {
    /// The error of an S3 call that failed after its retries: S3's code,
    /// the key, the part; a refused condition is [`Error::Exists`].
    fn named(&self, e: Error, code: Option<String>, part: Option<u32>) -> Error {
        if code.as_deref() == Some("PreconditionFailed") {
            return Error::Exists {
                url: self.name.clone(),
                how: "S3 answered PreconditionFailed to `If-None-Match: *`".into(),
            };
        }
        let e = s3_error(e, &self.bucket, &self.key, code);
        match part {
            Some(part) => Error::Part {
                url: self.name.clone(),
                part,
                source: Box::new(e),
            },
            None => e,
        }
    }

    /// Runs one S3 call with the retry policy; names its failure.
    fn call<T>(
        &self,
        jitter: &mut Jitter,
        part: Option<u32>,
        mut op: impl FnMut() -> std::result::Result<T, HttpFail>,
    ) -> Result<T> {
        let mut code = None;
        with_retries(&self.net, jitter, &self.name, || {
            op().inspect_err(|f| code.clone_from(&f.code))
        })
        .map_err(|e| self.named(e, code, part))
    }

    fn fail(&self, e: Error) {
        let mut first = self.error.locked();
        first.get_or_insert(e);
        // Release: pairs with the Acquire in `failure`; the error is set.
        self.failed.store(true, Ordering::Release);
    }

    fn failure(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.locked().clone()
    }
}

/// The upload threads and the queue to them.
struct Pool {
    queue: Option<SyncSender<(u32, Bytes)>>,
    threads: Vec<JoinHandle<()>>,
}

/// An S3 object being written.
pub(super) struct S3Upload {
    shared: Arc<UploadShared>,
    overwrite: bool,
    part_size: usize,
    in_flight: usize,
    /// The part being filled.
    buf: Vec<u8>,
    /// Parts handed to the threads so far, and their bytes.
    parts: u32,
    shipped: u64,
    upload: Option<Arc<str>>,
    pool: Option<Pool>,
    jitter: Jitter,
}

impl S3Upload {
    pub(super) fn open(url: &str, cfg: &Config, progress: Arc<Progress>) -> Result<S3Upload> {
        let bad = |reason: String| Error::Url {
            url: url.to_string(),
            reason,
        };
        let u = S3Url::parse(url).map_err(bad)?;
        if u.is_prefix() || u.key.is_empty() {
            return Err(bad("names a prefix; give the object's key".into()));
        }
        if cfg.part_size < S3_MIN_PART {
            return Err(Error::Config(format!(
                "`part_size` is {} bytes; S3's multipart uploads take parts of at least 5 MiB",
                cfg.part_size
            )));
        }
        let client = S3Client::new(&cfg.s3, &Env::process())?;
        let part_size = cfg.part_size as usize;
        let shared = Arc::new(UploadShared {
            client,
            bucket: u.bucket.clone(),
            key: u.key.clone(),
            name: u.display(),
            checksum: cfg.checksum,
            net: NetOptions::for_config(cfg),
            // A part may take a while on a slow link: a minute, and a
            // second per MiB on top.
            part_timeout: Duration::from_secs(60 + (cfg.part_size >> 20)),
            done: Mutex::new(Vec::new()),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            progress,
        });
        if !cfg.overwrite {
            let mut jitter = Jitter::new(0x0b1ec7 ^ 0x55);
            let there = shared.call(&mut jitter, None, || {
                shared.client.exists(&shared.bucket, &shared.key)
            })?;
            if there {
                return Err(Error::Exists {
                    url: shared.name.clone(),
                    how: "the key exists".into(),
                });
            }
        }
        Ok(S3Upload {
            shared,
            overwrite: cfg.overwrite,
            part_size,
            in_flight: cfg.fixed_parts(),
            buf: Vec::new(),
            parts: 0,
            shipped: 0,
            upload: None,
            pool: None,
            jitter: Jitter::new(0x0b1ec7 ^ 0x77),
        })
    }

    pub(super) fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if let Some(e) = self.shared.failure() {
                return Err(e);
            }
            if self.buf.capacity() == 0 {
                self.buf.reserve_exact(self.part_size);
            }
            let n = (self.part_size - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == self.part_size {
                let part = std::mem::take(&mut self.buf);
                self.ship(part)?;
            }
        }
        Ok(())
    }

    /// Hands a full part (or the last) to the upload threads, starting the
    /// upload at the first.
    fn ship(&mut self, part: Vec<u8>) -> Result<()> {
        if self.parts == S3_MAX_PARTS {
            return Err(Error::Config(format!(
                "`{}` needs more than {S3_MAX_PARTS} parts of {} bytes (S3's limit); raise `part_size`",
                self.shared.name, self.part_size
            )));
        }
        if self.upload.is_none() {
            let s = &self.shared;
            let id = s.call(&mut self.jitter, None, || {
                s.client.create_upload(&s.bucket, &s.key, s.checksum)
            })?;
            self.upload = Some(id.into());
            self.pool = Some(self.start_pool()?);
        }
        self.parts += 1;
        self.shipped += part.len() as u64;
        let queue = self
            .pool
            .as_ref()
            .and_then(|p| p.queue.as_ref())
            .ok_or(Error::Closed)?;
        if queue.send((self.parts, Bytes::from(part))).is_err() {
            // Every thread is gone: only after a failure.
            return Err(self
                .shared
                .failure()
                .unwrap_or_else(|| Error::internal(Fault::Thread, "the upload threads stopped")));
        }
        Ok(())
    }

    fn start_pool(&self) -> Result<Pool> {
        let (tx, rx) = sync_channel::<(u32, Bytes)>(self.in_flight);
        let rx = Arc::new(Mutex::new(rx));
        let upload = Arc::clone(self.upload.as_ref().ok_or(Error::Closed)?);
        let mut threads = Vec::new();
        for t in 0..self.in_flight {
            let (shared, rx, upload) = (
                Arc::clone(&self.shared),
                Arc::clone(&rx),
                Arc::clone(&upload),
            );
            let h = std::thread::Builder::new()
                .name(format!("ringfeed-put-{t}"))
                .spawn(move || upload_parts(&shared, &rx, &upload, t))
                .map_err(|e| {
                    Error::internal(Fault::Thread, format!("cannot start an upload thread: {e}"))
                })?;
            threads.push(h);
        }
        Ok(Pool {
            queue: Some(tx),
            threads,
        })
    }

    /// Waits for the parts in flight; the first failure, if any.
    fn drain(&mut self) -> Result<()> {
        if let Some(mut pool) = self.pool.take() {
            drop(pool.queue.take());
            for h in pool.threads.drain(..) {
                if h.join().is_err() {
                    self.shared
                        .fail(Error::internal(Fault::Panic, "an upload thread panicked"));
                }
            }
        }
        match self.shared.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(super) fn finish(&mut self) -> Result<()> {
        let s = Arc::clone(&self.shared);
        let Some(upload) = self.upload.clone() else {
            // Smaller than a part: one conditional PutObject.
            let body = Bytes::from(std::mem::take(&mut self.buf));
            let n = body.len() as u64;
            s.call(&mut self.jitter, None, || {
                s.client.put_object(
                    &s.bucket,
                    &s.key,
                    body.clone(),
                    s.checksum,
                    self.overwrite,
                    s.part_timeout,
                )
            })?;
            s.progress.add(n);
            return Ok(());
        };
        if !self.buf.is_empty() {
            let last = std::mem::take(&mut self.buf);
            self.ship(last)?;
        }
        self.drain()?;
        let mut parts = s.done.locked().clone();
        parts.sort_by_key(|p| p.number);
        if parts.len() != self.parts as usize {
            return Err(Error::internal(
                Fault::Invariant,
                format!("{} of {} parts were kept", parts.len(), self.parts),
            ));
        }
        let overwrite = self.overwrite;
        // Whether an attempt went out and got no answer: S3 may have
        // completed it, and the retry then meets the object (or no upload).
        let mut unanswered = false;
        let mut code = None;
        let done = with_retries(&s.net, &mut self.jitter, &s.name, || {
            s.client
                .complete_upload(&s.bucket, &s.key, &upload, &parts, s.checksum, overwrite)
                .inspect_err(|f| {
                    // No answer, or one cut short: the request may have
                    // reached S3 (a refused connection or a name that did
                    // not resolve sent nothing).
                    unanswered |= matches!(
                        f.kind,
                        FailKind::Reset | FailKind::Stalled | FailKind::Truncated
                    );
                    code.clone_from(&f.code);
                })
        });
        let done = match done {
            Ok(_) => Ok(()),
            Err(_)
                if unanswered
                    && is_completed_answer(code.as_deref())
                    && self.completed_by_us(&parts) =>
            {
                Ok(())
            }
            Err(e) => Err(s.named(e, code, None)),
        };
        if done.is_ok() {
            // Completed: nothing to abort.
            self.upload = None;
        }
        done
    }

    /// Whether the object now at the key is the one `parts` make: after a
    /// completion whose answer was lost, the retry meets it
    /// (`PreconditionFailed`) or no upload (`NoSuchUpload`), and only its
    /// ETag (S3's MD5 of the parts' MD5s, `-N`) and size tell whether this
    /// upload made it or another writer did. Parts whose ETags are not
    /// MD5s (server-side encryption with KMS) leave it unknown: not ours.
    fn completed_by_us(&mut self, parts: &[DonePart]) -> bool {
        let s = Arc::clone(&self.shared);
        let Some(want) = multipart_etag(parts) else {
            return false;
        };
        let head = s.call(&mut self.jitter, None, || s.client.head(&s.bucket, &s.key));
        match head {
            Ok(Some(h)) => {
                let ours = h.etag.as_deref() == Some(want.as_str())
                    && h.size.is_none_or(|n| n == self.shipped);
                if ours {
                    crate::log::log(Level::Info, || {
                        format!(
                            "{}: the completion's answer was lost; the object there is this \
                             upload's (ETag {want}, {} bytes), so the write is done",
                            s.name, self.shipped
                        )
                    });
                }
                ours
            }
            Ok(None) | Err(_) => false,
        }
    }

    pub(super) fn abort(&mut self) -> Result<()> {
        self.shared.fail(Error::Closed);
        let _ = self.drain();
        let Some(upload) = self.upload.take() else {
            return Ok(());
        };
        let s = Arc::clone(&self.shared);
        s.call(&mut self.jitter, None, || {
            s.client.abort_upload(&s.bucket, &s.key, &upload)
        })
    }
}

impl Drop for S3Upload {
    fn drop(&mut self) {
        if self.upload.is_some() || self.pool.is_some() {
            let _ = self.abort();
        }
    }
}

/// The codes a retried completion meets when its first attempt completed
/// the upload: the object is there (`If-None-Match: *`), or the upload is
/// gone.
fn is_completed_answer(code: Option<&str>) -> bool {
    matches!(code, Some("PreconditionFailed" | "NoSuchUpload"))
}

/// An upload thread: takes parts off the queue until it closes; after a
/// failure (its own or another's) it drops the rest unsent.
fn upload_parts(s: &UploadShared, rx: &Mutex<Receiver<(u32, Bytes)>>, upload: &str, t: usize) {
    let mut jitter = Jitter::new(0x0b1ec7 ^ (t as u64 + 1) << 8);
    loop {
        let next = rx.locked().recv();
        let Ok((number, body)) = next else {
            return;
        };
        if s.failed.load(Ordering::Acquire) {
            continue;
        }
        let n = body.len() as u64;
        let r = s.call(&mut jitter, Some(number), || {
            s.client.upload_part(
                &s.bucket,
                &s.key,
                upload,
                number,
                body.clone(),
                s.checksum,
                s.part_timeout,
            )
        });
        match r {
            Ok(done) => {
                s.progress.add(n);
                s.done.locked().push(done);
            }
            Err(e) => s.fail(e),
        }
    }
}
