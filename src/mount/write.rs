//! The write side of [`Fs`]: new files (and, allowed, replaced ones) as
//! one upload each, taking bytes in order, completed by an `fsync` or by
//! the writer's close when the mount sees it is one (`upload::Closes`
//! decides, on who closed: `closer`), aborted otherwise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::source::MountSource;
use super::upload::{Abort, Closes, MountUpload, Refused, Verdict};
use super::{Attr, Errno, Fs, FsResult, Handle, TreeKind, WriteHandle, tree};
use crate::log::{Level, log};
use crate::sync::Locked;

impl Fs {
    pub(super) fn open_write(&self, ino: u64, node: &tree::Node, flags: i32) -> FsResult<u64> {
        let rel = node.rel.clone();
        if !self.source.writable() {
            return Err(self.refuse(libc::EROFS, || {
                format!("mount: `{rel}`: an http(s):// source takes no writes (EROFS)")
            }));
        }
        if node.local {
            return Err(self.refuse(libc::EPERM, || {
                format!("mount: `{rel}` is being written by another handle (open refused, EPERM)")
            }));
        }
        if !self.opts.allow_overwrite {
            return Err(self.refuse(libc::EPERM, || {
                format!(
                    "mount: `{rel}` exists; overwriting an object is refused (EPERM): mount with \
                     --allow-overwrite to replace objects opened with O_TRUNC"
                )
            }));
        }
        if flags & libc::O_TRUNC == 0 {
            return Err(self.refuse(libc::EPERM, || {
                format!(
                    "mount: `{rel}` exists; it can be replaced only whole, opened with O_TRUNC \
                     (EPERM)"
                )
            }));
        }
        let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
        self.start_upload(ino, node.parent, &name, &rel)
    }

    fn start_upload(&self, ino: u64, parent: u64, name: &str, rel: &str) -> FsResult<u64> {
        let url = self.source.url(rel);
        if let MountSource::Local(root) = &self.source
            && let Some(dir) = root.join(rel).parent()
        {
            // A directory made in the mount exists on disk once a file is
            // written in it, as a prefix does in S3.
            std::fs::create_dir_all(dir).map_err(|e| {
                log(Level::Warn, || {
                    format!("mount: cannot make `{}`: {e}", dir.display())
                });
                Errno(e.raw_os_error().unwrap_or(libc::EIO))
            })?;
        }
        let writer = crate::object::ObjectWriter::open(&url, &self.cfg, None).map_err(|e| {
            log(Level::Warn, || format!("mount: cannot start `{url}`: {e}"));
            Errno(if e.to_string().contains("exists") {
                libc::EEXIST
            } else {
                libc::EIO
            })
        })?;
        if let Some(n) = self.tree.locked().get_mut(ino) {
            n.local = true;
            n.size = 0;
        }
        let w = Arc::new(WriteHandle {
            ino,
            parent,
            name: name.to_string(),
            url,
            upload: Mutex::new(MountUpload::new(writer)),
            size: AtomicU64::new(0),
            closes: Mutex::new(Closes::default()),
        });
        self.writing.locked().insert(ino, Arc::clone(&w));
        Ok(self.new_fh(Handle::Write(w)))
    }

    /// Makes the new file `name` in `parent` and opens it for writing
    /// (the handle's caching is [`super::Caching::Direct`]).
    pub fn create(&self, parent: u64, name: &str, flags: i32) -> FsResult<(Attr, u64)> {
        self.fresh(parent)?;
        let existing = self.tree.locked().child(parent, name);
        if let Some(ino) = existing {
            if flags & libc::O_EXCL != 0 {
                return Err(Errno(libc::EEXIST));
            }
            let (fh, _) = self.open(ino, flags | libc::O_WRONLY)?;
            self.tree.locked().looked_up(ino);
            return Ok((self.getattr(ino)?, fh));
        }
        if !self.source.writable() {
            return Err(self.refuse(libc::EROFS, || {
                format!("mount: `{name}`: an http(s):// source takes no writes (EROFS)")
            }));
        }
        let (ino, rel) = {
            let mut t = self.tree.locked();
            let ino = t.add_local(parent, name, TreeKind::File);
            // The kernel holds the entry `create` answers.
            t.looked_up(ino);
            (ino, t.get(ino).map(|n| n.rel.clone()).unwrap_or_default())
        };
        match self.start_upload(ino, parent, name, &rel) {
            Ok(fh) => Ok((self.getattr(ino)?, fh)),
            Err(e) => {
                self.tree.locked().remove(parent, name);
                Err(e)
            }
        }
    }

    /// Writes `data` at `off` through handle `fh`, for descriptor table
    /// `owner` (the kernel's lock owner of a direct-I/O write).
    pub fn write(&self, fh: u64, off: u64, data: &[u8], owner: Option<u64>) -> FsResult<u32> {
        let w = match self.handles.locked().get(&fh) {
            Some(Handle::Write(w)) => Arc::clone(w),
            _ => return Err(Errno(libc::EBADF)),
        };
        let r = {
            let mut u = w.upload.locked();
            let r = u.write(off, data);
            if r.is_ok() {
                w.closes.locked().wrote(owner);
            }
            // Relaxed: see `WriteHandle::size`.
            w.size.store(u.size(), Ordering::Relaxed);
            r
        };
        match r {
            Ok(()) => {
                self.counts
                    .add(&self.counts.bytes_written, data.len() as u64);
                Ok(data.len() as u32)
            }
            Err(Refused::OutOfOrder { at, end }) => Err(self.refuse(libc::EINVAL, || {
                format!(
                    "mount: `{}`: a write at byte {at} is not at the end ({end}); objects are \
                     written in order only (EINVAL)",
                    w.url
                )
            })),
            Err(Refused::Closed) => Err(self.refuse(libc::EBADF, || {
                format!(
                    "mount: `{}`: a write after the file was closed or synced (its object is \
                     complete) (EBADF)",
                    w.url
                )
            })),
            Err(Refused::Broken(_)) => Err(Errno(libc::EIO)),
            Err(Refused::Failed(why)) => {
                log(Level::Error, || {
                    format!("mount: writing `{}` failed: {why}", w.url)
                });
                self.counts.add(&self.counts.uploads_aborted, 1);
                self.drop_local(&w);
                Err(Errno(libc::EIO))
            }
        }
    }

    /// A file whose upload did not complete is gone: from its directory,
    /// and its inode (a name the kernel still caches finds nothing).
    fn drop_local(&self, w: &WriteHandle) {
        let mut t = self.tree.locked();
        if t.get(w.ino).is_some_and(|n| n.local) {
            t.remove(w.parent, &w.name);
            t.forget(w.ino);
        }
    }

    /// Completes the upload of `w`: the object is there, or the error.
    pub(super) fn complete(&self, w: &WriteHandle) -> FsResult<()> {
        let (first, r) = {
            let mut u = w.upload.locked();
            let r = (u.is_open(), u.complete());
            // Relaxed: see `WriteHandle::size`.
            w.size.store(u.size(), Ordering::Relaxed);
            r
        };
        match r {
            Ok(size) => {
                if first {
                    self.counts.add(&self.counts.uploads, 1);
                    let mut t = self.tree.locked();
                    if let Some(n) = t.get_mut(w.ino) {
                        n.local = false;
                        n.size = size;
                        n.etag = None;
                        n.mtime = SystemTime::now();
                    }
                    log(Level::Info, || {
                        format!("mount: wrote `{}` ({size} bytes)", w.url)
                    });
                }
                Ok(())
            }
            Err(why) => {
                if first {
                    log(Level::Error, || {
                        format!("mount: `{}` was not written: {why}", w.url)
                    });
                    self.counts.add(&self.counts.uploads_aborted, 1);
                    self.drop_local(w);
                }
                Err(Errno(libc::EIO))
            }
        }
    }

    /// A `close` of a descriptor of `fh` by thread `pid` (as the kernel
    /// numbers it) of descriptor table `owner` (the kernel's lock owner):
    /// [`Closes::close`] decides on who closed ([`super::closer`]) —
    /// nothing; nothing yet but `EIO` (closed empty from where the mount
    /// cannot see); the object completed; or no object (`EIO`, and a line
    /// saying why). Once the upload is done, every close answers its
    /// outcome.
    pub fn flush(&self, fh: u64, pid: u32, owner: u64) -> FsResult<()> {
        let w = match self.handles.locked().get(&fh) {
            Some(Handle::Write(w)) => Arc::clone(w),
            _ => return Ok(()),
        };
        // While this is answered the closing thread waits: its pid names
        // it and no other.
        let closer = self.proc.closer(pid);
        let verdict = {
            let u = w.upload.locked();
            if u.is_open() {
                let written = u.size();
                Some(w.closes.locked().close(owner, &closer, written))
            } else {
                None
            }
        };
        match verdict {
            Some(Verdict::Leave) => Ok(()),
            Some(Verdict::Unsure(_)) => Err(Errno(libc::EIO)),
            Some(Verdict::Abort(why)) => {
                self.abort(&w, &why, pid);
                Err(Errno(libc::EIO))
            }
            Some(Verdict::Complete) | None => self.complete(&w),
        }
    }

    /// The last reference to `w` went: an upload still open is decided
    /// by [`Closes::release`].
    pub(super) fn released(&self, w: &WriteHandle) {
        let verdict = {
            let u = w.upload.locked();
            u.is_open().then(|| w.closes.locked().release(u.size()))
        };
        match verdict {
            Some(Verdict::Complete) => {
                let _ = self.complete(w);
            }
            Some(Verdict::Abort(why)) => self.abort(w, &why, 0),
            Some(Verdict::Leave | Verdict::Unsure(_)) | None => {}
        }
    }

    /// Aborts `w`'s upload for `why` (closed by thread `pid`): no object,
    /// no upload left, and a line naming the file and why.
    fn abort(&self, w: &WriteHandle, why: &Abort, pid: u32) {
        let (level, text) = match why {
            Abort::Killed(signal) => (
                Level::Warn,
                format!(
                    "the writer of `{}` (thread {pid}, signal {signal}) was killed before closing \
                     it: upload aborted, no object written",
                    w.url
                ),
            ),
            Abort::Unseen(unseen) => (
                Level::Error,
                format!(
                    "`{}` was closed before an fsync by a process whose close cannot be told from \
                     its death ({unseen}): upload aborted, no object written (fsync a file \
                     before closing it to complete it from there)",
                    w.url
                ),
            ),
            Abort::NoClose => (
                Level::Error,
                format!(
                    "`{}`: its last descriptor went with no close seen to complete it: upload \
                     aborted, no object written",
                    w.url
                ),
            ),
        };
        let aborted = w.upload.locked().abort(&text);
        match aborted {
            Ok(true) => {
                self.counts.add(&self.counts.uploads_aborted, 1);
                self.drop_local(w);
                log(level, || format!("mount: {text}"));
            }
            Ok(false) => {}
            Err(e) => log(Level::Error, || {
                format!("mount: aborting the upload of `{}` failed: {e}", w.url)
            }),
        }
    }

    /// `fsync`: completes a write handle's upload (later writes are
    /// refused), answering its error.
    pub fn fsync(&self, fh: u64) -> FsResult<()> {
        let w = match self.handles.locked().get(&fh) {
            Some(Handle::Write(w)) => Arc::clone(w),
            _ => return Ok(()),
        };
        self.complete(&w)
    }
}
