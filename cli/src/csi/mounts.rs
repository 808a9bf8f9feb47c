//! The mounts as processes: each published volume is a `ringfeed mount`
//! process of its own, in a session of its own, started by the driver
//! and outliving it (a driver killed, or stopped and started again, leaves
//! every mount serving); unpublishing unmounts, which ends the process.
//!
//! The driver waits for each process it started on a thread of its own,
//! so none is left a zombie while the driver runs; a process an earlier
//! driver started is its parent's (init's) to reap.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::state::Record;
use super::volume::Plan;
use super::{handover, mountinfo};

/// How long a mount may take to come up: its source is listed before (by
/// the driver); mounting itself takes milliseconds, so this bounds a hung
/// start, well inside the kubelet's two minutes for a publish.
const MOUNT_LIMIT: Duration = Duration::from_secs(60);
/// How long an unpublish waits for the mount process to end once
/// unmounted: it writes out the cache fills it queued, then exits.
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// The start time of process `pid` (`/proc/PID/stat`'s 22nd field, in
/// clock ticks since boot), while it runs: with the pid, names one
/// process for good.
pub(crate) fn started(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold anything: the
    // fields after its last `)` start at field 3.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // A zombie (state Z) has ended; it waits only for its parent to
    // reap it.
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the mount process of `r` still runs.
pub(crate) fn alive(r: &Record) -> bool {
    started(r.pid) == Some(r.started)
}

/// Starts the mount `plan` asks for, its log in `log`; returns once it
/// is mounted, with its record.
pub(crate) fn start(plan: &Plan, log: &Path) -> Result<Record, String> {
    match std::fs::create_dir(&plan.target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !plan.target.is_dir() {
                return Err(format!(
                    "`{}` exists and is not a directory",
                    plan.target.display()
                ));
            }
        }
        Err(e) => return Err(format!("cannot make `{}`: {e}", plan.target.display())),
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(log)
        .map_err(|e| format!("mount log `{}`: {e}", log.display()))?;
    // A mount that fills the node engine's cache runs as its owner, on a
    // mount the driver makes (handover.rs); any other runs as the driver.
    let handover = handover::plan(&plan.args)?;
    let mut child = match &handover {
        None => crate::mount::spawn_detached(&plan.args, file, None)
            .map_err(|e| format!("cannot start `ringfeed mount`: {e}"))?,
        Some(h) => {
            let fuse = h.mount()?;
            let as_owner = crate::mount::Handed {
                fd: fuse,
                at: handover::CHILD_FD,
                uid: h.uid,
                gid: h.gid,
            };
            match crate::mount::spawn_detached(
                &handover::child_args(&plan.args),
                file,
                Some(as_owner),
            ) {
                Ok(c) => c,
                Err(e) => {
                    handover::undo(&plan.target);
                    return Err(format!("cannot start `ringfeed mount`: {e}"));
                }
            }
        }
    };
    if let Err(e) = crate::mount::wait_mounted(&mut child, log, &plan.target, MOUNT_LIMIT) {
        if handover.is_some() {
            handover::undo(&plan.target);
        }
        return Err(ringfeed::redact::text(&e.to_string()).into_owned());
    }
    if let Some(h) = &handover {
        h.set_read_ahead();
        eprintln!(
            "ringfeed csi: `{}` is served by uid {}:{}, the owner of the node's cache",
            plan.target.display(),
            h.uid,
            h.gid
        );
    }
    let pid = child.id();
    let record = Record {
        volume_id: plan.volume_id.clone(),
        target: plan.target.clone(),
        args: plan.args.clone(),
        pid,
        started: started(pid).unwrap_or(0),
        log: log.to_path_buf(),
    };
    let target = plan.target.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        eprintln!(
            "ringfeed csi: the mount on `{}` (pid {pid}) ended: {status:?}",
            target.display()
        );
    });
    Ok(record)
}

/// Unmounts `target` (busy: detached, as `ringfeed mount` does on a busy
/// exit), waits for the mount process of `record` to end, and removes the
/// directory a publish made. Nothing mounted there is fine.
pub(crate) fn stop(target: &Path, record: Option<&Record>) -> Result<(), String> {
    if mountinfo::mounted(target)
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?
        .is_some()
    {
        unmount(target)?;
    }
    if let Some(r) = record {
        let until = Instant::now() + EXIT_LIMIT;
        while alive(r) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(r) {
            eprintln!(
                "ringfeed csi: warning: the mount process {} of `{}` still runs {} s after its \
                 unmount",
                r.pid,
                target.display(),
                EXIT_LIMIT.as_secs()
            );
        }
    }
    match std::fs::remove_dir(target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            // Files written under the directory while it was not mounted
            // are not the driver's to delete.
            eprintln!(
                "ringfeed csi: warning: `{}` is left in place: {e}",
                target.display()
            );
            Ok(())
        }
    }
}

/// The `umount2` system call on `target` (root, or `CAP_SYS_ADMIN`), else
/// `fusermount3 -u`; a busy mount is detached (`MNT_DETACH`, `-z`).
fn unmount(target: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| format!("`{}` holds a NUL", target.display()))?;
    for flags in [0, libc::MNT_DETACH] {
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let rc = unsafe { libc::umount2(c.as_ptr(), flags) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBUSY) => continue,
            // Not a mount point (any more): unmounted by someone else.
            Some(libc::EINVAL) => return Ok(()),
            Some(libc::EPERM) => return fusermount(target),
            _ => return Err(format!("umount `{}`: {e}", target.display())),
        }
    }
    Err(format!(
        "umount `{}`: still busy after detaching",
        target.display()
    ))
}

fn fusermount(target: &Path) -> Result<(), String> {
    let out = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(target)
        .output()
        .map_err(|e| format!("fusermount3 -u `{}`: {e}", target.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "fusermount3 -u `{}`: {}",
            target.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether the mount on `target` answers: a FUSE mount whose process is
/// gone answers `ENOTCONN` to opening its root (a `stat` may still be
/// answered from the kernel's cache of attributes).
pub(crate) fn answers(target: &Path) -> bool {
    std::fs::read_dir(target).is_ok()
}

/// The parent directory of `target`, which the kubelet makes.
pub(crate) fn parent(target: &Path) -> PathBuf {
    target
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_its_pid_and_start_time() {
        let me = std::process::id();
        let t = started(me).unwrap();
        let r = Record {
            volume_id: "v".into(),
            target: "/t".into(),
            args: vec![],
            pid: me,
            started: t,
            log: "/l".into(),
        };
        assert!(alive(&r));
        // The same pid with another start time is another process.
        assert!(!alive(&Record {
            started: t + 1,
            ..r.clone()
        }));
        assert!(!alive(&Record { pid: u32::MAX, ..r }));
    }

    #[test]
    fn stopping_a_target_that_is_not_mounted_removes_its_empty_directory_only() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        stop(&empty, None).unwrap();
        assert!(!empty.exists());
        stop(&tmp.path().join("never"), None).unwrap();
        let full = tmp.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("f"), b"kept").unwrap();
        stop(&full, None).unwrap();
        assert_eq!(std::fs::read(full.join("f")).unwrap(), b"kept");
    }
}
