//! What keeps a cache directory private to the user running the loader.
//!
//! A cache holds copies of remote data that may be private (an S3 bucket
//! only this user's credentials read), and a loader trusts its entries
//! enough to train on them. So the directory is this user's alone:
//!
//! - made with mode 0700; an existing one is used only when this user owns
//!   it (and the symbolic link naming it, if any, is this user's or root's)
//!   and no one else may write into it, unless its sticky bit keeps others
//!   from replacing this user's files ([`check_dir`]). Anything else is
//!   refused by name ([`Error::CacheDir`]), never read nor written.
//! - every file is made 0600 with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   ([`create_new`]), or, for the lock files that outlive their fills,
//!   `O_CREAT | O_NOFOLLOW` and checked to be this user's regular file
//!   ([`open_lock`]): a symbolic link planted at a name makes the open fail,
//!   never a write through it. Entries are opened `O_NOFOLLOW` and used only
//!   when this user owns them ([`open_owned`]), so in a sticky shared
//!   directory another user's file is refused too.
//! - temporary files of fills that died (a process killed mid-fill) are
//!   removed when the directory is opened, each only once its fill lock is
//!   taken: a live filler holds its lock, so its file is never touched
//!   ([`clean_stale`]).
//!
//! Entries carry CRC32C checksums, which find torn and corrupt files but
//! are no MAC: whoever can write the directory can forge an entry. With the
//! directory this user's and closed to others, only this user (and root)
//! can; a keyed MAC would add a key to keep, and guard against no one else.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{CacheDirRefusal, Error};

/// The mode of a directory this module makes: the user's alone.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file in it.
pub const FILE_MODE: u32 = 0o600;
/// The sticky bit: in a directory others may write, only a file's owner
/// may rename or remove it.
const STICKY: u32 = 0o1000;
/// Write permission for the group and for others.
const OTHERS_WRITE: u32 = 0o022;

/// The user this process acts as.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Makes `dir` (and missing parents) with mode 0700.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Refuses a directory that is not this user's alone (see the module
/// doc). A path that does not exist passes: nothing is there to trust.
pub fn check_dir(dir: &Path) -> Result<(), Error> {
    let uid = euid();
    let refuse = |why| Error::CacheDir {
        dir: dir.to_path_buf(),
        why,
    };
    let link = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    // Whoever owns the link decides where it points.
    if link.file_type().is_symlink() && link.uid() != uid && link.uid() != 0 {
        return Err(refuse(CacheDirRefusal::LinkNotOwned {
            owner: link.uid(),
            uid,
        }));
    }
    let m = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(_) => return Ok(()),
    };
    // A file there: nothing to read, and `Cache::open` says it cannot
    // make the directory (the job goes on uncached).
    if !m.is_dir() {
        return Ok(());
    }
    if m.uid() != uid {
        return Err(refuse(CacheDirRefusal::NotOwned {
            owner: m.uid(),
            uid,
        }));
    }
    let mode = m.mode() & 0o7777;
    if mode & OTHERS_WRITE != 0 && mode & STICKY == 0 {
        return Err(refuse(CacheDirRefusal::OpenToOthers { mode }));
    }
    Ok(())
}

/// Creates `path` anew, 0600, for reading and writing: fails when anything
/// is there (a symbolic link included), never opens what another planted.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Opens (or creates, 0600) the lock file `path`: never through a
/// symbolic link, and only this user's regular file.
pub fn open_lock(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    owned(f, path)
}

/// Opens `path` for reading: never through a symbolic link, and only this
/// user's regular file.
pub fn open_owned(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    owned(f, path)
}

/// `f` when it is a regular file of this user's.
fn owned(f: File, path: &Path) -> io::Result<File> {
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a regular file of this user's (uid {}, mode {:o})",
                path.display(),
                m.uid(),
                m.mode()
            ),
        ));
    }
    Ok(f)
}

/// Whether `f` is the file at `path` now (not one unlinked or replaced
/// since it was opened).
pub fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `a` and `b` are one file.
pub fn same_inode(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What [`clean_stale`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    /// Temporary files of dead fills removed.
    pub temps: u64,
    /// Entries of this user's made 0600 (written before entries were).
    pub modes: u64,
}

/// Removes the temporary files of fills that died in `dir` (each once its
/// fill lock is taken, so never a live filler's), and closes entries
/// (files named `*{entry_suffix}`) readable by others to them.
pub fn clean_stale(dir: &Path, entry_suffix: &str) -> Cleaned {
    let mut done = Cleaned::default();
    let Ok(list) = std::fs::read_dir(dir) else {
        return done;
    };
    for d in list.flatten() {
        let name = d.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if let Some(entry) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(super::TMP_SUFFIX))
        {
            let lock_path = dir.join(super::lock_name(entry));
            let Ok(lock) = open_lock(&lock_path) else {
                continue;
            };
            // Held: a live filler's file. Taken: no one writes it.
            if super::flock(&lock, libc::LOCK_EX | libc::LOCK_NB).unwrap_or(false)
                && same_file(&lock, &lock_path)
                && std::fs::remove_file(d.path()).is_ok()
            {
                done.temps += 1;
            }
        } else if !name.starts_with('.') && name.ends_with(entry_suffix) {
            let Ok(f) = open_owned(&d.path()) else {
                continue;
            };
            let loose = f.metadata().is_ok_and(|m| m.mode() & 0o077 != 0);
            if loose
                && f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
                    .is_ok()
            {
                done.modes += 1;
            }
        }
    }
    done
}
