//! What CompleteMultipartUpload checks before the upload is consumed, as
//! S3 does: the part list against the parts uploaded, the object's size,
//! and the whole object's checksum as S3 reports it.

use base64::Engine as _;
use s3s::dto::{CompleteMultipartUploadInput, CompletedPart};
use s3s::{S3Result, s3_error};

use super::checksum::{Crcs, sent_checksums, single, type_mismatch};
use super::{OpenUpload, PartRecord};

/// S3's smallest part but the last (its "Multipart upload limits").
const MIN_PART: u64 = 5 << 20;

/// The part list of a CompleteMultipartUpload checked against what was
/// uploaded, the list before the parts; returns the listed parts in order.
pub(super) fn check_parts(
    input: &CompleteMultipartUploadInput,
    upload: &OpenUpload,
) -> S3Result<Vec<PartRecord>> {
    let listed = input
        .multipart_upload
        .as_ref()
        .and_then(|m| m.parts.as_ref())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| s3_error!(InvalidRequest, "You must specify at least one part"))?;
    let numbers = listed
        .iter()
        .map(|p| {
            p.part_number
                .ok_or_else(|| s3_error!(InvalidRequest, "missing part number"))
        })
        .collect::<S3Result<Vec<i32>>>()?;
    if numbers.windows(2).any(|w| w[0] >= w[1]) {
        return Err(s3_error!(
            InvalidPartOrder,
            "The list of parts was not in ascending order. The parts list must be specified in order by part number."
        ));
    }
    let records = listed
        .iter()
        .zip(&numbers)
        .map(|(part, &number)| check_part(part, number, upload))
        .collect::<S3Result<Vec<PartRecord>>>()?;
    if records[..records.len() - 1]
        .iter()
        .any(|r| r.size < MIN_PART)
    {
        return Err(s3_error!(
            EntityTooSmall,
            "Your proposed upload is smaller than the minimum allowed object size."
        ));
    }
    // s3s-fs assembles parts 1..=N only; S3 allows gaps.
    if numbers.iter().zip(1..).any(|(&n, i)| n != i) {
        return Err(s3_error!(
            NotImplemented,
            "this test server completes parts numbered 1..=N only"
        ));
    }
    let size: u64 = records.iter().map(|r| r.size).sum();
    if let Some(want) = input.mpu_object_size
        && want as u64 != size
    {
        return Err(s3_error!(
            InvalidRequest,
            "The provided x-amz-mp-object-size {want} does not match the object's size {size}."
        ));
    }
    Ok(records)
}

/// One listed part: uploaded, with the ETag and checksum it was uploaded
/// with.
fn check_part(part: &CompletedPart, number: i32, upload: &OpenUpload) -> S3Result<PartRecord> {
    let invalid_part = || {
        s3_error!(
            InvalidPart,
            "One or more of the specified parts could not be found. The part may not have been uploaded, or the specified entity tag may not match the part's entity tag."
        )
    };
    let record = upload.parts.get(&number).ok_or_else(invalid_part)?;
    let e_tag = part.e_tag.as_ref().map(|e| e.value().trim_matches('"'));
    if e_tag != Some(record.e_tag.as_str()) {
        return Err(invalid_part());
    }
    let sent = sent_checksums!(part);
    match (single(&sent)?, upload.algorithm) {
        (Some((a, v)), Some(want)) if *a == want => {
            if Some(v) != record.checksum.as_ref() {
                return Err(s3_error!(
                    InvalidPart,
                    "The {} of part {number} does not match the uploaded part's.",
                    a.name()
                ));
            }
        }
        (Some((a, _)), want) => return Err(type_mismatch(want, Some(*a))),
        // A COMPOSITE checksum is built from the parts' checksums, so each
        // listed part must name its own.
        (None, Some(want)) if !upload.full_object => {
            return Err(s3_error!(
                InvalidRequest,
                "The upload was initiated with the {} checksum algorithm, and part {number} was listed without its checksum.",
                want.name()
            ));
        }
        (None, _) => {}
    }
    Ok(record.clone())
}

/// The whole object's checksum, by the upload's algorithm and type:
/// FULL_OBJECT the CRC of the whole object (combined from the parts'),
/// COMPOSITE the checksum of the parts' checksums with `-N`, as S3
/// reports them.
pub(super) fn object_checksum(upload: &OpenUpload, parts: &[PartRecord]) -> Option<String> {
    let algorithm = upload.algorithm?;
    if upload.full_object {
        let whole = parts[1..]
            .iter()
            .fold(parts[0].crcs, |acc, p| acc.then(&p.crcs, p.size));
        return whole.encode(algorithm);
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut joined = Vec::new();
    for p in parts {
        joined.extend(b64.decode(p.checksum.as_ref()?).ok()?);
    }
    let digest = algorithm.checksum(&joined, &Crcs::of(&joined));
    Some(format!("{digest}-{}", parts.len()))
}
