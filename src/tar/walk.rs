//! The streaming walk: `TarWalk` turns the segments of one shard (the
//! chunks a worker filled, in file order, split anywhere) into member events
//! for a `MemberSink`, buffering only what crosses a segment end inside
//! metadata (a header, a long name, a pax block; bounded by `META_LIMIT`).
//! Member data is never copied: the sink gets ranges of the segment fed.

use std::ops::Range;

use super::header::{BLOCK, META_LIMIT, pad, parse_number, parse_pax, ustar_name, verify_checksum};
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
}
