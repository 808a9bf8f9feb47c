//! Reading a whole object: its size from the resolver (a listing, `HEAD`,
//! or the file's metadata), then parts of `part_size` read straight into
//! their place in the destination, `parts_in_flight` at a time. A remote
//! object's count is found as its parts complete when `parts_in_flight` is
//! auto (`crate::net::inflight`, from 8 to 64): at S3's ~115 ms per 8 MiB
//! GET, 8 carry ~0.6 GB/s and a link of 3 GB/s needs ~40; the parts go
//! straight into the destination, so more in flight costs connections,
//! not memory.
//!
//! With io_uring, one ring on the calling thread keeps every part in
//! flight: `READ`s of a local file, ranged GETs over as many keep-alive
//! connections for HTTP and S3 (the loader's own HTTP driver, bodies
//! received into the destination). Where io_uring is refused (or
//! `io_backend` is `"threads"`), as many threads each read one part at a
//! time with `pread` or a blocking GET. Either way a part that fails is
//! retried by the network layer's policy, and a failure for good stops new
//! parts, waits for those in flight (their memory must not go while the
//! kernel writes it), and names the part.
//!
//! One read is one version: every part of a remote object is pinned to the
//! size the read was planned for and to the ETag of the first answer
//! (`If-Match` on every later GET, every answer's ETag and `Content-Range`
//! total compared: `VersionPin`). An object rewritten during the read is
//! `Error::Changed` (inside `Error::Part`), never a buffer of two versions;
//! the read is not restarted on its own, since the caller's buffer was
//! sized for the old version: reading again gets the new one whole.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use super::Progress;
use crate::config::{Config, IoBackend};
use crate::dataset::{Shard, Source};
use crate::error::{Error, Fault, IoOp, Result};
use crate::fetch::direct::LocalFd;
use crate::fetch::http_sync::HttpPool;
use crate::fetch::threads::run_blocking;
use crate::fetch::uring::UringReader;
use crate::fetch::{BackendKind, Completion, NetOptions, ReadFail, ReadRequest, Reader, Target};
use crate::memory::{Arena, ArenaOptions};
use crate::net::inflight::{InFlight, Read};
use crate::net::retry::Jitter;
use crate::net::version::VersionPin;

/// How a read went, for messages and the CLI.
#[derive(Debug, Clone)]
pub struct ReadReport {
    pub bytes: u64,
    pub parts: usize,
    pub backend: BackendKind,
    pub seconds: f64,
    /// Why the preferred path or memory was not used, if it was not.
    pub notes: Vec<String>,
}

/// An object read into memory of its own (huge pages where the system
/// gives them): the bytes stay put until the value is dropped, so views of
/// them (a numpy array, a tensor) need no copy.
pub struct ObjectBuf {
    arena: Arena,
    len: usize,
    pub name: String,
    pub report: ReadReport,
}

impl std::fmt::Debug for ObjectBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBuf")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl ObjectBuf {
    pub fn as_ptr(&self) -> *const u8 {
        self.arena.base()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the arena holds at least `len` bytes, all written by the
        // read before the value was made; nothing writes them after.
        unsafe { std::slice::from_raw_parts(self.arena.base(), self.len) }
    }
}

/// Reads the object `url` into memory of its own.
pub fn read(url: &str, cfg: &Config, progress: Option<&Progress>) -> Result<ObjectBuf> {
    let net = NetOptions::for_config(cfg);
    let shard = super::one(url, cfg, &net)?;
    read_shard(&shard, cfg, &net, progress)
}

/// Reads an object [`super::list`] gave into memory of its own.
pub fn read_shard(
    shard: &Shard,
    cfg: &Config,
    net: &NetOptions,
    progress: Option<&Progress>,
) -> Result<ObjectBuf> {
    let size = shard_size(shard)?;
    let len = usize::try_from(size).map_err(|_| Error::Memory(format!("{size} bytes")))?;
    let arena = own_memory(len, cfg)?;
    let mut notes = arena.report().notes.clone();
    // The fresh mapping's first touches, from its end backwards on a
    // thread of their own while the parts land from its start: each page
    // is faulted in once, by whichever side reaches it first, and the
    // receiving thread meets faulted pages for the rest of the object.
    let stop = AtomicBool::new(false);
    let mut report = std::thread::scope(|scope| {
        if len >= FAULT_AHEAD_MIN {
            scope.spawn(|| fault_ahead(&arena, len, &stop));
        }
        let read = read_to(shard, size, arena.base(), cfg, net, progress);
        // The scope joins the helper once it sees this.
        stop.store(true, Ordering::Relaxed);
        read
    })?;
    notes.append(&mut report.notes);
    report.notes = notes;
    Ok(ObjectBuf {
        arena,
        len,
        name: shard.name.clone(),
        report,
    })
}

/// Objects from this size on have their memory faulted in ahead of the
/// receives (a thread costs more than it saves on smaller ones).
const FAULT_AHEAD_MIN: usize = 32 << 20;

/// Faults in `arena`'s first `len` bytes for writing, a step at a time from
/// the end towards the start, until `stop` or the start; never writes a
/// byte (`MADV_POPULATE_WRITE`), so the receives landing at the same time
/// are untouched. Returns the bytes it went over (0 where the kernel
/// cannot: pages then fault in on the receives, as without it).
fn fault_ahead(arena: &Arena, len: usize, stop: &AtomicBool) -> usize {
    const STEP: usize = 4 << 20;
    let mut done = 0;
    let mut end = len;
    while end > 0 && !stop.load(Ordering::Relaxed) {
        let start = end.saturating_sub(STEP);
        if !arena.populate(start, end - start) {
            break;
        }
        done += end - start;
        end = start;
    }
    done
}

/// A mapping of its own of `len` bytes (a page at least) for an object's
/// bytes: reserved huge pages where there are some, else ordinary pages,
/// unless `memory_kind` says otherwise; locked only when asked.
pub(super) fn own_memory(len: usize, cfg: &Config) -> Result<Arena> {
    let opts = |kind| ArenaOptions {
        kind,
        // Locking would fault every page in before the first read; on
        // only when asked.
        lock: Some(cfg.lock_memory == crate::config::Toggle::On),
        prefault: false,
        shared: false,
    };
    // A page at least: a mapping cannot be empty.
    let bytes = len.max(1).next_multiple_of(4096);
    // Not transparent huge pages unless asked: a multi-GB mapping asked
    // for with MADV_HUGEPAGE makes the kernel compact memory on the
    // reading thread when it is fragmented (`defrag` = `madvise`, the
    // default): reads swung by an order of magnitude where 4 KiB pages
    // held steady (docs/decisions.md, "An object's memory is its own
    // mapping, not arena chunks").
    match cfg.memory_kind {
        Some(kind) => Arena::new(bytes, opts(Some(kind))),
        None => Arena::new_without_thp(bytes, opts(None), None),
    }
}

/// Reads the object `url` into `buf`, which must hold it: returns its
/// size. A buffer too small is an error naming the size, before any read.
pub fn read_into(
    url: &str,
    cfg: &Config,
    buf: &mut [u8],
    progress: Option<&Progress>,
) -> Result<(u64, ReadReport)> {
    let net = NetOptions::for_config(cfg);
    let shard = super::one(url, cfg, &net)?;
    let report = read_shard_into(&shard, cfg, &net, buf, progress)?;
    Ok((report.bytes, report))
}

/// Reads an object [`super::list`] gave into `buf`, which must hold it.
pub fn read_shard_into(
    shard: &Shard,
    cfg: &Config,
    net: &NetOptions,
    buf: &mut [u8],
    progress: Option<&Progress>,
) -> Result<ReadReport> {
    let size = shard_size(shard)?;
    if size > buf.len() as u64 {
        return Err(Error::Memory(format!(
            "`{}` is {size} bytes; the buffer holds {}",
            shard.name,
            buf.len()
        )));
    }
    read_to(shard, size, buf.as_mut_ptr(), cfg, net, progress)
}

pub fn shard_size(shard: &Shard) -> Result<u64> {
    shard.size.ok_or_else(|| {
        Error::internal(
            Fault::Invariant,
            format!("`{}` was not sized before its read", shard.name),
        )
    })
}

/// The parts of an object of `size` bytes: offset and length of each.
pub fn parts(size: u64, part_size: u64) -> impl Iterator<Item = (u64, usize)> {
    let step = part_size.max(1);
    (0..size.div_ceil(step)).map(move |i| {
        let off = i * step;
        (off, (size - off).min(step) as usize)
    })
}

/// Reads all of `shard` (`size` bytes) to `dst`.
fn read_to(
    shard: &Shard,
    size: u64,
    dst: *mut u8,
    cfg: &Config,
    net: &NetOptions,
    progress: Option<&Progress>,
) -> Result<ReadReport> {
    let started = Instant::now();
    let (target, _file) = target_of(shard)?;
    let list: Vec<(u64, usize)> = parts(size, cfg.part_size).collect();
    let job = Job::new(shard, size, dst, target, &list, cfg, progress);
    let mut notes = Vec::new();
    let backend = match open_ring(cfg, net, job.most, &mut notes)? {
        Some(mut r) => {
            job.on_ring(&mut r, &mut Whole)?;
            BackendKind::IoUring
        }
        None => {
            job.on_threads(net)?;
            BackendKind::Threads
        }
    };
    Ok(ReadReport {
        bytes: size,
        parts: list.len(),
        backend,
        seconds: started.elapsed().as_secs_f64(),
        notes,
    })
}

/// What `shard`'s parts are read from, and the file kept open until every
/// read of it is done.
pub(super) fn target_of(shard: &Shard) -> Result<(Target, Option<File>)> {
    Ok(match &shard.source {
        Source::File(path) => {
            let f = File::open(path).map_err(|e| Error::io(IoOp::Open, path, &e))?;
            let fd = LocalFd {
                fd: f.as_raw_fd(),
                align: 0,
            };
            (Target::File(fd), Some(f))
        }
        Source::Http(obj) => (Target::Http(Arc::clone(obj)), None),
    })
}

/// A ring for `most` parts in flight, or `None` for the thread backend
/// (where io_uring is refused under `io_backend` auto: said in `notes`).
pub(super) fn open_ring(
    cfg: &Config,
    net: &NetOptions,
    most: usize,
    notes: &mut Vec<String>,
) -> Result<Option<UringReader>> {
    match cfg.io_backend {
        IoBackend::Threads => Ok(None),
        IoBackend::IoUring | IoBackend::Auto => {
            let entries = (most * 2 + 2).next_power_of_two() as u32;
            match UringReader::new(entries, None, net.clone(), 0x0b1ec7) {
                Ok(r) => Ok(Some(r)),
                Err(e) if cfg.io_backend == IoBackend::Auto => {
                    notes.push(format!("io_uring unavailable ({e}): thread backend"));
                    Ok(None)
                }
                Err(e) => Err(Error::IoUring(format!(
                    "cannot set up a ring ({e}); `io_backend` is \"io_uring\": use \"auto\" or \"threads\""
                ))),
            }
        }
    }
}

/// Where the parts read on a ring land, and what follows each one's
/// arrival: the whole object in one destination ([`Whole`]), or a window
/// of reused slots written out in order (`super::stream`).
pub(super) trait Landing {
    /// Where part `i` goes (`dst` is the job's destination, `offset` the
    /// part's place in the object), or `None` while it has no room yet.
    fn place(&mut self, i: usize, dst: *mut u8, offset: u64) -> Option<*mut u8>;
    /// Part `i` arrived whole and checked; an error stops new parts.
    fn landed(&mut self, i: usize) -> Result<()>;
    /// Asked after every wait: an error stops new parts (the caller gave
    /// up, as a Ctrl-C), those in flight are waited for.
    fn go_on(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Every part at its own offset in the destination.
pub(super) struct Whole;

impl Landing for Whole {
    fn place(&mut self, _: usize, dst: *mut u8, offset: u64) -> Option<*mut u8> {
        // SAFETY: parts lie inside the `size` bytes at `dst`.
        Some(unsafe { dst.add(offset as usize) })
    }

    fn landed(&mut self, _: usize) -> Result<()> {
        Ok(())
    }
}

/// One object's read: what each backend needs.
pub(super) struct Job<'a> {
    shard: &'a Shard,
    size: u64,
    dst: *mut u8,
    target: Target,
    /// What every part of a remote object is checked against.
    pin: Option<Arc<VersionPin>>,
    parts: &'a [(u64, usize)],
    /// Parts in flight at once (where found: where the count starts).
    in_flight: usize,
    /// The most in flight: above `in_flight` when the count is found.
    pub(super) most: usize,
    progress: Option<&'a Progress>,
}

// SAFETY: `dst` is only written through disjoint parts, each by one reader,
// and outlives the job (the caller holds it for the whole read).
unsafe impl Sync for Job<'_> {}

impl<'a> Job<'a> {
    /// The read of `parts` of `shard` (`size` bytes, from `target`) into
    /// `dst`: a remote object's parts pinned to one version, as many in
    /// flight as `cfg` says or as found.
    pub(super) fn new(
        shard: &'a Shard,
        size: u64,
        dst: *mut u8,
        target: Target,
        parts: &'a [(u64, usize)],
        cfg: &Config,
        progress: Option<&'a Progress>,
    ) -> Job<'a> {
        let pin = match &target {
            Target::Http(_) => Some(Arc::new(VersionPin::planned(None, Some(size)))),
            Target::File(_) => None,
        };
        let found = cfg.parts_in_flight == 0 && matches!(target, Target::Http(_));
        Job {
            shard,
            size,
            dst,
            target,
            pin,
            parts,
            in_flight: cfg.fixed_parts(),
            most: if found {
                crate::config::AUTO_READS_MAX
            } else {
                cfg.fixed_parts()
            },
            progress,
        }
    }

    /// The same read into `dst` instead.
    pub(super) fn into_dst(self, dst: *mut u8) -> Job<'a> {
        Job { dst, ..self }
    }

    fn request(&self, i: usize) -> ReadRequest {
        // SAFETY: parts lie inside the `size` bytes at `dst`.
        let buf = unsafe { self.dst.add(self.parts[i].0 as usize) };
        self.request_at(i, buf)
    }

    /// Part `i`'s read into `buf`, which holds its length.
    fn request_at(&self, i: usize, buf: *mut u8) -> ReadRequest {
        let (offset, len) = self.parts[i];
        ReadRequest {
            id: i as u64,
            target: self.target.clone(),
            offset,
            buf,
            len,
            buf_index: 0,
            open_end: false,
            pin: self.pin.clone(),
        }
    }

    /// The outcome of part `c.id`'s read: an error names the object and
    /// the part (from 1), or says the object changed under the read.
    fn check(&self, c: Completion) -> Result<()> {
        let i = c.id as usize;
        let (offset, len) = self.parts[i];
        let part = |source: Error| Error::Part {
            url: self.shard.name.clone(),
            part: i as u32 + 1,
            source: Box::new(source),
        };
        let changed = |now: String| {
            part(Error::Changed {
                url: self.shard.name.clone(),
                expected: format!("{} bytes", self.size),
                seen: now,
            })
        };
        match c.result {
            Ok(_) if c.total.is_some_and(|t| t != self.size) => {
                Err(changed(format!("{} bytes", c.total.unwrap_or(0))))
            }
            Ok(n) if n == len => {
                if let Some(p) = self.progress {
                    p.add(n as u64);
                }
                Ok(())
            }
            Ok(n) => Err(changed(format!(
                "a read at byte {offset} that gave {n} of {len} bytes"
            ))),
            Err(ReadFail::Io(e)) => {
                let path = match &self.shard.source {
                    Source::File(p) => p.clone(),
                    Source::Http(_) => self.shard.name.clone().into(),
                };
                Err(part(Error::io(IoOp::Read, path, &e)))
            }
            Err(ReadFail::Net(e)) => Err(part(e)),
        }
    }

    /// Every part on one ring, `in_flight` at a time, or as many as the
    /// measured read times call for up to `most`, each where `landing`
    /// places it, in order, once it has room.
    pub(super) fn on_ring(&self, ring: &mut UringReader, landing: &mut dyn Landing) -> Result<()> {
        let mut next = 0;
        let mut out_standing = 0;
        let mut first_error: Option<Error> = None;
        let mut done = Vec::new();
        let started = Instant::now();
        let mut count =
            (self.most > self.in_flight).then(|| InFlight::new(self.in_flight, 1, self.most, None));
        let mut asked = vec![started; self.parts.len()];
        loop {
            let limit = count.as_ref().map_or(self.in_flight, InFlight::total);
            while first_error.is_none() && out_standing < limit && next < self.parts.len() {
                let Some(buf) = landing.place(next, self.dst, self.parts[next].0) else {
                    break;
                };
                // SAFETY: each part's bytes are written by this read only
                // (the landing gives a place to one part at a time), and
                // the destination and the file outlive it: this loop
                // returns only once nothing is in flight.
                match unsafe { ring.submit(self.request_at(next, buf)) } {
                    Ok(()) => {
                        asked[next] = Instant::now();
                        next += 1;
                        out_standing += 1;
                    }
                    Err(e) => {
                        first_error = Some(Error::IoUring(format!("submit: {e}")));
                    }
                }
            }
            if out_standing == 0 {
                break;
            }
            if let Err(e) = ring.wait(1, &mut done) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // A ring that cannot wait cannot be left with reads in
                // flight into memory about to be freed.
                return Err(Error::internal(
                    Fault::Invariant,
                    format!("io_uring wait failed with reads in flight: {e}"),
                ));
            }
            for c in done.drain(..) {
                out_standing -= 1;
                // A failed read's time says nothing of the link's room.
                let measured = c.result.is_ok().then(|| asked.get(c.id as usize)).flatten();
                if let (Some(count), Some(at)) = (&mut count, measured) {
                    let len = self.parts[c.id as usize].1 as u64;
                    let read = Read {
                        bytes: len,
                        secs: at.elapsed().as_secs_f64(),
                        first_byte: c.timing.map(|t| t.first_byte.as_secs_f64()),
                        on_wire: c.timing.map(|t| t.last_byte.as_secs_f64()),
                        paced: c.timing.and_then(|t| t.paced),
                        // The caller's memory: every part lands in pages
                        // of its own, a cost of every read, not once.
                        fresh: false,
                    };
                    count.record(started.elapsed().as_secs_f64(), read);
                }
                let i = c.id as usize;
                if let Err(e) = self.check(c).and_then(|()| landing.landed(i)) {
                    first_error.get_or_insert(e);
                }
            }
            if first_error.is_none()
                && let Err(e) = landing.go_on()
            {
                first_error = Some(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None if next < self.parts.len() => Err(Error::internal(
                Fault::Invariant,
                format!(
                    "`{}`: {next} of {} parts read, none in flight and none with room",
                    self.shard.name,
                    self.parts.len()
                ),
            )),
            None => Ok(()),
        }
    }

    /// Every part on `in_flight` threads, each taking the next part.
    fn on_threads(&self, net: &NetOptions) -> Result<()> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let threads = self.in_flight.min(self.parts.len()).max(1);
        let errors: Vec<Option<(usize, Error)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (next, failed) = (&next, &failed);
                    s.spawn(move || {
                        let mut pool = HttpPool::new(net.stall, Arc::clone(&net.tls));
                        let mut jitter = Jitter::new(0x0b1ec7 ^ t as u64);
                        loop {
                            // Relaxed: the counter only hands out indexes;
                            // the flag is advisory (stop taking new parts).
                            if failed.load(Ordering::Relaxed) {
                                return None;
                            }
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= self.parts.len() {
                                return None;
                            }
                            let req = self.request(i);
                            let c = loop {
                                if let Some(c) = run_blocking(&req, &mut pool, net, &mut jitter) {
                                    break c;
                                }
                            };
                            if let Err(e) = self.check(c) {
                                failed.store(true, Ordering::Relaxed);
                                return Some((i, e));
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Some((0, Error::internal(Fault::Panic, "a read thread panicked")))
                    })
                })
                .collect()
        });
        // The lowest part that failed, so the error does not depend on
        // which thread lost the race.
        match errors.into_iter().flatten().min_by_key(|(i, _)| *i) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_object_once() {
        for (size, part) in [
            (0u64, 8u64),
            (1, 8),
            (7, 8),
            (8, 8),
            (9, 8),
            (80, 8),
            (81, 8),
        ] {
            let ps: Vec<_> = parts(size, part).collect();
            assert_eq!(ps.iter().map(|p| p.1 as u64).sum::<u64>(), size);
            let mut at = 0;
            for (off, len) in &ps {
                assert_eq!(*off, at);
                assert!(*len as u64 <= part && *len > 0);
                at += *len as u64;
            }
            assert_eq!(ps.len() as u64, size.div_ceil(part));
        }
    }

    /// Pages of `arena`'s first `len` bytes resident now.
    fn resident(arena: &Arena, len: usize) -> usize {
        let mut v = vec![0u8; len / 4096];
        // SAFETY: the range is inside the mapping; `v` holds a byte a page.
        let r = unsafe { libc::mincore(arena.base().cast(), len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn memory_is_faulted_in_ahead_from_the_end_and_not_after_stop() {
        let len = 40 << 20;
        let cfg = Config::default();
        let fresh = own_memory(len, &cfg).unwrap();
        assert_eq!(resident(&fresh, len), 0, "a fresh mapping");
        // The control: stopped before it starts, nothing is touched.
        assert_eq!(fault_ahead(&fresh, len, &AtomicBool::new(true)), 0);
        assert_eq!(resident(&fresh, len), 0);
        // Bytes already landed at the start are kept as they are.
        // SAFETY: the first page of the mapping, written before the helper.
        unsafe { std::ptr::write_bytes(fresh.base(), 0xab, 4096) };
        assert_eq!(fault_ahead(&fresh, len, &AtomicBool::new(false)), len);
        assert_eq!(resident(&fresh, len), len / 4096);
        // SAFETY: the mapping holds `len` bytes, all faulted in above.
        let bytes = unsafe { std::slice::from_raw_parts(fresh.base(), len) };
        assert!(bytes[..4096].iter().all(|&b| b == 0xab));
        assert!(bytes[4096..].iter().all(|&b| b == 0));
    }
}
