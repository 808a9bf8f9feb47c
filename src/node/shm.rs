//! The shared-memory rings between a node engine and one consumer: a memory
//! file (`memfd`) both map read-write, holding a byte ring of records from
//! the engine (batch descriptors, epoch ends, errors) and a ring of batch
//! numbers coming back (releases). Each ring has one writer and one reader
//! (the engine's feeder writes records, the consumer reads them; the
//! consumer writes releases, the engine's session reads them), so each is
//! two counters and plain bytes: the writer fills, then publishes its
//! counter (Release); the reader loads it (Acquire), reads, then publishes
//! its own.
//!
//! The counters count bytes (or entries) since the start and never wrap in
//! practice (u64). Both sides check what the other wrote before using it: a
//! broken peer is an error, never an out-of-bounds access. The engine keeps
//! its own two counters (record bytes written, releases read) in its own
//! memory and only publishes them on the page: a consumer may write every
//! byte of the page, and the engine never reads its own place in a ring
//! back from there. The file is
//! sealed against shrinking and growing (and its seals sealed): a consumer
//! that may write every byte of it still cannot take the pages from under
//! the engine's mapping. A holder's link uses the release ring alone.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

/// Says the region is a ringfeed node ring of this layout.
const MAGIC: u64 = 0x7269_6e67_6665_6564; // "ringfeed"
const LAYOUT: u64 = 1;

/// The marker of a record that does not fit before the end of the byte
/// ring: the reader skips to the start.
const WRAP: u32 = u32::MAX;

/// Bytes of the record ring: room for many batch descriptors (a batch of 32
/// samples with two fields is about 1.5 KiB). Pages are touched only as
/// records reach them.
pub const RECORD_BYTES: u64 = 4 << 20;
/// Entries of the release ring: more than any budget holds batches.
pub const RELEASE_SLOTS: u64 = 1 << 16;

/// The counters, each on its own cache line (the two sides write different
/// ones).
#[repr(C)]
struct Header {
    magic: u64,
    layout: u64,
    record_bytes: u64,
    release_slots: u64,
    _p0: [u64; 4],
    /// Record bytes written (engine).
    rec_head: AtomicU64,
    _p1: [u64; 7],
    /// Record bytes read (consumer).
    rec_tail: AtomicU64,
    _p2: [u64; 7],
    /// Releases written (consumer).
    rel_head: AtomicU64,
    _p3: [u64; 7],
    /// Releases read (engine).
    rel_tail: AtomicU64,
    _p4: [u64; 7],
}

const HEADER: usize = std::mem::size_of::<Header>();

/// One side's mapping of the rings.
pub struct Rings {
    map: MmapRaw,
    record_bytes: u64,
    release_slots: u64,
    /// The engine side's record bytes written and releases read, kept
    /// here (the page's copies are for the consumer to read); unused on
    /// the consumer's side. Relaxed: each has one writer, the engine's one
    /// thread on its ring, which alone reads it.
    rec_head: AtomicU64,
    rel_tail: AtomicU64,
}

// SAFETY: every access to the mapping goes through atomics (the counters) or
// through byte ranges that the ring protocol gives to one side at a time.
unsafe impl Send for Rings {}
// SAFETY: as above; the methods that write take `&self` but each ring has
// one writer, which the callers keep (a mutex on the consumer side, one
// thread on the engine side).
unsafe impl Sync for Rings {}

fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

impl Rings {
    /// Makes the rings in a new memory file (the engine's side); the file is
    /// what the consumer maps with [`Rings::attach`].
    pub fn create() -> std::io::Result<(Rings, File)> {
        // SAFETY: a static NUL-terminated name and plain flags.
        let fd = unsafe {
            libc::memfd_create(
                c"ringfeed-node-rings".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        let len = HEADER as u64 + RECORD_BYTES + RELEASE_SLOTS * 8;
        file.set_len(len)?;
        super::sock::seal(
            fd,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )?;
        let map = MmapOptions::new().len(len as usize).map_raw(&file)?;
        // SAFETY: the mapping is at least HEADER bytes, page-aligned, and
        // zero-filled (a new file); nobody else maps it yet.
        unsafe {
            let h = map.as_mut_ptr().cast::<Header>();
            (*h).magic = MAGIC;
            (*h).layout = LAYOUT;
            (*h).record_bytes = RECORD_BYTES;
            (*h).release_slots = RELEASE_SLOTS;
        }
        Ok((
            Rings {
                map,
                record_bytes: RECORD_BYTES,
                release_slots: RELEASE_SLOTS,
                rec_head: AtomicU64::new(0),
                rel_tail: AtomicU64::new(0),
            },
            file,
        ))
    }

    /// Maps the rings the engine made (the consumer's side), checking their
    /// layout.
    pub fn attach(file: &File) -> Result<Rings, String> {
        let len = file
            .metadata()
            .map_err(|e| format!("the rings' memory file: {e}"))?
            .len();
        if len < HEADER as u64 {
            return Err(format!("the rings' memory file has {len} bytes"));
        }
        let map = MmapOptions::new()
            .len(len as usize)
            .map_raw(file.as_raw_fd())
            .map_err(|e| format!("mapping the rings: {e}"))?;
        // SAFETY: at least HEADER bytes are mapped; plain integers are read.
        let (magic, layout, rb, rs) = unsafe {
            let h = map.as_ptr().cast::<Header>();
            (
                (*h).magic,
                (*h).layout,
                (*h).record_bytes,
                (*h).release_slots,
            )
        };
        let fits = (HEADER as u64)
            .checked_add(rb)
            .and_then(|n| n.checked_add(rs.checked_mul(8)?))
            .is_some_and(|n| n <= len);
        if magic != MAGIC || layout != LAYOUT || !fits || rb % 8 != 0 || rb == 0 || rs == 0 {
            return Err("the rings' memory file has another layout".into());
        }
        Ok(Rings {
            map,
            record_bytes: rb,
            release_slots: rs,
            rec_head: AtomicU64::new(0),
            rel_tail: AtomicU64::new(0),
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping holds a Header at offset 0 (checked at attach),
        // page-aligned; its fields are read plainly or as atomics.
        unsafe { &*self.map.as_ptr().cast::<Header>() }
    }

    fn records(&self) -> *mut u8 {
        // SAFETY: the record ring follows the header inside the mapping.
        unsafe { self.map.as_mut_ptr().add(HEADER) }
    }

    fn releases(&self) -> *mut u64 {
        // SAFETY: the release ring follows the record ring (8-aligned).
        unsafe {
            self.map
                .as_mut_ptr()
                .add(HEADER + self.record_bytes as usize)
                .cast()
        }
    }

    /// Largest record [`Rings::push_record`] takes.
    pub fn max_record(&self) -> usize {
        (self.record_bytes / 2) as usize - 8
    }

    /// Writes one record (engine side, one writer). `false` when the ring has
    /// no room now; the caller waits for the consumer to read.
    pub fn push_record(&self, rec: &[u8]) -> bool {
        assert!(
            rec.len() <= self.max_record(),
            "record larger than the ring allows"
        );
        let h = self.header();
        let cap = self.record_bytes;
        // Relaxed: this thread's own counter (see the field).
        let head = self.rec_head.load(Ordering::Relaxed);
        // Acquire: the consumer is done with the bytes it has passed.
        let tail = h.rec_tail.load(Ordering::Acquire);
        let free = cap.saturating_sub(head.wrapping_sub(tail));
        let need = align8(4 + rec.len() as u64);
        let pos = head % cap;
        let to_end = cap - pos;
        let (skip, at) = if need > to_end { (to_end, 0) } else { (0, pos) };
        if skip + need > free {
            return false;
        }
        let base = self.records();
        // SAFETY: `pos` and `at .. at + need` lie inside the ring (need ≤ cap/2,
        // and at + need ≤ cap by the choice above), in bytes the reader has
        // passed (free space); u32 writes at 8-aligned offsets.
        unsafe {
            if skip > 0 {
                base.add(pos as usize).cast::<u32>().write(WRAP);
            }
            base.add(at as usize).cast::<u32>().write(rec.len() as u32);
            std::ptr::copy_nonoverlapping(rec.as_ptr(), base.add(at as usize + 4), rec.len());
        }
        // Relaxed: as above.
        self.rec_head.store(head + skip + need, Ordering::Relaxed);
        // Release: the bytes above are visible before the new head.
        h.rec_head.store(head + skip + need, Ordering::Release);
        true
    }

    /// Reads the next record (consumer side, one reader) into `out`;
    /// `Ok(false)` when there is none. A record that breaks the layout is an
    /// error.
    pub fn pop_record(&self, out: &mut Vec<u8>) -> Result<bool, String> {
        let h = self.header();
        let cap = self.record_bytes;
        let mut tail = h.rec_tail.load(Ordering::Relaxed);
        // Acquire: the engine's bytes up to head are visible.
        let head = h.rec_head.load(Ordering::Acquire);
        if head == tail {
            return Ok(false);
        }
        if head.wrapping_sub(tail) > cap || head % 8 != 0 {
            return Err("the record ring's counters are broken".into());
        }
        let base = self.records();
        let mut pos = tail % cap;
        // SAFETY: pos is 8-aligned and inside the ring.
        let mut len = unsafe { base.add(pos as usize).cast::<u32>().read() };
        if len == WRAP {
            tail += cap - pos;
            pos = 0;
            if head == tail {
                return Err("the record ring wraps to nothing".into());
            }
            // SAFETY: as above, at the ring's start.
            len = unsafe { base.cast::<u32>().read() };
        }
        let need = align8(4 + len as u64);
        if need > head - tail || pos + need > cap {
            return Err(format!("a record of {len} bytes does not fit the ring"));
        }
        out.clear();
        // SAFETY: `pos + 4 .. pos + 4 + len` lies inside the ring, in bytes
        // the engine published (checked against head above).
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(base.add(pos as usize + 4), len as usize)
        });
        // Release: done with those bytes; the engine may reuse them.
        h.rec_tail.store(tail + need, Ordering::Release);
        Ok(true)
    }

    /// Record bytes written so far (engine side: its own counter).
    pub fn written(&self) -> u64 {
        // Relaxed: as in `push_record`.
        self.rec_head.load(Ordering::Relaxed)
    }

    /// Record bytes the consumer says it has read (engine side): untrusted,
    /// so a consumer that lies only misleads the engine about itself.
    pub fn consumed(&self) -> u64 {
        // Acquire: pairs with the consumer's publishing store of its tail.
        self.header().rec_tail.load(Ordering::Acquire)
    }

    /// Whether a record waits to be read (consumer side).
    pub fn pending(&self) -> bool {
        let h = self.header();
        // Acquire: pairs with the engine's publishing store.
        h.rec_head.load(Ordering::Acquire) != h.rec_tail.load(Ordering::Relaxed)
    }

    /// Hands back batch number `id` (consumer side, one writer at a time).
    /// `false` when the ring is full (the engine is not reading).
    pub fn push_release(&self, id: u64) -> bool {
        let h = self.header();
        let head = h.rel_head.load(Ordering::Relaxed);
        // Acquire: the engine has read the entries it passed.
        let tail = h.rel_tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) >= self.release_slots {
            return false;
        }
        // SAFETY: the slot is inside the release ring and free.
        unsafe {
            self.releases()
                .add((head % self.release_slots) as usize)
                .write(id)
        };
        // Release: the entry is visible before the new head.
        h.rel_head.store(head + 1, Ordering::Release);
        true
    }

    /// Takes every release written so far (engine side, one reader). A broken
    /// counter is an error.
    pub fn drain_releases(&self, out: &mut Vec<u64>) -> Result<(), String> {
        let h = self.header();
        // Relaxed: this thread's own counter (see the field).
        let mut tail = self.rel_tail.load(Ordering::Relaxed);
        // Acquire: the consumer's entries up to head are visible.
        let head = h.rel_head.load(Ordering::Acquire);
        if head.wrapping_sub(tail) > self.release_slots {
            return Err("the release ring's counters are broken".into());
        }
        while tail != head {
            // SAFETY: the slot is inside the ring and published.
            out.push(unsafe {
                self.releases()
                    .add((tail % self.release_slots) as usize)
                    .read()
            });
            tail += 1;
        }
        // Relaxed: as above.
        self.rel_tail.store(tail, Ordering::Relaxed);
        // Release: the slots may be written again.
        h.rel_tail.store(tail, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_cross_in_order_through_many_wraps() {
        let (engine, file) = Rings::create().unwrap();
        let consumer = Rings::attach(&file).unwrap();
        let mut out = Vec::new();
        let mut next_read = 0u64;
        let mut written = 0u64;
        // Records of varied sizes, written ahead of the reader until full.
        let rec = |i: u64| {
            let n = (i * 7919 % 300_000) as usize;
            let mut v = vec![(i % 251) as u8; n];
            v.extend_from_slice(&i.to_le_bytes());
            v
        };
        while next_read < 400 {
            while written < 400 && engine.push_record(&rec(written)) {
                written += 1;
            }
            assert!(consumer.pop_record(&mut out).unwrap());
            assert_eq!(out, rec(next_read));
            next_read += 1;
        }
        assert!(!consumer.pop_record(&mut out).unwrap());
    }

    #[test]
    fn releases_cross_and_a_full_ring_says_so() {
        let (engine, file) = Rings::create().unwrap();
        let consumer = Rings::attach(&file).unwrap();
        for i in 0..RELEASE_SLOTS {
            assert!(consumer.push_release(i));
        }
        assert!(!consumer.push_release(7));
        let mut got = Vec::new();
        engine.drain_releases(&mut got).unwrap();
        assert_eq!(got.len() as u64, RELEASE_SLOTS);
        assert_eq!(got[5], 5);
        assert!(consumer.push_release(9));
    }

    /// A consumer that writes the engine's counters on the page (its
    /// record head, its release tail) changes nothing the engine does: it
    /// writes its next record where it belongs, republishes its head, and
    /// reads the releases from where it left off. The control is the page
    /// itself: it held the garbage, which the engine once read back.
    #[test]
    fn the_engines_counters_are_its_own_whatever_the_page_says() {
        let (engine, file) = Rings::create().unwrap();
        let consumer = Rings::attach(&file).unwrap();
        assert!(engine.push_record(b"first"));
        let written = engine.written();
        assert!(consumer.push_release(41));
        let page = consumer.header();
        page.rec_head.store(1 << 40, Ordering::Release);
        page.rel_tail.store(u64::MAX / 3, Ordering::Release);
        // The control: what reading the page back would have given.
        assert_eq!(engine.header().rec_head.load(Ordering::Acquire), 1 << 40);
        assert_eq!(engine.written(), written);
        let mut got = Vec::new();
        engine.drain_releases(&mut got).unwrap();
        assert_eq!(got, [41]);
        // The page's head is the engine's again after its next record,
        // and the consumer reads both records in order (it read nothing
        // before: its tail is still 0).
        assert!(engine.push_record(b"second"));
        assert_eq!(page.rec_head.load(Ordering::Acquire), engine.written());
        assert!(engine.written() > written);
        let mut out = Vec::new();
        assert!(consumer.pop_record(&mut out).unwrap());
        assert_eq!(out, b"first");
        assert!(consumer.pop_record(&mut out).unwrap());
        assert_eq!(out, b"second");
    }

    #[test]
    fn broken_counters_and_layouts_are_errors() {
        let (engine, file) = Rings::create().unwrap();
        let consumer = Rings::attach(&file).unwrap();
        // A peer writing garbage into the counters.
        engine.header().rec_head.store(3, Ordering::Release);
        assert!(consumer.pop_record(&mut Vec::new()).is_err());
        engine
            .header()
            .rel_head
            .store(u64::MAX / 2, Ordering::Release);
        assert!(engine.drain_releases(&mut Vec::new()).is_err());
        // A record length past the published bytes.
        let (engine, file) = Rings::create().unwrap();
        let consumer = Rings::attach(&file).unwrap();
        assert!(engine.push_record(b"hello"));
        // SAFETY: the test overwrites the record's length in place.
        unsafe { engine.records().cast::<u32>().write(1 << 30) };
        assert!(consumer.pop_record(&mut Vec::new()).is_err());
        // The file cannot shrink or grow, nor be unsealed.
        let (_, file) = Rings::create().unwrap();
        assert!(file.set_len(4096).is_err());
        assert!(file.set_len(64 << 20).is_err());
        assert!(super::super::sock::seal(file.as_raw_fd(), 0).is_err());
        // A file that is not a ring.
        let other = tempfile::tempfile().unwrap();
        other.set_len(4096).unwrap();
        assert!(Rings::attach(&other).is_err());
    }
}
