//! The arena: one anonymous mapping sized by the memory budget, holding every
//! payload byte the engine reads; [`super::ChunkPool`] cuts it into equal
//! chunks with reference counts.
//!
//! Memory is asked for in order of preference — explicit huge pages
//! (`MAP_HUGETLB`), transparent huge pages (`MADV_HUGEPAGE`), normal pages —
//! then locked with `mlock` when permitted and prefaulted, so no page fault
//! lands mid-run. What was obtained, and why a preference was not, is kept in
//! [`ArenaReport`] for the stats. A shared arena (`ArenaOptions::shared`) is a
//! memory file (`memfd`) that another process may map.

use std::sync::OnceLock;

use memmap2::{Advice, MmapMut, MmapOptions};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Which kind of memory backs the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryKind {
    /// Explicit huge pages from the reserved pool (`/proc/sys/vm/nr_hugepages`).
    Hugetlb,
    /// Transparent huge pages, asked for with `madvise(MADV_HUGEPAGE)`.
    Thp,
    /// Ordinary 4 KiB pages.
    Normal,
}

impl MemoryKind {
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Hugetlb => "hugetlb",
            MemoryKind::Thp => "thp",
            MemoryKind::Normal => "normal",
        }
    }
}

/// What the arena setup obtained, for the stats.
#[derive(Debug, Clone)]
pub struct ArenaReport {
    pub kind: MemoryKind,
    pub bytes: usize,
    pub locked: bool,
    /// The NUMA node the arena's pages are preferred on (`mbind`), when bound.
    pub numa_node: Option<usize>,
    /// Why a better memory kind, or locking, was not obtained.
    pub notes: Vec<String>,
}

/// How the arena is asked to set itself up (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct ArenaOptions {
    /// `None`: best available. `Some(kind)`: exactly that kind, or an error.
    pub kind: Option<MemoryKind>,
    /// `None`: lock when permitted. `Some(true)`: lock or fail. `Some(false)`: never.
    pub lock: Option<bool>,
    pub prefault: bool,
    /// Back the arena with a memory file (`memfd`, `MAP_SHARED`) that another
    /// process may map: how a PyTorch DataLoader worker's batches reach the
    /// main process without a copy. Otherwise an anonymous private mapping.
    pub shared: bool,
}

/// The mapping itself. Its bytes are only reached through raw pointers: the
/// kernel writes into it (io_uring reads) while consumers read other parts.
pub struct Arena {
    /// The mapping's CUDA registration, or CUDA's refusal, once tried:
    /// declared before the mapping so it drops first (unregistered, then
    /// unmapped).
    cuda: OnceLock<std::result::Result<super::cuda::Registration, String>>,
    _map: MmapMut,
    /// The memory file behind a shared arena.
    file: Option<std::fs::File>,
    base: *mut u8,
    len: usize,
    /// Bytes from the start whose pages are secured; past them a hugetlb
    /// arena mapped without a reservation (`MAP_NORESERVE`) has its pages
    /// faulted in on demand, each run populated before its first write
    /// ([`Arena::on_demand_from`]).
    backed: usize,
    report: ArenaReport,
}

// SAFETY: the arena is a plain block of memory; which thread may touch which
// byte is decided by chunk ownership (ChunkRef), not by the Arena value.
unsafe impl Send for Arena {}
// SAFETY: as above; the Arena itself has no interior state besides the mapping.
unsafe impl Sync for Arena {}

const HUGE_2M: usize = 2 << 20;

impl Arena {
    pub fn new(len: usize, opts: ArenaOptions) -> Result<Arena> {
        Arena::new_on_node(len, opts, None)
    }

    /// An arena of reserved huge pages where there are some, else normal
    /// pages, never transparent huge pages: for memory whose pages fault in
    /// as reads first land in it, where `MADV_HUGEPAGE` makes the kernel
    /// compact fragmented memory on the reading thread (`defrag` =
    /// `madvise`, the default) and every read behind it waits. `opts.kind`
    /// is ignored. The report's notes say why.
    pub fn new_without_thp(len: usize, opts: ArenaOptions, node: Option<usize>) -> Result<Arena> {
        let huge = ArenaOptions {
            kind: Some(MemoryKind::Hugetlb),
            ..opts
        };
        if let Ok(a) = Arena::new_on_node(len, huge, node) {
            return Ok(a);
        }
        let normal = ArenaOptions {
            kind: Some(MemoryKind::Normal),
            ..opts
        };
        let mut a = Arena::new_on_node(len, normal, node)?;
        a.report.notes.push(
            "normal pages: no huge pages reserved, and transparent huge pages are not asked \
             for memory the reads fault in (compaction would stall them)"
                .to_string(),
        );
        Ok(a)
    }

    /// An arena whose pages are preferred on NUMA `node` (the NIC's, where
    /// its DMA lands), bound before any page is faulted in; a refused
    /// binding is a note, not an error.
    pub fn new_on_node(len: usize, opts: ArenaOptions, node: Option<usize>) -> Result<Arena> {
        Arena::new_backed(len, len, opts, node)
    }

    /// A shared arena of `len` bytes of which only the first `backed` must
    /// have memory behind them at once (a node engine's budget, its arena
    /// being larger for the streams past it): in huge pages, only those are
    /// reserved and faulted in now, the rest on demand
    /// ([`Arena::on_demand_from`]), so the huge pages a node reserves for
    /// the budget are enough.
    pub fn new_backed(
        len: usize,
        backed: usize,
        opts: ArenaOptions,
        node: Option<usize>,
    ) -> Result<Arena> {
        let backed = backed.min(len);
        let mut notes = Vec::new();
        let (mut map, kind, file) = if opts.shared {
            let (m, k, f) = map_shared(len, backed, opts.kind, &mut notes)?;
            (m, k, Some(f))
        } else {
            let (m, k) = map_region(len, opts.kind, &mut notes)?;
            (m, k, None)
        };
        let numa_node = node.and_then(|n| match super::numa::prefer_node(&mut map, n) {
            Ok(()) => Some(n),
            Err(e) => {
                notes.push(format!("arena not bound to NUMA node {n} (mbind: {e})"));
                None
            }
        });
        // Training data, and a node engine's consumers' batches, stay out of
        // core dumps: a dump of a crashed trainer is often copied off the
        // machine, and gigabytes of arena would also make it useless.
        if let Err(e) = map.advise(Advice::DontDump) {
            notes.push(format!(
                "madvise(MADV_DONTDUMP) refused ({e}): the arena would be in core dumps"
            ));
        }
        let locked = match opts.lock {
            Some(false) => false,
            want => match lock(&map, opts.prefault) {
                Ok(()) => true,
                Err(e) if want == Some(true) => {
                    return Err(Error::Memory(format!(
                        "mlock of {len} bytes failed ({e}); `lock_memory` is \"on\". \
                         Raise `ulimit -l`, grant CAP_IPC_LOCK, or set it to \"auto\""
                    )));
                }
                Err(e) => {
                    notes.push(format!(
                        "mlock refused ({e}): memory is not locked (ulimit -l or CAP_IPC_LOCK)"
                    ));
                    false
                }
            },
        };
        if opts.prefault && !locked {
            // mlock already faulted everything in. Otherwise ask the kernel to
            // populate writable pages, or touch one byte per page (nobody
            // uses the memory yet).
            if map.advise(Advice::PopulateWrite).is_err() {
                let page = if kind == MemoryKind::Normal {
                    4096
                } else {
                    HUGE_2M
                };
                for off in (0..len).step_by(page) {
                    map[off] = 0;
                }
            }
        }
        let base = map.as_mut_ptr();
        // Past `backed`, only a hugetlb memory file is left unreserved.
        let backed = if opts.shared && kind == MemoryKind::Hugetlb {
            backed
        } else {
            len
        };
        Ok(Arena {
            cuda: OnceLock::new(),
            _map: map,
            file,
            base,
            len,
            backed,
            report: ArenaReport {
                kind,
                bytes: len,
                locked,
                numa_node,
                notes,
            },
        })
    }

    /// Where the pages with no memory secured behind them begin, if
    /// anywhere: a run there is populated ([`Arena::populate`]) before its
    /// first write, and one that cannot be is not used (a write to an
    /// unbacked huge page would kill the process with `SIGBUS`).
    pub fn on_demand_from(&self) -> Option<usize> {
        (self.backed < self.len).then_some(self.backed)
    }

    /// Faults in `len` bytes from `offset` for writing, as a write would,
    /// without changing them (`MADV_POPULATE_WRITE`, Linux 5.14): safe while
    /// other parts of the arena are in use. False when the kernel cannot,
    /// and then pages fault in on first use.
    pub fn populate(&self, offset: usize, len: usize) -> bool {
        if offset >= self.len {
            return true;
        }
        let len = len.min(self.len - offset);
        // SAFETY: the range lies inside this mapping; POPULATE_WRITE only
        // faults pages in, it never changes their contents.
        unsafe { libc::madvise(self.base.add(offset).cast(), len, libc::MADV_POPULATE_WRITE) == 0 }
    }

    /// Registers the whole mapping with the CUDA runtime `runtime` until
    /// the arena drops, so host-to-device copies from it are DMA transfers;
    /// pins (faults in) every page. Tried once: a later call gives the
    /// first one's outcome. The error is CUDA's, with its text.
    pub fn register_cuda(
        &self,
        runtime: &'static super::cuda::Runtime,
    ) -> std::result::Result<(), String> {
        let outcome = self
            .cuda
            .get_or_init(|| runtime.register(self.base, self.len, false));
        outcome.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// Bytes registered with CUDA (0: not registered, or not yet).
    pub fn cuda_registered(&self) -> usize {
        match self.cuda.get() {
            Some(Ok(r)) => r.len(),
            _ => 0,
        }
    }

    /// Why registering with CUDA failed, when it was tried and did.
    pub fn cuda_refused(&self) -> Option<&str> {
        match self.cuda.get() {
            Some(Err(e)) => Some(e),
            _ => None,
        }
    }

    pub fn report(&self) -> &ArenaReport {
        &self.report
    }

    /// Locks the first `len` bytes (as they fault in) of an arena made with
    /// `lock: Some(false)`: a node engine's, whose pages past its budget are
    /// address space for consumers beyond those expected and batches kept
    /// outside, and locked would count against `RLIMIT_MEMLOCK` for nothing.
    /// `want` as `ArenaOptions::lock`; a refusal under `None` is a note.
    pub fn lock_prefix(&mut self, len: usize, want: Option<bool>) -> Result<()> {
        if want == Some(false) || len == 0 {
            return Ok(());
        }
        let len = len.min(self.len);
        // SAFETY: the range is the start of this mapping; mlock2 changes no
        // byte of it.
        let r = unsafe { libc::mlock2(self.base.cast(), len, MLOCK_ONFAULT) };
        let r = if r != 0 && matches!(errno(), libc::EINVAL | libc::ENOSYS) {
            // SAFETY: as above (kernels without MLOCK_ONFAULT).
            unsafe { libc::mlock(self.base.cast(), len) }
        } else {
            r
        };
        if r == 0 {
            self.report.locked = true;
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if want == Some(true) {
            return Err(Error::Memory(format!(
                "mlock of {len} bytes failed ({e}); `lock_memory` is \"on\". \
                 Raise `ulimit -l`, grant CAP_IPC_LOCK, or set it to \"auto\""
            )));
        }
        self.report.notes.push(format!(
            "mlock refused ({e}): memory is not locked (ulimit -l or CAP_IPC_LOCK)"
        ));
        Ok(())
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory file of a shared arena (`ArenaOptions::shared`): mapping
    /// it (`MAP_SHARED`, offset 0) in another process shows the same bytes.
    pub fn shared_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.file.as_ref().map(|f| f.as_raw_fd())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `MLOCK_ONFAULT` (Linux 4.4, linux/include/uapi/asm-generic/mman-common.h); the
/// libc crate has it for Android only.
const MLOCK_ONFAULT: libc::c_uint = 1;

/// Locks the mapping. With `prefault`, every page is faulted in now
/// (`mlock`); without, pages are locked as they fault in (`MLOCK_ONFAULT`),
/// so a large arena costs nothing at open and the permission is still
/// checked now (RLIMIT_MEMLOCK, CAP_IPC_LOCK). Kernels without
/// `MLOCK_ONFAULT` get a plain `mlock`.
fn lock(map: &MmapMut, prefault: bool) -> std::io::Result<()> {
    if !prefault {
        // SAFETY: the range is this mapping; mlock2 changes no byte of it.
        let r = unsafe { libc::mlock2(map.as_ptr().cast(), map.len(), MLOCK_ONFAULT) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            return Err(e);
        }
    }
    map.lock()
}

/// The kernel's transparent-huge-page mode for shared memory (the bracketed
/// word of `shmem_enabled`), when it can be read.
fn shmem_thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// A memory file of `len` bytes mapped `MAP_SHARED`: explicit huge pages
/// (`MFD_HUGETLB`) when reserved, else transparent huge pages when the
/// kernel gives them to shared memory, else normal pages.
fn map_shared(
    len: usize,
    backed: usize,
    want: Option<MemoryKind>,
    notes: &mut Vec<String>,
) -> Result<(MmapMut, MemoryKind, std::fs::File)> {
    use std::os::fd::FromRawFd;
    let memfd = |flags: libc::c_uint| -> std::io::Result<(MmapMut, std::fs::File)> {
        // SAFETY: a static NUL-terminated name and plain flags.
        let fd = unsafe {
            libc::memfd_create(
                c"ringfeed-arena".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | flags,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        let huge = flags & libc::MFD_HUGETLB != 0;
        let mut opts = MmapOptions::new();
        opts.len(len);
        if huge && backed < len {
            // Huge pages are reserved for the whole of a shared mapping at
            // mmap unless told not to: only `backed` bytes are, below.
            opts.no_reserve_swap();
        }
        // SAFETY: the file is ours alone until the arena hands its
        // descriptor out; its length was set above and never changes.
        let map = unsafe { opts.map_mut(&file) }?;
        if huge && backed < len {
            // The backed part's pages now, or no huge pages at all.
            // SAFETY: within the mapping; POPULATE_WRITE only faults in.
            let r =
                unsafe { libc::madvise(map.as_ptr() as *mut _, backed, libc::MADV_POPULATE_WRITE) };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok((map, file))
    };
    let mut want_huge = want.is_none() || want == Some(MemoryKind::Hugetlb);
    if want.is_none() && len % HUGE_2M != 0 {
        notes.push(format!(
            "{len} bytes is not a multiple of 2 MiB: no MFD_HUGETLB"
        ));
        want_huge = false;
    }
    if want_huge {
        match memfd(libc::MFD_HUGETLB) {
            Ok((m, f)) => return Ok((m, MemoryKind::Hugetlb, f)),
            Err(e) if want == Some(MemoryKind::Hugetlb) => {
                return Err(Error::Memory(format!(
                    "a shared arena of {len} bytes, {backed} of them backed at once, in huge pages failed ({e}); `memory_kind` is \
                     \"hugetlb\": reserve huge pages in /proc/sys/vm/nr_hugepages or choose \"auto\""
                )));
            }
            Err(e) => notes.push(format!("MFD_HUGETLB failed ({e}): no huge pages reserved")),
        }
    }
    let (map, file) = memfd(0)
        .map_err(|e| Error::Memory(format!("a shared arena of {len} bytes (memfd) failed: {e}")))?;
    if want == Some(MemoryKind::Normal) {
        return Ok((map, MemoryKind::Normal, file));
    }
    let mode = shmem_thp_mode();
    let thp = matches!(
        mode.as_deref(),
        Some("always" | "within_size" | "advise" | "force")
    );
    if thp && map.advise(Advice::HugePage).is_ok() {
        return Ok((map, MemoryKind::Thp, file));
    }
    let why = match mode {
        Some(m) if !thp => format!(
            "the kernel gives shared memory no transparent huge pages \
             (/sys/kernel/mm/transparent_hugepage/shmem_enabled is {m})"
        ),
        Some(_) => "MADV_HUGEPAGE refused on shared memory".to_string(),
        None => "shared memory THP mode unknown".to_string(),
    };
    if want == Some(MemoryKind::Thp) {
        return Err(Error::Memory(format!(
            "`memory_kind` is \"thp\" but {why}; `shared_arena` needs shared memory"
        )));
    }
    notes.push(format!("shared arena: normal pages: {why}"));
    Ok((map, MemoryKind::Normal, file))
}

fn map_region(
    len: usize,
    want: Option<MemoryKind>,
    notes: &mut Vec<String>,
) -> Result<(MmapMut, MemoryKind)> {
    let anon = |huge: bool| {
        let mut o = MmapOptions::new();
        o.len(len);
        if huge {
            o.huge(None);
        }
        o.map_anon()
    };
    let mut want_huge = want.is_none() || want == Some(MemoryKind::Hugetlb);
    if want.is_none() && len % HUGE_2M != 0 {
        notes.push(format!(
            "{len} bytes is not a multiple of 2 MiB: no MAP_HUGETLB"
        ));
        want_huge = false;
    }
    if want_huge {
        match anon(true) {
            Ok(m) => return Ok((m, MemoryKind::Hugetlb)),
            Err(e) if want == Some(MemoryKind::Hugetlb) => {
                return Err(Error::Memory(format!(
                    "MAP_HUGETLB of {len} bytes failed ({e}); `memory_kind` is \"hugetlb\": \
                     reserve huge pages in /proc/sys/vm/nr_hugepages or choose \"auto\""
                )));
            }
            Err(e) => notes.push(format!("MAP_HUGETLB failed ({e}): no huge pages reserved")),
        }
    }
    let map = anon(false).map_err(|e| Error::Memory(format!("mmap of {len} bytes failed: {e}")))?;
    if want == Some(MemoryKind::Normal) {
        return Ok((map, MemoryKind::Normal));
    }
    match map.advise(Advice::HugePage) {
        Ok(()) => Ok((map, MemoryKind::Thp)),
        Err(e) if want == Some(MemoryKind::Thp) => Err(Error::Memory(format!(
            "madvise(MADV_HUGEPAGE) failed ({e}); `memory_kind` is \"thp\""
        ))),
        Err(e) => {
            notes.push(format!("MADV_HUGEPAGE refused ({e}): normal pages"));
            Ok((map, MemoryKind::Normal))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping that starts at `addr`, and its size.
    fn vma(addr: usize) -> Option<(usize, String)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut lines = smaps.lines();
        while let Some(l) = lines.next() {
            let Some((range, _)) = l.split_once(' ') else {
                continue;
            };
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            if a != addr {
                continue;
            }
            for l in lines.by_ref() {
                if let Some(flags) = l.strip_prefix("VmFlags:") {
                    return Some((b - a, flags.to_string()));
                }
            }
        }
        None
    }

    #[test]
    fn a_prefix_is_locked_and_the_rest_is_not() {
        let mut a = Arena::new(
            8 << 20,
            ArenaOptions {
                kind: Some(MemoryKind::Normal),
                lock: Some(false),
                prefault: false,
                shared: true,
            },
        )
        .unwrap();
        a.lock_prefix(2 << 20, None).unwrap();
        let base = a.base() as usize;
        if !a.report().locked {
            // Not permitted here (no CAP_IPC_LOCK, a small ulimit -l): said.
            assert!(a.report().notes.iter().any(|n| n.contains("mlock refused")));
            return;
        }
        let (len, flags) = vma(base).expect("the arena's mapping");
        assert_eq!(len, 2 << 20, "the locked part is its own mapping");
        assert!(flags.split_whitespace().any(|f| f == "lo"), "{flags}");
        let (rest, flags) = vma(base + (2 << 20)).expect("the rest");
        assert_eq!(rest, 6 << 20);
        assert!(!flags.split_whitespace().any(|f| f == "lo"), "{flags}");
    }

    #[test]
    fn each_memory_kind_can_be_forced_or_reports_why_not() {
        for kind in [MemoryKind::Thp, MemoryKind::Normal] {
            let a = Arena::new(
                4 << 20,
                ArenaOptions {
                    kind: Some(kind),
                    lock: None,
                    prefault: true,
                    shared: false,
                },
            )
            .unwrap();
            assert_eq!(a.report().kind, kind);
        }
        let auto = Arena::new(
            4 << 20,
            ArenaOptions {
                kind: None,
                lock: Some(false),
                prefault: true,
                shared: false,
            },
        )
        .unwrap();
        assert!(!auto.report().locked);
        if auto.report().kind != MemoryKind::Hugetlb {
            assert!(
                auto.report()
                    .notes
                    .iter()
                    .any(|n| n.contains("MAP_HUGETLB"))
            );
            let forced = Arena::new(
                4 << 20,
                ArenaOptions {
                    kind: Some(MemoryKind::Hugetlb),
                    lock: None,
                    prefault: false,
                    shared: false,
                },
            );
            match forced {
                Err(Error::Memory(m)) => assert!(m.contains("nr_hugepages"), "{m}"),
                other => panic!("expected a memory error, got {:?}", other.map(|_| ())),
            }
        }
    }
}
