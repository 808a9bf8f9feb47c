//! The tar walk: a pure state machine that turns the bytes of one shard, fed
//! as a sequence of segments (the chunks a worker filled, in file order), into
//! member events, without copying member data.
//!
//! It understands ustar (with the `prefix` field), GNU long names and long
//! links (`L`/`K`), and pax extended headers (`x`: `path`, `size`; `g` is
//! skipped). Only regular files become members; every other entry type is
//! skipped and counted. A member that lies whole inside one segment is
//! reported by its range in that segment; a member that crosses a segment end
//! is reported in pieces (`split_begin`, then `split_more` until `last`), and
//! the shell decides where its bytes come together (see `worker::spill`).
//!
//! Metadata that crosses a segment end (a 512-byte header, a long name, a pax
//! record block) is buffered here: it is small and bounded by `META_LIMIT`.
//!
//! `count_samples` drives the same walk over a shard read at random offsets,
//! reading only headers and extended-header records and passing over member
//! data unread, so the loader learns a shard's sample count at open without
//! reading the shard; sharing the walk keeps its verdicts (counts, errors and
//! their offsets) those of the worker's streaming walk.

pub mod sample;

pub use sample::split_name;

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, TarError};

/// Tar block size: headers and member data are padded to it.
pub const BLOCK: u64 = 512;
/// Largest GNU long name or pax header accepted. Real names are under 4 KiB;
/// 1 MiB bounds what a corrupt size field can make us buffer.
pub const META_LIMIT: u64 = 1 << 20;

/// Receives the members the walk finds. `name` is the member's full path.
pub trait MemberSink {
    /// A member whose data is `range` of the segment being fed.
    fn whole(&mut self, name: &[u8], offset: u64, range: Range<usize>) -> Result<(), Error>;
    /// A member of `size` bytes whose first piece is `range` (it ends the segment).
    fn split_begin(
        &mut self,
        name: &[u8],
        offset: u64,
        size: u64,
        range: Range<usize>,
    ) -> Result<(), Error>;
    /// The next piece of the split member, at the start of a later segment.
    fn split_more(&mut self, range: Range<usize>, last: bool) -> Result<(), Error>;
}

/// Counts kept by the walk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalkCounts {
    /// Regular-file members reported.
    pub members: u64,
    /// Entries of other types (directories, links, devices, global pax, ...).
    pub skipped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meta {
    LongName,
    LongLink,
    Pax,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a 512-byte header (`hdr_fill` bytes so far).
    Header,
    /// Member data: `remaining` bytes of `size`; `started` once a piece went out.
    Data {
        size: u64,
        remaining: u64,
        started: bool,
    },
    /// Bytes to pass over: padding, or the data of a skipped entry.
    Skip { remaining: u64 },
    /// Collecting a long name or pax block of `remaining` more bytes, then `pad`.
    Meta {
        kind: Meta,
        remaining: u64,
        pad: u64,
    },
    /// Two zero blocks seen: the archive is over; later bytes are ignored.
    End,
}

/// Walks one shard. Create one per shard; feed segments in order; `finish` at EOF.
#[derive(Debug)]
pub struct TarWalk {
    /// Shard offset of the next byte to be fed.
    pos: u64,
    state: State,
    hdr: [u8; BLOCK as usize],
    hdr_fill: usize,
    /// Shard offset of the header being collected or of the current entry.
    entry_offset: u64,
    zero_blocks: u8,
    meta: Vec<u8>,
    /// Name set by a GNU `L` entry or a pax `path` record for the next member.
    next_name: Option<Vec<u8>>,
    /// Size set by a pax `size` record for the next member.
    next_size: Option<u64>,
    /// Name of the member whose data is being walked.
    name: Vec<u8>,
    max_member: u64,
    counts: WalkCounts,
}

impl TarWalk {
    /// `max_member`: members larger than this are an error (the memory budget).
    pub fn new(max_member: u64) -> Self {
        TarWalk {
            pos: 0,
            state: State::Header,
            hdr: [0; BLOCK as usize],
            hdr_fill: 0,
            entry_offset: 0,
            zero_blocks: 0,
            meta: Vec::new(),
            next_name: None,
            next_size: None,
            name: Vec::new(),
            max_member,
            counts: WalkCounts::default(),
        }
    }

    pub fn counts(&self) -> WalkCounts {
        self.counts
    }

    /// Shard offset of the next byte expected.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// True once the end-of-archive marker (two zero blocks) was seen.
    pub fn at_end(&self) -> bool {
        self.state == State::End
    }

    /// Header-only walking (`count_samples`): what the walk does with the
    /// bytes at `position()`.
    fn next_bytes(&self) -> NextBytes {
        match self.state {
            State::Header => NextBytes::Read(BLOCK - self.hdr_fill as u64),
            State::Meta { remaining, .. } => NextBytes::Read(remaining),
            State::Data { remaining, .. } | State::Skip { remaining } => NextBytes::Pass(remaining),
            State::End => NextBytes::Done,
        }
    }

    /// Passes over the next `n` bytes (at most what `NextBytes::Pass` said)
    /// unread, making the moves `feed` would make over them; true when they
    /// ended a member's data (its name is `self.name`).
    fn pass_unread(&mut self, n: u64) -> bool {
        self.pos += n;
        match self.state {
            State::Data {
                size, remaining, ..
            } if n == remaining => {
                self.counts.members += 1;
                self.state = State::Skip {
                    remaining: pad(size),
                };
                true
            }
            State::Data {
                size, remaining, ..
            } => {
                self.state = State::Data {
                    size,
                    remaining: remaining - n,
                    started: true,
                };
                false
            }
            State::Skip { remaining } => {
                self.state = if n == remaining {
                    State::Header
                } else {
                    State::Skip {
                        remaining: remaining - n,
                    }
                };
                false
            }
            State::Header | State::Meta { .. } | State::End => {
                debug_assert_eq!(n, 0, "only data and padding are passed unread");
                false
            }
        }
    }

    /// Feeds the next segment of the shard.
    pub fn feed(&mut self, seg: &[u8], sink: &mut impl MemberSink) -> Result<(), Error> {
        let mut i = 0usize;
        let base = self.pos;
        let result = self.walk(seg, &mut i, sink);
        self.pos = base + i as u64;
        result
    }

    fn walk(&mut self, seg: &[u8], i: &mut usize, sink: &mut impl MemberSink) -> Result<(), Error> {
        let base = self.pos;
        while *i < seg.len() {
            let avail = (seg.len() - *i) as u64;
            match self.state {
                State::End => {
                    *i = seg.len();
                }
                State::Header => {
                    if self.hdr_fill == 0 {
                        self.entry_offset = base + *i as u64;
                    }
                    let take = (BLOCK as usize - self.hdr_fill).min(seg.len() - *i);
                    self.hdr[self.hdr_fill..self.hdr_fill + take]
                        .copy_from_slice(&seg[*i..*i + take]);
                    self.hdr_fill += take;
                    *i += take;
                    if self.hdr_fill == BLOCK as usize {
                        self.hdr_fill = 0;
                        self.on_header(sink, seg, i)?;
                    }
                }
                State::Data {
                    size,
                    remaining,
                    started,
                } => {
                    let data_offset = self.entry_offset;
                    if !started {
                        if remaining <= avail {
                            let r = *i..*i + remaining as usize;
                            sink.whole(&self.name, data_offset, r)?;
                            *i += remaining as usize;
                            self.counts.members += 1;
                            self.state = State::Skip {
                                remaining: pad(size),
                            };
                        } else {
                            sink.split_begin(&self.name, data_offset, size, *i..seg.len())?;
                            self.state = State::Data {
                                size,
                                remaining: remaining - avail,
                                started: true,
                            };
                            *i = seg.len();
                        }
                    } else {
                        let take = remaining.min(avail);
                        let last = take == remaining;
                        sink.split_more(*i..*i + take as usize, last)?;
                        *i += take as usize;
                        if last {
                            self.counts.members += 1;
                            self.state = State::Skip {
                                remaining: pad(size),
                            };
                        } else {
                            self.state = State::Data {
                                size,
                                remaining: remaining - take,
                                started: true,
                            };
                        }
                    }
                }
                State::Skip { remaining } => {
                    let take = remaining.min(avail);
                    *i += take as usize;
                    self.state = if take == remaining {
                        State::Header
                    } else {
                        State::Skip {
                            remaining: remaining - take,
                        }
                    };
                }
                State::Meta {
                    kind,
                    remaining,
                    pad,
                } => {
                    let take = remaining.min(avail) as usize;
                    self.meta.extend_from_slice(&seg[*i..*i + take]);
                    *i += take;
                    if take as u64 == remaining {
                        self.on_meta(kind)?;
                        self.state = State::Skip { remaining: pad };
                    } else {
                        self.state = State::Meta {
                            kind,
                            remaining: remaining - take as u64,
                            pad,
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// Called at the end of the shard; `total` is the shard's length.
    pub fn finish(&mut self) -> Result<(), TarError> {
        let offset = self.pos;
        match self.state {
            State::End => Ok(()),
            State::Header if self.hdr_fill == 0 => {
                if offset == 0 {
                    Err(TarError::Empty)
                } else if self.next_name.is_some() || self.next_size.is_some() {
                    Err(TarError::Truncated {
                        offset,
                        inside: "an extended header with no member after it".into(),
                        missing: BLOCK,
                    })
                } else {
                    // No end-of-archive marker: some writers omit it; the
                    // archive ended at an entry boundary, so nothing is lost.
                    Ok(())
                }
            }
            State::Header if self.entry_offset == 0 => Err(TarError::NotTar),
            State::Header => Err(TarError::Truncated {
                offset,
                inside: format!("the header at byte {}", self.entry_offset),
                missing: BLOCK - self.hdr_fill as u64,
            }),
            State::Data { remaining, .. } => Err(TarError::Truncated {
                offset,
                inside: format!("member `{}`", String::from_utf8_lossy(&self.name)),
                missing: remaining,
            }),
            State::Skip { remaining } => {
                // Missing only the padding of the last entry is harmless.
                if remaining < BLOCK && self.entry_offset > 0 {
                    Ok(())
                } else {
                    Err(TarError::Truncated {
                        offset,
                        inside: format!("the entry at byte {}", self.entry_offset),
                        missing: remaining,
                    })
                }
            }
            State::Meta { remaining, .. } => Err(TarError::Truncated {
                offset,
                inside: format!("the extended header at byte {}", self.entry_offset),
                missing: remaining,
            }),
        }
    }

    fn on_header(
        &mut self,
        sink: &mut impl MemberSink,
        seg: &[u8],
        i: &mut usize,
    ) -> Result<(), Error> {
        let offset = self.entry_offset;
        let h = &self.hdr;
        if h.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            if self.zero_blocks >= 2 {
                self.state = State::End;
            }
            return Ok(());
        }
        self.zero_blocks = 0;
        verify_checksum(h, offset)?;
        let typeflag = h[156];
        let mut size = parse_number(&h[124..136], offset, "size")?;
        match typeflag {
            b'0' | 0 | b'7' => {
                if let Some(s) = self.next_size.take() {
                    size = s;
                }
                self.name.clear();
                match self.next_name.take() {
                    Some(n) => self.name = n,
                    None => ustar_name(h, &mut self.name),
                }
                if size > self.max_member {
                    return Err(TarError::TooLarge {
                        offset,
                        what: format!("member `{}`", String::from_utf8_lossy(&self.name)),
                        size,
                        limit: self.max_member,
                    }
                    .into());
                }
                self.entry_offset = offset + BLOCK;
                self.state = State::Data {
                    size,
                    remaining: size,
                    started: false,
                };
                if size == 0 {
                    // Report empty members at once, even at a segment end.
                    sink.whole(&self.name, self.entry_offset, *i..*i)?;
                    self.counts.members += 1;
                    self.state = State::Header;
                }
                let _ = seg;
            }
            b'L' | b'K' | b'x' => {
                if size > META_LIMIT {
                    return Err(TarError::TooLarge {
                        offset,
                        what: "extended header".into(),
                        size,
                        limit: META_LIMIT,
                    }
                    .into());
                }
                let kind = match typeflag {
                    b'L' => Meta::LongName,
                    b'K' => Meta::LongLink,
                    _ => Meta::Pax,
                };
                self.meta.clear();
                self.state = State::Meta {
                    kind,
                    remaining: size,
                    pad: pad(size),
                };
                if size == 0 {
                    self.on_meta(kind)?;
                    self.state = State::Header;
                }
            }
            b'1'..=b'6' => {
                // Links, devices, directories, FIFOs: no data blocks follow.
                self.counts.skipped += 1;
                self.next_name = None;
                self.next_size = None;
            }
            _ => {
                // Global pax headers, volume labels, sparse files, vendor
                // types: their data is not a sample member; pass over it.
                self.counts.skipped += 1;
                self.next_name = None;
                self.next_size = None;
                self.state = State::Skip {
                    remaining: size + pad(size),
                };
            }
        }
        Ok(())
    }

    fn on_meta(&mut self, kind: Meta) -> Result<(), Error> {
        match kind {
            Meta::LongName => {
                let end = self
                    .meta
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(self.meta.len());
                self.next_name = Some(self.meta[..end].to_vec());
            }
            Meta::LongLink => {}
            Meta::Pax => {
                let (path, size) = parse_pax(&self.meta, self.entry_offset)?;
                if let Some(p) = path {
                    self.next_name = Some(p);
                }
                if let Some(s) = size {
                    self.next_size = Some(s);
                }
            }
        }
        Ok(())
    }
}

/// What the walk does with the bytes at its position (see `TarWalk::next_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextBytes {
    /// It must see the next this many bytes: a header, or extended-header records.
    Read(u64),
    /// It passes over the next this many bytes without looking: member data,
    /// padding, or the data of a skipped entry.
    Pass(u64),
    /// The end-of-archive marker was seen; later bytes are ignored.
    Done,
}

/// Groups members into samples the way `worker::ShardSink::member` does:
/// a member whose name has no field part is passed over (it neither opens nor
/// closes a sample), and a member whose key differs from the open sample's
/// starts a new one, even when that key was seen before.
#[derive(Debug, Default)]
struct SampleCounter {
    samples: u64,
    /// Key of the open sample; `None` before the first sample.
    key: Option<Vec<u8>>,
}

impl SampleCounter {
    fn member(&mut self, name: &[u8]) {
        let Some((key, _field)) = split_name(name) else {
            return;
        };
        if self.key.as_deref() != Some(key) {
            self.samples += 1;
            self.key = Some(key.to_vec());
        }
    }
}

/// Empty members (reported by the walk from their header) arrive here; data
/// is never fed, so nothing is ever split.
impl MemberSink for SampleCounter {
    fn whole(&mut self, name: &[u8], _offset: u64, _range: Range<usize>) -> Result<(), Error> {
        self.member(name);
        Ok(())
    }

    fn split_begin(
        &mut self,
        name: &[u8],
        _offset: u64,
        _size: u64,
        _range: Range<usize>,
    ) -> Result<(), Error> {
        self.member(name);
        Ok(())
    }

    fn split_more(&mut self, _range: Range<usize>, _last: bool) -> Result<(), Error> {
        Ok(())
    }
}

/// Samples in a tar shard, counted by reading only its headers (and GNU long-name / pax records):
/// consecutive members with the same key (crate::tar::split_name) form one sample, exactly as
/// the worker groups them; members without a field part are not samples; non-regular entries skipped.
///
/// `read_at(offset, buf)` fills `buf` from the shard's byte `offset` or fails;
/// `size` is the shard's length; `max_member` is the walk's member-size limit
/// (`TarError::TooLarge` above it, as in the worker). The walk is `TarWalk`
/// itself, fed headers and records and passed over member data unread, so
/// every verdict (the count, each error and its offset) is the one the
/// worker's streaming walk reaches on the same bytes. A failing `read_at` is
/// reported as `TarError::Truncated` at the offset of the read (a file that
/// shrank reads short); a caller that needs the `io::Error` keeps it from its
/// closure, as `count_file_samples` does.
pub fn count_samples(
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    size: u64,
    max_member: u64,
) -> Result<u64, TarError> {
    let mut walk = TarWalk::new(max_member);
    let mut counter = SampleCounter::default();
    let mut buf = Vec::new();
    while walk.pos < size {
        let avail = size - walk.pos;
        match walk.next_bytes() {
            NextBytes::Done => break,
            NextBytes::Pass(n) => {
                if walk.pass_unread(n.min(avail)) {
                    counter.member(&walk.name);
                }
            }
            NextBytes::Read(n) => {
                // At most META_LIMIT (checked at the extended header) or one block.
                let n = n.min(avail) as usize;
                buf.resize(n, 0);
                read_at(walk.pos, &mut buf).map_err(|e| TarError::Truncated {
                    offset: walk.pos,
                    inside: format!("a read that failed ({e})"),
                    missing: n as u64,
                })?;
                walk.feed(&buf, &mut counter).map_err(counter_tar_error)?;
            }
        }
    }
    walk.finish()?;
    Ok(counter.samples)
}

/// The walk's errors while counting: `SampleCounter` never fails, so every
/// error is the walk's own `TarError`.
fn counter_tar_error(e: Error) -> TarError {
    match e {
        Error::Tar { source, .. } => source,
        other => unreachable!("the sample counter never fails, yet: {other}"),
    }
}

/// `count_samples` over a local file, read with `pread` (`read_exact_at`).
/// No member-size limit applies here: the worker checks members against its
/// arena when it reads the shard. Errors name the file as the worker does:
/// `Error::Io` (`open`, `stat`, `read`) or `Error::Tar` with the path as shard.
pub fn count_file_samples(path: &Path) -> crate::error::Result<u64> {
    let file = File::open(path).map_err(|e| Error::io("open", path, &e))?;
    let size = file
        .metadata()
        .map_err(|e| Error::io("stat", path, &e))?
        .len();
    let mut read_error: Option<std::io::Error> = None;
    let counted = count_samples(
        &mut |offset, buf| {
            file.read_exact_at(buf, offset).map_err(|e| {
                let kind = e.kind();
                read_error = Some(e);
                std::io::Error::from(kind)
            })
        },
        size,
        u64::MAX,
    );
    counted.map_err(|source| match read_error {
        Some(e) => Error::io("read", path, &e),
        None => Error::Tar {
            shard: path.display().to_string(),
            source,
        },
    })
}

fn pad(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// The name of a plain ustar (or v7) header: `prefix/name`.
fn ustar_name(h: &[u8; 512], out: &mut Vec<u8>) {
    let name = cstr(&h[0..100]);
    if &h[257..262] == b"ustar" {
        let prefix = cstr(&h[345..500]);
        if !prefix.is_empty() {
            out.extend_from_slice(prefix);
            out.push(b'/');
        }
    }
    out.extend_from_slice(name);
}

fn verify_checksum(h: &[u8; 512], offset: u64) -> Result<(), TarError> {
    let stored = match parse_number(&h[148..156], offset, "chksum") {
        Ok(v) => v,
        Err(_) if offset == 0 => return Err(TarError::NotTar),
        Err(e) => return Err(e),
    };
    let mut unsigned: u64 = 0;
    let mut signed: i64 = 0;
    for (k, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&k) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    if stored == unsigned || stored as i64 == signed {
        Ok(())
    } else if offset == 0 {
        Err(TarError::NotTar)
    } else {
        Err(TarError::BadChecksum {
            offset,
            stored,
            computed: unsigned,
        })
    }
}

/// Parses an octal field (NUL/space padded) or GNU base-256 (high bit set).
pub fn parse_number(field: &[u8], offset: u64, name: &'static str) -> Result<u64, TarError> {
    let bad = TarError::BadNumber {
        offset,
        field: name,
    };
    if let Some(&first) = field.first()
        && first & 0x80 != 0
    {
        if first & 0x40 != 0 {
            return Err(bad); // negative
        }
        let mut v: u64 = u64::from(first & 0x3f);
        for &b in &field[1..] {
            v = v.checked_mul(256).ok_or(bad.clone())? | u64::from(b);
        }
        return Ok(v);
    }
    let mut v: u64 = 0;
    let mut seen = false;
    let mut done = false;
    for &b in field {
        match b {
            b'0'..=b'7' if !done => {
                v = v
                    .checked_mul(8)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or(bad.clone())?;
                seen = true;
            }
            b' ' if !seen => {}
            b' ' | 0 => done = true,
            _ => return Err(bad),
        }
    }
    if seen || field.iter().all(|&b| b == 0 || b == b' ') {
        Ok(v)
    } else {
        Err(bad)
    }
}

type PaxFields = (Option<Vec<u8>>, Option<u64>);

/// Parses pax records `"<len> <key>=<value>\n"`, keeping `path` and `size`.
fn parse_pax(mut data: &[u8], offset: u64) -> Result<PaxFields, TarError> {
    let bad = |reason: &str| TarError::BadPax {
        offset,
        reason: reason.into(),
    };
    let mut path = None;
    let mut size = None;
    while !data.is_empty() {
        if data.iter().all(|&b| b == 0) {
            break;
        }
        let sp = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("record without a length"))?;
        let len: usize = std::str::from_utf8(&data[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("record length is not a number"))?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("record length does not match its text"));
        }
        let rec = &data[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("record without `=`"))?;
        let (key, value) = (&rec[..eq], &rec[eq + 1..]);
        match key {
            b"path" => path = Some(value.to_vec()),
            b"size" => {
                size = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad("`size` is not a number"))?,
                )
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok((path, size))
}

impl From<TarError> for Error {
    fn from(source: TarError) -> Self {
        Error::Tar {
            shard: String::new(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Collects members, assembling split ones from their pieces.
    #[derive(Default)]
    struct Collect {
        seg: Vec<u8>,
        members: Vec<(Vec<u8>, Vec<u8>)>,
        offsets: Vec<u64>,
        open: Option<(Vec<u8>, Vec<u8>, u64)>,
        splits: usize,
    }

    impl MemberSink for Collect {
        fn whole(&mut self, name: &[u8], offset: u64, r: Range<usize>) -> Result<(), Error> {
            self.members.push((name.to_vec(), self.seg[r].to_vec()));
            self.offsets.push(offset);
            Ok(())
        }
        fn split_begin(
            &mut self,
            name: &[u8],
            offset: u64,
            size: u64,
            r: Range<usize>,
        ) -> Result<(), Error> {
            assert!(self.open.is_none());
            assert!((r.len() as u64) < size);
            self.splits += 1;
            self.open = Some((name.to_vec(), self.seg[r].to_vec(), size));
            self.offsets.push(offset);
            Ok(())
        }
        fn split_more(&mut self, r: Range<usize>, last: bool) -> Result<(), Error> {
            let (name, mut data, size) = self.open.take().expect("split open");
            assert_eq!(r.start, 0, "continuations start their segment");
            data.extend_from_slice(&self.seg[r]);
            if last {
                assert_eq!(data.len() as u64, size);
                self.members.push((name, data));
            } else {
                self.open = Some((name, data, size));
            }
            Ok(())
        }
    }

    fn walk_all(bytes: &[u8], cuts: &[usize], limit: u64) -> Result<Collect, Error> {
        let mut c = Collect::default();
        let mut w = TarWalk::new(limit);
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|&x| x % (bytes.len() + 1)).collect();
        points.push(bytes.len());
        points.sort();
        for p in points {
            c.seg = bytes[at..p].to_vec();
            w.feed(&bytes[at..p], &mut c)?;
            at = p;
        }
        w.finish()?;
        assert!(c.open.is_none());
        Ok(c)
    }

    /// Builds an archive with the `tar` crate: GNU long names where a name
    /// exceeds 100 bytes, pax headers when asked, and a directory and a
    /// symlink that must be skipped.
    fn archive(members: &[(String, Vec<u8>)], pax: bool) -> Vec<u8> {
        let mut b = ::tar::Builder::new(Vec::new());
        let mut dir = ::tar::Header::new_gnu();
        dir.set_entry_type(::tar::EntryType::Directory);
        dir.set_size(0);
        dir.set_mode(0o755);
        b.append_data(&mut dir, "somedir/", std::io::empty())
            .unwrap();
        for (i, (name, data)) in members.iter().enumerate() {
            if pax && i % 2 == 0 {
                b.append_pax_extensions([("path", name.as_bytes()), ("comment", b"x".as_slice())])
                    .unwrap();
                let mut h = ::tar::Header::new_ustar();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(::tar::EntryType::Regular);
                h.as_mut_bytes()[..4].copy_from_slice(b"junk");
                h.set_cksum();
                b.append(&h, data.as_slice()).unwrap();
            } else {
                let mut h = ::tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                b.append_data(&mut h, name, data.as_slice()).unwrap();
            }
        }
        let mut link = ::tar::Header::new_gnu();
        link.set_entry_type(::tar::EntryType::Symlink);
        link.set_size(0);
        b.append_link(&mut link, "a-link", "target").unwrap();
        b.into_inner().unwrap()
    }

    fn member_strategy() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        prop::collection::vec((1usize..260, 0usize..3000, any::<u8>()), 0..12).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (name_len, size, fill))| {
                    let mut name = format!("d/{i:04}.");
                    while name.len() < name_len {
                        name.push((b'a' + (name.len() % 26) as u8) as char);
                    }
                    let data = (0..size).map(|k| fill.wrapping_add(k as u8)).collect();
                    (name, data)
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn any_segmentation_yields_every_member_once(
            members in member_strategy(),
            pax in any::<bool>(),
            cuts in prop::collection::vec(any::<usize>(), 0..40),
        ) {
            let bytes = archive(&members, pax);
            let c = walk_all(&bytes, &cuts, u64::MAX).unwrap();
            let got: Vec<(String, Vec<u8>)> = c
                .members
                .into_iter()
                .map(|(n, d)| (String::from_utf8(n).unwrap(), d))
                .collect();
            prop_assert_eq!(got, members);
        }

        #[test]
        fn truncation_anywhere_inside_a_member_is_an_error(
            members in member_strategy(),
            cut in any::<usize>(),
        ) {
            let bytes = archive(&members, false);
            // The last byte of real content: the end of the last member's data.
            let end = bytes.len() - 1024;
            let cut = 1 + cut % end.max(1);
            match walk_all(&bytes[..cut], &[cut / 2], u64::MAX) {
                Ok(c) => {
                    // Only a cut at an entry boundary may succeed, and then
                    // with a prefix of the members.
                    prop_assert!(c.members.len() <= members.len());
                    for (got, want) in c.members.iter().zip(&members) {
                        prop_assert_eq!(&got.1, &want.1);
                    }
                }
                Err(Error::Tar { source: TarError::Truncated { offset, .. }, .. }) => {
                    prop_assert_eq!(offset, cut as u64);
                }
                // Shorter than one header block: not recognisable as tar.
                Err(Error::Tar { source: TarError::NotTar, .. }) => prop_assert!(cut < 512),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4096), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
            let _ = walk_all(&bytes, &cuts, 1 << 20);
        }
    }

    /// The worker's verdict on `bytes`: the streaming walk (segmented at
    /// `cuts`) grouped as `worker::ShardSink::member` groups, reduced to the
    /// sample count or the walk's error.
    fn streamed_samples(bytes: &[u8], cuts: &[usize], limit: u64) -> Result<u64, TarError> {
        match walk_all(bytes, cuts, limit) {
            Ok(c) => {
                let mut counter = SampleCounter::default();
                for (name, _) in &c.members {
                    counter.member(name);
                }
                Ok(counter.samples)
            }
            Err(Error::Tar { source, .. }) => Err(source),
            Err(e) => panic!("not a tar error: {e}"),
        }
    }

    fn count_bytes(bytes: &[u8], limit: u64) -> Result<u64, TarError> {
        count_samples(
            &mut |offset, buf| {
                let start = usize::try_from(offset).unwrap();
                buf.copy_from_slice(&bytes[start..start + buf.len()]);
                Ok(())
            },
            bytes.len() as u64,
            limit,
        )
    }

    /// Directories of the grouped archives: the key includes the directory;
    /// the long ones push names past 100 bytes (ustar prefix, GNU `L`, pax).
    const DIRS: [&str; 4] = [
        "",
        "shard/",
        "a-fairly-long-directory-name-to-split/another-long-directory-component/and-two-more/levels-of-it/",
        "x/yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy/",
    ];

    /// One member of a grouped archive: `DIRS[dir]`, key `k{key}`, an optional
    /// field (none: `k{key}` or `.k{key}`, not a sample), how it is written, and
    /// what comes before it.
    #[derive(Debug, Clone, Copy)]
    struct Grouped {
        dir: usize,
        key: u8,
        field: Option<u8>,
        hidden: bool,
        size: usize,
        style: u8,
        before: u8,
    }

    impl Grouped {
        fn name(&self) -> String {
            let dot = if self.hidden { "." } else { "" };
            match self.field {
                Some(f) => format!("{}{dot}k{}.f{f}.bin", DIRS[self.dir], self.key),
                None => format!("{}{dot}k{}", DIRS[self.dir], self.key),
            }
        }

        /// The sample key, when the member belongs to a sample; worked out
        /// from the parts, not with `split_name`.
        fn key(&self) -> Option<(usize, u8)> {
            (self.field.is_some() && !self.hidden).then_some((self.dir, self.key))
        }
    }

    fn grouped_strategy() -> impl Strategy<Value = Vec<Grouped>> {
        let one = (
            0usize..DIRS.len(),
            0u8..3,
            prop::option::weighted(0.85, 0u8..3),
            prop::bool::weighted(0.1),
            prop_oneof![0usize..2, 0usize..1100],
            0u8..5,
            0u8..8,
        )
            .prop_map(|(dir, key, field, hidden, size, style, before)| Grouped {
                dir,
                key,
                field,
                hidden,
                size,
                style,
                before,
            });
        prop::collection::vec(one, 0..14)
    }

    /// Writes `members` with every header form the walk reads: GNU headers
    /// (`L` long names), ustar headers (`prefix` + `name` where the name is
    /// long), pax `path` records, pax `path` + `size` records over a header
    /// whose own size is wrong, and base-256 sizes; before a member maybe a
    /// directory, a symlink, a global pax header or a lone zero block. The
    /// end is two zero blocks, one, or none (`end` 0, 1, 2).
    fn grouped_archive(members: &[Grouped], end: u8) -> Vec<u8> {
        let mut b = ::tar::Builder::new(Vec::new());
        for (i, m) in members.iter().enumerate() {
            let data: Vec<u8> = (0..m.size).map(|k| (k + i) as u8).collect();
            let name = m.name();
            match m.before {
                1 => {
                    let mut dir = ::tar::Header::new_gnu();
                    dir.set_entry_type(::tar::EntryType::Directory);
                    dir.set_size(0);
                    b.append_data(&mut dir, "somedir/", std::io::empty())
                        .unwrap();
                }
                2 => {
                    let mut link = ::tar::Header::new_gnu();
                    link.set_entry_type(::tar::EntryType::Symlink);
                    link.set_size(0);
                    b.append_link(&mut link, "k9.link", "target").unwrap();
                }
                3 => {
                    let rec = b"25 path=not/a/member.jpg\n";
                    let mut g = ::tar::Header::new_ustar();
                    g.set_entry_type(::tar::EntryType::XGlobalHeader);
                    g.set_size(rec.len() as u64);
                    g.set_path("pax_global_header").unwrap();
                    g.set_cksum();
                    b.append(&g, rec.as_slice()).unwrap();
                }
                4 if i > 0 => b.get_mut().extend_from_slice(&[0; BLOCK as usize]),
                _ => {}
            }
            match m.style {
                0 => {
                    let mut h = ::tar::Header::new_gnu();
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, &name, data.as_slice()).unwrap();
                }
                1 => {
                    let mut h = ::tar::Header::new_ustar();
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, &name, data.as_slice()).unwrap();
                }
                _ => {
                    let size = data.len().to_string();
                    let mut recs = vec![("path", name.as_bytes())];
                    if m.style == 3 {
                        recs.push(("size", size.as_bytes()));
                    }
                    b.append_pax_extensions(recs).unwrap();
                    let mut h = ::tar::Header::new_ustar();
                    h.set_path("junk").unwrap();
                    h.set_entry_type(::tar::EntryType::Regular);
                    match m.style {
                        // The pax size rules; the header's own is wrong.
                        3 => h.set_size(data.len() as u64 + 1000),
                        // GNU base-256, the form of sizes of 8 GiB and more.
                        4 => {
                            let field = &mut h.as_mut_bytes()[124..136];
                            field.fill(0);
                            field[0] = 0x80;
                            field[8..].copy_from_slice(&(data.len() as u32).to_be_bytes());
                        }
                        _ => h.set_size(data.len() as u64),
                    }
                    h.set_cksum();
                    b.append(&h, data.as_slice()).unwrap();
                }
            }
        }
        let mut bytes = b.into_inner().unwrap();
        bytes.truncate(bytes.len() - BLOCK as usize * usize::from(end.min(2)));
        bytes
    }

    /// Samples in `members`, counted from their parts.
    fn expected_samples(members: &[Grouped]) -> u64 {
        let mut samples = 0;
        let mut open = None;
        for key in members.iter().filter_map(Grouped::key) {
            if open != Some(key) {
                samples += 1;
                open = Some(key);
            }
        }
        samples
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn counts_every_key_group(members in grouped_strategy(), end in 0u8..3) {
            let bytes = grouped_archive(&members, end);
            let want = if bytes.is_empty() {
                Err(TarError::Empty)
            } else {
                Ok(expected_samples(&members))
            };
            prop_assert_eq!(count_bytes(&bytes, u64::MAX), want.clone());
            prop_assert_eq!(streamed_samples(&bytes, &[], u64::MAX), want);
        }

        #[test]
        fn counts_the_plain_archives_one_sample_per_member(
            members in member_strategy(),
            pax in any::<bool>(),
        ) {
            // Every member of `member_strategy` has its own key.
            let bytes = archive(&members, pax);
            prop_assert_eq!(count_bytes(&bytes, u64::MAX), Ok(members.len() as u64));
        }

        /// Cut short, corrupted, or under a member limit, the count gives the
        /// streaming walk's verdict: the same count or the same error.
        #[test]
        fn damaged_archives_get_the_streaming_verdict(
            members in grouped_strategy(),
            end in 0u8..3,
            cut in prop::option::of(any::<usize>()),
            flips in prop::collection::vec((any::<usize>(), 1u8..=255), 0..3),
            limit in prop_oneof![Just(u64::MAX), 0u64..1200],
            cuts in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            let mut bytes = grouped_archive(&members, end);
            if let Some(cut) = cut {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            for (at, x) in flips {
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] ^= x;
                }
            }
            prop_assert_eq!(count_bytes(&bytes, limit), streamed_samples(&bytes, &cuts, limit));
        }

        #[test]
        fn a_cut_inside_member_data_is_truncation_there(
            members in grouped_strategy(),
            pick in any::<usize>(),
            into in any::<u64>(),
        ) {
            let bytes = grouped_archive(&members, 0);
            let walked = walk_all(&bytes, &[], u64::MAX).unwrap();
            let with_data: Vec<(u64, u64)> = walked
                .offsets
                .iter()
                .zip(&walked.members)
                .filter(|(_, (_, data))| !data.is_empty())
                .map(|(&offset, (_, data))| (offset, data.len() as u64))
                .collect();
            prop_assume!(!with_data.is_empty());
            let (offset, size) = with_data[pick % with_data.len()];
            let cut = offset + into % size;
            let got = count_bytes(&bytes[..cut as usize], u64::MAX);
            prop_assert!(
                matches!(got, Err(TarError::Truncated { offset, missing, .. })
                    if offset == cut && missing > 0),
                "cut at {} gave {:?}", cut, got
            );
        }

        #[test]
        fn garbage_gets_the_streaming_verdict(
            bytes in prop::collection::vec(any::<u8>(), 0..4096),
            limit in prop_oneof![Just(u64::MAX), 0u64..4096],
        ) {
            prop_assert_eq!(count_bytes(&bytes, limit), streamed_samples(&bytes, &[], limit));
        }
    }

    fn member(dir: usize, key: u8, field: Option<u8>, style: u8) -> Grouped {
        Grouped {
            dir,
            key,
            field,
            hidden: false,
            size: 600,
            style,
            before: 0,
        }
    }

    #[test]
    fn groups_are_consecutive_keys_and_fieldless_members_do_not_split_them() {
        let m = [
            member(1, 0, Some(0), 1),
            member(1, 0, None, 0), // `shard/k0`: no field, not a sample
            member(1, 0, Some(1), 2),
            member(1, 1, Some(0), 0),
            member(1, 0, Some(2), 3), // k0 again, not consecutive: a new sample
            member(2, 0, Some(0), 1), // same basename, other directory
        ];
        let bytes = grouped_archive(&m, 0);
        // The long directory went into the ustar `prefix` field of its header.
        let walked = walk_all(&bytes, &[], u64::MAX).unwrap();
        let last_header = walked.offsets[5] as usize - BLOCK as usize;
        assert_ne!(bytes[last_header + 345], 0, "prefix field is used");
        assert_eq!(count_bytes(&bytes, u64::MAX), Ok(4));
        assert_eq!(expected_samples(&m), 4);
    }

    #[test]
    fn the_end_of_archive_is_the_walks() {
        let bytes = grouped_archive(&[member(0, 0, Some(0), 0)], 0);
        // Bytes after two zero blocks are not read.
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(&[0xAB; 700]);
        assert_eq!(count_bytes(&trailing, u64::MAX), Ok(1));
        // One zero block then EOF, or no marker at all, ends at an entry boundary.
        assert_eq!(count_bytes(&bytes[..bytes.len() - 512], u64::MAX), Ok(1));
        assert_eq!(count_bytes(&bytes[..bytes.len() - 1024], u64::MAX), Ok(1));
        // Half a zero block is half a header.
        assert!(matches!(
            count_bytes(&bytes[..bytes.len() - 768], u64::MAX),
            Err(TarError::Truncated { missing: 256, .. })
        ));
        assert_eq!(count_bytes(&[], u64::MAX), Err(TarError::Empty));
        assert_eq!(count_bytes(&[0; 100], u64::MAX), Err(TarError::NotTar));
        assert_eq!(count_bytes(&[0; 1024], u64::MAX), Ok(0));
        // An entry at byte 0 whose data ends exactly at EOF with no padding
        // left: the walk's verdict is an error "missing 0 bytes", and the
        // count's must be the same.
        let mut g = ::tar::Header::new_ustar();
        g.set_entry_type(::tar::EntryType::XGlobalHeader);
        g.set_size(0);
        g.set_cksum();
        let lone = g.as_bytes().to_vec();
        assert!(matches!(
            count_bytes(&lone, u64::MAX),
            Err(TarError::Truncated {
                offset: 512,
                missing: 0,
                ..
            })
        ));
        assert_eq!(
            count_bytes(&lone, u64::MAX),
            streamed_samples(&lone, &[], u64::MAX)
        );
    }

    #[test]
    fn member_data_is_never_read() {
        let m: Vec<Grouped> = (0..5)
            .map(|k| Grouped {
                size: 5000,
                ..member(1, k, Some(0), k % 5)
            })
            .collect();
        let bytes = grouped_archive(&m, 0);
        let walked = walk_all(&bytes, &[], u64::MAX).unwrap();
        let data: Vec<Range<u64>> = walked.offsets.iter().map(|&o| o..o + 5000).collect();
        let mut read = 0u64;
        let n = count_samples(
            &mut |offset, buf| {
                let end = offset + buf.len() as u64;
                assert!(
                    data.iter().all(|d| end <= d.start || offset >= d.end),
                    "read {offset}..{end} overlaps member data"
                );
                read += buf.len() as u64;
                buf.copy_from_slice(&bytes[offset as usize..end as usize]);
                Ok(())
            },
            bytes.len() as u64,
            u64::MAX,
        );
        assert_eq!(n, Ok(5));
        assert!(
            read < bytes.len() as u64 / 4,
            "read {read} of {}",
            bytes.len()
        );
    }

    #[test]
    fn a_failed_read_is_an_error_at_its_offset() {
        let bytes = grouped_archive(&[member(0, 0, Some(0), 0); 3], 0);
        let got = count_samples(
            &mut |offset, buf| {
                if offset > 0 {
                    return Err(std::io::Error::other("injected"));
                }
                buf.copy_from_slice(&bytes[..buf.len()]);
                Ok(())
            },
            bytes.len() as u64,
            u64::MAX,
        );
        // The first member is 512 bytes of header then 600 of data, padded to 1024.
        assert!(matches!(
            got,
            Err(TarError::Truncated { offset: 1536, missing: 512, ref inside }) if inside.contains("injected")
        ));
    }

    #[test]
    fn count_file_samples_reads_a_shard_file_and_names_it_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let m = [
            member(2, 0, Some(0), 2),
            member(2, 0, Some(1), 0),
            member(2, 1, Some(0), 4),
        ];
        let bytes = grouped_archive(&m, 0);
        let path = dir.path().join("shard-000.tar");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(count_file_samples(&path).unwrap(), 2);

        let short = dir.path().join("short.tar");
        std::fs::write(&short, &bytes[..1000]).unwrap();
        match count_file_samples(&short) {
            Err(Error::Tar {
                shard,
                source: TarError::Truncated { offset: 1000, .. },
            }) => assert_eq!(shard, short.display().to_string()),
            other => panic!("expected truncation, got {other:?}"),
        }

        let missing = dir.path().join("missing.tar");
        match count_file_samples(&missing) {
            Err(Error::Io {
                op: "open",
                path,
                errno,
                ..
            }) => {
                assert_eq!(path, missing);
                assert_eq!(errno, libc::ENOENT);
            }
            other => panic!("expected an open error, got {other:?}"),
        }
        match count_file_samples(dir.path()) {
            Err(Error::Io {
                op: "read", errno, ..
            }) => assert_eq!(errno, libc::EISDIR),
            other => panic!("expected a read error, got {other:?}"),
        }
    }

    fn tar_err(bytes: &[u8], limit: u64) -> TarError {
        match walk_all(bytes, &[], limit) {
            Err(Error::Tar { source, .. }) => source,
            Err(e) => panic!("not a tar error: {e}"),
            Ok(_) => panic!("walk succeeded"),
        }
    }

    #[test]
    fn corrupt_inputs_name_the_byte_offset() {
        let good = archive(
            &[
                ("a.jpg".into(), vec![1; 700]),
                ("b.jpg".into(), vec![2; 10]),
            ],
            false,
        );
        // Second entry (after dir header, a.jpg header + 2 data blocks) is at 512*4.
        let mut bad = good.clone();
        bad[512 * 4 + 10] ^= 0x55;
        assert!(matches!(
            tar_err(&bad, u64::MAX),
            TarError::BadChecksum { offset: 2048, .. }
        ));
        assert_eq!(
            tar_err(b"this is not a tar file at all", u64::MAX),
            TarError::NotTar
        );
        assert_eq!(tar_err(&[b'x'; 2048], u64::MAX), TarError::NotTar);
        assert_eq!(tar_err(&[], u64::MAX), TarError::Empty);
        assert!(matches!(
            tar_err(&good, 100),
            TarError::TooLarge {
                offset: 512,
                size: 700,
                limit: 100,
                ..
            }
        ));
        let mut bad_size = good.clone();
        bad_size[512 + 124..512 + 136].copy_from_slice(b"zz0000000000");
        let mut h = [0u8; 512];
        h.copy_from_slice(&bad_size[512..1024]);
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        bad_size[512 + 148..512 + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        assert!(matches!(
            tar_err(&bad_size, u64::MAX),
            TarError::BadNumber {
                offset: 512,
                field: "size"
            }
        ));
    }

    #[test]
    fn gnu_base256_sizes_and_bad_pax_records() {
        assert_eq!(
            parse_number(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00], 0, "size").unwrap(),
            256
        );
        assert!(parse_number(&[0xff; 12], 0, "size").is_err());
        assert!(matches!(
            parse_pax(b"abc", 9),
            Err(TarError::BadPax { offset: 9, .. })
        ));
        assert!(matches!(
            parse_pax(b"99 path=x\n", 9),
            Err(TarError::BadPax { .. })
        ));
        assert_eq!(
            parse_pax(b"10 path=x\n", 0).unwrap(),
            (Some(b"x".to_vec()), None)
        );
    }
}
