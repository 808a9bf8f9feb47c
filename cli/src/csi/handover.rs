//! A mount made by the driver and handed to a process of the cache's
//! owner: the node engine runs as its image's user (not root) and owns
//! the node's cache directory, which the cache trusts only for its owner
//! (`ringfeed::cache`'s private directory). A mount process of root's would
//! refuse that cache; one of the owner's cannot mount (no `CAP_SYS_ADMIN`,
//! and `fusermount3` would need it to traverse the kubelet's root-only
//! directories). So the driver, root, opens `/dev/fuse`, mounts it on the
//! target itself (`mount(2)`, as `fusermount3` would), sets the kernel's
//! read-ahead, and runs `ringfeed mount --fuse-fd 3` as the owner with the
//! descriptor as its fd 3: the process serves the mount and fills the
//! node's cache as the engine does, with no privilege of its own.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use clap::Parser as _;

use crate::args::{Cli, Command, MountArgs};

/// The descriptor number the mount process finds `/dev/fuse` at.
pub(crate) const CHILD_FD: i32 = 3;

/// What a handed-over mount needs: who runs it and how it is mounted.
pub(crate) struct Handover {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    args: MountArgs,
}

/// The user a mount of `args` (`mount SOURCE TARGET ...`) must run as:
/// `None` when it fills no cache, or the cache directory is missing or
/// this process's user's (it runs as the driver, mounting itself).
pub(crate) fn plan(args: &[String]) -> Result<Option<Handover>, String> {
    let cli =
        Cli::try_parse_from(std::iter::once("ringfeed".to_string()).chain(args.iter().cloned()))
            .map_err(|e| format!("the mount's arguments: {e}"))?;
    let Command::Mount(m) = cli.command else {
        return Err("the mount's arguments are not a `mount` command".into());
    };
    let Some(dir) = &m.cache_dir else {
        return Ok(None);
    };
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(_) => return Ok(None),
    };
    // SAFETY: a plain getter.
    if meta.uid() == unsafe { libc::geteuid() } {
        return Ok(None);
    }
    if !meta.is_dir() {
        return Err(format!("the cache `{}` is not a directory", dir.display()));
    }
    Ok(Some(Handover {
        uid: meta.uid(),
        gid: meta.gid(),
        args: m,
    }))
}

impl Handover {
    /// Mounts a FUSE file system on the target for the owner's process to
    /// serve: the returned descriptor is the only way to it.
    pub(crate) fn mount(&self) -> Result<OwnedFd, String> {
        let target = &self.args.mountpoint;
        let fuse: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| format!("/dev/fuse: {e}"))?
            .into();
        let c = |s: &[u8], what: &str| {
            CString::new(s).map_err(|_| format!("the {what} holds a NUL byte"))
        };
        let source = c(
            ringfeed::redact::url(&self.args.source).as_bytes(),
            "source",
        )?;
        let path = c(target.as_os_str().as_bytes(), "target path")?;
        // What fusermount3 gives the kernel for `ringfeed mount
        // --allow-other` (the volume's mounts always are: pods run as any
        // user): the owner's process answers, the kernel checks the modes.
        let mut data = format!(
            "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
            fuse.as_raw_fd(),
            self.uid,
            self.gid
        );
        if self.args.allow_other {
            data.push_str(",allow_other");
        }
        let data = c(data.as_bytes(), "mount data")?;
        let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
        if self.args.read_only {
            flags |= libc::MS_RDONLY;
        }
        // SAFETY: every pointer is a NUL-terminated string alive across the
        // call; `fuse` stays open (the kernel takes its own reference).
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                path.as_ptr(),
                c"fuse.ringfeed".as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "mount on `{}`: {}",
                target.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(fuse)
    }

    /// The kernel's read-ahead on the mount, as the mount itself sets it
    /// when it mounts (`--kernel-read-ahead`); a warning in the driver's log
    /// when it cannot (the mount serves on, at the kernel's default).
    pub(crate) fn set_read_ahead(&self) {
        let (target, bytes) = (&self.args.mountpoint, self.args.kernel_read_ahead);
        if bytes == 0 {
            return;
        }
        if let Err(why) = crate::mount::set_kernel_read_ahead(target, bytes) {
            eprintln!(
                "ringfeed csi: warning: the kernel's read-ahead on `{}` stays at its default: {why}",
                target.display()
            );
        }
    }
}

/// The flags the mount process gets after the volume's own: serve the
/// inherited descriptor.
pub(crate) fn child_args(args: &[String]) -> Vec<String> {
    let mut v = args.to_vec();
    v.extend(["--fuse-fd".to_string(), CHILD_FD.to_string()]);
    v
}

/// Unmounts `target` at once (detached): a handed-over mount whose
/// process did not come up.
pub(crate) fn undo(target: &Path) {
    if let Ok(c) = CString::new(target.as_os_str().as_bytes()) {
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
