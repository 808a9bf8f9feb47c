//! Who closed a file written through the mount, as far as the mount can
//! tell: the pid of the kernel's request looked up in `/proc`.
//!
//! The kernel numbers a FUSE request's `pid` in the pid namespace of
//! the process that mounted (`fuse_req`'s `in.h.pid` is
//! `pid_nr_ns(task_pid(current), fc->pid_ns)`): the calling *thread's*
//! id there, or 0 when the caller is not visible from it — a writer in
//! another pod on Kubernetes, where the mount runs in a driver's pod. A
//! `close` (FUSE's flush) and a writer's death look alike on the wire
//! (the kernel closes a dying process's files for it); only the closing
//! thread itself tells them apart: `PF_EXITING` in its flags and a
//! signal in its exit code (`/proc/<tid>/stat`, fields 9 and 52). While
//! the mount answers a flush, the closing thread waits for the answer
//! (the request is sent with `force`, waited for uninterruptibly), so
//! its pid names it and no other: nothing can have reused it.
//!
//! A close is [`Closer::Seen`] only when all of this holds; any other is
//! [`Closer::Unseen`], with why ([`Unseen`]):
//!
//! - the pid is not 0;
//! - the mount's `/proc` is of its own pid namespace (checked once, by
//!   [`Proc::probe`]: `/proc/self/status` has one `NSpid`), so a pid the
//!   kernel gives names the same task there; a daemon started in a pid
//!   namespace of its own without a `/proc` of it would otherwise read
//!   another process's entry;
//! - `/proc/<pid>/stat` can be read (`hidepid=1`/`2` hides other users'
//!   processes from a mount without `CAP_SYS_PTRACE` over them);
//! - for a thread that is exiting, its exit code can be seen: the kernel
//!   shows 0 to a reader that may not ptrace-read the task, which would
//!   make a killed writer look like one that called `exit(0)`. The
//!   permission is the one `/proc/<pid>/ns/pid`'s link asks
//!   (`PTRACE_MODE_READ_FSCREDS`, the same check as the exit code's).

use std::path::{Path, PathBuf};

/// `PF_EXITING`, the flag the kernel sets as a task begins to exit
/// (the kernel's linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// The mount's `/proc`, and whether the pids of the kernel's requests
/// name tasks in it.
#[derive(Debug, Clone)]
pub struct Proc {
    root: PathBuf,
    /// Why this `/proc` cannot name the requests' tasks, if it cannot.
    foreign: Option<String>,
}

/// How the closing thread stood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Not exiting: a close on purpose (`close`, `dup2` over it, an
    /// `exec` closing it).
    Running,
    /// Exiting with this status (`exit(status)`), not by a signal.
    Exited(i32),
    /// Exiting because this signal killed it.
    Killed(i32),
}

/// Why a close cannot be told from a kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unseen {
    /// The kernel gave pid 0: the caller is in a pid namespace the
    /// mount's cannot see (another pod's, another container's).
    PidZero,
    /// The mount's `/proc` is not of its own pid namespace.
    ForeignProc(String),
    /// `/proc/<pid>` could not be read (`hidepid`, permissions).
    Unreadable { pid: u32, error: String },
    /// The thread is exiting and its exit code is hidden from the mount
    /// (no ptrace-read permission over it): killed or not is unknown.
    ExitHidden { pid: u32 },
}

impl std::fmt::Display for Unseen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unseen::PidZero => write!(
                f,
                "the kernel gave pid 0: the closing process is in a pid namespace this mount \
                 cannot see (another pod or container)"
            ),
            Unseen::ForeignProc(why) => write!(f, "the mount's /proc {why}"),
            Unseen::Unreadable { pid, error } => write!(
                f,
                "/proc/{pid} cannot be read by this mount ({error}; /proc mounted with hidepid?)"
            ),
            Unseen::ExitHidden { pid } => write!(
                f,
                "process {pid} is exiting and its exit code is hidden from this mount (it may \
                 not ptrace-read it), so a kill cannot be told from an exit"
            ),
        }
    }
}

/// Who closed: a thread the mount sees, and how it stood, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closer {
    Seen(End),
    Unseen(Unseen),
}

impl Proc {
    /// The `/proc` at `root` (`/proc` but in tests), checked once: its
    /// entry for this process must show a single `NSpid` (the pid
    /// namespace of the procfs is this process's own). Before Linux 4.1
    /// there is no `NSpid`: then `self` must name this process's pid.
    pub fn probe(root: &Path) -> Proc {
        let foreign = match std::fs::read_to_string(root.join("self/status")) {
            Err(e) => Some(format!("cannot be read ({e})")),
            Ok(status) => match nspid_levels(&status) {
                Some(1) => None,
                Some(n) => Some(format!(
                    "is of a pid namespace other than the mount's own (NSpid has {n} levels), so \
                     the pids the kernel gives name other processes in it"
                )),
                None => match std::fs::read_link(root.join("self")) {
                    Ok(p) if p.to_str() == Some(&std::process::id().to_string()) => None,
                    Ok(p) => Some(format!(
                        "is of a pid namespace other than the mount's own (self is {} while \
                         the mount is pid {})",
                        p.display(),
                        std::process::id()
                    )),
                    Err(e) => Some(format!("has no self link ({e})")),
                },
            },
        };
        Proc {
            root: root.to_path_buf(),
            foreign,
        }
    }

    /// Why no request's pid can be looked up here, if so (said once when
    /// the mount starts).
    pub fn foreign(&self) -> Option<&str> {
        self.foreign.as_deref()
    }

    /// Who thread `pid` of a request is, as this `/proc` shows it; called
    /// while the thread waits for the answer.
    pub fn closer(&self, pid: u32) -> Closer {
        if pid == 0 {
            return Closer::Unseen(Unseen::PidZero);
        }
        if let Some(why) = &self.foreign {
            return Closer::Unseen(Unseen::ForeignProc(why.clone()));
        }
        let dir = self.root.join(pid.to_string());
        let stat = match read_bounded(&dir.join("stat"), STAT_WAIT) {
            Ok(s) => s,
            Err(e) => {
                return Closer::Unseen(Unseen::Unreadable {
                    pid,
                    error: e.to_string(),
                });
            }
        };
        let Some(stat) = Stat::parse(&stat) else {
            return Closer::Unseen(Unseen::Unreadable {
                pid,
                error: "its stat does not parse".into(),
            });
        };
        if stat.flags & PF_EXITING == 0 {
            return Closer::Seen(End::Running);
        }
        // Exiting: its exit code is the kernel's only word on why, and it
        // reads as 0 where the mount may not ptrace-read the thread.
        if std::fs::read_link(dir.join("ns/pid")).is_err() {
            return Closer::Unseen(Unseen::ExitHidden { pid });
        }
        Closer::Seen(stat.end())
    }
}

/// How long a close's `/proc/<pid>/stat` may take to read. It takes
/// microseconds, except for a thread in `execve`: the kernel closes its
/// close-on-exec files (a flush to this mount, answered before the exec
/// goes on) while holding the exec lock that reading its `stat` waits for,
/// so the read would wait for the answer it is part of, for ever.
const STAT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// `path`'s text, read on a thread of its own and given up after `wait`
/// (the thread then ends when the read does).
fn read_bounded(path: &Path, wait: std::time::Duration) -> std::io::Result<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("rf-mount-proc".into())
        .spawn(move || {
            let _ = tx.send(std::fs::read_to_string(path));
        })?;
    rx.recv_timeout(wait).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "reading it took over {} ms: the process is in execve, closing this file as \
                 close-on-exec while it holds the lock that reading its stat waits for",
                wait.as_millis()
            ),
        ))
    })
}

/// What a `/proc/<pid>/stat` tells of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The task's flags (field 9).
    pub flags: u64,
    /// Its exit code as `wait` encodes it (field 52).
    pub exit_code: i64,
}

impl Stat {
    /// Parses the text of a `/proc/<pid>/stat`; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Stat> {
        // Fields after the command name, which may hold spaces and `)`.
        let rest = &text[text.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (the state).
        let field = |n: usize| f.get(n - 3).copied();
        Some(Stat {
            flags: field(9)?.parse().ok()?,
            exit_code: field(52)?.parse().ok()?,
        })
    }

    /// How the thread ends, exiting or not.
    pub fn end(&self) -> End {
        if self.flags & PF_EXITING == 0 {
            End::Running
        } else if self.exit_code & 0x7f != 0 {
            End::Killed((self.exit_code & 0x7f) as i32)
        } else {
            End::Exited(((self.exit_code >> 8) & 0xff) as i32)
        }
    }
}

/// The number of pid namespace levels a `/proc/<pid>/status` shows its
/// task in, from the procfs's own namespace down (`NSpid`); `None` where
/// the kernel does not say (before 4.1).
pub fn nspid_levels(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| v.split_whitespace().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_text(flags: u64, code: i64) -> String {
        let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
        f[0] = "R".into();
        f[9 - 3] = flags.to_string();
        f[52 - 3] = code.to_string();
        format!("1234 (py) th)read) {}", f.join(" "))
    }

    #[test]
    fn a_thread_exiting_on_a_signal_is_killed_and_others_are_not() {
        let end = |flags, code| Stat::parse(&stat_text(flags, code)).unwrap().end();
        assert_eq!(end(0x4 | 0x40, 9), End::Killed(9));
        assert_eq!(end(0x4, 15), End::Killed(15));
        // A core dump sets 0x80 beside the signal.
        assert_eq!(end(0x4, 0x80 | 11), End::Killed(11));
        // Exiting normally (exit(0), exit(1)): the code is status << 8.
        assert_eq!(end(0x4, 0), End::Exited(0));
        assert_eq!(end(0x4, 1 << 8), End::Exited(1));
        // Alive (a plain close), whatever the code field says.
        assert_eq!(end(0x40, 0), End::Running);
        assert_eq!(end(0x40, 9), End::Running);
        for bad in [
            "",
            "1 (x",
            "1 (x) R 2",
            "garbage )",
            &stat_text(0, 0).replace(" 0", " x"),
        ] {
            assert_eq!(Stat::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn nspid_counts_the_levels_and_is_absent_on_old_kernels() {
        assert_eq!(nspid_levels("Name:\tx\nNSpid:\t42\n"), Some(1));
        assert_eq!(nspid_levels("NSpid:\t30645\t1\n"), Some(2));
        assert_eq!(nspid_levels("Name:\tx\nPid:\t42\n"), None);
    }

    /// A fake `/proc` in a temporary directory: `self/status` with
    /// `nspid`, and for each `(pid, stat, hidden)` its `stat` (and its
    /// `ns/pid` link unless the exit code is to be hidden).
    fn fake_proc(nspid: &str, tasks: &[(u32, String, bool)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("self")).unwrap();
        std::fs::write(
            root.path().join("self/status"),
            format!("Name:\tringfeed\nNSpid:\t{nspid}\n"),
        )
        .unwrap();
        for (pid, stat, hidden) in tasks {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(dir.join("ns")).unwrap();
            std::fs::write(dir.join("stat"), stat).unwrap();
            if !hidden {
                std::os::unix::fs::symlink("pid:[4026531836]", dir.join("ns/pid")).unwrap();
            }
        }
        root
    }

    #[test]
    fn a_close_is_seen_only_with_a_pid_a_proc_of_its_own_and_a_readable_exit() {
        let tasks = [
            (10, stat_text(0x40, 0), false),
            (11, stat_text(0x4, 9), false),
            (12, stat_text(0x4, 9), true),
            (13, stat_text(0x4, 0), false),
            (14, stat_text(0x40, 0), true),
            (15, "not a stat".to_string(), false),
        ];
        let root = fake_proc("77", &tasks);
        let p = Proc::probe(root.path());
        assert_eq!(p.foreign(), None);
        assert_eq!(p.closer(10), Closer::Seen(End::Running));
        assert_eq!(p.closer(11), Closer::Seen(End::Killed(9)));
        // Killed, but the mount may not read its exit code: unknown.
        assert_eq!(p.closer(12), Closer::Unseen(Unseen::ExitHidden { pid: 12 }));
        assert_eq!(p.closer(13), Closer::Seen(End::Exited(0)));
        // Not exiting: a close on purpose, exit code or not.
        assert_eq!(p.closer(14), Closer::Seen(End::Running));
        assert!(matches!(
            p.closer(15),
            Closer::Unseen(Unseen::Unreadable { pid: 15, .. })
        ));
        assert_eq!(p.closer(0), Closer::Unseen(Unseen::PidZero));
        // Not there (hidepid hides it, or no such task).
        assert!(matches!(
            p.closer(99),
            Closer::Unseen(Unseen::Unreadable { pid: 99, .. })
        ));
        // The same /proc of an ancestor namespace names other tasks: no
        // pid is looked up in it.
        let root = fake_proc("30645\t1", &tasks);
        let p = Proc::probe(root.path());
        assert!(
            p.foreign()
                .unwrap()
                .contains("a pid namespace other than the mount's own"),
            "{p:?}"
        );
        assert!(matches!(
            p.closer(10),
            Closer::Unseen(Unseen::ForeignProc(_))
        ));
        // A /proc that cannot be read at all.
        let p = Proc::probe(Path::new("/nonexistent/proc"));
        assert!(matches!(
            p.closer(10),
            Closer::Unseen(Unseen::ForeignProc(_))
        ));
    }

    /// Found by a CI run that hung: a test's child closed (close-on-exec,
    /// in `execve`) a file it had inherited from a writer, and the mount's
    /// read of the child's `stat` waited for the exec lock the child held
    /// while it waited for the mount's answer. A FIFO with no writer stands
    /// for that `stat` here: reading it blocks. Control: with the read not
    /// bounded (`std::fs::read_to_string`) this test never ends.
    #[test]
    fn a_stat_whose_read_blocks_is_given_up_not_waited_for() {
        let root = fake_proc("77", &[(10, stat_text(0x40, 0), false)]);
        let dir = root.path().join("20");
        std::fs::create_dir(&dir).unwrap();
        let fifo = std::ffi::CString::new(dir.join("stat").to_str().unwrap()).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path that lives across the call.
        let made = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        let p = Proc::probe(root.path());
        match p.closer(20) {
            Closer::Unseen(Unseen::Unreadable { pid: 20, error }) => {
                assert!(error.contains("execve"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        // What reads at once is still read.
        assert_eq!(p.closer(10), Closer::Seen(End::Running));
        // Unblock the reader left behind, so its thread ends.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("stat"));
    }

    #[test]
    fn this_thread_is_seen_running_in_the_real_proc() {
        // The tests run with a /proc of their own pid namespace.
        let p = Proc::probe(Path::new("/proc"));
        assert_eq!(p.foreign(), None);
        // SAFETY: plain getter.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(p.closer(tid), Closer::Seen(End::Running));
    }
}
