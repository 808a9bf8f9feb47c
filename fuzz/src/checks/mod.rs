//! What each fuzz target asserts, one file per parser of outside bytes. The
//! fuzz targets (`fuzz/fuzz_targets/`) call these, and so does
//! `tests/fuzz_corpus.rs`, which replays the committed corpora in the
//! ordinary test suite; so the properties are written once, and a corpus
//! input that once crashed stays a test.
//!
//! A check panics when a property fails. Inputs are raw bytes: the first
//! bytes of some are parameters (chunk splits, a range), read by [`Input`],
//! so seeds stay plain files and every byte is the fuzzer's to change.

pub mod cache;
pub mod config;
pub mod glob;
pub mod http;
pub mod hub;
pub mod image;
pub mod manifest;
pub mod node;
pub mod resume;
pub mod s3;
pub mod tar;

/// Reads parameters off the front of a fuzz input; past its end, zeros.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `max` cut points (each taken modulo the length cut later).
    pub fn cuts(&mut self, max: u8) -> Vec<usize> {
        let n = self.byte() % (max + 1);
        (0..n).map(|_| self.u32() as usize).collect()
    }

    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// `cuts` (any numbers) as sorted segment ends within `0..=len`, ending at `len`.
pub fn segment_ends(cuts: &[usize], len: usize) -> Vec<usize> {
    let mut points: Vec<usize> = cuts.iter().map(|&c| c % (len + 1)).collect();
    points.push(len);
    points.sort_unstable();
    points
}
