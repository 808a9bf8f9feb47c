//! A local source's files opened beneath its root, never by a path
//! rebuilt from the root's name: each open starts at a descriptor of the
//! root directory, taken once when mounted, and resolves the relative
//! path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (Linux 5.6),
//! or, where the kernel has no `openat2` (or a seccomp policy refuses it),
//! walks it one component at a time with `O_NOFOLLOW`. A directory of the
//! tree swapped for a symbolic link after it was listed (to `/`, to
//! another user's home) is then an error (`ELOOP`), never a way out: a
//! mount with `--allow-other`, run by one user and read by others, hands
//! out only what lies beneath its root, with the mounter's rights.
//!
//! Every name a path is made of is checked first: empty, `.`, `..`, a
//! NUL, or a `/` inside a name are refused (`EINVAL`) before the kernel
//! sees them.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The root directory of a local source: its name (for URLs and messages)
/// and a descriptor every open starts from.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    fd: OwnedFd,
}

impl std::ops::Deref for Root {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

/// A directory entry as the local source lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct BeneathEntry {
    pub name: String,
    pub dir: bool,
    pub size: u64,
    pub mtime: Option<SystemTime>,
}

/// How a path is resolved beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `openat2` where the kernel has it, else [`Resolve::Walk`].
    Kernel,
    /// One component at a time with `O_NOFOLLOW`.
    Walk,
}

impl Root {
    /// Opens the directory `path` (the name the user gave, followed as
    /// given: it is the mount's root by the user's choice).
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root {
            path: path.to_path_buf(),
            fd,
        })
    }

    /// The root's name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The regular file at `rel` (names joined by `/`), for reading.
    pub fn open_file(&self, rel: &str) -> io::Result<File> {
        self.open_file_by(rel, Resolve::Kernel)
    }

    /// As [`Root::open_file`], resolving as `how` says (the walk is
    /// what runs where the kernel has no `openat2`; tests take both).
    pub fn open_file_by(&self, rel: &str, how: Resolve) -> io::Result<File> {
        // O_NONBLOCK: a FIFO put beneath the root does not hold the open
        // (it is refused below); a regular file's reads ignore the flag.
        let fd = open_beneath(self.fd.as_fd(), rel, OFlags::RDONLY | OFlags::NONBLOCK, how)?;
        let f = File::from(fd);
        let m = f.metadata()?;
        if !m.is_file() {
            let errno = if m.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            };
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(f)
    }

    /// The directory at `rel` (empty: the root), one level: its
    /// subdirectories and regular files (symbolic links and other kinds
    /// are not shown; names that are not UTF-8 are left out).
    pub fn list(&self, rel: &str) -> io::Result<Vec<BeneathEntry>> {
        self.list_by(rel, Resolve::Kernel)
    }

    /// As [`Root::list`], resolving as `how` says.
    pub fn list_by(&self, rel: &str, how: Resolve) -> io::Result<Vec<BeneathEntry>> {
        let dir = open_beneath(
            self.fd.as_fd(),
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY,
            how,
        )?;
        let mut out = Vec::new();
        for e in Dir::read_from(&dir)? {
            let e = e?;
            let raw = e.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(raw) else {
                continue;
            };
            // The entry's own kind: a link is seen as a link, not followed.
            let Ok(st) = rustix::fs::statat(&dir, e.file_name(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let dir = match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => true,
                FileType::RegularFile => false,
                _ => continue,
            };
            let mtime = u64::try_from(st.st_mtime).ok().map(|s| {
                SystemTime::UNIX_EPOCH
                    + Duration::new(s, u32::try_from(st.st_mtime_nsec).unwrap_or(0))
            });
            out.push(BeneathEntry {
                name: name.to_string(),
                dir,
                size: if dir { 0 } else { st.st_size as u64 },
                mtime,
            });
        }
        Ok(out)
    }
}

/// The names of `rel`, each checked: none empty, `.` or `..`, none with a
/// NUL. The empty path is the root itself (no names).
pub fn names(rel: &str) -> io::Result<Vec<&str>> {
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    rel.split('/')
        .map(|n| match n {
            "" | "." | ".." => Err(refused(rel, "an empty, `.` or `..` name")),
            n if n.contains('\0') => Err(refused(rel, "a NUL in a name")),
            n => Ok(n),
        })
        .collect()
}

fn refused(rel: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("path {rel:?} refused: {why}"),
    )
}

/// Opens `rel` beneath `root` with `flags`, through no symbolic link.
fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    how: Resolve,
) -> io::Result<OwnedFd> {
    let names = names(rel)?;
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if names.is_empty() {
        return Ok(rustix::fs::openat(root, ".", flags, Mode::empty())?);
    }
    if how == Resolve::Kernel {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve) {
            // No openat2 here (before Linux 5.6), or a seccomp policy that
            // answers unknown calls EPERM: the walk does the same.
            Err(Errno::NOSYS) | Err(Errno::PERM) => {}
            r => return Ok(r?),
        }
    }
    walk(root, &names, flags)
}

/// The walk: each directory opened from its parent's descriptor with
/// `O_NOFOLLOW | O_DIRECTORY` (a link is `ELOOP`, a file `ENOTDIR`), then
/// the last name with `O_NOFOLLOW`. No name is `..` ([`names`]), so
/// nothing climbs out.
fn walk(root: BorrowedFd<'_>, names: &[&str], flags: OFlags) -> io::Result<OwnedFd> {
    let (last, dirs) = names.split_last().ok_or_else(|| refused("", "no name"))?;
    let mut at: Option<OwnedFd> = None;
    for name in dirs {
        let from = at.as_ref().map_or(root, |f| f.as_fd());
        let next = rustix::fs::openat(
            from,
            OsStr::from_bytes(name.as_bytes()),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        at = Some(next);
    }
    let from = at.as_ref().map_or(root, |f| f.as_fd());
    Ok(rustix::fs::openat(
        from,
        OsStr::from_bytes(last.as_bytes()),
        flags,
        Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn hostile_names_are_refused_before_the_kernel_sees_them() {
        for rel in [
            "..",
            ".",
            "a/../b",
            "a//b",
            "/etc/passwd",
            "a/",
            "a\0b",
            "../x",
        ] {
            let e = names(rel).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{rel:?}");
        }
        assert_eq!(names("a/b.c").unwrap(), vec!["a", "b.c"]);
        assert!(names("").unwrap().is_empty());
    }

    /// A tree `root/d/f` with a secret outside it; returns (tmp, root).
    fn tree() -> (tempfile::TempDir, Root) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("root/d")).unwrap();
        std::fs::write(t.path().join("root/d/f"), b"inside").unwrap();
        std::fs::create_dir(t.path().join("outside")).unwrap();
        std::fs::write(t.path().join("outside/f"), b"secret").unwrap();
        let root = Root::open(&t.path().join("root")).unwrap();
        (t, root)
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_listing_is_not_followed() {
        for how in [Resolve::Kernel, Resolve::Walk] {
            let (t, root) = tree();
            let read = |f: io::Result<File>| {
                f.map(|mut f| {
                    let mut s = String::new();
                    io::Read::read_to_string(&mut f, &mut s).unwrap();
                    s
                })
            };
            let listed = root.list_by("d", how).unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!(read(root.open_file_by("d/f", how)).unwrap(), "inside");
            // The swap: `d` becomes a link to the directory outside.
            std::fs::rename(t.path().join("root/d"), t.path().join("old-d")).unwrap();
            symlink(t.path().join("outside"), t.path().join("root/d")).unwrap();
            // Control: the path rebuilt from the root's name, as a plain
            // open takes it, reaches the secret.
            let by_name = std::fs::read_to_string(root.path().join("d/f")).unwrap();
            assert_eq!(by_name, "secret");
            // (A link opened as a directory without following is ENOTDIR
            // or ELOOP, by which check the kernel makes first.)
            let link_refused =
                |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR));
            let e = read(root.open_file_by("d/f", how)).unwrap_err();
            assert!(link_refused(&e), "{how:?}: {e}");
            let e = root.list_by("d", how).unwrap_err();
            assert!(link_refused(&e), "{how:?}: {e}");
            // A link as the last name is refused too, and not listed.
            symlink(t.path().join("outside/f"), t.path().join("root/g")).unwrap();
            let e = read(root.open_file_by("g", how)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{how:?}: {e}");
            let names: Vec<String> = root
                .list_by("", how)
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect();
            assert!(names.is_empty(), "{names:?}");
        }
    }

    #[test]
    fn a_directory_is_not_opened_as_a_file() {
        let (_t, root) = tree();
        let e = root.open_file("d").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
    }
}
