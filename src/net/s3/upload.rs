//! S3 writes: a single `PutObject`, and the multipart upload's four calls
//! (`CreateMultipartUpload`, `UploadPart`, `CompleteMultipartUpload`,
//! `AbortMultipartUpload`), each one signed request on the control plane's
//! client. Each call is one attempt; the caller (`crate::object::write`)
//! retries with the policy and names the part. The checksums of
//! `crate::config::Checksum` go in the headers S3 verifies; the XML
//! documents are built and parsed here, as pure functions.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::Digest as _;

use super::list::S3Client;
use super::{encode_query, error_code};
use crate::net::http::{FailKind, HttpFail};

/// Error bodies read for their code; S3's are under 1 KiB.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// The checksum each part of a whole-object write carries (the configuration's `checksum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// `x-amz-checksum-crc32c`.
    Crc32c,
    /// `x-amz-checksum-crc64nvme`.
    Crc64Nvme,
    /// `Content-MD5`.
    Md5,
    /// None: S3 checks only the signature and the length.
    None,
}

/// A request that got no answer, by what went wrong.
fn request_failed(method: &str, e: &reqwest::Error) -> HttpFail {
    let kind = if e.is_timeout() {
        FailKind::Stalled
    } else if e.is_connect() {
        FailKind::Refused
    } else {
        FailKind::Reset
    };
    HttpFail::new(kind, format!("{method} request failed ({})", kind.name()))
}

/// A part's checksum header, as S3 takes it: the name and the base64 value
/// (big-endian CRC, or the MD5 digest).
pub fn checksum_header(kind: Checksum, data: &[u8]) -> Option<(&'static str, String)> {
    use crc_fast::{CrcAlgorithm, checksum};
    match kind {
        Checksum::Crc32c => {
            let crc = checksum(CrcAlgorithm::Crc32Iscsi, data) as u32;
            Some(("x-amz-checksum-crc32c", BASE64.encode(crc.to_be_bytes())))
        }
        Checksum::Crc64Nvme => {
            let crc = checksum(CrcAlgorithm::Crc64Nvme, data);
            Some(("x-amz-checksum-crc64nvme", BASE64.encode(crc.to_be_bytes())))
        }
        Checksum::Md5 => Some(("content-md5", BASE64.encode(md5::Md5::digest(data)))),
        Checksum::None => None,
    }
}

/// The `x-amz-checksum-algorithm` of an upload whose parts carry `kind`
/// (MD5 is not one: it is checked per request only).
pub fn algorithm_name(kind: Checksum) -> Option<&'static str> {
    match kind {
        Checksum::Crc32c => Some("CRC32C"),
        Checksum::Crc64Nvme => Some("CRC64NVME"),
        Checksum::Md5 | Checksum::None => None,
    }
}

/// A part S3 kept: its number, ETag and checksum, for the completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DonePart {
    pub number: u32,
    pub etag: String,
    pub checksum: Option<String>,
}

/// The body of `CompleteMultipartUpload`: the parts in order.
pub fn complete_body(parts: &[DonePart], kind: Checksum) -> String {
    let tag = match kind {
        Checksum::Crc32c => Some("ChecksumCRC32C"),
        Checksum::Crc64Nvme => Some("ChecksumCRC64NVME"),
        Checksum::Md5 | Checksum::None => None,
    };
    let mut xml =
        String::from("<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for p in parts {
        xml.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag>",
            p.number,
            escape(&p.etag)
        ));
        if let (Some(tag), Some(c)) = (tag, &p.checksum) {
            xml.push_str(&format!("<{tag}>{}</{tag}>", escape(c)));
        }
        xml.push_str("</Part>");
    }
    xml.push_str("</CompleteMultipartUpload>");
    xml
}

fn escape(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

/// The upload id in `CreateMultipartUpload`'s answer.
pub fn parse_upload_id(xml: &str) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Initiated {
        #[serde(rename = "UploadId")]
        upload_id: String,
    }
    let id = quick_xml::de::from_str::<Initiated>(xml)
        .map_err(|e| format!("CreateMultipartUpload's answer is not valid: {e}"))?
        .upload_id;
    // It goes into a query string (encoded) and messages: bound it.
    if id.is_empty() || id.len() > 1024 || id.chars().any(char::is_control) {
        return Err("CreateMultipartUpload's answer has no usable UploadId".into());
    }
    Ok(id)
}

/// The ETag S3 gives the object a multipart upload of `parts` makes: the
/// MD5 of the parts' MD5 digests, then `-` and the number of parts. None
/// when a part's ETag is not its MD5 in hex (with server-side encryption
/// by KMS or a customer's key it is not), so nothing can be compared.
pub fn multipart_etag(parts: &[DonePart]) -> Option<String> {
    let mut all = md5::Md5::new();
    for p in parts {
        let hex = p.etag.trim_matches('"');
        // An MD5 digest in hex: 16 bytes, 32 digits.
        if hex.len() != 32 {
            return None;
        }
        let mut digest = [0u8; 16];
        for (i, byte) in digest.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        all.update(digest);
    }
    let hex: String = all.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{hex}-{}", parts.len()))
}

/// What a `HEAD` of an object found: its ETag (quotes removed) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub etag: Option<String>,
    pub size: Option<u64>,
}

/// An answer S3 gave: status, the headers a writer reads, the body.
#[derive(Debug)]
pub struct UploadReply {
    pub status: u16,
    pub etag: Option<String>,
    pub body: Vec<u8>,
}

impl S3Client {
    /// The object URL of `bucket/key` with `query` (already encoded).
    fn write_url(&self, bucket: &str, key: &str, query: &str) -> String {
        let base = self.addressing.object_url(bucket, key);
        if query.is_empty() {
            base
        } else {
            format!("{base}?{query}")
        }
    }

    /// One signed request with `headers` (signed too) and `body`, once.
    /// A non-2xx answer is an `HttpFail` of its kind, with S3's code; so is
    /// a 200 whose body is an `<Error>` (`CompleteMultipartUpload` may
    /// answer so after it started).
    pub fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::blocking::Body>,
        timeout: Duration,
    ) -> Result<UploadReply, HttpFail> {
        let req = self.signed(method, url, headers)?.timeout(timeout);
        let resp = req
            .body(body)
            .send()
            .map_err(|e| request_failed(method, &e))?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if !(200..300).contains(&status) {
            let mut f = HttpFail::new(
                FailKind::of_status(status),
                format!(
                    "HTTP {status} {}",
                    resp.status().canonical_reason().unwrap_or("")
                ),
            );
            // At most MAX_ERROR_BODY bytes, whatever the server sends (a
            // chunked body has no length to check first).
            let mut b = Vec::new();
            if std::io::Read::read_to_end(&mut std::io::Read::take(resp, MAX_ERROR_BODY), &mut b)
                .is_ok()
            {
                f.code = error_code(&b);
            }
            if f.code
                .as_deref()
                .is_some_and(crate::net::retry::is_throttling_code)
            {
                f.kind = FailKind::Throttled;
            }
            return Err(f);
        }
        let body = resp
            .bytes()
            .map_err(|_| HttpFail::new(FailKind::Truncated, "the answer's body ended early"))?
            .to_vec();
        if let Some(code) = error_code(&body) {
            // An error inside a 200: S3's own advice is to retry
            // InternalError; others are final.
            let kind = match code.as_str() {
                "InternalError" | "ServiceUnavailable" => FailKind::ServerError,
                c if crate::net::retry::is_throttling_code(c) => FailKind::Throttled,
                _ => FailKind::Client,
            };
            let mut f = HttpFail::new(kind, format!("HTTP {status} with an error body"));
            f.code = Some(code);
            return Err(f);
        }
        Ok(UploadReply { status, etag, body })
    }

    /// A request for `method url`, signed over `host` and `headers`
    /// (which it carries).
    fn signed(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<reqwest::blocking::RequestBuilder, HttpFail> {
        let m = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| HttpFail::new(FailKind::Client, format!("bad method {method}")))?;
        let mut req = self.http.request(m, url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(s) = &self.signer {
            let u = reqwest::Url::parse(url)
                .map_err(|e| HttpFail::new(FailKind::Protocol, format!("bad URL: {e}")))?;
            let host = match u.port() {
                Some(p) => format!("{}:{p}", u.host_str().unwrap_or("")),
                None => u.host_str().unwrap_or("").to_string(),
            };
            let mut signed = vec![("host", host.as_str())];
            signed.extend_from_slice(headers);
            for (k, v) in s
                .headers(method, url, &signed, SystemTime::now())
                .map_err(|e| HttpFail::new(FailKind::Client, e))?
            {
                req = req.header(k, v);
            }
        }
        Ok(req)
    }

    /// Whether `bucket/key` exists (`HEAD`: 200 yes, 404 no); any other
    /// answer is an `HttpFail` of its kind. A writer asks before it
    /// uploads, so a refused write costs one round trip, not the upload
    /// (the conditional completion still decides a race).
    pub fn exists(&self, bucket: &str, key: &str) -> Result<bool, HttpFail> {
        self.head(bucket, key).map(|h| h.is_some())
    }

    /// `HEAD` of `bucket/key`: its ETag and size, None on 404; any other
    /// answer is an `HttpFail` of its kind.
    pub fn head(&self, bucket: &str, key: &str) -> Result<Option<Head>, HttpFail> {
        let url = self.write_url(bucket, key, "");
        let resp = self
            .signed("HEAD", &url, &[])?
            .timeout(Duration::from_secs(60))
            .send()
            .map_err(|e| request_failed("HEAD", &e))?;
        match resp.status().as_u16() {
            200..=299 => {
                let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
                Ok(Some(Head {
                    etag: header("etag").map(|e| e.trim_matches('"').to_string()),
                    size: header("content-length").and_then(|n| n.parse().ok()),
                }))
            }
            404 => Ok(None),
            status => Err(HttpFail::new(
                FailKind::of_status(status),
                format!(
                    "HTTP {status} {}",
                    resp.status().canonical_reason().unwrap_or("")
                ),
            )),
        }
    }

    /// Whether `bucket/key` is there, by a `GET` of its first byte, whose
    /// error answers carry S3's code (a `HEAD`'s carry none): absent only
    /// on 404 `NoSuchKey` (or a 404 without a code); `NoSuchBucket`,
    /// `AccessDenied` (S3's answer for a missing key without
    /// `s3:ListBucket`), `ExpiredToken` and every other answer are a
    /// `HttpFail` with the code, never "absent". A 416 is an empty object.
    pub fn present(&self, bucket: &str, key: &str) -> Result<bool, HttpFail> {
        let url = self.write_url(bucket, key, "");
        let resp = self
            .signed("GET", &url, &[("range", "bytes=0-0")])?
            .timeout(Duration::from_secs(60))
            .send()
            .map_err(|e| request_failed("GET", &e))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) || status == 416 {
            // Its body (one byte, or the whole object from a server that
            // ignores ranges) is not read: dropping the answer closes the
            // connection.
            return Ok(true);
        }
        let reason = resp.status().canonical_reason().unwrap_or("");
        let mut b = Vec::new();
        let code = match std::io::Read::read_to_end(
            &mut std::io::Read::take(resp, MAX_ERROR_BODY),
            &mut b,
        ) {
            Ok(_) => error_code(&b),
            Err(_) => None,
        };
        if status == 404 && matches!(code.as_deref(), None | Some("NoSuchKey")) {
            return Ok(false);
        }
        let mut f = HttpFail::new(
            FailKind::of_status(status),
            format!("HTTP {status} {reason}"),
        );
        f.code = code;
        Err(f)
    }

    /// `PutObject` of `body` whole; conditional unless `overwrite`.
    pub fn put_object(
        &self,
        bucket: &str,
        key: &str,
        body: bytes::Bytes,
        kind: Checksum,
        overwrite: bool,
        timeout: Duration,
    ) -> Result<UploadReply, HttpFail> {
        let sum = checksum_header(kind, &body);
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some((k, v)) = &sum {
            headers.push((k, v));
        }
        if !overwrite {
            headers.push(("if-none-match", "*"));
        }
        let url = self.write_url(bucket, key, "");
        self.send("PUT", &url, &headers, body, timeout)
    }

    /// `CreateMultipartUpload`: the upload id.
    pub fn create_upload(
        &self,
        bucket: &str,
        key: &str,
        kind: Checksum,
    ) -> Result<String, HttpFail> {
        let mut headers = Vec::new();
        if let Some(a) = algorithm_name(kind) {
            headers.push(("x-amz-checksum-algorithm", a));
        }
        let url = self.write_url(bucket, key, "uploads=");
        let reply = self.send("POST", &url, &headers, Vec::new(), Duration::from_secs(60))?;
        let text = String::from_utf8_lossy(&reply.body);
        parse_upload_id(&text).map_err(|e| HttpFail::new(FailKind::Protocol, e))
    }

    /// `UploadPart` number `number` (from 1) of `upload`.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload: &str,
        number: u32,
        body: bytes::Bytes,
        kind: Checksum,
        timeout: Duration,
    ) -> Result<DonePart, HttpFail> {
        let sum = checksum_header(kind, &body);
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some((k, v)) = &sum {
            headers.push((k, v));
        }
        let query = format!("partNumber={number}&uploadId={}", encode_query(upload));
        let url = self.write_url(bucket, key, &query);
        let reply = self.send("PUT", &url, &headers, body, timeout)?;
        let etag = reply.etag.ok_or_else(|| {
            HttpFail::new(FailKind::Protocol, "UploadPart answered without an ETag")
        })?;
        Ok(DonePart {
            number,
            etag,
            checksum: match kind {
                Checksum::Crc32c | Checksum::Crc64Nvme => sum.map(|(_, v)| v),
                Checksum::Md5 | Checksum::None => None,
            },
        })
    }

    /// `CompleteMultipartUpload` of `parts` (in order); conditional
    /// unless `overwrite`.
    pub fn complete_upload(
        &self,
        bucket: &str,
        key: &str,
        upload: &str,
        parts: &[DonePart],
        kind: Checksum,
        overwrite: bool,
    ) -> Result<UploadReply, HttpFail> {
        let mut headers = vec![("content-type", "application/xml")];
        if !overwrite {
            headers.push(("if-none-match", "*"));
        }
        let url = self.write_url(bucket, key, &format!("uploadId={}", encode_query(upload)));
        let body = complete_body(parts, kind);
        // S3 may take a while to assemble many parts.
        self.send("POST", &url, &headers, body, Duration::from_secs(300))
    }

    /// `AbortMultipartUpload`: S3 drops the parts. A missing upload
    /// (`NoSuchUpload`, already gone) counts as done.
    pub fn abort_upload(&self, bucket: &str, key: &str, upload: &str) -> Result<(), HttpFail> {
        let url = self.write_url(bucket, key, &format!("uploadId={}", encode_query(upload)));
        match self.send("DELETE", &url, &[], Vec::new(), Duration::from_secs(60)) {
            Ok(_) => Ok(()),
            Err(f) if f.code.as_deref() == Some("NoSuchUpload") => Ok(()),
            Err(f) => Err(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_are_s3s_encodings() {
        // RFC 3720's CRC32C of 32 zero bytes is 0x8a9136aa; S3 sends the
        // big-endian bytes in base64.
        let (h, v) = checksum_header(Checksum::Crc32c, &[0u8; 32]).unwrap();
        assert_eq!(h, "x-amz-checksum-crc32c");
        assert_eq!(v, BASE64.encode(0x8a91_36aau32.to_be_bytes()));
        // MD5 of "" is d41d8cd98f00b204e9800998ecf8427e.
        let (h, v) = checksum_header(Checksum::Md5, b"").unwrap();
        assert_eq!((h, v.as_str()), ("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg=="));
        // CRC-64/NVME of "123456789" is 0xae8b14860a799888 (its check value).
        let (h, v) = checksum_header(Checksum::Crc64Nvme, b"123456789").unwrap();
        assert_eq!(h, "x-amz-checksum-crc64nvme");
        assert_eq!(v, BASE64.encode(0xae8b_1486_0a79_9888u64.to_be_bytes()));
        assert!(checksum_header(Checksum::None, b"x").is_none());
    }

    #[test]
    fn the_completion_lists_parts_with_their_checksums() {
        let parts = [
            DonePart {
                number: 1,
                etag: "\"a\"".into(),
                checksum: Some("AAAA".into()),
            },
            DonePart {
                number: 2,
                etag: "\"b<\"".into(),
                checksum: Some("BBBB".into()),
            },
        ];
        let xml = complete_body(&parts, Checksum::Crc32c);
        assert!(xml.contains(
            "<Part><PartNumber>1</PartNumber><ETag>&quot;a&quot;</ETag><ChecksumCRC32C>AAAA</ChecksumCRC32C></Part>"
        ), "{xml}");
        assert!(xml.contains("<ETag>&quot;b&lt;&quot;</ETag>"), "{xml}");
        assert!(!complete_body(&parts, Checksum::Md5).contains("Checksum"));
    }

    #[test]
    fn a_multipart_etag_is_the_md5_of_the_parts_md5s() {
        let part = |number, etag: &str| DonePart {
            number,
            etag: etag.into(),
            checksum: None,
        };
        // MD5("a") and MD5("b"); the MD5 of their 32 digest bytes is
        // 96e024ba2074fe77e8e965ba43a704be (Python's hashlib).
        let parts = [
            part(1, "\"0cc175b9c0f1b6a831c399e269772661\""),
            part(2, "92eb5ffee6ae2fec3ad71c777531578f"),
        ];
        assert_eq!(
            multipart_etag(&parts).as_deref(),
            Some("96e024ba2074fe77e8e965ba43a704be-2")
        );
        // Not an MD5: nothing to compare.
        assert_eq!(multipart_etag(&[part(1, "\"kms-opaque\"")]), None);
        assert_eq!(
            multipart_etag(&[part(1, "zz175b9c0f1b6a831c399e269772661z")]),
            None
        );
    }

    #[test]
    fn upload_ids_are_parsed_and_garbage_is_named() {
        let xml = "<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>abc-123</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(parse_upload_id(xml).unwrap(), "abc-123");
        for bad in [
            "",
            "<html/>",
            "<InitiateMultipartUploadResult><UploadId></UploadId></InitiateMultipartUploadResult>",
            "<InitiateMultipartUploadResult><UploadId>a\u{1}b</UploadId></InitiateMultipartUploadResult>",
        ] {
            assert!(parse_upload_id(bad).is_err(), "{bad:?}");
        }
    }
}
