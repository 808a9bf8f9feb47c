//! Synthetic WebDataset shards with content that can be checked at any byte:
//! every field's bytes are a function of (seed, key, field name, length), so
//! a consumer — a test, the benchmark — can verify what it received without
//! keeping a copy. Used by `ringfeed gen`, `ringfeed demo` and the tests.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, IoOp, Result};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenOptions {
    pub shards: usize,
    /// Approximate bytes per shard; samples are added until it is reached.
    pub shard_bytes: u64,
    /// Mean size of the first field of each sample.
    pub sample_bytes: u64,
    /// Relative spread of that size: uniform in `mean * (1 ± spread)`.
    pub spread: f64,
    /// Field names; the first carries the sized payload, the others 8–64 bytes.
    pub fields: Vec<String>,
    pub seed: u64,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            shards: 8,
            shard_bytes: 64 << 20,
            // ~100 KB: a typical JPEG of an ImageNet-style dataset.
            sample_bytes: 100_000,
            spread: 0.5,
            fields: vec!["jpg".into(), "cls".into()],
            seed: 0,
        }
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct GenReport {
    pub paths: Vec<PathBuf>,
    /// Brace pattern naming every shard.
    pub pattern: String,
    pub samples: u64,
    /// Samples written to each shard, in shard order: shard `i` holds the
    /// keys `sample_key(i, j)` for `j` in `0..shard_samples[i]`.
    pub shard_samples: Vec<u64>,
    pub payload_bytes: u64,
    pub file_bytes: u64,
}

/// Name of shard `i` of `n`.
pub fn shard_name(i: usize, n: usize) -> String {
    let width = n.saturating_sub(1).to_string().len().max(6);
    format!("shard-{i:0width$}.tar")
}

/// Key of sample `j` of shard `i`.
pub fn sample_key(i: usize, j: u64) -> String {
    format!("{i:06}-{j:07}")
}

/// Writes the shards into `dir` (created if missing); `progress` gets bytes written.
pub fn generate(dir: &Path, o: &GenOptions, mut progress: impl FnMut(u64)) -> Result<GenReport> {
    if o.shards == 0 || o.fields.is_empty() || o.sample_bytes == 0 {
        return Err(Error::config(
            "gen needs at least one shard, one field and a sample size",
        ));
    }
    if !(0.0..1.0).contains(&o.spread) {
        return Err(Error::config("gen: `spread` must be in [0, 1)"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(IoOp::Create, dir, &e))?;
    let mut rng = Rng::new(o.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut report = GenReport {
        paths: Vec::new(),
        pattern: dir
            .join(format!(
                "shard-{{{}..{}}}.tar",
                shard_name(0, o.shards)
                    .trim_start_matches("shard-")
                    .trim_end_matches(".tar"),
                shard_name(o.shards - 1, o.shards)
                    .trim_start_matches("shard-")
                    .trim_end_matches(".tar")
            ))
            .display()
            .to_string(),
        samples: 0,
        shard_samples: Vec::with_capacity(o.shards),
        payload_bytes: 0,
        file_bytes: 0,
    };
    let mut buf = Vec::new();
    for i in 0..o.shards {
        let path = dir.join(shard_name(i, o.shards));
        let f = File::create(&path).map_err(|e| Error::io(IoOp::Create, &path, &e))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut written = 0u64;
        let mut j = 0u64;
        while written < o.shard_bytes {
            let key = sample_key(i, j);
            for (k, field) in o.fields.iter().enumerate() {
                let len = if k == 0 {
                    let lo = o.sample_bytes as f64 * (1.0 - o.spread);
                    let hi = o.sample_bytes as f64 * (1.0 + o.spread);
                    (lo + (hi - lo) * rng.unit()) as usize
                } else {
                    8 + (rng.next() % 57) as usize
                };
                buf.resize(len, 0);
                fill(o.seed, key.as_bytes(), field.as_bytes(), &mut buf);
                let name = format!("{key}.{field}");
                let n = write_member(&mut w, &name, &buf)
                    .map_err(|e| Error::io(IoOp::Write, &path, &e))?;
                written += n;
                report.payload_bytes += len as u64;
                progress(n);
            }
            report.samples += 1;
            j += 1;
        }
        w.write_all(&[0u8; 1024])
            .map_err(|e| Error::io(IoOp::Write, &path, &e))?;
        w.flush().map_err(|e| Error::io(IoOp::Write, &path, &e))?;
        report.file_bytes += written + 1024;
        report.shard_samples.push(j);
        report.paths.push(path);
    }
    Ok(report)
}

/// Writes one ustar member; returns bytes written (header, data, padding).
pub fn write_member(w: &mut impl Write, name: &str, data: &[u8]) -> std::io::Result<u64> {
    w.write_all(&ustar_header(name, data.len() as u64, b'0'))?;
    w.write_all(data)?;
    let pad = (512 - data.len() % 512) % 512;
    w.write_all(&[0u8; 512][..pad])?;
    Ok(512 + (data.len() + pad) as u64)
}

/// A ustar header for a member of `size` bytes (`name` up to 100 bytes).
pub fn ustar_header(name: &str, size: u64, typeflag: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    let n = name.as_bytes();
    assert!(n.len() <= 100, "ustar names hold at most 100 bytes");
    h[..n.len()].copy_from_slice(n);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Fills `buf` with the content of field `field` of sample `key`.
pub fn fill(seed: u64, key: &[u8], field: &[u8], buf: &mut [u8]) {
    let mut rng = Rng::new(content_seed(seed, key, field, buf.len()));
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&rng.next().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = rng.next().to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// True when `data` is exactly what `fill` writes for this field.
pub fn verify(seed: u64, key: &[u8], field: &[u8], data: &[u8]) -> bool {
    let mut rng = Rng::new(content_seed(seed, key, field, data.len()));
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        if c != rng.next().to_le_bytes() {
            return false;
        }
    }
    let rest = chunks.remainder();
    rest == &rng.next().to_le_bytes()[..rest.len()]
}

fn content_seed(seed: u64, key: &[u8], field: &[u8], len: usize) -> u64 {
    // FNV-1a over the identity of the field.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in key
        .iter()
        .chain(b"\0")
        .chain(field)
        .chain(&(len as u64).to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// xorshift64*: fast, and plenty for test content.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_verifies_and_differs_by_identity() {
        let mut a = vec![0u8; 1001];
        fill(7, b"k", b"jpg", &mut a);
        assert!(verify(7, b"k", b"jpg", &a));
        assert!(!verify(7, b"k", b"png", &a));
        assert!(!verify(8, b"k", b"jpg", &a));
        a[1000] ^= 1;
        assert!(!verify(7, b"k", b"jpg", &a));
    }

    #[test]
    fn headers_carry_a_valid_checksum() {
        let h = ustar_header("a/b.jpg", 1234, b'0');
        let mut sum: u64 = 0;
        for (i, &b) in h.iter().enumerate() {
            sum += u64::from(if (148..156).contains(&i) { b' ' } else { b });
        }
        assert_eq!(
            crate::tar::parse_number(&h[148..156], 0, "chksum").unwrap(),
            sum
        );
    }
}
