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

use std::ops::Range;

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
