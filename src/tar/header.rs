//! The 512-byte tar header: its numeric fields (octal or GNU base-256), the
//! checksum, the ustar name with its `prefix`, and pax extended-header
//! records. Pure parsing of bytes the walk (`walk.rs`) has collected; no
//! state, no I/O.

use crate::error::TarError;

/// Tar block size: headers and member data are padded to it.
pub const BLOCK: u64 = 512;
/// Largest GNU long name or pax header accepted. Real names are under 4 KiB;
/// 1 MiB bounds what a corrupt size field can make us buffer.
pub const META_LIMIT: u64 = 1 << 20;

pub(super) fn pad(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Magic and version of a POSIX ustar header (ustar and pax archives).
const USTAR_MAGIC: &[u8; 6] = b"ustar\0";
/// Magic and version of an old GNU header (`--format=gnu`/`oldgnu`), which
/// keeps atime, ctime and sparse data where ustar keeps its `prefix`.
#[cfg(test)]
pub(super) const OLDGNU_MAGIC: &[u8; 8] = b"ustar  \0";

/// The name of a plain header: `prefix/name` for a POSIX ustar header,
/// `name` alone otherwise.
///
/// The `prefix` field (bytes 345..500) is read only under the POSIX magic
/// `ustar\0`: an old GNU header (magic `ustar  \0`) keeps its atime and
/// ctime there (GNU tar fills them with `--incremental`), and a v7 header
/// has no prefix. GNU tar and libarchive decide by the magic alone, and so
/// does this; the version (`00`) is not checked. Python's `tarfile` reads
/// the prefix whatever the magic (CPython issue 155629), so WebDataset
/// misnames the members of such GNU archives; see docs/webdataset-compat.md.
pub(super) fn ustar_name(h: &[u8; 512], out: &mut Vec<u8>) {
    let name = cstr(&h[0..100]);
    if &h[257..263] == USTAR_MAGIC {
        let prefix = cstr(&h[345..500]);
        if !prefix.is_empty() {
            out.extend_from_slice(prefix);
            out.push(b'/');
        }
    }
    out.extend_from_slice(name);
}

/// A header of type `0` (or the v7 `\0`) whose own name field ends in `/`
/// is a directory written the v7 way: GNU tar and Python's `tarfile` read
/// it as one, and so no data blocks follow it.
pub(super) fn is_v7_directory(h: &[u8; 512]) -> bool {
    h[156] == 0 && cstr(&h[0..100]).ends_with(b"/")
}

/// The compressed format whose magic number `start` (the first bytes of a
/// shard) begins with, and the command that decompresses it: the formats
/// Python's `tarfile` (so WebDataset) opens transparently.
pub(super) fn compression(start: &[u8]) -> Option<(&'static str, &'static str)> {
    const FORMATS: [(&[u8], &str, &str); 4] = [
        (b"\x1f\x8b", "gzip", "gunzip"),
        (b"BZh", "bzip2", "bunzip2"),
        (b"\xfd7zXZ\0", "xz", "unxz"),
        (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    ];
    FORMATS
        .iter()
        .find(|(magic, ..)| start.starts_with(magic))
        .map(|&(_, format, tool)| (format, tool))
}

pub(super) fn verify_checksum(h: &[u8; 512], offset: u64) -> Result<(), TarError> {
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

/// What a pax extended header says about the next member.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct PaxFields {
    /// `path`, without trailing slashes (as Python's `tarfile` strips them).
    pub path: Option<Vec<u8>>,
    pub size: Option<u64>,
    /// A `GNU.sparse.*` record: the member is a GNU sparse file (pax sparse
    /// formats 0.0, 0.1 and 1.0 all carry one).
    pub sparse: bool,
}

/// Parses pax records `"<len> <key>=<value>\n"`, keeping `path` and `size`
/// and noting GNU sparse records.
pub(super) fn parse_pax(mut data: &[u8], offset: u64) -> Result<PaxFields, TarError> {
    let bad = |reason: &str| TarError::BadPax {
        offset,
        reason: reason.into(),
    };
    let mut fields = PaxFields::default();
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
            b"path" => {
                let end = value.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
                fields.path = Some(value[..end].to_vec());
            }
            b"size" => {
                fields.size = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad("`size` is not a number"))?,
                )
            }
            // The member's real name (pax sparse 1.0 writes a made-up
            // `GNUSparseFile.<pid>/` path in the header); `path` wins.
            b"GNU.sparse.name" => {
                fields.sparse = true;
                if fields.path.is_none() {
                    fields.path = Some(value.to_vec());
                }
            }
            _ if key.starts_with(b"GNU.sparse.") => fields.sparse = true,
            _ => {}
        }
        data = &data[len..];
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            PaxFields {
                path: Some(b"x".to_vec()),
                ..PaxFields::default()
            }
        );
    }
}
