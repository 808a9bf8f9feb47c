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
