//! One cache entry on disk: a header that names exactly what the bytes are
//! (the object's identity: endpoint, bucket and key, ETag or Last-Modified,
//! and the byte range) with a checksum of the data, then the data at a
//! block boundary (so a later read may be O_DIRECT). Written to a temporary
//! file and renamed into place, so a reader sees a whole entry or none;
//! read back only when the header, the identity, the length and the
//! checksum all agree, so a torn, truncated, corrupt or stale entry is a
//! miss, never wrong bytes.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0   magic  b"RFCACHE1"
//! 8   u32    identity length I
//! 12  u32    CRC32C of the data
//! 16  u64    data length N
//! 24  u32    CRC32C of bytes 0..24 and the identity
//! 28  I      identity (UTF-8)
//! ..  pad to DATA_ALIGN
//! D   N      data
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crc_fast::{CrcAlgorithm, checksum};

const MAGIC: &[u8; 8] = b"RFCACHE1";
const FIXED: usize = 28;
/// Where the data starts: a multiple of every block size O_DIRECT needs.
pub const DATA_ALIGN: usize = 4096;
/// Identities are URLs and tags; anything longer is not one of ours.
pub const MAX_IDENTITY: usize = 3072;

/// What a cached range is: the same bytes of the same version of the
/// same object. Two ranges are the same entry only if every field agrees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `scheme://host:port` of the server, or `file` for local data.
    pub endpoint: String,
    /// The object's path on it: `bucket/key` for S3.
    pub object: String,
    /// The version the server gave: its ETag, else its Last-Modified.
    pub version: String,
    pub offset: u64,
    pub len: u64,
}

impl Identity {
    /// The identity as stored in the header: fields joined by a byte no
    /// field holds (`\n`; URLs and tags never do).
    pub fn text(&self) -> Result<String, String> {
        for (name, f) in [
            ("endpoint", &self.endpoint),
            ("object", &self.object),
            ("version", &self.version),
        ] {
            if f.contains('\n') {
                return Err(format!("a cache identity's {name} holds a line break"));
            }
        }
        let t = format!(
            "{}\n{}\n{}\n{}\n{}",
            self.endpoint, self.object, self.version, self.offset, self.len
        );
        if t.len() > MAX_IDENTITY {
            return Err(format!(
                "a cache identity of {} bytes is over {MAX_IDENTITY}",
                t.len()
            ));
        }
        Ok(t)
    }

    /// The entry's file name: a hash of the identity, so every process
    /// finds the same entry; the header's identity decides a collision.
    pub fn file_name(&self) -> Result<String, String> {
        let t = self.text()?;
        let h = checksum(CrcAlgorithm::Crc64Nvme, t.as_bytes());
        Ok(format!("{h:016x}.rfc"))
    }
}

/// Where the data starts for an identity of `i` bytes.
pub fn data_offset(i: usize) -> usize {
    (FIXED + i).next_multiple_of(DATA_ALIGN)
}

/// The header of an entry for `identity` holding `data`, padded to
/// [`data_offset`].
pub fn header(identity: &str, data: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(data_offset(identity.len()));
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    let crc = checksum(CrcAlgorithm::Crc32Iscsi, data) as u32;
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let mut covered = h.clone();
    covered.extend_from_slice(identity.as_bytes());
    let hcrc = checksum(CrcAlgorithm::Crc32Iscsi, &covered) as u32;
    h.extend_from_slice(&hcrc.to_le_bytes());
    h.extend_from_slice(identity.as_bytes());
    h.resize(data_offset(identity.len()), 0);
    h
}

/// A parsed header: where the data is and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub identity: String,
    pub data_crc: u32,
    pub data_len: u64,
    pub data_offset: usize,
}

/// Why an entry was not used. Every one is a miss; the caller drops the
/// file (and counts a corrupt one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// Not an entry of this format (or torn inside the fixed header).
    NotAnEntry(String),
    /// A whole entry of another identity: a hash collision or a changed
    /// object under the same name.
    OtherIdentity,
    /// The data is shorter or longer than the header says, or fails its
    /// checksum.
    Corrupt(String),
}

/// Parses the fixed header and the identity from the start of a file.
pub fn parse_header(bytes: &[u8]) -> Result<Header, Bad> {
    if bytes.len() < FIXED {
        return Err(Bad::NotAnEntry(format!("{} bytes, no header", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(Bad::NotAnEntry("no magic".into()));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
    let ilen = u32_at(8) as usize;
    if ilen > MAX_IDENTITY {
        return Err(Bad::NotAnEntry(format!("identity of {ilen} bytes")));
    }
    let Some(identity) = bytes.get(FIXED..FIXED + ilen) else {
        return Err(Bad::NotAnEntry("torn identity".into()));
    };
    let mut covered = bytes[..24].to_vec();
    covered.extend_from_slice(identity);
    if checksum(CrcAlgorithm::Crc32Iscsi, &covered) as u32 != u32_at(24) {
        return Err(Bad::NotAnEntry("header checksum".into()));
    }
    let identity = String::from_utf8(identity.to_vec())
        .map_err(|_| Bad::NotAnEntry("identity not UTF-8".into()))?;
    Ok(Header {
        identity,
        data_crc: u32_at(12),
        data_len: u64::from_le_bytes(bytes[16..24].try_into().unwrap_or([0; 8])),
        data_offset: data_offset(ilen),
    })
}

/// Checks `data` against its header.
pub fn check_data(h: &Header, data: &[u8]) -> Result<(), Bad> {
    if data.len() as u64 != h.data_len {
        return Err(Bad::Corrupt(format!(
            "{} data bytes, the header says {}",
            data.len(),
            h.data_len
        )));
    }
    if checksum(CrcAlgorithm::Crc32Iscsi, data) as u32 != h.data_crc {
        return Err(Bad::Corrupt("data checksum".into()));
    }
    Ok(())
}

/// Writes an entry for `id` holding `data` into `dir`, whole or not at
/// all: a temporary file renamed over the entry's name (a reader holding
/// the old file keeps reading it). Returns the entry's path.
pub fn store(dir: &Path, id: &Identity, data: &[u8]) -> std::io::Result<PathBuf> {
    let text = id.text().map_err(std::io::Error::other)?;
    let name = id.file_name().map_err(std::io::Error::other)?;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        // Relaxed: only makes names unique within the process.
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(&header(&text, data))?;
        f.write_all(data)?;
        std::fs::rename(&tmp, dir.join(&name))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(dir.join(name))
}

/// Reads the entry for `id` from `dir`: `Ok(Some(data))` on a hit,
/// `Ok(None)` when there is none, `Err(bad)` when the file there is not a
/// good entry for `id` (the caller drops it).
pub fn load(dir: &Path, id: &Identity) -> std::io::Result<Result<Option<Vec<u8>>, Bad>> {
    let text = id.text().map_err(std::io::Error::other)?;
    let path = dir.join(id.file_name().map_err(std::io::Error::other)?);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let h = match parse_header(&bytes) {
        Ok(h) => h,
        Err(b) => return Ok(Err(b)),
    };
    if h.identity != text {
        return Ok(Err(Bad::OtherIdentity));
    }
    let data = bytes.get(h.data_offset..).unwrap_or(&[]);
    if let Err(b) = check_data(&h, data) {
        return Ok(Err(b));
    }
    Ok(Ok(Some(data.to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(version: &str, offset: u64, len: u64) -> Identity {
        Identity {
            endpoint: "http://127.0.0.1:9000".into(),
            object: "bucket/train/shard-000001.tar".into(),
            version: version.into(),
            offset,
            len,
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + 7) as u8).collect()
    }

    #[test]
    fn entries_round_trip_at_an_aligned_offset() {
        let dir = tempfile::tempdir().unwrap();
        for n in [0, 1, 4095, 4096, 100_000] {
            let k = id("\"etag-1\"", 0, n as u64);
            let path = store(dir.path(), &k, &data(n)).unwrap();
            let raw = std::fs::read(&path).unwrap();
            let h = parse_header(&raw).unwrap();
            assert_eq!(h.data_offset % DATA_ALIGN, 0);
            assert_eq!(raw.len(), h.data_offset + n);
            assert_eq!(load(dir.path(), &k).unwrap(), Ok(Some(data(n))));
        }
        // No temporary file is left.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".rfc")), "{names:?}");
    }

    #[test]
    fn another_version_or_range_is_a_miss_never_stale_bytes() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &id("\"v1\"", 0, 10), &data(10)).unwrap();
        assert_eq!(load(dir.path(), &id("\"v2\"", 0, 10)).unwrap(), Ok(None));
        assert_eq!(load(dir.path(), &id("\"v1\"", 10, 10)).unwrap(), Ok(None));
        // The same name holding another identity (a collision, forced
        // here by copying the file): refused by the header's identity.
        let a = id("\"v1\"", 0, 10);
        let b = id("\"v3\"", 0, 10);
        std::fs::copy(
            dir.path().join(a.file_name().unwrap()),
            dir.path().join(b.file_name().unwrap()),
        )
        .unwrap();
        assert_eq!(load(dir.path(), &b).unwrap(), Err(Bad::OtherIdentity));
    }

    #[test]
    fn torn_truncated_and_flipped_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let k = id("\"e\"", 0, 9000);
        let path = store(dir.path(), &k, &data(9000)).unwrap();
        let good = std::fs::read(&path).unwrap();
        let h = parse_header(&good).unwrap();
        // Every cut and a flip at every region of the file: a miss, never data.
        let mut cuts: Vec<usize> = (0..40).collect();
        cuts.extend([
            h.data_offset - 1,
            h.data_offset,
            h.data_offset + 1,
            good.len() - 1,
        ]);
        for cut in cuts {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(
                load(dir.path(), &k).unwrap().is_err(),
                "a file cut at {cut} was used"
            );
        }
        for at in [0, 9, 13, 17, 25, 30, h.data_offset, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                load(dir.path(), &k).unwrap().is_err(),
                "a flip at byte {at} was used"
            );
        }
        // Appended bytes are refused too.
        let mut long = good.clone();
        long.push(0);
        std::fs::write(&path, &long).unwrap();
        assert!(matches!(
            load(dir.path(), &k).unwrap(),
            Err(Bad::Corrupt(_))
        ));
    }

    #[test]
    fn identities_that_cannot_be_stored_are_named() {
        let mut k = id("a\nb", 0, 1);
        assert!(k.text().unwrap_err().contains("version"));
        k.version = "x".repeat(MAX_IDENTITY);
        assert!(k.text().unwrap_err().contains("over"));
        for garbage in [&b""[..], b"RFCACHE1", b"not an entry at all, not at all"] {
            assert!(matches!(parse_header(garbage), Err(Bad::NotAnEntry(_))));
        }
    }
}
