//! The driver's records on disk (`--state-dir`): one file per published
//! target, saying which volume is there, the mount command that serves it
//! and its process. A driver started again reads them back, checks each
//! against the kernel's mount table, and so answers a publish or an
//! unpublish of a mount an earlier driver made.
//!
//! Each record is written whole to a temporary file, synced and renamed
//! over the last one, so a driver killed mid-write leaves the old record
//! or the new one. A record that cannot be read is set aside (`.bad`) with
//! a warning, never fatal: the kernel's mount table still says what is
//! mounted.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

/// One published target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) volume_id: String,
    pub(crate) target: PathBuf,
    /// The arguments of `ringfeed` that serve it (`mount SOURCE TARGET
    /// ...`): a second publish of the target is the same one only if its
    /// arguments are these.
    pub(crate) args: Vec<String>,
    /// The mount process, and its start time (`/proc/PID/stat`'s 22nd
    /// field), so a pid used again by another process is not taken for it.
    pub(crate) pid: u32,
    pub(crate) started: u64,
    /// The mount's log.
    pub(crate) log: PathBuf,
}

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    #[error("state directory `{dir}`: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("state record `{file}`: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

/// The records of one state directory.
pub(crate) struct State {
    dir: PathBuf,
}

impl State {
    /// The state directory `dir` (made, owner-only, when missing).
    pub(crate) fn open(dir: &Path) -> Result<State, StateError> {
        use std::os::unix::fs::DirBuilderExt;
        let targets = dir.join("targets");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&targets)
            .map_err(|source| StateError::Dir {
                dir: targets.clone(),
                source,
            })?;
        Ok(State { dir: targets })
    }

    /// The file name of `target`'s record and log: a digest of the path
    /// (a kubelet path is long; the digest is a fixed, safe name).
    fn stem(&self, target: &Path) -> PathBuf {
        let digest = Sha1::digest(target.as_os_str().as_encoded_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(hex)
    }

    /// Where the mount of `target` logs.
    pub(crate) fn log_path(&self, target: &Path) -> PathBuf {
        self.stem(target).with_extension("log")
    }

    fn record_path(&self, target: &Path) -> PathBuf {
        self.stem(target).with_extension("json")
    }

    /// Writes `r` whole, replacing the target's last record.
    pub(crate) fn save(&self, r: &Record) -> Result<(), StateError> {
        let file = self.record_path(&r.target);
        let tmp = file.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &file)
        };
        write().map_err(|source| StateError::Write {
            file: file.clone(),
            source,
        })
    }

    /// Forgets `target` (its record and its log); nothing there is fine.
    pub(crate) fn remove(&self, target: &Path) -> Result<(), StateError> {
        for file in [self.record_path(target), self.log_path(target)] {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StateError::Write { file, source }),
            }
        }
        Ok(())
    }

    /// Every record, by target; a record that cannot be read is renamed
    /// `.bad` and told in the warnings.
    pub(crate) fn load(&self) -> Result<(HashMap<PathBuf, Record>, Vec<String>), StateError> {
        let mut out = HashMap::new();
        let mut warnings = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|source| StateError::Dir {
            dir: self.dir.clone(),
            source,
        })?;
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let read = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| e.to_string()))
                .and_then(|r| {
                    if self.record_path(&r.target) == path {
                        Ok(r)
                    } else {
                        Err(format!(
                            "names target `{}`, not this file's",
                            r.target.display()
                        ))
                    }
                });
            match read {
                Ok(r) => {
                    out.insert(r.target.clone(), r);
                }
                Err(why) => {
                    let aside = path.with_extension("json.bad");
                    let _ = std::fs::rename(&path, &aside);
                    warnings.push(format!(
                        "state record `{}` cannot be read ({why}): set aside as `{}`",
                        path.display(),
                        aside.display()
                    ));
                }
            }
        }
        Ok((out, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(target: &str) -> Record {
        Record {
            volume_id: "vol".into(),
            target: target.into(),
            args: vec!["mount".into(), "s3://b/".into(), target.into()],
            pid: 42,
            started: 7,
            log: "/x.log".into(),
        }
    }

    #[test]
    fn records_round_trip_are_replaced_whole_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let s = State::open(&tmp.path().join("state")).unwrap();
        let (a, b) = (record("/t/a"), record("/t/b"));
        s.save(&a).unwrap();
        s.save(&b).unwrap();
        let mut a2 = a.clone();
        a2.pid = 43;
        s.save(&a2).unwrap();
        let (got, warnings) = s.load().unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(got.len(), 2);
        assert_eq!(got[Path::new("/t/a")], a2);
        assert_eq!(got[Path::new("/t/b")], b);
        s.remove(Path::new("/t/a")).unwrap();
        s.remove(Path::new("/t/never")).unwrap();
        assert_eq!(s.load().unwrap().0.len(), 1);
    }

    #[test]
    fn a_record_that_cannot_be_read_is_set_aside_with_a_warning() {
        let tmp = tempfile::tempdir().unwrap();
        let s = State::open(tmp.path()).unwrap();
        s.save(&record("/t/good")).unwrap();
        let dir = tmp.path().join("targets");
        std::fs::write(dir.join("garbage.json"), b"{not json").unwrap();
        std::fs::write(dir.join("empty.json"), b"").unwrap();
        // A record copied under another target's name.
        let moved = std::fs::read(s.record_path(Path::new("/t/good"))).unwrap();
        std::fs::write(dir.join("moved.json"), moved).unwrap();
        let (got, warnings) = s.load().unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), [Path::new("/t/good")]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("garbage.json") && w.contains("set aside"))
        );
        assert!(warnings.iter().any(|w| w.contains("not this file's")));
        assert!(dir.join("garbage.json.bad").exists());
        // Set aside: the next load is clean.
        assert!(s.load().unwrap().1.is_empty());
    }
}
