//! What is mounted on a path, from `/proc/self/mountinfo` (proc(5)): the
//! kernel's word, which the driver's records are checked against. The
//! path is never `stat`ed itself: a FUSE mount whose process is gone
//! answers `ENOTCONN` to that, and must still be found to be unmounted.

use std::path::{Path, PathBuf};

/// The file system type `ringfeed mount` mounts with through
/// `fusermount3` (`fuse.` and its subtype); mounted by the system call
/// itself (as root), it is plain `fuse`.
const OURS: &str = "fuse.ringfeed";

/// The top mount on a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The file system type (`fuse.ringfeed`, `tmpfs`, ...).
    pub(crate) fstype: String,
    /// What the mount names as its source (ours: the URL, redacted).
    pub(crate) source: String,
}

impl Entry {
    /// Whether this is a `ringfeed mount`: of our type, or a plain FUSE
    /// mount whose source is the URL a ringfeed mount names itself by.
    pub(crate) fn is_ringfeed(&self) -> bool {
        self.fstype == OURS
            || (self.fstype == "fuse"
                && ["s3://", "http://", "https://"]
                    .iter()
                    .any(|s| self.source.starts_with(s)))
    }
}

/// A mountinfo field unescaped: the kernel writes space, tab, newline
/// and backslash as `\040`, `\011`, `\012` and `\134`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let n = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(n) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The top mount on `path` in a mountinfo `text` (the last line naming
/// it: later mounts cover earlier ones).
pub(crate) fn find(text: &str, path: &Path) -> Option<Entry> {
    let want = path.to_string_lossy();
    text.lines().rev().find_map(|line| {
        let f: Vec<&str> = line.split(' ').collect();
        if unescape(f.get(4)?) != want {
            return None;
        }
        let mut after = f.iter().skip_while(|x| **x != "-").skip(1);
        let fstype = unescape(after.next()?);
        let source = unescape(after.next()?);
        Some(Entry { fstype, source })
    })
}

/// `path` as the kernel names its mounts: its parent's real path and its
/// own name (the path itself is not resolved: see the module's comment).
pub(crate) fn kernel_path(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map_or_else(|_| path.to_path_buf(), |p| p.join(name)),
        _ => path.to_path_buf(),
    }
}

/// The top mount on `path` now, if any.
pub(crate) fn mounted(path: &Path) -> std::io::Result<Option<Entry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(find(&text, &kernel_path(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
36 22 0:33 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv\\040one/mount rw,nosuid,nodev shared:90 - fuse.ringfeed s3://bucket/train/ rw,user_id=0,group_id=0,allow_other
37 22 0:34 / /mnt/t rw - tmpfs tmpfs rw
38 37 0:35 / /mnt/t rw,nosuid master:3 - fuse.ringfeed https://h/d/ ro,user_id=0
39 22 0:36 / /mnt/back\\134slash rw - tmpfs none rw
";

    #[test]
    fn the_top_mount_of_a_path_with_its_type_and_source() {
        let e = find(
            INFO,
            Path::new("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv one/mount"),
        )
        .unwrap();
        assert_eq!(
            e,
            Entry {
                fstype: OURS.into(),
                source: "s3://bucket/train/".into()
            }
        );
        // Two mounts on one path: the later covers the earlier.
        assert_eq!(
            find(INFO, Path::new("/mnt/t")).unwrap().source,
            "https://h/d/"
        );
        assert_eq!(
            find(INFO, Path::new("/mnt/back\\slash")).unwrap().fstype,
            "tmpfs"
        );
        assert_eq!(find(INFO, Path::new("/mnt")), None);
        assert_eq!(
            find(
                INFO,
                Path::new("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv\\040one/mount")
            ),
            None
        );
        // Garbage lines are no mounts.
        assert_eq!(find("x\n1 2 3\n\n- - -\n", Path::new("/x")), None);
        assert_eq!(unescape("a\\040b\\011c\\9xy\\"), "a b\tc\\9xy\\");
    }

    #[test]
    fn the_kernel_s_own_mounts_are_found_by_the_real_parent() {
        assert_eq!(mounted(Path::new("/proc")).unwrap().unwrap().fstype, "proc");
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(mounted(&tmp.path().join("nothing")).unwrap(), None);
    }
}
