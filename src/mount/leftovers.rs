//! What a writer killed mid-file leaves in a local directory: its
//! temporary file (`.NAME.ringfeed-PID-N.tmp`,
//! `crate::object::ObjectWriter`'s, renamed into place only once
//! complete). A listing never shows one, and one left by a writer that is
//! gone is removed when listed: its process is not alive on this host
//! and it was last written before this mount began (so a writer on
//! another host sharing the directory, still writing, keeps its file).

use std::path::Path;
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::log::{Level, log};

/// When this mount began (first asked when the file system is made):
/// temporary files last written before it, by a process that is gone,
/// are left from an earlier run.
pub fn started() -> SystemTime {
    static STARTED: OnceLock<SystemTime> = OnceLock::new();
    *STARTED.get_or_init(SystemTime::now)
}

/// The pid in a writer's temporary file's name, if `name` is one.
pub fn temp_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (_, tail) = rest.rsplit_once(".ringfeed-")?;
    let (pid, seq) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(seq)).then(|| pid.parse().ok())?
}

/// Whether `name` in directory `dir` is a writer's temporary file (not to
/// be listed); one left by a writer that is gone is removed.
pub fn hide(dir: &Path, name: &str, modified: Option<SystemTime>) -> bool {
    let Some(pid) = temp_pid(name) else {
        return false;
    };
    let alive = Path::new("/proc").join(pid.to_string()).exists();
    if !alive && modified.is_some_and(|m| m < started()) {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => log(Level::Warn, || {
                format!(
                    "mount: removed `{}`, left by writer {pid}, which is gone",
                    path.display()
                )
            }),
            Err(e) => log(Level::Warn, || {
                format!("mount: cannot remove `{}`: {e}", path.display())
            }),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_temporary_names_are_told_from_others() {
        assert_eq!(temp_pid(".ckpt.pt.ringfeed-4242-0.tmp"), Some(4242));
        assert_eq!(temp_pid(".a.ringfeed-b.ringfeed-7-12.tmp"), Some(7));
        for other in [
            "ckpt.pt",
            ".hidden",
            ".x.ringfeed-12.tmp",
            ".x.ringfeed--1.tmp",
            ".x.ringfeed-1-.tmp",
            ".x.ringfeed-a-1.tmp",
            "x.ringfeed-1-1.tmp",
            ".x.ringfeed-99999999999999999999-1.tmp",
        ] {
            assert_eq!(temp_pid(other), None, "{other}");
        }
    }

    #[test]
    fn a_gone_writers_old_file_is_removed_and_a_live_or_new_one_kept() {
        started();
        let d = tempfile::tempdir().unwrap();
        let long_ago = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        // No process has pid 2^22 + 1 (above Linux's pid_max limit).
        let gone = format!(".a.ringfeed-{}-0.tmp", (1 << 22) + 1);
        let live = format!(".b.ringfeed-{}-0.tmp", std::process::id());
        for n in [&gone, &live, &"plain".to_string()] {
            std::fs::write(d.path().join(n), b"x").unwrap();
        }
        assert!(!hide(d.path(), "plain", Some(long_ago)));
        assert!(hide(d.path(), &live, Some(long_ago)));
        assert!(d.path().join(&live).exists(), "its writer is alive");
        assert!(hide(d.path(), &gone, Some(SystemTime::now())));
        assert!(
            d.path().join(&gone).exists(),
            "written since the mount began"
        );
        assert!(hide(d.path(), &gone, Some(long_ago)));
        assert!(!d.path().join(&gone).exists());
    }
}
