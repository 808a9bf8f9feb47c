//! Test fixtures shared by the walk's and the counter's tests: a sink that
//! collects members (assembling split ones), a driver that feeds an archive
//! cut at arbitrary points, and archives built with the `tar` crate.

use std::ops::Range;

use proptest::prelude::*;

use crate::error::Error;
use crate::tar::{MemberSink, TarWalk};

/// Collects members, assembling split ones from their pieces.
#[derive(Default)]
pub(super) struct Collect {
    pub(super) seg: Vec<u8>,
    pub(super) members: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) offsets: Vec<u64>,
    pub(super) open: Option<(Vec<u8>, Vec<u8>, u64)>,
    pub(super) splits: usize,
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

pub(super) fn walk_all(bytes: &[u8], cuts: &[usize], limit: u64) -> Result<Collect, Error> {
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
pub(super) fn archive(members: &[(String, Vec<u8>)], pax: bool) -> Vec<u8> {
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

pub(super) fn member_strategy() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
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
