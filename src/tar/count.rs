//! The header-only counter: `count_samples` drives `TarWalk` over a shard
//! read at random offsets, reading headers and extended-header records and
//! passing over member data unread, so the loader learns a shard's sample
//! count at open without reading the shard. Sharing the walk keeps its
//! verdicts (counts, errors and their offsets) those of the worker's
//! streaming walk.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::sample::split_name;
use super::walk::{MemberSink, NextBytes, TarWalk};
use crate::error::{Error, IoOp, TarError};

/// Groups members into samples the way `engine::worker::ShardSink::member`
/// does: a member whose name has no field part is passed over (it neither
/// opens nor closes a sample), and a member whose key differs from the open
/// sample's starts a new one, even when that key was seen before.
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
    while walk.position() < size {
        let avail = size - walk.position();
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
                read_at(walk.position(), &mut buf).map_err(|e| TarError::Truncated {
                    offset: walk.position(),
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
    let file = File::open(path).map_err(|e| Error::io(IoOp::Open, path, &e))?;
    let size = file
        .metadata()
        .map_err(|e| Error::io(IoOp::Stat, path, &e))?
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
        Some(e) => Error::io(IoOp::Read, path, &e),
        None => Error::Tar {
            shard: path.display().to_string(),
            source,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tar::BLOCK;
    use crate::tar::fixtures::{archive, member_strategy, walk_all};
    use proptest::prelude::*;

    /// The worker's verdict on `bytes`: the streaming walk (segmented at
    /// `cuts`) grouped as `engine::worker::ShardSink::member` groups,
    /// reduced to the sample count or the walk's error.
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
    /// field (none: `k{key}`, not a sample), maybe a leading dot (`.k{key}…`:
    /// WebDataset keys it by its directory), how it is written, and what
    /// comes before it.
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
        /// from the parts, not with `split_name`: `(dir, Some(k))` for
        /// `DIRS[dir]k{k}`, `(dir, None)` for the directory itself. WebDataset's
        /// pattern makes `dir/.k0.f1.bin` and `dir/.k0` members of the sample
        /// keyed `dir/` (no component of `DIRS` has a dot), and passes over a
        /// leading dot at the top level.
        fn key(&self) -> Option<(usize, Option<u8>)> {
            if self.hidden {
                (self.dir != 0).then_some((self.dir, None))
            } else {
                self.field.is_some().then_some((self.dir, Some(self.key)))
            }
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
                op: IoOp::Open,
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
                op: IoOp::Read,
                errno,
                ..
            }) => assert_eq!(errno, libc::EISDIR),
            other => panic!("expected a read error, got {other:?}"),
        }
    }
}
