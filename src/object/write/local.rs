//! A local object: written to a temporary file beside its path, synced,
//! then renamed into place (`RENAME_NOREPLACE` unless `overwrite`), the
//! directory synced; dropped unfinished, the temporary file is removed.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Progress;
use crate::error::{Error, IoOp, Result};

/// A local file written beside its final path and renamed into place.
pub(super) struct Local {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    overwrite: bool,
    progress: Arc<Progress>,
}

impl Local {
    pub(super) fn open(path: &Path, overwrite: bool, progress: Arc<Progress>) -> Result<Local> {
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

    pub(super) fn write(&mut self, data: &[u8]) -> Result<()> {
        let f = self.file.as_mut().ok_or(Error::Closed)?;
        f.write_all(data)
            .map_err(|e| Error::io(IoOp::Write, &self.tmp, &e))?;
        self.progress.add(data.len() as u64);
        Ok(())
    }

    pub(super) fn finish(&mut self) -> Result<()> {
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
