//! The read side of [`Fs`]: opening a file to read (a remote file's
//! version pinned, its handle's read-ahead, the next small files of a walk
//! fetched ahead) and answering reads from local files, the node's cache
//! entries or a remote file's blocks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::blocks::RemoteFile;
use super::readahead::{Limits, ReadAhead};
use super::source::Object;
use super::{
    Caching, DIR_AHEAD, Data, Errno, Fs, FsResult, Handle, ReadHandle, Reading, TreeKind, tree,
};
use crate::log::{Level, log};
use crate::sync::Locked;

impl Fs {
    /// Opens `ino`: for reading (the kernel may keep the pages it cached
    /// when the version is the one it read: [`Caching::Keep`]), or for
    /// writing when `flags` ask for it (see [`Fs::create`]; always
    /// [`Caching::Direct`]).
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, Caching)> {
        let node = self
            .tree
            .locked()
            .get(ino)
            .cloned()
            .ok_or(Errno(libc::ENOENT))?;
        if node.kind == TreeKind::Dir {
            return Err(Errno(libc::EISDIR));
        }
        let rel = node.rel.clone();
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return self
                .open_write(ino, &node, flags)
                .map(|fh| (fh, Caching::Direct));
        }
        if node.local {
            return Err(self.refuse(libc::EPERM, || {
                format!(
                    "mount: `{rel}` is being written; it can be read once closed (open refused, EPERM)"
                )
            }));
        }
        let obj = self.source.object(&rel).map_err(|e| {
            log(Level::Warn, || format!("mount: `{rel}`: {e}"));
            Errno(libc::EIO)
        })?;
        let (reading, keep) = match obj {
            Object::Local(opened) => {
                let f = opened.map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
                (Reading::Local(f), false)
            }
            Object::Remote(obj) => {
                let (file, same) = self.remote_file(ino, &node, obj, true);
                self.prefetch_after(&node);
                (Reading::Remote(file), same)
            }
        };
        let fh = self.new_fh(Handle::Read(Arc::new(ReadHandle {
            ino,
            reading,
            ahead: Mutex::new(ReadAhead::default()),
        })));
        Ok((fh, if keep { Caching::Keep } else { Caching::Drop }))
    }

    /// The current version of remote file `ino`, and whether it is the
    /// one opened before (its blocks, and the kernel's pages, kept); `open`
    /// counts a handle. Made anew when the listing shows another size,
    /// ETag or `Last-Modified` — and, without a strong ETag, whenever its
    /// directory was listed again since: a server with no strong validator
    /// cannot say the bytes are the same, so nothing read before is kept
    /// (one version per open, never old pages beside new blocks).
    fn remote_file(
        &self,
        ino: u64,
        node: &tree::Node,
        obj: Arc<crate::net::object::HttpObject>,
        open: bool,
    ) -> (Arc<RemoteFile>, bool) {
        let mut files = self.files.locked();
        let etag = node
            .etag
            .clone()
            .filter(|t| crate::net::version::is_strong(t));
        let same = files.get(&ino).is_some_and(|(f, _)| {
            f.size == node.size
                && f.etag == etag
                && f.modified == node.modified
                && (etag.is_some() || f.listing == node.listing || self.source.pinned())
        });
        if !same {
            let f = RemoteFile::new(
                self.source.url(&node.rel),
                obj,
                node.size,
                node.etag.clone(),
                node.modified.clone(),
                node.listing,
            );
            let opens = files.get(&ino).map_or(0, |e| e.1);
            files.insert(ino, (Arc::new(f), opens));
        }
        let e = files.get_mut(&ino).expect("inserted above");
        if open {
            e.1 += 1;
        }
        (Arc::clone(&e.0), same)
    }

    /// Files opened one after another in a directory's name order (a
    /// dataset of small files walked by one reader or several, each its
    /// share): the next [`DIR_AHEAD`] small files are fetched before they
    /// are opened, as a stream's blocks are.
    fn prefetch_after(&self, node: &tree::Node) {
        let Some(store) = &self.store else { return };
        let name = node.rel.rsplit('/').next().unwrap_or(&node.rel).to_string();
        let (walking, next) = {
            let t = self.tree.locked();
            let before = t.neighbours(node.parent, &name, 4, false);
            let mut recent = self.recent.locked();
            let seen = recent.entry(node.parent).or_default();
            let walking = before.iter().any(|(n, _)| seen.contains(n));
            seen.push_back(name.clone());
            if seen.len() > 64 {
                seen.pop_front();
            }
            let next: Vec<(u64, tree::Node)> = if walking {
                t.neighbours(node.parent, &name, DIR_AHEAD, true)
                    .into_iter()
                    .filter_map(|(_, i)| t.get(i).cloned().map(|n| (i, n)))
                    .filter(|(_, n)| {
                        n.kind == TreeKind::File
                            && !n.local
                            && n.size > 0
                            && n.size <= store.block_size()
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (walking, next)
        };
        if !walking {
            return;
        }
        for (ino, n) in next {
            if let Ok(Object::Remote(obj)) = self.source.object(&n.rel) {
                let (file, _) = self.remote_file(ino, &n, obj, false);
                if !store.holds(&file, 0) && store.may_read_ahead() {
                    store.block(&file, 0);
                    self.counts.add(&self.counts.prefetched, 1);
                }
            }
        }
    }

    /// Reads `size` bytes at `off` through handle `fh`.
    pub fn read(&self, fh: u64, off: u64, size: u32) -> FsResult<Data> {
        let h = match self.handles.locked().get(&fh) {
            Some(Handle::Read(h)) => Arc::clone(h),
            Some(Handle::Write(_) | Handle::Dir(_)) | None => return Err(Errno(libc::EBADF)),
        };
        let data = match &h.reading {
            Reading::Local(f) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    match f.read_at(&mut buf[n..], off + n as u64) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(Errno(e.raw_os_error().unwrap_or(libc::EIO))),
                    }
                }
                buf.truncate(n);
                Data::Owned(buf)
            }
            Reading::Remote(file) => self.read_remote(&h, file, off, size)?,
        };
        self.counts.add(&self.counts.reads, 1);
        self.counts
            .add(&self.counts.bytes_read, data.bytes().len() as u64);
        Ok(data)
    }

    fn read_remote(
        &self,
        h: &ReadHandle,
        file: &Arc<RemoteFile>,
        off: u64,
        size: u32,
    ) -> FsResult<Data> {
        let store = self.store.as_ref().ok_or(Errno(libc::EIO))?;
        if off >= file.size || size == 0 {
            return Ok(Data::Owned(Vec::new()));
        }
        let end = (off + size as u64).min(file.size);
        let block = store.block_size();
        let lim = Limits {
            block,
            max: self.opts.readahead,
            // Relaxed: see set_kernel_readahead.
            slack: self.kernel_readahead.load(Ordering::Relaxed),
        };
        let (first, last) = h.ahead.locked().on_read(off, end, file.size, lim);
        let stream = h.ahead.locked().window() > 0 || file.size <= block;
        if let Some(e) = store.entry(file, off == 0 && stream)
            && let Some(bytes) = store.read_entry(file, &e, off, end)
        {
            return Ok(Data::Owned(bytes));
        }
        // Every block the read covers and the window ahead, asked for at
        // once; then the covered ones waited for in order.
        let need_last = end.div_ceil(block);
        let mut covered = Vec::new();
        for i in first..last {
            // Ahead of the read only while the memory budget has room for
            // what is on its way (`Store::may_read_ahead`).
            if i >= need_last && !store.holds(file, i) && !store.may_read_ahead() {
                break;
            }
            let b = store.block(file, i);
            if i < need_last {
                covered.push((i, b));
            }
        }
        let mut parts = Vec::with_capacity(covered.len());
        for (i, b) in covered {
            let r = b.wait();
            if let Err(why) = r {
                store.forget(file, i, &b);
                log(Level::Warn, || {
                    format!(
                        "mount: reading `{}` (inode {}) at byte {}: {why}",
                        file.name,
                        h.ino,
                        i * block
                    )
                });
                return Err(Errno(libc::EIO));
            }
            parts.push((i, b));
        }
        if off == 0 && stream {
            // The version is known now if the listing gave none: a fill
            // starts with the first block in.
            store.entry(file, true);
        }
        store.advance_fill(file);
        if parts.len() == 1 {
            let (i, b) = parts.pop().expect("one");
            let base = i * block;
            return Ok(Data::Block(b, (off - base) as usize..(end - base) as usize));
        }
        let mut out = Vec::with_capacity((end - off) as usize);
        for (i, b) in parts {
            let base = i * block;
            let from = off.max(base) - base;
            let to = end.min(base + b.bytes().len() as u64) - base;
            out.extend_from_slice(&b.bytes()[from as usize..to as usize]);
        }
        Ok(Data::Owned(out))
    }
}
