//! The streaming walk: `TarWalk` turns the segments of one shard (the
//! chunks a worker filled, in file order, split anywhere) into member events
//! for a `MemberSink`, buffering only what crosses a segment end inside
//! metadata (a header, a long name, a pax block; bounded by `META_LIMIT`).
//! Member data is never copied: the sink gets ranges of the segment fed.

use std::ops::Range;

use super::header::{
    BLOCK, META_LIMIT, compression, is_v7_directory, pad, parse_number, parse_pax, ustar_name,
    verify_checksum,
};
use crate::error::{Error, TarError};

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
    /// A pax header with `GNU.sparse.*` records: the next member is sparse.
    next_sparse: bool,
    /// Name of the member whose data is being walked.
    pub(super) name: Vec<u8>,
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
            next_sparse: false,
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

    /// Header-only walking (`count_samples`): what the walk does with the
    /// bytes at `position()`.
    pub(super) fn next_bytes(&self) -> NextBytes {
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
    pub(super) fn pass_unread(&mut self, n: u64) -> bool {
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

    /// Called at the end of the shard, once every byte of it was fed (so
    /// `position()` is the shard's length).
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
            State::Header if self.entry_offset == 0 => {
                match compression(&self.hdr[..self.hdr_fill]) {
                    Some((format, tool)) => Err(TarError::Compressed { format, tool }),
                    None => Err(TarError::NotTar),
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
        if let Err(e) = verify_checksum(h, offset) {
            // A `.tar.gz` (or other compressed) shard fails here, at byte 0.
            return Err(match compression(h) {
                Some((format, tool)) if offset == 0 => TarError::Compressed { format, tool },
                _ => e,
            }
            .into());
        }
        let typeflag = h[156];
        let mut size = parse_number(&h[124..136], offset, "size")?;
        match typeflag {
            0 if is_v7_directory(h) => self.skip_entry(),
            b'0' | 0 | b'7' | b'S' => {
                if let Some(s) = self.next_size.take() {
                    size = s;
                }
                self.name.clear();
                match self.next_name.take() {
                    Some(n) => self.name = n,
                    None => ustar_name(h, &mut self.name),
                }
                if typeflag == b'S' || std::mem::take(&mut self.next_sparse) {
                    return Err(TarError::Sparse {
                        offset,
                        name: String::from_utf8_lossy(&self.name).into_owned(),
                    }
                    .into());
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
            // `X`: the Solaris extended header, read as pax (as `tarfile` does).
            b'L' | b'K' | b'x' | b'X' => {
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
            // Hard links, symlinks, devices, directories, FIFOs: no data
            // blocks follow, whatever the size field says. WebDataset skips
            // them too (`tarfile` says they are not regular files); a hard
            // link's data is its target's, already given under that name.
            b'1'..=b'6' => self.skip_entry(),
            // Global pax headers, volume labels, GNU dump directories,
            // vendor types: their data is not a sample member; pass over it.
            _ => {
                self.skip_entry();
                // A base-256 size can be up to 2^64 - 1: with its padding
                // it would wrap, and the walk would skip a few bytes and
                // read the entry's data as headers. No shard holds such an
                // entry; the size is what is wrong.
                let remaining = size.checked_add(pad(size)).ok_or(TarError::BadNumber {
                    offset,
                    field: "size",
                })?;
                self.state = State::Skip { remaining };
            }
        }
        Ok(())
    }

    /// An entry that is not a member: counted, and what extended headers
    /// said about it goes with it.
    fn skip_entry(&mut self) {
        self.counts.skipped += 1;
        self.next_name = None;
        self.next_size = None;
        self.next_sparse = false;
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
                let pax = parse_pax(&self.meta, self.entry_offset)?;
                if let Some(p) = pax.path {
                    self.next_name = Some(p);
                }
                if let Some(s) = pax.size {
                    self.next_size = Some(s);
                }
                self.next_sparse |= pax.sparse;
            }
        }
        Ok(())
    }
}

/// What the walk does with the bytes at its position (see `TarWalk::next_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NextBytes {
    /// It must see the next this many bytes: a header, or extended-header records.
    Read(u64),
    /// It passes over the next this many bytes without looking: member data,
    /// padding, or the data of a skipped entry.
    Pass(u64),
    /// The end-of-archive marker was seen; later bytes are ignored.
    Done,
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
    use crate::tar::fixtures::{archive, member_strategy, walk_all};
    use proptest::prelude::*;

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

    /// A raw header: `name`, type, size, the 8 bytes of magic and version
    /// at 257, and `tail` written at 345 (a ustar prefix, or old GNU atime
    /// and ctime), with its checksum.
    fn raw_header(name: &[u8], typeflag: u8, size: u64, magic: &[u8; 8], tail: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; BLOCK as usize];
        h[..name.len()].copy_from_slice(name);
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        h[136..148].copy_from_slice(b"15303462466\0");
        h[156] = typeflag;
        h[257..265].copy_from_slice(magic);
        h[345..345 + tail.len()].copy_from_slice(tail);
        h[148..156].fill(b' ');
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    /// An entry: its header, then `data` padded to whole blocks.
    fn entry(header: Vec<u8>, data: &[u8]) -> Vec<u8> {
        let mut out = header;
        out.extend_from_slice(data);
        out.resize(out.len() + pad(data.len() as u64) as usize, 0);
        out
    }

    fn names(bytes: &[u8]) -> Vec<String> {
        let c = walk_all(bytes, &[100, 700], u64::MAX).unwrap();
        c.members
            .iter()
            .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    const USTAR: &[u8; 8] = b"ustar\x0000";
    const V7: &[u8; 8] = &[0; 8];

    #[test]
    fn the_prefix_is_read_only_from_a_posix_ustar_header() {
        use crate::tar::header::OLDGNU_MAGIC;
        // GNU tar --incremental: atime and ctime where ustar has `prefix`.
        let times = b"15303462466\x0015303462466\x00";
        let mut bytes = entry(
            raw_header(b"000001.jpg", b'0', 3, OLDGNU_MAGIC, times),
            b"abc",
        );
        bytes.extend(entry(
            raw_header(b"000001.json", b'0', 2, USTAR, b"pre/fix"),
            b"{}",
        ));
        bytes.extend(entry(raw_header(b"000002.jpg", b'0', 1, V7, times), b"x"));
        // Magic `ustar\0` with another version: the magic decides.
        bytes.extend(entry(
            raw_header(b"000003.jpg", b'0', 1, b"ustar\0\0\0", b"p"),
            b"y",
        ));
        bytes.extend([0; 1024]);
        assert_eq!(
            names(&bytes),
            [
                "000001.jpg",
                "pre/fix/000001.json",
                "000002.jpg",
                "p/000003.jpg"
            ]
        );
    }

    #[test]
    fn compressed_shards_are_refused_naming_the_format() {
        for (magic, format, tool) in [
            (&b"\x1f\x8b\x08\x00"[..], "gzip", "gunzip"),
            (b"BZh91AY&SY", "bzip2", "bunzip2"),
            (b"\xfd7zXZ\x00\x00", "xz", "unxz"),
            (b"\x28\xb5\x2f\xfd\x00", "zstd", "unzstd"),
        ] {
            for len in [20, 600, 5000] {
                let mut bytes = magic.to_vec();
                bytes.resize(len, 0x5a);
                assert_eq!(
                    tar_err(&bytes, u64::MAX),
                    TarError::Compressed { format, tool },
                    "{format}, {len} bytes"
                );
            }
        }
        let e = TarError::Compressed {
            format: "gzip",
            tool: "gunzip",
        };
        assert!(e.to_string().contains("gzip-compressed"), "{e}");
        assert!(e.to_string().contains("gunzip"), "{e}");
        // Garbage that is not compressed stays `NotTar`.
        assert_eq!(tar_err(&[0x1f; 600], u64::MAX), TarError::NotTar);
    }

    #[test]
    fn sparse_members_are_refused_naming_the_member() {
        use crate::tar::header::OLDGNU_MAGIC;
        let good = entry(raw_header(b"a.txt", b'0', 1, USTAR, b""), b"a");
        // Old GNU sparse (`--format=gnu --sparse`): type `S`.
        let mut gnu = good.clone();
        let at = gnu.len() as u64;
        gnu.extend(entry(
            raw_header(b"b.bin", b'S', 2, OLDGNU_MAGIC, b""),
            b"bb",
        ));
        assert_eq!(
            tar_err(&gnu, u64::MAX),
            TarError::Sparse {
                offset: at,
                name: "b.bin".into()
            }
        );
        // pax sparse 1.0 (`--format=posix --sparse`): the real name is in
        // `GNU.sparse.name`, the header's is made up.
        let recs = b"22 GNU.sparse.major=1\n22 GNU.sparse.minor=0\n27 GNU.sparse.name=./c.bin\n";
        let mut pax = good.clone();
        let at = pax.len() as u64 + 512 + 512;
        pax.extend(entry(
            raw_header(b"PaxHeaders/c.bin", b'x', recs.len() as u64, USTAR, b""),
            recs,
        ));
        pax.extend(entry(
            raw_header(b"GNUSparseFile.1/c.bin", b'0', 3, USTAR, b""),
            b"ccc",
        ));
        assert_eq!(
            tar_err(&pax, u64::MAX),
            TarError::Sparse {
                offset: at,
                name: "./c.bin".into()
            }
        );
        let e = TarError::Sparse {
            offset: 7,
            name: "x".into(),
        };
        assert!(e.to_string().contains("--sparse"), "{e}");
    }

    #[test]
    fn entries_read_as_tarfile_reads_them() {
        let mut bytes = Vec::new();
        // A v7 directory: type `\0` and a trailing slash; no data follows
        // even when its size field says so.
        bytes.extend(raw_header(b"dir.d/", 0, 1024, V7, b""));
        // A hard link's size field is not data either.
        bytes.extend(raw_header(b"k.lnk", b'1', 700, USTAR, b""));
        // A Solaris extended header is pax; `path` loses trailing slashes.
        let rec = b"17 path=s/k.txt/\n";
        bytes.extend(entry(
            raw_header(b"X", b'X', rec.len() as u64, USTAR, b""),
            rec,
        ));
        bytes.extend(entry(raw_header(b"junk", b'0', 2, USTAR, b""), b"ok"));
        bytes.extend([0; 1024]);
        let c = walk_all(&bytes, &[], u64::MAX).unwrap();
        assert_eq!(c.members, [(b"s/k.txt".to_vec(), b"ok".to_vec())]);
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

    /// A vendor entry whose base-256 size is 2^64 - 1: its size plus its
    /// padding would wrap to 0, and the walk would read its data as the
    /// next header. It is a bad size, named.
    #[test]
    fn a_size_that_would_wrap_with_its_padding_is_a_bad_number() {
        let mut h = [0u8; 512];
        h[..4].copy_from_slice(b"vend");
        h[100..108].copy_from_slice(b"0000644\0");
        h[124] = 0x80;
        for b in &mut h[128..136] {
            *b = 0xff;
        }
        h[156] = b'V'; // a volume label: data that is no member
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut bytes = h.to_vec();
        bytes.extend_from_slice(&[0u8; 2048]);
        assert_eq!(
            tar_err(&bytes, u64::MAX),
            TarError::BadNumber {
                offset: 0,
                field: "size"
            }
        );
    }
}
