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
//! upload, so S3 keeps neither an object nor parts.
//!
//! To a local path: a temporary file beside it, synced, then renamed into
//! place (`RENAME_NOREPLACE` unless `overwrite`), the directory synced; a
//! writer dropped unfinished removes its temporary file.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;

use super::Progress;
use crate::config::{Checksum, Config};
use crate::error::{Error, IoOp, Result};
use crate::fetch::{NetOptions, with_retries};
use crate::net::http::Fail;
use crate::net::retry::Jitter;
use crate::net::s3::list::{S3Client, s3_error};
use crate::net::s3::upload::DonePart;
use crate::net::s3::{Env, S3Url};

/// S3's smallest part (all but the last), and most parts per upload.
pub const S3_MIN_PART: u64 = 5 << 20;
pub const S3_MAX_PARTS: u32 = 10_000;

/// Writes `data` to `url` as one object (see [`Writer`]).
pub fn write(url: &str, data: &[u8], cfg: &Config, progress: Option<Arc<Progress>>) -> Result<()> {
    let mut w = Writer::open(url, cfg, progress)?;
    w.write(data)?;
    w.finish()
}

/// An object being written. Bytes go in with [`Writer::write`]; the object
/// appears with [`Writer::finish`]. Dropped before that, or after any
/// error, nothing of it remains.
pub struct Writer {
    name: String,
    dest: Dest,
    written: u64,
    /// A failure already returned: later calls repeat it.
    failed: Option<Error>,
}

enum Dest {
    Local(Local),
    S3(Box<Upload>),
    /// Finished or aborted.
    Done,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("name", &self.name)
            .field("written", &self.written)
            .finish()
    }
}

impl Writer {
    /// Starts an object at `url` (`s3://bucket/key`, a local path or
    /// `file://` URL). Fails at once when the object exists and
    /// `overwrite` is false (checked again when it is committed).
    pub fn open(url: &str, cfg: &Config, progress: Option<Arc<Progress>>) -> Result<Writer> {
        let progress = progress.unwrap_or_default();
        let dest = if url.starts_with("s3://") {
            Dest::S3(Box::new(Upload::open(url, cfg, progress)?))
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
        Ok(Writer {
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

/// A local file written beside its final path and renamed into place.
struct Local {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    overwrite: bool,
    progress: Arc<Progress>,
}

impl Local {
    fn open(path: &Path, overwrite: bool, progress: Arc<Progress>) -> Result<Local> {
        let name = path.file_name().ok_or_else(|| Error::Url {
            url: path.display().to_string(),
            reason: "names a directory, not a file".into(),
        })?;
        if !overwrite && path.symlink_metadata().is_ok() {
            return Err(exists_local(path));
        }
        // A rename would put a file where a device or pipe was
        // (`/dev/null`): refused, overwrite or not.
        if let Ok(m) = std::fs::metadata(path)
            && !m.is_file()
        {
            return Err(Error::Url {
                url: path.display().to_string(),
                reason: "is not a regular file (a directory, device, pipe or socket);                          an object is written as a file renamed into place"
                    .into(),
            });
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{}.ringfeed-{}-{}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            // Relaxed: only makes names unique within the process.
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| Error::io(IoOp::Open, &tmp, &e))?;
        Ok(Local {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
            overwrite,
            progress,
        })
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        let f = self.file.as_mut().ok_or(Error::Closed)?;
        f.write_all(data)
            .map_err(|e| Error::io(IoOp::Write, &self.tmp, &e))?;
        self.progress.add(data.len() as u64);
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let f = self.file.take().ok_or(Error::Closed)?;
        f.sync_all()
            .map_err(|e| Error::io(IoOp::Write, &self.tmp, &e))?;
        drop(f);
        if self.overwrite {
            std::fs::rename(&self.tmp, &self.path)
                .map_err(|e| Error::io(IoOp::Write, &self.path, &e))?;
        } else {
            rename_new(&self.tmp, &self.path)?;
        }
        // Renamed: nothing to remove on drop.
        self.tmp = PathBuf::new();
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            // The rename itself durable; a refusal (some file systems do
            // not sync directories) leaves the file in place all the same.
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn exists_local(path: &Path) -> Error {
    Error::Exists {
        url: path.display().to_string(),
        how: "the file exists".into(),
    }
}

/// Renames `from` to `to` unless `to` exists, atomically: `renameat2`
/// with `RENAME_NOREPLACE`, or a hard link and an unlink where the file
/// system does not take that flag.
fn rename_new(from: &Path, to: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::Url {
            url: p.display().to_string(),
            reason: "the path holds a NUL byte".into(),
        })
    };
    let (cf, ct) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths; the call reads them only.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cf.as_ptr(),
            libc::AT_FDCWD,
            ct.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Err(exists_local(to)),
        Some(libc::EINVAL | libc::ENOSYS) => match std::fs::hard_link(from, to) {
            Ok(()) => {
                let _ = std::fs::remove_file(from);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(exists_local(to)),
            Err(e) => Err(Error::io(IoOp::Write, to, &e)),
        },
        _ => Err(Error::io(IoOp::Write, to, &e)),
    }
}

/// What an S3 upload's threads share with the writer.
struct Shared {
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

impl Shared {
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
        mut op: impl FnMut() -> std::result::Result<T, Fail>,
    ) -> Result<T> {
        let mut code = None;
        with_retries(&self.net, jitter, &self.name, || {
            op().inspect_err(|f| code.clone_from(&f.code))
        })
        .map_err(|e| self.named(e, code, part))
    }

    fn fail(&self, e: Error) {
        let mut first = self.error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(e);
        // Release: pairs with the Acquire in `failure`; the error is set.
        self.failed.store(true, Ordering::Release);
    }

    fn failure(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The upload threads and the queue to them.
struct Pool {
    queue: Option<SyncSender<(u32, Bytes)>>,
    threads: Vec<JoinHandle<()>>,
}

/// An S3 object being written.
struct Upload {
    shared: Arc<Shared>,
    overwrite: bool,
    part_size: usize,
    in_flight: usize,
    /// The part being filled.
    buf: Vec<u8>,
    /// Parts handed to the threads so far.
    parts: u32,
    upload: Option<Arc<str>>,
    pool: Option<Pool>,
    jitter: Jitter,
}

impl Upload {
    fn open(url: &str, cfg: &Config, progress: Arc<Progress>) -> Result<Upload> {
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
        let shared = Arc::new(Shared {
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
        Ok(Upload {
            shared,
            overwrite: cfg.overwrite,
            part_size,
            in_flight: cfg.parts_in_flight.max(1),
            buf: Vec::new(),
            parts: 0,
            upload: None,
            pool: None,
            jitter: Jitter::new(0x0b1ec7 ^ 0x77),
        })
    }

    fn write(&mut self, mut data: &[u8]) -> Result<()> {
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
                .unwrap_or_else(|| Error::Internal("the upload threads stopped".into())));
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
                .map_err(|e| Error::Internal(format!("cannot start an upload thread: {e}")))?;
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
                        .fail(Error::Internal("an upload thread panicked".into()));
                }
            }
        }
        match self.shared.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<()> {
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
        let mut parts = s.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        parts.sort_by_key(|p| p.number);
        if parts.len() != self.parts as usize {
            return Err(Error::Internal(format!(
                "{} of {} parts were kept",
                parts.len(),
                self.parts
            )));
        }
        let overwrite = self.overwrite;
        let done = s.call(&mut self.jitter, None, || {
            s.client
                .complete_upload(&s.bucket, &s.key, &upload, &parts, s.checksum, overwrite)
        });
        if done.is_ok() {
            // Completed: nothing to abort.
            self.upload = None;
        }
        done.map(|_| ())
    }

    fn abort(&mut self) -> Result<()> {
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

impl Drop for Upload {
    fn drop(&mut self) {
        if self.upload.is_some() || self.pool.is_some() {
            let _ = self.abort();
        }
    }
}

/// An upload thread: takes parts off the queue until it closes; after a
/// failure (its own or another's) it drops the rest unsent.
fn upload_parts(s: &Shared, rx: &Mutex<Receiver<(u32, Bytes)>>, upload: &str, t: usize) {
    let mut jitter = Jitter::new(0x0b1ec7 ^ (t as u64 + 1) << 8);
    loop {
        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
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
                s.done.lock().unwrap_or_else(|p| p.into_inner()).push(done);
            }
            Err(e) => s.fail(e),
        }
    }
}
