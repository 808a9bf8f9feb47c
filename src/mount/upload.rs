//! New files written through the mount: one object each, written as it
//! comes (`crate::object::ObjectWriter`: a multipart upload with parts in
//! flight, or a local temporary file) and made visible only when the
//! writer is known to have finished it.
//!
//! - Writes must come in order (each at the end of the last); any other
//!   is refused (`EINVAL`), as an object cannot be written in place.
//! - `fsync` (or `fdatasync`), by any process, completes the upload: the
//!   bytes written so far are the object, later writes are refused
//!   (`EBADF`), later closes answer the same outcome.
//! - A close (FUSE's flush) is told apart from a kill only by looking at
//!   the closing thread (`super::closer`); [`Closes`] decides what each
//!   close does. The writer is the descriptor tables (processes, each
//!   with its threads) whose bytes the file holds: the kernel gives each
//!   direct-I/O write and each flush the same lock owner for one table.
//!   A close by a table that wrote nothing, once bytes are in, is another
//!   process's copy (a forked child's, one closed at an `exec`) and does
//!   nothing. A close by the writer completes the upload when the mount
//!   sees a close (the thread is not exiting, or exits by `exit`), and
//!   aborts it when the thread is dying of a signal or cannot be seen
//!   (pid 0 from another pid namespace, a `/proc` that hides it): a
//!   half-written file never becomes a whole object.
//! - Before the first write, any close may be the writer's: one dying of
//!   a signal aborts; one seen to be a close does nothing (a shell's `>`
//!   duplicates the descriptor and closes the original before writing),
//!   and the last release completes the empty file; one that cannot be
//!   seen answers `EIO` (`touch` fails) but aborts nothing yet, since
//!   the process may write on through a duplicate and `fsync` (`dd
//!   of=F` does), and the last release aborts what is still empty.

use super::closer::{Closer, End, Unseen};
use crate::error::Error;
use crate::object::ObjectWriter;

/// Where an upload stands.
pub enum MountUpload {
    /// Taking writes: the bytes so far and the writer.
    Open {
        writer: Box<ObjectWriter>,
        written: u64,
    },
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

impl MountUpload {
    pub fn new(writer: ObjectWriter) -> MountUpload {
        MountUpload::Open {
            writer: Box::new(writer),
            written: 0,
        }
    }

    /// Writes `data` at `off`.
    pub fn write(&mut self, off: u64, data: &[u8]) -> Result<(), Refused> {
        let (writer, written) = match self {
            MountUpload::Open { writer, written } => (writer, written),
            MountUpload::Done(Err(why)) => return Err(Refused::Broken(why.clone())),
            MountUpload::Done(Ok(_)) => return Err(Refused::Closed),
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
            *self = MountUpload::Done(Err(msg.clone()));
            return Err(Refused::Failed(msg));
        }
        *written += data.len() as u64;
        Ok(())
    }

    /// Bytes written so far (or the completed object's size).
    pub fn size(&self) -> u64 {
        match self {
            MountUpload::Open { written, .. } => *written,
            MountUpload::Done(Ok(n)) => *n,
            MountUpload::Done(Err(_)) => 0,
        }
    }

    /// Whether the upload still takes writes.
    pub fn is_open(&self) -> bool {
        matches!(self, MountUpload::Open { .. })
    }

    /// Completes the upload (once): its size, or why it failed.
    pub fn complete(&mut self) -> Result<u64, String> {
        if let MountUpload::Open { writer, written } = self {
            let r = writer.finish().map(|()| *written).map_err(|e| {
                let _ = writer.abort();
                e.to_string()
            });
            *self = MountUpload::Done(r);
        }
        match self {
            MountUpload::Done(r) => r.clone(),
            MountUpload::Open { .. } => unreachable!("completed above"),
        }
    }

    /// Aborts an upload not completed yet: no object, no open upload.
    /// True when there was one to abort.
    pub fn abort(&mut self, why: &str) -> Result<bool, Error> {
        let MountUpload::Open { writer, .. } = self else {
            return Ok(false);
        };
        let r = writer.abort();
        *self = MountUpload::Done(Err(why.to_string()));
        r.map(|()| true)
    }
}

/// Who wrote a file and what its closes told: what each close and the
/// last release do to an upload still open. Pure.
#[derive(Debug, Default)]
pub struct Closes {
    /// The descriptor tables (the kernel's lock owners) that wrote.
    writers: Vec<u64>,
    /// A write came without its table (the kernel names it for direct
    /// I/O writes only): any close may then be the writer's.
    anonymous: bool,
    /// A close the mount saw to be a close, not a death, came.
    seen: bool,
    /// A close before any write came from where the mount cannot see.
    unseen: Option<Unseen>,
}

/// What a close does to an upload still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: another process's copy, or a close before any write.
    Leave,
    /// Nothing yet, but this close does not make a file (`EIO` to it): a
    /// close before any write that cannot be told from a death. The same
    /// process may go on writing through a duplicate and `fsync` (`dd`
    /// opens its output, moves it onto stdout and closes the original).
    Unsure(Unseen),
    /// The writer closed it: the object is complete.
    Complete,
    /// No object: why.
    Abort(Abort),
}

/// Why an upload is aborted at a close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The closing thread is dying of this signal.
    Killed(i32),
    /// The close cannot be told from a kill.
    Unseen(Unseen),
    /// The last descriptor went with no close seen to be one and nothing
    /// completing it.
    NoClose,
}

impl Closes {
    /// Table `owner` (`None`: not named) wrote bytes in.
    pub fn wrote(&mut self, owner: Option<u64>) {
        match owner {
            Some(o) if !self.writers.contains(&o) => self.writers.push(o),
            Some(_) => {}
            None => self.anonymous = true,
        }
    }

    /// A descriptor closed by table `owner`, by `closer`, with `written`
    /// bytes in so far.
    pub fn close(&mut self, owner: u64, closer: &Closer, written: u64) -> Verdict {
        let writer = self.anonymous || self.writers.contains(&owner);
        if !writer && written > 0 {
            return Verdict::Leave;
        }
        match closer {
            Closer::Unseen(why) if written == 0 => {
                self.unseen = Some(why.clone());
                Verdict::Unsure(why.clone())
            }
            Closer::Unseen(why) => Verdict::Abort(Abort::Unseen(why.clone())),
            Closer::Seen(End::Killed(signal)) => Verdict::Abort(Abort::Killed(*signal)),
            Closer::Seen(End::Running | End::Exited(_)) => {
                self.seen = true;
                if written == 0 {
                    Verdict::Leave
                } else {
                    Verdict::Complete
                }
            }
        }
    }

    /// The last reference went, the upload still open with `written`
    /// bytes: an empty file whose closes were all seen to be closes is
    /// complete; one closed from where the mount cannot see is not, nor
    /// anything else (bytes no writer's close decided on).
    pub fn release(&self, written: u64) -> Verdict {
        match (&self.unseen, written) {
            (Some(why), 0) => Verdict::Abort(Abort::Unseen(why.clone())),
            (None, 0) if self.seen => Verdict::Complete,
            _ => Verdict::Abort(Abort::NoClose),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(path: &std::path::Path) -> ObjectWriter {
        let cfg = crate::config::Config::for_objects("{}").unwrap();
        ObjectWriter::open(path.to_str().unwrap(), &cfg, None).unwrap()
    }

    #[test]
    fn writes_in_order_complete_once_and_nothing_after() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("obj");
        let mut u = MountUpload::new(writer(&p));
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
        let mut u = MountUpload::new(writer(&p));
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

    const A: u64 = 0xa;
    const B: u64 = 0xb;

    fn seen(end: End) -> Closer {
        Closer::Seen(end)
    }

    #[test]
    fn the_writers_close_completes_and_other_tables_closes_do_nothing() {
        let mut c = Closes::default();
        c.wrote(Some(A));
        // A forked child (table B) closing its copy, alive or killed, or
        // from where the mount cannot see it.
        assert_eq!(c.close(B, &seen(End::Running), 10), Verdict::Leave);
        assert_eq!(c.close(B, &seen(End::Killed(9)), 10), Verdict::Leave);
        assert_eq!(
            c.close(B, &Closer::Unseen(Unseen::PidZero), 10),
            Verdict::Leave
        );
        // The writer: a close, an exit, a kill, an unseen close.
        assert_eq!(c.close(A, &seen(End::Running), 10), Verdict::Complete);
        assert_eq!(c.close(A, &seen(End::Exited(0)), 10), Verdict::Complete);
        assert_eq!(c.close(A, &seen(End::Exited(3)), 10), Verdict::Complete);
        assert_eq!(
            c.close(A, &seen(End::Killed(9)), 10),
            Verdict::Abort(Abort::Killed(9))
        );
        for why in [
            Unseen::PidZero,
            Unseen::ExitHidden { pid: 7 },
            Unseen::Unreadable {
                pid: 7,
                error: "No such file or directory".into(),
            },
            Unseen::ForeignProc("is of another pid namespace".into()),
        ] {
            assert_eq!(
                c.close(A, &Closer::Unseen(why.clone()), 10),
                Verdict::Abort(Abort::Unseen(why))
            );
        }
        // A child that also wrote is a writer too.
        c.wrote(Some(B));
        assert_eq!(
            c.close(B, &seen(End::Killed(15)), 20),
            Verdict::Abort(Abort::Killed(15))
        );
    }

    #[test]
    fn before_the_first_write_a_seen_close_waits_and_a_kill_aborts() {
        let mut c = Closes::default();
        // A shell's `>`: the original descriptor closed before writing.
        assert_eq!(c.close(A, &seen(End::Running), 0), Verdict::Leave);
        assert_eq!(c.close(B, &seen(End::Exited(0)), 0), Verdict::Leave);
        // The empty file is complete at the release after a seen close...
        assert_eq!(c.release(0), Verdict::Complete);
        // ...but not without one, nor with bytes no close decided on.
        assert_eq!(Closes::default().release(0), Verdict::Abort(Abort::NoClose));
        assert_eq!(c.release(5), Verdict::Abort(Abort::NoClose));
        // Killed before writing: it may have been the writer.
        assert_eq!(
            c.close(B, &seen(End::Killed(9)), 0),
            Verdict::Abort(Abort::Killed(9))
        );
    }

    #[test]
    fn before_the_first_write_an_unseen_close_is_unsure_and_the_release_aborts() {
        let mut c = Closes::default();
        // `dd of=F`, `touch F` from another pid namespace: EIO to the
        // close, nothing aborted yet (dd goes on writing through stdout).
        assert_eq!(
            c.close(A, &Closer::Unseen(Unseen::PidZero), 0),
            Verdict::Unsure(Unseen::PidZero)
        );
        // A seen close after does not make the empty file whole.
        assert_eq!(c.close(B, &seen(End::Running), 0), Verdict::Leave);
        assert_eq!(c.release(0), Verdict::Abort(Abort::Unseen(Unseen::PidZero)));
        // dd's writes through its duplicate, then its close, decide as
        // any writer's (its fsync, before, would have completed it).
        c.wrote(Some(A));
        assert_eq!(
            c.close(A, &Closer::Unseen(Unseen::PidZero), 8),
            Verdict::Abort(Abort::Unseen(Unseen::PidZero))
        );
    }

    #[test]
    fn writes_without_a_table_make_every_close_the_writers() {
        let mut c = Closes::default();
        c.wrote(None);
        assert_eq!(c.close(B, &seen(End::Running), 4), Verdict::Complete);
        assert_eq!(
            c.close(B, &Closer::Unseen(Unseen::PidZero), 4),
            Verdict::Abort(Abort::Unseen(Unseen::PidZero))
        );
    }
}
