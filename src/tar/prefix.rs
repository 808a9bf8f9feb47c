//! What a shard's first bytes say about its samples: how many samples lie
//! whole in a prefix and how many bytes they take. The loader reads the
//! first mebibyte of a few remote shards when no sample counts are known
//! (`crate::engine` planning: a nominal epoch split by shard), and every
//! consumer of a job reads the same bytes, so every consumer reaches the
//! same estimate. The walk is `TarWalk` itself, so a prefix's samples are
//! grouped as the worker groups them.

use std::ops::Range;

use super::sample::split_name;
use super::walk::{MemberSink, TarWalk};
use crate::error::{Error, TarError};

/// The samples a shard's prefix holds whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCount {
    /// Samples whose every member lies in the prefix.
    pub samples: u64,
    /// Bytes from the shard's start to the end of the last of those
    /// samples' data (headers included).
    pub bytes: u64,
    /// The prefix was the whole shard: `samples` is its count.
    pub whole: bool,
}

/// Groups members into samples as `SampleCounter` in `count.rs` does (a
/// member without a field part neither opens nor closes a sample), keeping
/// where the samples end.
#[derive(Debug, Default)]
struct PrefixSink {
    /// Samples opened so far.
    opened: u64,
    /// Key of the open sample.
    key: Option<Vec<u8>>,
    /// End of the open sample's last whole member so far.
    open_end: u64,
    /// End of the last sample that a later one closed.
    closed_end: u64,
}

impl PrefixSink {
    fn member(&mut self, name: &[u8], end: u64) {
        let Some((key, _field)) = split_name(name) else {
            return;
        };
        if self.key.as_deref() != Some(key) {
            if self.key.is_some() {
                self.closed_end = self.open_end;
            }
            self.opened += 1;
            self.key = Some(key.to_vec());
        }
        self.open_end = end;
    }
}

impl MemberSink for PrefixSink {
    fn whole(&mut self, name: &[u8], offset: u64, range: Range<usize>) -> Result<(), Error> {
        self.member(name, offset + range.len() as u64);
        Ok(())
    }

    fn split_begin(
        &mut self,
        name: &[u8],
        offset: u64,
        size: u64,
        _range: Range<usize>,
    ) -> Result<(), Error> {
        // Its data runs past the prefix: its sample is the open one, and
        // the last (nothing of the prefix follows it).
        self.member(name, offset + size);
        Ok(())
    }

    fn split_more(&mut self, _range: Range<usize>, _last: bool) -> Result<(), Error> {
        Ok(())
    }
}

/// The samples the first `bytes.len()` bytes of a `size`-byte shard hold
/// whole. The walk's errors on those bytes are the shard's (a corrupt or
/// compressed shard is named the same way the worker would name it); a
/// prefix that is the whole shard gives its exact count.
pub fn count_prefix(bytes: &[u8], size: u64) -> Result<PrefixCount, TarError> {
    let whole = bytes.len() as u64 >= size;
    let bytes = &bytes[..bytes.len().min(usize::try_from(size).unwrap_or(usize::MAX))];
    let mut walk = TarWalk::new(u64::MAX);
    let mut sink = PrefixSink::default();
    walk.feed(bytes, &mut sink).map_err(|e| match e {
        Error::Tar { source, .. } => source,
        other => unreachable!("the prefix sink never fails, yet: {other}"),
    })?;
    if whole {
        walk.finish()?;
        return Ok(PrefixCount {
            samples: sink.opened,
            bytes: size,
            whole: true,
        });
    }
    // The open sample may have members past the prefix: only the samples
    // a later one closed are whole.
    Ok(PrefixCount {
        samples: sink.opened.saturating_sub(1),
        bytes: sink.closed_end,
        whole: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::count::count_samples;
    use proptest::prelude::*;

    /// A tar of `samples` samples named `s{i}` with fields of the sizes
    /// given (cycled), written with the `tar` crate.
    fn shard(samples: usize, sizes: &[usize]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..samples {
            for (f, field) in ["jpg", "cls"].iter().enumerate() {
                let len = sizes[(i * 2 + f) % sizes.len()];
                let mut h = tar::Header::new_ustar();
                h.set_size(len as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, format!("s{i:05}.{field}"), &vec![b'x'; len][..])
                    .unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    fn full_count(bytes: &[u8]) -> u64 {
        count_samples(
            &mut |offset, buf| {
                let start = usize::try_from(offset).unwrap();
                buf.copy_from_slice(&bytes[start..start + buf.len()]);
                Ok(())
            },
            bytes.len() as u64,
            u64::MAX,
        )
        .unwrap()
    }

    #[test]
    fn a_whole_shard_gives_its_count() {
        let s = shard(7, &[1000, 3]);
        let c = count_prefix(&s, s.len() as u64).unwrap();
        assert_eq!(
            c,
            PrefixCount {
                samples: 7,
                bytes: s.len() as u64,
                whole: true
            }
        );
    }

    #[test]
    fn a_prefix_counts_the_samples_it_holds_whole() {
        // Each sample: a 512-byte header + 1024 bytes, a header + 3 bytes
        // padded to 512: 2,560 bytes.
        let s = shard(10, &[1024, 3]);
        let per = 2560;
        // Cut inside sample 4's second member: samples 0..=3 are whole;
        // sample 3's data ends 512 + 3 bytes into its second member.
        let cut = 4 * per + 512 + 1024 + 200;
        let c = count_prefix(&s[..cut], s.len() as u64).unwrap();
        assert_eq!(c.samples, 4);
        assert_eq!(c.bytes, 3 * per as u64 + 512 + 1024 + 512 + 3);
        assert!(!c.whole);
        // A cut right after a sample's last member still leaves that
        // sample open: a next member of its key could follow.
        let c = count_prefix(&s[..5 * per], s.len() as u64).unwrap();
        assert_eq!(c.samples, 4);
    }

    #[test]
    fn garbage_is_the_walks_named_error() {
        let mut s = shard(3, &[100]);
        s[1024 + 148] ^= 0x55; // the second member's header's checksum
        let want = count_samples(
            &mut |offset, buf| {
                let start = usize::try_from(offset).unwrap();
                buf.copy_from_slice(&s[start..start + buf.len()]);
                Ok(())
            },
            s.len() as u64,
            u64::MAX,
        )
        .unwrap_err();
        assert!(
            matches!(want, TarError::BadNumber { offset: 1024, .. }),
            "{want:?}"
        );
        assert_eq!(count_prefix(&s, s.len() as u64).unwrap_err(), want);
        assert_eq!(count_prefix(&s[..1536], s.len() as u64).unwrap_err(), want);
        // Bytes that are no tar at all, given whole.
        let junk = [b'x'; 1024];
        let e = count_prefix(&junk, junk.len() as u64).unwrap_err();
        assert!(!matches!(e, TarError::Truncated { .. }), "{e:?}");
    }

    proptest! {
        /// Whatever the cut, the whole samples of a prefix are at most the
        /// shard's count, and at least the count less the samples the cut
        /// can reach; the whole shard is its exact count.
        #[test]
        fn a_prefix_never_counts_more_than_the_shard(
            samples in 0usize..30,
            sizes in prop::collection::vec(0usize..3000, 1..5),
            cut in 0f64..1.0,
        ) {
            let s = shard(samples, &sizes);
            let total = full_count(&s);
            let at = (s.len() as f64 * cut) as usize;
            let c = count_prefix(&s[..at], s.len() as u64).unwrap();
            prop_assert!(c.samples <= total);
            prop_assert!(c.bytes <= at as u64);
            let whole = count_prefix(&s, s.len() as u64).unwrap();
            prop_assert_eq!(whole.samples, total);
        }
    }
}
