//! Local shards read with O_DIRECT (`direct_io`): the file's bytes go from
//! the disk into the chunk by DMA, past the page cache. Cold data that
//! does not fit in memory gains (no copy out of the page cache, no cache
//! filled with pages that are evicted before the next epoch); data the page
//! cache holds is faster read buffered, so `"auto"` goes direct only when
//! the local shards are larger than the machine's memory (see
//! docs/decisions.md).
//!
//! O_DIRECT wants file offsets, lengths and buffer addresses in multiples
//! of the file system's block ([`LocalFd::align`], from `statx`'s
//! `STATX_DIOALIGN` where the kernel reports it, else 4096). A worker's
//! reads start at multiples of a chunk's data length and land at the
//! chunk's data start, so only the last read of a file is off: the backend
//! widens it to whole blocks ([`KernelRead`]) into the chunk's back slack,
//! and hands back no byte past the length asked. A file whose file system
//! refuses O_DIRECT (tmpfs, ramfs, FUSE without it), or whose alignment the
//! chunks cannot meet, is read buffered, and the stats note says so once
//! ([`DirectIo::note`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Toggle;
use crate::error::{Error, IoOp, Result};
use crate::sync::Locked;

/// The alignment assumed where `statx` does not report one (kernels before
/// 6.1): the page size, which every Linux file system's block size divides.
pub const DEFAULT_ALIGN: u32 = 4096;

/// An open local file, as a read targets it.
#[derive(Debug, Clone, Copy)]
pub struct LocalFd {
    pub fd: RawFd,
    /// 0: buffered. Else the file is open with O_DIRECT, and each read is
    /// widened to offsets, lengths and addresses in multiples of this.
    pub align: u32,
}

/// Where a worker's reads land in its chunks: at `slack` bytes into a
/// chunk of `chunk` bytes, at file offsets that are multiples of
/// `data_len` (`engine::open` sets them).
#[derive(Debug, Clone, Copy)]
pub struct ChunkLayout {
    pub chunk: usize,
    pub slack: usize,
    pub data_len: usize,
}

impl ChunkLayout {
    /// Whether every widened read stays inside its chunk and meets `align`:
    /// chunks start on page boundaries (the arena is page-aligned, chunk
    /// sizes are multiples of 4096), data starts and read offsets are
    /// multiples of `align`, and the back slack holds the rounding of a
    /// last read.
    pub fn fits(&self, align: usize) -> bool {
        align.is_power_of_two()
            && align <= 4096
            && self.chunk % align == 0
            && self.slack % align == 0
            && self.slack >= align
            && self.data_len % align == 0
    }
}

/// The read a backend gives the kernel for a direct read of `len` bytes at
/// `offset` into `buf`: begun `shift` bytes earlier (only a continued
/// short read starts off a block; the bytes before `buf` are that same
/// read's, read again) and rounded up to whole blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelRead {
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
    pub shift: usize,
    /// The length asked: no more is handed back.
    pub asked: usize,
}

impl KernelRead {
    /// The read of `len` bytes at `offset` into `buf` for a file of
    /// [`LocalFd::align`] `align`: as asked when 0 (buffered), else widened
    /// to `align`. `buf` and `offset` must be equally far from a multiple
    /// of `align` (the worker's layout keeps them so: [`ChunkLayout::fits`]).
    pub fn new(offset: u64, buf: *mut u8, len: usize, align: u32) -> io::Result<KernelRead> {
        if align == 0 {
            return Ok(KernelRead {
                offset,
                buf,
                len,
                shift: 0,
                asked: len,
            });
        }
        let a = align as usize;
        let shift = (offset % align as u64) as usize;
        if (buf as usize) % a != shift {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "direct read at offset {offset} into a buffer {} bytes off a {a}-byte \
                     boundary",
                    (buf as usize) % a
                ),
            ));
        }
        Ok(KernelRead {
            offset: offset - shift as u64,
            buf: buf.wrapping_sub(shift),
            len: (shift + len).div_ceil(a) * a,
            shift,
            asked: len,
        })
    }

    /// Whether the kernel's read differs from the one asked.
    pub fn widened(&self) -> bool {
        self.shift != 0 || self.len != self.asked
    }

    /// The bytes of the asked read among the `n` the kernel read: those
    /// before `buf` are not its, those past `asked` lie past the file's end
    /// as it was opened (or in the rounding) and are never handed on.
    pub fn delivered(&self, n: usize) -> usize {
        n.saturating_sub(self.shift).min(self.asked)
    }
}

/// A loader's choice of buffered or direct reads for local shards, and
/// what became of it, file by file.
#[derive(Debug)]
pub struct DirectIo {
    /// Open local files with O_DIRECT where they allow it.
    pub wanted: bool,
    files_direct: AtomicU64,
    files_buffered: AtomicU64,
    /// Why the first file that could not be read direct was read buffered.
    refused: Mutex<Option<String>>,
}

/// `direct_io: "auto"`: direct when the local shards add up to more than
/// the machine's memory (`mem_total`), so that no epoch finds them in the
/// page cache anyway; buffered when they may stay cached from one epoch to
/// the next. Unknown memory: buffered.
pub fn auto_direct(local_bytes: u64, mem_total: Option<u64>) -> bool {
    mem_total.is_some_and(|m| local_bytes > m)
}

/// `MemTotal` of /proc/meminfo, in bytes.
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

impl DirectIo {
    /// The choice for `mode` over local shards of `local_bytes` in all.
    pub fn new(mode: Toggle, local_bytes: u64) -> DirectIo {
        let wanted = match mode {
            Toggle::On => true,
            Toggle::Off => false,
            Toggle::Auto => auto_direct(local_bytes, mem_total()),
        };
        DirectIo {
            wanted,
            files_direct: AtomicU64::new(0),
            files_buffered: AtomicU64::new(0),
            refused: Mutex::new(None),
        }
    }

    /// Opens `path` for reading, with O_DIRECT when wanted and possible;
    /// gives the file (which must outlive its reads), how reads target it,
    /// and its size.
    pub fn open(&self, path: &Path, layout: ChunkLayout) -> Result<(File, LocalFd, u64)> {
        let file = File::open(path).map_err(|e| Error::io(IoOp::Open, path, &e))?;
        self.adopt(file, path, layout)
    }

    /// [`DirectIo::open`] for a file already open (`path` names it in
    /// messages).
    pub fn adopt(
        &self,
        file: File,
        path: &Path,
        layout: ChunkLayout,
    ) -> Result<(File, LocalFd, u64)> {
        let fd = file.as_raw_fd();
        let st = file_statx(fd).map_err(|e| Error::io(IoOp::Stat, path, &e))?;
        let mut local = LocalFd { fd, align: 0 };
        if self.wanted {
            match go_direct(fd, &st, layout) {
                Ok(align) => local.align = align,
                Err(why) => self.refuse(path, why),
            }
        }
        let counter = match local.align {
            0 => &self.files_buffered,
            _ => &self.files_direct,
        };
        // Relaxed: a statistic.
        counter.fetch_add(1, Ordering::Relaxed);
        Ok((file, local, st.size))
    }

    fn refuse(&self, path: &Path, why: String) {
        let mut r = self.refused.locked();
        r.get_or_insert_with(|| format!("{}: {why}", path.display()));
        crate::log::once("direct refused", crate::log::Level::Warn, || {
            format!("{}: read buffered, not direct: {why}", path.display())
        });
    }

    /// Local files opened so far: (direct, buffered).
    pub fn files(&self) -> (u64, u64) {
        // Relaxed: a report.
        (
            self.files_direct.load(Ordering::Relaxed),
            self.files_buffered.load(Ordering::Relaxed),
        )
    }

    /// Which path local reads took: "direct", "buffered", both, or "none"
    /// (no local file opened yet).
    pub fn path_name(&self) -> &'static str {
        match self.files() {
            (0, 0) => "none",
            (_, 0) => "direct",
            (0, _) => "buffered",
            _ => "direct+buffered",
        }
    }

    /// The stats note of files read buffered although direct was wanted.
    pub fn note(&self) -> Option<String> {
        let first = self.refused.locked().clone()?;
        let (_, buffered) = self.files();
        Some(format!(
            "direct_io: {buffered} local file(s) read buffered (first: {first})"
        ))
    }
}

/// What `statx` says of an open file.
struct FileStat {
    size: u64,
    /// `STATX_DIOALIGN` (offset, memory), where the kernel reports it.
    dio: Option<(u32, u32)>,
}

fn file_statx(fd: RawFd) -> io::Result<FileStat> {
    // SAFETY: all-zero is a valid statx value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_SIZE | libc::STATX_DIOALIGN | libc::STATX_DIO_READ_ALIGN;
    // SAFETY: an empty C string with AT_EMPTY_PATH names `fd` itself;
    // `stx` is a valid statx to fill.
    let r = unsafe { libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, mask, &mut stx) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        // No statx (old kernels, some sandboxes): fstat for the size.
        // SAFETY: as above, for `stat`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid stat to fill for the open `fd`.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(FileStat {
            size: st.st_size as u64,
            dio: None,
        });
    }
    let dio = (stx.stx_mask & libc::STATX_DIOALIGN != 0).then(|| {
        // Linux 6.14+ may allow reads finer offsets than writes.
        let read = stx.stx_dio_read_offset_align;
        let off = if stx.stx_mask & libc::STATX_DIO_READ_ALIGN != 0 && read != 0 {
            read
        } else {
            stx.stx_dio_offset_align
        };
        (off, stx.stx_dio_mem_align)
    });
    Ok(FileStat {
        size: stx.stx_size,
        dio,
    })
}

/// tmpfs (`TMPFS_MAGIC`): the file is memory; O_DIRECT, which it takes
/// since Linux 6.6, only copies from the same pages a buffered read does.
/// (ramfs refuses O_DIRECT outright.)
const MEMORY_FILESYSTEMS: &[(i64, &str)] = &[(0x0102_1994, "tmpfs")];

/// Switches `fd` to O_DIRECT and gives the alignment its reads need, or
/// says why it stays buffered.
fn go_direct(fd: RawFd, st: &FileStat, layout: ChunkLayout) -> Result<u32, String> {
    // SAFETY: all-zero is a valid statfs value for the kernel to fill.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fs` is a valid statfs to fill for the open `fd`.
    if unsafe { libc::fstatfs(fd, &mut fs) } == 0
        && let Some((_, name)) = MEMORY_FILESYSTEMS
            .iter()
            .find(|(magic, _)| *magic == fs.f_type as i64)
    {
        return Err(format!(
            "on {name}, which is memory: no page cache to bypass"
        ));
    }
    let align = match st.dio {
        Some((0, _)) => {
            return Err("the file system does not support direct I/O (statx)".into());
        }
        Some((off, mem)) => off.max(mem),
        None => DEFAULT_ALIGN,
    };
    if !layout.fits(align as usize) {
        return Err(format!(
            "direct I/O needs {align}-byte alignment, which chunks of {} bytes with {} bytes \
             of slack cannot give",
            layout.chunk, layout.slack
        ));
    }
    // SAFETY: F_GETFL/F_SETFL on an open descriptor change only its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } != 0 {
        return Err(format!(
            "the file system refused O_DIRECT ({})",
            io::Error::last_os_error()
        ));
    }
    Ok(align)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_read_is_rounded_up_and_hands_back_no_byte_past_the_end() {
        let base = 0x10_0000 as *mut u8;
        // 5000 bytes from a block boundary: 8192 to the kernel, 5000 back.
        let k = KernelRead::new(8192, base, 5000, 4096).unwrap();
        assert_eq!((k.offset, k.buf, k.len, k.shift), (8192, base, 8192, 0));
        assert!(k.widened());
        assert_eq!(k.delivered(5000), 5000);
        // The file grew since it was opened: still only what was asked.
        assert_eq!(k.delivered(8192), 5000);
        // A whole-block read is left alone, and so is any buffered one.
        let k = KernelRead::new(0, base, 1 << 20, 512).unwrap();
        assert!(!k.widened());
        assert_eq!(k.delivered(1 << 20), 1 << 20);
        let k = KernelRead::new(4196, base.wrapping_add(7), 5, 0).unwrap();
        assert!(!k.widened());
        assert_eq!((k.offset, k.len, k.delivered(5)), (4196, 5, 5));
    }

    #[test]
    fn a_continued_short_read_starts_at_the_block_before_it() {
        let base = 0x10_0000 as *mut u8;
        // 100 bytes of the read were in: go on at 4196 into base + 100.
        let k = KernelRead::new(4196, base.wrapping_add(100), 3000, 4096).unwrap();
        assert_eq!((k.offset, k.buf, k.len, k.shift), (4096, base, 4096, 100));
        assert_eq!(k.delivered(4096), 3000);
        // The file ended where the first part did: nothing new.
        assert_eq!(k.delivered(100), 0);
        assert_eq!(k.delivered(0), 0);
        // An offset and a buffer off by different amounts are refused.
        assert!(KernelRead::new(4196, base, 10, 4096).is_err());
    }

    #[test]
    fn layouts_fit_alignments_their_slack_can_round_into() {
        let l = ChunkLayout {
            chunk: 8 << 20,
            slack: 512 << 10,
            data_len: 7 << 20,
        };
        assert!(l.fits(512) && l.fits(4096));
        assert!(
            !l.fits(8192),
            "past a page, chunk starts are not known to align"
        );
        assert!(!l.fits(3000));
        let tight = ChunkLayout {
            chunk: 64 << 10,
            slack: 4096,
            data_len: 56 << 10,
        };
        assert!(tight.fits(4096));
    }

    #[test]
    fn auto_goes_direct_only_past_the_memory() {
        assert!(!auto_direct(2 << 30, Some(16 << 30)));
        assert!(auto_direct(20 << 30, Some(16 << 30)));
        assert!(!auto_direct(u64::MAX, None));
    }
}
