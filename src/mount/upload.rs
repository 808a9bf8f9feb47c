//! New files written through the mount: one object each, written as it
//! comes (`crate::object::Writer`: a multipart upload with parts in
//! flight, or a local temporary file) and made visible only when the
//! writer closes it whole.
//!
//! - Writes must come in order (each at the end of the last); any other
//!   is refused (`EINVAL`), as an object cannot be written in place.
//! - A `close` (FUSE's flush) by the process that opened the file, once
//!   it has written, or an `fsync`, completes the upload and answers its
//!   error, if any, to the writer; later writes are refused (`EBADF`),
//!   later closes answer the same outcome. A close by another process (a
//!   forked child exiting with the descriptor it inherited) or before the
//!   first write (a shell's `>`: the file is opened, its descriptor
//!   duplicated onto stdout and the original closed) completes nothing;
//!   the last reference's release completes what is left.
//! - A writer killed by a signal still closes its files (the kernel does,
//!   as the process exits), but its file is half-done: the flush that
//!   comes from a process exiting on a signal aborts the upload instead,
//!   so no object and no open multipart upload is left. The kernel tells
//!   by the calling thread's `/proc/<tid>/stat`: the exiting flag in its
//!   flags and the signal in its exit code ([`killed`]).

use crate::error::Error;
use crate::object::Writer;

/// Where an upload stands.
pub enum Upload {
    /// Taking writes: the bytes so far and the writer.
    Open { writer: Box<Writer>, written: u64 },
    /// Completed (`Ok`, with its size) or failed for good (the message
    /// every later close answers).
    Done(Result<u64, String>),
}

/// Why a write is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not at the end of what was written.
    OutOfOrder { at: u64, end: u64 },
    /// After the upload was completed or failed.
    Closed,
    /// The upload failed at this write.
    Failed(String),
    /// The upload failed before (every later write answers its error).
    Broken(String),
}

impl Upload {
    pub fn new(writer: Writer) -> Upload {
        Upload::Open {
            writer: Box::new(writer),
            written: 0,
        }
    }

    /// Writes `data` at `off`.
    pub fn write(&mut self, off: u64, data: &[u8]) -> Result<(), Refused> {
        let (writer, written) = match self {
            Upload::Open { writer, written } => (writer, written),
            Upload::Done(Err(why)) => return Err(Refused::Broken(why.clone())),
            Upload::Done(Ok(_)) => return Err(Refused::Closed),
        };
        if off != *written {
            return Err(Refused::OutOfOrder {
                at: off,
                end: *written,
            });
        }
        if let Err(e) = writer.write(data) {
            let msg = e.to_string();
            let _ = writer.abort();
            *self = Upload::Done(Err(msg.clone()));
            return Err(Refused::Failed(msg));
        }
        *written += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far (or the completed object's size).
    pub fn size(&self) -> u64 {
        match self {
            Upload::Open { written, .. } => *written,
            Upload::Done(Ok(n)) => *n,
            Upload::Done(Err(_)) => 0,
        }
    }

    /// Whether the upload still takes writes.
    pub fn is_open(&self) -> bool {
        matches!(self, Upload::Open { .. })
    }

    /// Completes the upload (once): its size, or why it failed.
    pub fn complete(&mut self) -> Result<u64, String> {
        if let Upload::Open { writer, written } = self {
            let r = writer.finish().map(|()| *written).map_err(|e| {
                let _ = writer.abort();
                e.to_string()
            });
            *self = Upload::Done(r);
        }
        match self {
            Upload::Done(r) => r.clone(),
            Upload::Open { .. } => unreachable!("completed above"),
        }
    }

    /// Aborts an upload not completed yet: no object, no open upload.
    /// True when there was one to abort.
    pub fn abort(&mut self, why: &str) -> Result<bool, Error> {
        let Upload::Open { writer, .. } = self else {
            return Ok(false);
        };
        let r = writer.abort();
        *self = Upload::Done(Err(why.to_string()));
        r.map(|()| true)
    }
}

/// Whether thread `tid` is exiting because a signal killed it: what a
/// flush from a writer that was killed mid-file looks like.
pub fn killed(tid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{tid}/stat")) {
        Ok(stat) => killed_by_stat(&stat),
        // Gone already: it cannot have closed its file on purpose now.
        Err(_) => false,
    }
}

/// The process (thread group) of thread `tid`, from `/proc/<tid>/status`.
pub fn tgid(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `PF_EXITING`, the flag the kernel sets as a task begins to exit.
const PF_EXITING: u64 = 0x4;

/// [`killed`] on the text of a `/proc/<tid>/stat`: the flags (field 9)
/// hold `PF_EXITING` and the exit code (field 52) is a signal's.
pub fn killed_by_stat(stat: &str) -> bool {
    // Fields after the command name, which may hold spaces and `)`.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let (Some(flags), Some(code)) = (field(9), field(52)) else {
        return false;
    };
    flags & PF_EXITING != 0 && code & 0x7f != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(flags: u64, code: u64) -> String {
        let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
        f[0] = "R".into();
        f[9 - 3] = flags.to_string();
        f[52 - 3] = code.to_string();
        format!("1234 (py) th)read) {}", f.join(" "))
    }

    #[test]
    fn a_thread_exiting_on_a_signal_is_killed_and_others_are_not() {
        assert!(killed_by_stat(&stat(0x4 | 0x40, 9)));
        assert!(killed_by_stat(&stat(0x4, 15)));
        // Exiting normally (exit(0), exit(1)): the code is status << 8.
        assert!(!killed_by_stat(&stat(0x4, 0)));
        assert!(!killed_by_stat(&stat(0x4, 1 << 8)));
        // Alive (a plain close).
        assert!(!killed_by_stat(&stat(0x40, 0)));
        for bad in ["", "1 (x", "1 (x) R 2", "garbage )"] {
            assert!(!killed_by_stat(bad), "{bad}");
        }
    }

    fn writer(path: &std::path::Path) -> Writer {
        let cfg = crate::config::Config::for_objects("{}").unwrap();
        Writer::open(path.to_str().unwrap(), &cfg, None).unwrap()
    }

    #[test]
    fn writes_in_order_complete_once_and_nothing_after() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("obj");
        let mut u = Upload::new(writer(&p));
        u.write(0, b"abc").unwrap();
        assert_eq!(u.write(1, b"x"), Err(Refused::OutOfOrder { at: 1, end: 3 }));
        assert_eq!(u.write(9, b"x"), Err(Refused::OutOfOrder { at: 9, end: 3 }));
        u.write(3, b"def").unwrap();
        assert!(!p.exists(), "visible only once complete");
        assert_eq!(u.complete(), Ok(6));
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
        assert_eq!(u.complete(), Ok(6), "a second close answers the same");
        assert_eq!(u.write(6, b"g"), Err(Refused::Closed));
        assert!(!u.abort("late").unwrap(), "nothing left to abort");
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
    }

    #[test]
    fn an_aborted_upload_leaves_nothing_and_answers_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("obj");
        let mut u = Upload::new(writer(&p));
        u.write(0, &[7u8; 10000]).unwrap();
        assert!(u.abort("killed").unwrap());
        assert_eq!(u.complete(), Err("killed".to_string()));
        assert_eq!(u.write(10000, b"x"), Err(Refused::Broken("killed".into())));
        assert!(!p.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temporary left"
        );
    }

    #[test]
    fn this_thread_is_not_killed_and_belongs_to_this_process() {
        // SAFETY: plain getter.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(!killed(tid));
        assert_eq!(tgid(tid), Some(std::process::id()));
        assert_eq!(tgid(u32::MAX), None);
    }
}
