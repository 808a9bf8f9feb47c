//! The tar walk (`ringfeed::tar`): arbitrary bytes, fed as one segment and
//! as segments cut where the input says.
//!
//! Asserts: the same members (name, shard offset, size), the same counts
//! and the same error whatever the cuts; every piece the walk hands out is
//! the member's own bytes (its range in the segment is the member's offset
//! in the shard, pieces follow each other and add up to the size); the
//! header-only counter reaches the streaming walk's verdict (its sample
//! count, or the same error); errors are `Error::Tar` values.

use std::ops::Range;

use ringfeed::Error;
use ringfeed::error::TarError;
use ringfeed::fuzzing::{MemberSink, TarWalk, WalkCounts, count_samples, split_name};

use super::{Input, segment_ends};

/// A member as the walk reported it: name, shard offset of its data, size.
type Member = (Vec<u8>, u64, u64);

#[derive(Debug, PartialEq, Eq)]
struct Walked {
    members: Vec<Member>,
    counts: WalkCounts,
}

/// Checks every piece against the shard and keeps the members.
struct Checker<'a> {
    shard: &'a [u8],
    /// Shard offset of the segment being fed.
    seg_start: u64,
    seg_len: usize,
    members: Vec<Member>,
    /// The split member: its next data offset and bytes still to come.
    open: Option<(u64, u64)>,
}

impl Checker<'_> {
    fn piece(&self, offset: u64, range: &Range<usize>) {
        assert!(
            range.start <= range.end && range.end <= self.seg_len,
            "{range:?} out of the segment"
        );
        assert_eq!(
            self.seg_start + range.start as u64,
            offset,
            "a piece handed out is not at its member's offset"
        );
    }
}

impl MemberSink for Checker<'_> {
    fn whole(&mut self, name: &[u8], offset: u64, range: Range<usize>) -> Result<(), Error> {
        assert!(self.open.is_none(), "a member began inside a split one");
        self.piece(offset, &range);
        let end = offset + range.len() as u64;
        assert!(end <= self.shard.len() as u64);
        self.members
            .push((name.to_vec(), offset, range.len() as u64));
        Ok(())
    }

    fn split_begin(
        &mut self,
        name: &[u8],
        offset: u64,
        size: u64,
        range: Range<usize>,
    ) -> Result<(), Error> {
        assert!(self.open.is_none(), "a member began inside a split one");
        self.piece(offset, &range);
        assert_eq!(range.end, self.seg_len, "a first piece ends its segment");
        assert!(
            (range.len() as u64) < size,
            "a split member fits its segment"
        );
        self.members.push((name.to_vec(), offset, size));
        self.open = Some((offset + range.len() as u64, size - range.len() as u64));
        Ok(())
    }

    fn split_more(&mut self, range: Range<usize>, last: bool) -> Result<(), Error> {
        let (next, left) = self.open.take().expect("split_more without split_begin");
        assert_eq!(range.start, 0, "a continuation starts its segment");
        self.piece(next, &range);
        let n = range.len() as u64;
        assert!(n <= left, "more bytes than the member has");
        assert_eq!(last, n == left, "`last` is the piece that ends the member");
        if !last {
            assert_eq!(range.end, self.seg_len, "a middle piece fills its segment");
            self.open = Some((next + n, left - n));
        }
        Ok(())
    }
}

fn walk(shard: &[u8], ends: &[usize], limit: u64) -> Result<Walked, TarError> {
    let mut w = TarWalk::new(limit);
    let mut c = Checker {
        shard,
        seg_start: 0,
        seg_len: 0,
        members: Vec::new(),
        open: None,
    };
    let mut at = 0;
    for &end in ends {
        c.seg_start = at as u64;
        c.seg_len = end - at;
        w.feed(&shard[at..end], &mut c).map_err(tar_error)?;
        assert_eq!(w.position(), end as u64);
        at = end;
    }
    w.finish()?;
    assert!(c.open.is_none(), "the walk finished inside a member");
    Ok(Walked {
        members: c.members,
        counts: w.counts(),
    })
}

fn tar_error(e: Error) -> TarError {
    match e {
        Error::Tar { source, .. } => source,
        other => panic!("the walk failed with a non-tar error: {other:?}"),
    }
}

/// Samples as the worker groups members: a change of key starts one.
fn samples(members: &[Member]) -> u64 {
    let mut n = 0;
    let mut key: Option<&[u8]> = None;
    for (name, _, _) in members {
        if let Some((k, _)) = split_name(name)
            && key != Some(k)
        {
            n += 1;
            key = Some(k);
        }
    }
    n
}

/// The figures an error reports, against the shard of `len` bytes walked
/// (whatever the member limit): impossible ones (a truncation that misses no
/// byte, a checksum error whose sums agree, an offset past the end) mean an
/// arithmetic slip on hostile sizes.
fn figures_hold(e: &TarError, len: u64) {
    let block = |offset: u64, what: &str| {
        assert!(
            offset % 512 == 0,
            "{what} at byte {offset}, not a block boundary: {e}"
        );
        assert!(
            offset < len,
            "{what} at byte {offset} of a {len}-byte shard: {e}"
        );
    };
    match e {
        TarError::NotTar | TarError::Empty | TarError::Compressed { .. } => {}
        TarError::BadChecksum {
            offset,
            stored,
            computed,
        } => {
            block(*offset, "a bad checksum");
            assert_ne!(stored, computed, "{e}");
        }
        TarError::BadNumber { offset, .. } | TarError::BadPax { offset, .. } => {
            assert!(*offset < len, "{e}");
        }
        TarError::Sparse { offset, .. } => block(*offset, "a sparse member"),
        TarError::TooLarge {
            offset,
            size,
            limit: l,
            ..
        } => {
            assert!(size > l, "over the limit but not over it: {e}");
            assert!(*offset < len, "{e}");
        }
        TarError::Truncated {
            offset, missing, ..
        } => {
            assert!(*missing > 0, "a truncation that misses no byte: {e}");
            assert!(*offset <= len, "{e}");
            assert!(
                offset.checked_add(*missing).is_some_and(|end| end > len),
                "a truncation that the shard's bytes would have covered: {e}"
            );
        }
    }
}

pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    // Member-size limits: none, a chunk-like one, and one small enough to
    // meet often.
    let limit = match input.byte() % 4 {
        0 | 1 => u64::MAX,
        2 => 1 << 20,
        _ => 700,
    };
    let cuts = input.cuts(16);
    let shard = input.rest();

    let whole = walk(shard, &[shard.len()], limit);
    if let Err(e) = &whole {
        figures_hold(e, shard.len() as u64);
    }
    let split = walk(shard, &segment_ends(&cuts, shard.len()), limit);
    assert_eq!(whole, split, "the cuts {cuts:?} changed the walk");

    let counted = count_samples(
        &mut |offset, buf| {
            let start = usize::try_from(offset).expect("small input");
            buf.copy_from_slice(&shard[start..start + buf.len()]);
            Ok(())
        },
        shard.len() as u64,
        limit,
    );
    if let Err(e) = &counted {
        figures_hold(e, shard.len() as u64);
    }
    assert_eq!(
        counted,
        whole.map(|w| samples(&w.members)),
        "the header-only count differs from the streaming walk"
    );
}
