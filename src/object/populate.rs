//! Faulting a read's destination in ahead of its parts: a thread beside
//! the reads asks the kernel for the pages of the parts not yet handed to
//! a reader (`MADV_POPULATE_WRITE`, [`populate_write`]), so the receives
//! copy into pages already mapped instead of taking a page fault every
//! 4 KiB on the reading thread.
//!
//! Why: a fresh mapping costs the kernel a fault, a zeroed page and its
//! accounting per 4 KiB, and the reading thread paid all of it inside its
//! receives. Profiled on the dev machine (`perf record` of `ringfeed get`,
//! 1 GiB over loopback): the faults, zeroing and page accounting were
//! about 60% of the process's time, the copy out of the sockets 14%. The
//! kernel does the same work for a populated range without a trap per
//! page (0.46 to 0.52 s per GiB against 0.62 to 0.81 s touching each
//! page), and on a second core it runs beside the receives instead of
//! between them. Transparent huge pages would need 512 times fewer
//! faults, but are not asked for (see `read.rs`: compaction on the
//! reading thread).
//!
//! The populator never holds the read up: it works on parts the readers
//! have not taken, skips to the first untaken one when they overtake it
//! (a reader's receive faults its own pages, as without it), and stops
//! when the read does. A refusal (a kernel before 5.14, memory of a
//! device) stops it and is a note in the read's report: the pages then
//! fault in as the parts arrive, and the bytes are the same.
//!
//! For a caller's buffer (`read_into`) the same is done over the buffer's
//! whole pages that the object will fill, and no page past the object:
//! pages the caller already faulted in cost the kernel a look only.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::memory::{page_size, populate_write};

/// Bytes asked of the kernel per call: between two calls the populator
/// checks whether the readers took its part (then it moves on) or the
/// read stopped. 2 MiB is about a millisecond of populating at the
/// 2 GB/s measured, one page-table page's worth of 4 KiB pages.
const SLICE: usize = 2 << 20;

/// The populator's shared state: what the readers have taken, and what it
/// did.
pub(super) struct Populate<'a> {
    dst: *mut u8,
    /// The destination's bytes the object fills (`size`).
    len: usize,
    parts: &'a [(u64, usize)],
    /// Parts handed to readers so far (the lowest not handed out).
    handed: AtomicUsize,
    stop: AtomicBool,
    populated: AtomicU64,
    refused: Mutex<Option<std::io::Error>>,
}

// SAFETY: `dst` is only given to `populate_write`, which changes no byte;
// the readers' writes into the same pages are theirs alone.
unsafe impl Sync for Populate<'_> {}

impl<'a> Populate<'a> {
    /// For `parts` of the `len` bytes at `dst`.
    pub(super) fn new(dst: *mut u8, len: usize, parts: &'a [(u64, usize)]) -> Populate<'a> {
        Populate {
            dst,
            len,
            parts,
            handed: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            populated: AtomicU64::new(0),
            refused: Mutex::new(None),
        }
    }

    /// The readers have taken every part below `n`.
    pub(super) fn handed(&self, n: usize) {
        // Relaxed: advisory; a stale value makes the populator fault in a
        // page a receive also faults, which the kernel resolves.
        self.handed.fetch_max(n, Ordering::Relaxed);
    }

    /// No more pages are wanted (the read is done or failed).
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Bytes faulted in ahead, and the kernel's refusal if it refused.
    pub(super) fn outcome(&self) -> (u64, Option<String>) {
        let refused = match self.refused.lock() {
            Ok(g) => g.as_ref().map(ToString::to_string),
            Err(p) => p.into_inner().as_ref().map(ToString::to_string),
        };
        (self.populated.load(Ordering::Relaxed), refused)
    }

    /// The whole pages of part `i`'s bytes, widened to the pages it shares
    /// with its neighbours but never past the destination's own whole
    /// pages: start and length.
    fn span(&self, i: usize) -> (usize, usize) {
        let page = page_size();
        let base = self.dst as usize;
        let lo = base.next_multiple_of(page);
        let hi = (base + self.len) / page * page;
        let (off, len) = self.parts[i];
        let a = ((base + off as usize) / page * page).max(lo);
        let b = (base + off as usize + len).next_multiple_of(page).min(hi);
        (a, b.saturating_sub(a))
    }

    /// The thread's body: the parts not yet handed out, in order, until
    /// the last, a refusal, or [`Self::stop`].
    pub(super) fn run(&self) {
        let mut p = 0;
        loop {
            p = p.max(self.handed.load(Ordering::Relaxed));
            if p >= self.parts.len() {
                return;
            }
            let (start, len) = self.span(p);
            let mut at = 0;
            while at < len {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                if self.handed.load(Ordering::Relaxed) > p {
                    // A reader has the part: its receive faults the rest.
                    break;
                }
                let n = SLICE.min(len - at);
                // SAFETY: whole pages inside the destination, which the
                // read may write and which outlives this thread (joined
                // before the read returns).
                match unsafe { populate_write((start + at) as *mut u8, n) } {
                    Ok(k) => {
                        self.populated.fetch_add(k as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        match self.refused.lock() {
                            Ok(mut g) => *g = Some(e),
                            Err(p) => *p.into_inner() = Some(e),
                        }
                        return;
                    }
                }
                at += n;
            }
            p += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::set_populate_refusal;

    /// Which pages of `len` bytes at `ptr` (page-aligned) are resident.
    fn resident(ptr: *mut u8, len: usize) -> Vec<bool> {
        let page = page_size();
        let mut v = vec![0u8; len.div_ceil(page)];
        // SAFETY: a range of a live mapping; mincore only reports.
        let r = unsafe { libc::mincore(ptr.cast(), len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.into_iter().map(|b| b & 1 == 1).collect()
    }

    struct Map(*mut u8, usize);
    impl Map {
        fn new(len: usize) -> Map {
            // SAFETY: a fresh private anonymous mapping, unmapped on drop.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Map(p.cast(), len)
        }
    }
    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.0.cast(), self.1) };
        }
    }

    fn parts_of(len: usize, part: usize) -> Vec<(u64, usize)> {
        crate::object::read::parts(len as u64, part as u64).collect()
    }

    // One test, not three: the refusal switch is process-wide, and the
    // tests of a crate run in parallel threads.
    #[test]
    fn untaken_parts_are_faulted_in_taken_ones_left_and_a_refusal_is_kept() {
        let page = page_size();
        let part = 16 * page + 100;
        let len = 10 * part;
        let list = parts_of(len, part);
        let m = Map::new(len.next_multiple_of(page) + 4 * page);

        // The readers have taken the first 3 parts: the populator starts
        // after them and goes to the object's end, never past it.
        let pop = Populate::new(m.0, len, &list);
        pop.handed(3);
        pop.run();
        let (n, refused) = pop.outcome();
        assert!(refused.is_none(), "{refused:?}");
        let res = resident(m.0, m.1);
        let first_own = (3 * part).div_ceil(page);
        assert!(
            res[..3 * part / page].iter().all(|r| !r),
            "taken parts were populated"
        );
        assert!(
            res[first_own..len / page].iter().all(|r| *r),
            "untaken parts left"
        );
        assert!(
            res[len.div_ceil(page)..].iter().all(|r| !r),
            "pages past the object populated"
        );
        assert!(n as usize >= (len / page - first_own) * page, "{n}");
        // Control: the residency check sees a page populated past the end.
        // SAFETY: the last page of the test's own mapping.
        let past = unsafe { m.0.add(m.1 - page) };
        // SAFETY: as above; populating changes no byte.
        let n = unsafe { populate_write(past, page) };
        assert_eq!(n.unwrap(), page);
        assert!(resident(m.0, m.1)[m.1 / page - 1]);

        // Stopped before it starts: nothing.
        let m2 = Map::new(len.next_multiple_of(page));
        let pop = Populate::new(m2.0, len, &list);
        pop.stop();
        pop.run();
        assert_eq!(pop.outcome().0, 0);
        assert!(resident(m2.0, m2.1).iter().all(|r| !r));

        // Refused: kept, nothing populated, the pages still usable.
        set_populate_refusal(Some(libc::EINVAL));
        let pop = Populate::new(m2.0, len, &list);
        pop.run();
        set_populate_refusal(None);
        let (n, refused) = pop.outcome();
        assert_eq!(n, 0);
        let why = refused.expect("the refusal");
        assert!(why.contains("Invalid argument"), "{why}");
        assert!(resident(m2.0, m2.1).iter().all(|r| !r));
    }
}
