//! S3's checksums of a request body: which `x-amz-checksum-*` a request
//! carries, whether it and `Content-MD5` match the bytes (checked before
//! anything is stored), and the CRCs of a part kept so that a whole
//! object's CRC is combined from its parts' without reading it again.

use base64::Engine as _;
use md5::Digest as _;
use s3s::dto::ChecksumAlgorithm;
use s3s::{S3Error, S3Result, s3_error};

/// A checksum algorithm of S3's `x-amz-checksum-*` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    pub(super) fn parse(s: &str) -> S3Result<Algorithm> {
        Ok(match s.to_ascii_uppercase().as_str() {
            ChecksumAlgorithm::CRC32 => Algorithm::Crc32,
            ChecksumAlgorithm::CRC32C => Algorithm::Crc32c,
            ChecksumAlgorithm::CRC64NVME => Algorithm::Crc64Nvme,
            ChecksumAlgorithm::SHA1 => Algorithm::Sha1,
            ChecksumAlgorithm::SHA256 => Algorithm::Sha256,
            _ => {
                return Err(s3_error!(
                    InvalidRequest,
                    "Checksum algorithm {s} is not supported"
                ));
            }
        })
    }

    /// As S3's headers spell it.
    pub(super) fn header_name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => ChecksumAlgorithm::CRC32,
            Algorithm::Crc32c => ChecksumAlgorithm::CRC32C,
            Algorithm::Crc64Nvme => ChecksumAlgorithm::CRC64NVME,
            Algorithm::Sha1 => ChecksumAlgorithm::SHA1,
            Algorithm::Sha256 => ChecksumAlgorithm::SHA256,
        }
    }

    /// As S3's messages spell it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "crc32",
            Algorithm::Crc32c => "crc32c",
            Algorithm::Crc64Nvme => "crc64nvme",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
        }
    }

    pub(super) fn digest_len(self) -> usize {
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c => 4,
            Algorithm::Crc64Nvme => 8,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
        }
    }

    /// The base64 checksum of `data` (whose CRCs are `crcs`).
    pub(super) fn checksum(self, data: &[u8], crcs: &Crcs) -> String {
        let sha = |mut h: s3s::checksum::ChecksumHasher| {
            h.update(data);
            let c = h.finalize();
            c.checksum_sha1.or(c.checksum_sha256).unwrap_or_default()
        };
        match self {
            Algorithm::Crc32 | Algorithm::Crc32c | Algorithm::Crc64Nvme => {
                crcs.encode(self).unwrap_or_default()
            }
            Algorithm::Sha1 => sha(s3s::checksum::ChecksumHasher {
                sha1: Some(Default::default()),
                ..Default::default()
            }),
            Algorithm::Sha256 => sha(s3s::checksum::ChecksumHasher {
                sha256: Some(Default::default()),
                ..Default::default()
            }),
        }
    }
}

/// The CRCs S3 offers, of one body: computed for every part, so that a
/// whole object's CRC is combined from its parts' without reading it again.
#[derive(Clone, Copy, Debug)]
pub(super) struct Crcs {
    pub(super) crc32: u32,
    pub(super) crc32c: u32,
    pub(super) crc64nvme: u64,
}

impl Crcs {
    pub(super) fn of(data: &[u8]) -> Crcs {
        use crc_fast::{CrcAlgorithm, checksum};
        // A 32-bit CRC comes back in the low half of the u64.
        Crcs {
            crc32: checksum(CrcAlgorithm::Crc32IsoHdlc, data) as u32,
            crc32c: checksum(CrcAlgorithm::Crc32Iscsi, data) as u32,
            crc64nvme: checksum(CrcAlgorithm::Crc64Nvme, data),
        }
    }

    /// The CRCs of `self`'s bytes followed by `next`'s `next_len` bytes.
    pub(super) fn then(self, next: &Crcs, next_len: u64) -> Crcs {
        use crc_fast::{CrcAlgorithm, checksum_combine};
        let c = |a, x: u64, y: u64| checksum_combine(a, x, y, next_len);
        Crcs {
            crc32: c(
                CrcAlgorithm::Crc32IsoHdlc,
                self.crc32.into(),
                next.crc32.into(),
            ) as u32,
            crc32c: c(
                CrcAlgorithm::Crc32Iscsi,
                self.crc32c.into(),
                next.crc32c.into(),
            ) as u32,
            crc64nvme: c(CrcAlgorithm::Crc64Nvme, self.crc64nvme, next.crc64nvme),
        }
    }

    /// S3's form: base64 of the big-endian CRC; `None` for a hash.
    pub(super) fn encode(&self, algorithm: Algorithm) -> Option<String> {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        match algorithm {
            Algorithm::Crc32 => Some(b64(&self.crc32.to_be_bytes())),
            Algorithm::Crc32c => Some(b64(&self.crc32c.to_be_bytes())),
            Algorithm::Crc64Nvme => Some(b64(&self.crc64nvme.to_be_bytes())),
            Algorithm::Sha1 | Algorithm::Sha256 => None,
        }
    }
}

/// The `x-amz-checksum-*` values of `$x`, by algorithm: any input, or
/// part listed in CompleteMultipartUpload, with S3's five `checksum_*`
/// fields.
macro_rules! sent_checksums {
    ($x:expr) => {
        super::checksum::by_algorithm([
            &$x.checksum_crc32,
            &$x.checksum_crc32c,
            &$x.checksum_crc64nvme,
            &$x.checksum_sha1,
            &$x.checksum_sha256,
        ])
    };
}
pub(super) use sent_checksums;

/// The values of the `checksum_*` fields in `sent_checksums!`'s order.
pub(super) fn by_algorithm(fields: [&Option<String>; 5]) -> Vec<(Algorithm, String)> {
    [
        Algorithm::Crc32,
        Algorithm::Crc32c,
        Algorithm::Crc64Nvme,
        Algorithm::Sha1,
        Algorithm::Sha256,
    ]
    .into_iter()
    .zip(fields)
    .filter_map(|(a, v)| v.clone().map(|v| (a, v)))
    .collect()
}

/// Sets the `checksum_*` field of output `$out` for `$algorithm` (an
/// `Option<Algorithm>`) to `$value`.
macro_rules! set_checksum {
    ($out:expr, $algorithm:expr, $value:expr) => {
        match $algorithm {
            Some(Algorithm::Crc32) => $out.checksum_crc32 = $value,
            Some(Algorithm::Crc32c) => $out.checksum_crc32c = $value,
            Some(Algorithm::Crc64Nvme) => $out.checksum_crc64nvme = $value,
            Some(Algorithm::Sha1) => $out.checksum_sha1 = $value,
            Some(Algorithm::Sha256) => $out.checksum_sha256 = $value,
            None => {}
        }
    };
}
pub(super) use set_checksum;

/// At most one checksum, as S3 allows.
pub(super) fn single(sent: &[(Algorithm, String)]) -> S3Result<Option<&(Algorithm, String)>> {
    match sent {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        _ => Err(s3_error!(
            InvalidRequest,
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        )),
    }
}

pub(super) fn type_mismatch(expected: Option<Algorithm>, actual: Option<Algorithm>) -> S3Error {
    let name = |a: Option<Algorithm>| a.map_or("null", Algorithm::name);
    s3_error!(
        InvalidRequest,
        "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
        name(expected),
        name(actual)
    )
}

/// Checks `data` against the request's `Content-MD5` and checksum, as S3
/// does before it stores anything; returns the body's CRCs.
pub(super) fn verify_body(
    data: &[u8],
    content_md5: Option<&str>,
    checksum: Option<&(Algorithm, String)>,
) -> S3Result<Crcs> {
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(sent) = content_md5 {
        let want = b64
            .decode(sent)
            .ok()
            .filter(|d| d.len() == 16)
            .ok_or_else(|| {
                s3_error!(InvalidDigest, "The Content-MD5 you specified was invalid.")
            })?;
        if md5::Md5::digest(data).as_slice() != want.as_slice() {
            return Err(s3_error!(
                BadDigest,
                "The Content-MD5 you specified did not match what we received."
            ));
        }
    }
    let crcs = Crcs::of(data);
    if let Some((algorithm, sent)) = checksum {
        if b64.decode(sent).map(|d| d.len()) != Ok(algorithm.digest_len()) {
            return Err(s3_error!(
                InvalidRequest,
                "Value for x-amz-checksum-{} header is invalid.",
                algorithm.name()
            ));
        }
        if &algorithm.checksum(data, &crcs) != sent {
            return Err(s3_error!(
                BadDigest,
                "The {} you specified did not match the calculated checksum.",
                algorithm.header_name()
            ));
        }
    }
    Ok(crcs)
}
