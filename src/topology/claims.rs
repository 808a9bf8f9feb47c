//! CPU claims between engines: one lock file per CPU in a per-user
//! directory (`$XDG_RUNTIME_DIR/ringfeed/cpus/`, else
//! `/tmp/ringfeed-<uid>/cpus/`), held with `flock(LOCK_EX | LOCK_NB)` by the
//! engine whose thread is pinned there. The kernel drops the lock when the
//! file is closed or the process dies, so a crashed engine leaves no stale
//! claim. `flock` locks belong to an open file description, so two loaders
//! in one process, each opening the file, see each other's claims too.
//!
//! [`ClaimsDir::place`] probes which CPUs are claimed (a try-lock that fails
//! is a claim), places with [`super::worker_cpus`], claims the chosen CPUs,
//! and places again when another engine won a race for one of them.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{Placement, PlacementRequest, Topology, worker_cpus};

/// Attempts at placing when other engines keep winning races for the
/// chosen CPUs; each lost race marks that CPU claimed, so this bounds a
/// loop that in practice ends at the second try.
const PLACE_ATTEMPTS: usize = 4;

/// The directory of claim files.
#[derive(Debug, Clone)]
pub struct ClaimsDir {
    path: PathBuf,
}

/// CPUs this engine holds; dropping it (or closing the loader) releases them.
#[derive(Debug, Default)]
pub struct Claims {
    held: Vec<(usize, File)>,
}

impl Claims {
    /// The CPUs held, ascending.
    pub fn cpus(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.held.iter().map(|h| h.0).collect();
        c.sort_unstable();
        c
    }

    /// Gives every claim back.
    pub fn release(&mut self) {
        self.held.clear();
    }
}

/// This user's directory for what engines on one node share (CPU claims,
/// node engine sockets): `$XDG_RUNTIME_DIR/ringfeed`, else
/// `/tmp/ringfeed-<uid>`; made with mode 0700, and refused when another user
/// owns it or others may write it (/tmp is shared: another user could have
/// made or linked it there first).
pub fn user_dir() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(run) => Path::new(&run).join("ringfeed"),
        _ => PathBuf::from(format!("/tmp/ringfeed-{uid}")),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of user {uid} that only it may write",
            dir.display()
        ));
    }
    Ok(dir)
}

impl ClaimsDir {
    /// The per-user directory, created (mode 0700) if missing.
    pub fn for_user() -> Result<ClaimsDir, String> {
        ClaimsDir::at(&user_dir()?.join("cpus"))
    }

    /// The directory `path`, created (mode 0700) if missing.
    pub fn at(path: &Path) -> Result<ClaimsDir, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let probe = ClaimsDir {
            path: path.to_path_buf(),
        };
        // Writable: a claim file can be made (CPU 0's always exists).
        probe
            .open(0)
            .map_err(|e| format!("cannot write in {}: {e}", path.display()))?;
        Ok(probe)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&self, cpu: usize) -> std::io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path.join(format!("cpu{cpu}")))
    }

    /// `cpu`'s claim file, locked; `None` when another holder has it (or
    /// the file cannot be opened: then the CPU counts as claimed, which
    /// only moves this engine elsewhere).
    fn try_lock(&self, cpu: usize) -> Option<File> {
        let file = self.open(cpu).ok()?;
        // SAFETY: a valid descriptor owned by `file`; flock changes no memory.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        (rc == 0).then_some(file)
    }

    /// Which of `cpus` another holder claims now.
    pub fn claimed(&self, cpus: &[usize]) -> Vec<usize> {
        // A lock taken here is dropped at once: only probing.
        cpus.iter()
            .copied()
            .filter(|&c| self.try_lock(c).is_none())
            .collect()
    }

    /// Places `req` away from the CPUs others claim and claims the chosen
    /// ones. CPUs chosen although claimed (every usable CPU was) are used
    /// without a claim.
    pub fn place(&self, topo: &Topology, req: &PlacementRequest) -> (Placement, Claims) {
        let probe: Vec<usize> = match req.cpus {
            Some(list) => list.to_vec(),
            None => req.allowed.to_vec(),
        };
        let mut claimed = self.claimed(&probe);
        claimed.extend_from_slice(req.claimed);
        let mut claims = Claims::default();
        let mut placement = worker_cpus(topo, req);
        for _ in 0..PLACE_ATTEMPTS {
            placement = worker_cpus(
                topo,
                &PlacementRequest {
                    claimed: &claimed,
                    ..*req
                },
            );
            let Some(cpus) = &placement.cpus else {
                return (placement, claims);
            };
            let mut lost = Vec::new();
            for &cpu in cpus.iter().filter(|c| !claimed.contains(c)) {
                match self.try_lock(cpu) {
                    Some(f) => claims.held.push((cpu, f)),
                    None => lost.push(cpu),
                }
            }
            if lost.is_empty() {
                return (placement, claims);
            }
            // Another engine claimed one between the probe and now.
            claims.release();
            claimed.extend(lost);
        }
        (placement, claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaNode;

    fn four_cpus() -> Topology {
        Topology {
            nodes: vec![NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3],
            }],
            affinity: vec![0, 1, 2, 3],
            ..Topology::default()
        }
    }

    #[test]
    fn engines_in_turn_take_different_cpus_and_give_them_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ClaimsDir::at(&tmp.path().join("ringfeed/cpus")).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let topo = four_cpus();
        let allowed = topo.allowed();
        let req = PlacementRequest {
            threads: 2,
            allowed: &allowed,
            ..PlacementRequest::default()
        };
        let (a, claims_a) = dir.place(&topo, &req);
        assert_eq!(a.cpus, Some(vec![0, 1]));
        assert_eq!(claims_a.cpus(), vec![0, 1]);
        let (b, claims_b) = dir.place(&topo, &req);
        assert_eq!(b.cpus, Some(vec![2, 3]));
        assert_eq!(dir.claimed(&allowed), vec![0, 1, 2, 3]);
        // All claimed: a third engine still gets distinct CPUs, unclaimed.
        let (c, claims_c) = dir.place(&topo, &req);
        assert_eq!(c.cpus, Some(vec![0, 1]));
        assert!(claims_c.cpus().is_empty());
        drop(claims_a);
        assert_eq!(dir.claimed(&allowed), vec![2, 3]);
        drop(claims_b);
        assert!(dir.claimed(&allowed).is_empty());
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain-file");
        std::fs::write(&file, b"").unwrap();
        assert!(ClaimsDir::at(&file.join("cpus")).is_err());
    }
}
