//! The S3-compatible test server (`support::s3`) answers writes as S3
//! does, so the tests of whole-object writes can trust it: per-part
//! checksums and Content-MD5 verified, the part list checked before the
//! upload is consumed, conditional writes exclusive, faults injected on
//! demand, and every upload accounted for. Requests are signed with the
//! engine's SigV4 signer and sent with reqwest.

use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine as _;
use md5::Digest as _;
use s3s::S3ErrorCode;

use ringfeed_test_support as support;

use support::s3::{ACCESS_KEY, Op, S3Server, SECRET_KEY, Upload};

use ringfeed::net::s3::creds::Provider;
use ringfeed::net::s3::sign::SigV4Signer;
use ringfeed::net::s3::{Env, S3Config};

const BUCKET: &str = "ringfeed-test";
const MIB: usize = 1 << 20;

/// A signed S3 client of a few lines: enough to drive the server.
struct Client {
    endpoint: String,
    signer: SigV4Signer,
    http: reqwest::blocking::Client,
}

/// An answer: status, headers (names in lower case) and body.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The text of the first `<tag>` of the XML body.
    fn xml(&self, tag: &str) -> Option<&str> {
        let open = format!("<{tag}>");
        let start = self.body.find(&open)? + open.len();
        let len = self.body[start..].find(&format!("</{tag}>"))?;
        Some(&self.body[start..start + len])
    }

    /// S3's error code, from a 4xx/5xx or a 200 carrying `<Error>`.
    fn code(&self) -> Option<&str> {
        self.body.contains("<Error>").then(|| self.xml("Code"))?
    }
}

impl Client {
    fn new(server: &S3Server) -> Client {
        let cfg = S3Config {
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
            ..Default::default()
        };
        let provider = Provider::new(&cfg, &Env::default()).unwrap();
        Client {
            endpoint: server.endpoint(),
            signer: SigV4Signer::new(Arc::new(provider), "us-east-1"),
            http: reqwest::blocking::Client::new(),
        }
    }

    /// `method` on `target` (path and query, encoded), with `headers`
    /// signed too.
    fn send(&self, method: &str, target: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
        let url = format!("{}{target}", self.endpoint);
        let host = self.endpoint.trim_start_matches("http://").to_string();
        let mut signed: Vec<(&str, &str)> = vec![("host", &host)];
        signed.extend_from_slice(headers);
        let mut req = self.http.request(method.parse().unwrap(), &url).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        for (k, v) in self
            .signer
            .headers(method, &url, &signed, SystemTime::now())
            .unwrap()
        {
            req = req.header(k, v);
        }
        let resp = req.send().unwrap();
        Answer {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.text().unwrap(),
        }
    }

    fn create(&self, key: &str, headers: &[(&str, &str)]) -> String {
        let a = self.send("POST", &format!("/{BUCKET}/{key}?uploads"), headers, vec![]);
        assert_eq!(a.status, 200, "{}", a.body);
        a.xml("UploadId").unwrap().to_string()
    }

    fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part: i32,
        headers: &[(&str, &str)],
        data: &[u8],
    ) -> Answer {
        let target = format!("/{BUCKET}/{key}?partNumber={part}&uploadId={upload_id}");
        self.send("PUT", &target, headers, data.to_vec())
    }

    /// CompleteMultipartUpload of `parts`.
    fn complete(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[Listed],
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (n, e_tag, checksum) in parts {
            xml += &format!("<Part><PartNumber>{n}</PartNumber><ETag>{e_tag}</ETag>");
            if let Some((tag, v)) = checksum {
                xml += &format!("<{tag}>{v}</{tag}>");
            }
            xml += "</Part>";
        }
        xml += "</CompleteMultipartUpload>";
        let target = format!("/{BUCKET}/{key}?uploadId={upload_id}");
        self.send("POST", &target, headers, xml.into_bytes())
    }

    fn abort(&self, key: &str, upload_id: &str) -> Answer {
        let target = format!("/{BUCKET}/{key}?uploadId={upload_id}");
        self.send("DELETE", &target, &[], vec![])
    }

    fn get(&self, key: &str) -> Vec<u8> {
        let url = format!("/{BUCKET}/{key}");
        let a = self.send("GET", &url, &[], vec![]);
        assert_eq!(a.status, 200, "{}", a.body);
        a.body.into_bytes()
    }
}

/// A part listed in CompleteMultipartUpload: number, ETag, and the
/// checksum element (`ChecksumCRC32C`, value) if any.
type Listed<'a> = (i32, &'a str, Option<(&'a str, &'a str)>);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn crc64nvme(data: &[u8]) -> String {
    b64(&crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, data).to_be_bytes())
}

fn crc32c(data: &[u8]) -> String {
    let v = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    b64(&v.to_be_bytes())
}

fn content_md5(data: &[u8]) -> String {
    b64(&md5::Md5::digest(data))
}

/// ASCII text of `len` bytes, distinct per `seed` (the GET answer is read
/// as text).
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| b'a' + ((i / 7 + seed as usize) % 26) as u8)
        .collect()
}

fn server() -> (tempfile::TempDir, S3Server) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join(BUCKET)).unwrap();
    let server = S3Server::start(root.path());
    (root, server)
}

#[test]
fn a_full_object_crc64nvme_upload_verifies_each_part_and_the_whole() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let (one, two) = (data(5 * MIB, 1), data(MIB + 3, 2));
    let id = c.create("obj", &[("x-amz-checksum-algorithm", "CRC64NVME")]);

    let a = c.upload_part(
        "obj",
        &id,
        1,
        &[("x-amz-checksum-crc64nvme", &crc64nvme(&one))],
        &one,
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.header("x-amz-checksum-crc64nvme"),
        Some(crc64nvme(&one).as_str())
    );
    let etag1 = a.header("etag").unwrap().to_string();

    // A wrong checksum, a wrong Content-MD5, another algorithm: refused.
    let wrong = crc64nvme(&one);
    let a = c.upload_part("obj", &id, 2, &[("x-amz-checksum-crc64nvme", &wrong)], &two);
    assert_eq!((a.status, a.code()), (400, Some("BadDigest")), "{}", a.body);
    let a = c.upload_part("obj", &id, 2, &[("content-md5", &content_md5(&one))], &two);
    assert_eq!((a.status, a.code()), (400, Some("BadDigest")), "{}", a.body);
    let a = c.upload_part(
        "obj",
        &id,
        2,
        &[("x-amz-checksum-crc32c", &crc32c(&two))],
        &two,
    );
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidRequest")),
        "{}",
        a.body
    );
    assert!(a.body.contains("Checksum Type mismatch"), "{}", a.body);
    // A malformed value is not a digest at all.
    let a = c.upload_part("obj", &id, 2, &[("x-amz-checksum-crc64nvme", "AAAA")], &two);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidRequest")),
        "{}",
        a.body
    );

    let headers = [
        ("x-amz-checksum-crc64nvme", crc64nvme(&two)),
        ("content-md5", content_md5(&two)),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = c.upload_part("obj", &id, 2, &headers, &two);
    assert_eq!(a.status, 200, "{}", a.body);
    let etag2 = a.header("etag").unwrap().to_string();

    // A wrong ETag or whole-object checksum fails and leaves the upload
    // open; so does a part list out of order.
    let whole: Vec<u8> = [one.as_slice(), two.as_slice()].concat();
    let parts = [(1, etag1.as_str(), None), (2, etag2.as_str(), None)];
    let a = c.complete(
        "obj",
        &id,
        &[(1, etag1.as_str(), None), (2, "\"0\"", None)],
        &[],
    );
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidPart")),
        "{}",
        a.body
    );
    let a = c.complete("obj", &id, &[parts[1], parts[0]], &[]);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidPartOrder")),
        "{}",
        a.body
    );
    let a = c.complete(
        "obj",
        &id,
        &parts,
        &[("x-amz-checksum-crc64nvme", &crc64nvme(&one))],
    );
    assert_eq!((a.status, a.code()), (400, Some("BadDigest")), "{}", a.body);
    assert_eq!(server.dangling_uploads().len(), 1);

    let a = c.complete(
        "obj",
        &id,
        &parts,
        &[("x-amz-checksum-crc64nvme", &crc64nvme(&whole))],
    );
    assert_eq!((a.status, a.code()), (200, None), "{}", a.body);
    assert_eq!(a.xml("ChecksumCRC64NVME"), Some(crc64nvme(&whole).as_str()));
    assert_eq!(a.xml("ChecksumType"), Some("FULL_OBJECT"));
    assert_eq!(c.get("obj"), whole);
    server.assert_no_uploads_left();
    assert_eq!(server.requests(Op::CreateMultipartUpload), 1);
    assert_eq!(server.requests(Op::UploadPart), 6);
    assert_eq!(server.requests(Op::CompleteMultipartUpload), 4);
}

#[test]
fn a_composite_crc32c_upload_wants_each_parts_checksum() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let (one, two) = (data(5 * MIB, 3), data(10, 4));
    let id = c.create("obj", &[("x-amz-checksum-algorithm", "CRC32C")]);
    // COMPOSITE (CRC32C's default): a part without its checksum is refused.
    let a = c.upload_part("obj", &id, 1, &[], &one);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidRequest")),
        "{}",
        a.body
    );
    let (s1, s2) = (crc32c(&one), crc32c(&two));
    let e1 = c.upload_part("obj", &id, 1, &[("x-amz-checksum-crc32c", &s1)], &one);
    let e2 = c.upload_part("obj", &id, 2, &[("x-amz-checksum-crc32c", &s2)], &two);
    let (e1, e2) = (e1.header("etag").unwrap(), e2.header("etag").unwrap());
    // Listed without their checksums, or with another's: refused.
    let a = c.complete("obj", &id, &[(1, e1, None), (2, e2, None)], &[]);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidRequest")),
        "{}",
        a.body
    );
    let listed = [
        (1, e1, Some(("ChecksumCRC32C", s2.as_str()))),
        (2, e2, Some(("ChecksumCRC32C", s2.as_str()))),
    ];
    let a = c.complete("obj", &id, &listed, &[]);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("InvalidPart")),
        "{}",
        a.body
    );
    let listed = [
        (1, e1, Some(("ChecksumCRC32C", s1.as_str()))),
        (2, e2, Some(("ChecksumCRC32C", s2.as_str()))),
    ];
    let a = c.complete("obj", &id, &listed, &[]);
    assert_eq!((a.status, a.code()), (200, None), "{}", a.body);
    // The checksum of the parts' checksums, with the number of parts.
    let raw: Vec<u8> = [s1, s2]
        .iter()
        .flat_map(|s| base64::engine::general_purpose::STANDARD.decode(s).unwrap())
        .collect();
    let composite = format!("{}-2", crc32c(&raw));
    assert_eq!(a.xml("ChecksumCRC32C"), Some(composite.as_str()));
    assert_eq!(c.get("obj"), [one, two].concat());
    server.assert_no_uploads_left();
}

#[test]
fn small_parts_unknown_uploads_and_parts_left_out() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let id = c.create("obj", &[]);
    let small = data(MIB, 5);
    let e: Vec<String> = (1..=3)
        .map(|n| {
            let a = c.upload_part("obj", &id, n, &[], &small);
            a.header("etag").unwrap().to_string()
        })
        .collect();
    // Only the last part may be under 5 MiB; the upload survives that.
    let a = c.complete("obj", &id, &[(1, &e[0], None), (2, &e[1], None)], &[]);
    assert_eq!(
        (a.status, a.code()),
        (400, Some("EntityTooSmall")),
        "{}",
        a.body
    );
    // Part 3, uploaded and left out, is freed when the upload completes.
    let a = c.complete("obj", &id, &[(1, &e[0], None)], &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(c.get("obj"), small);
    server.assert_no_uploads_left();
    // A completed upload is gone: each of its operations says so.
    let a = c.upload_part("obj", &id, 1, &[], &small);
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchUpload")),
        "{}",
        a.body
    );
    let a = c.complete("obj", &id, &[(1, &e[0], None)], &[]);
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchUpload")),
        "{}",
        a.body
    );
    let a = c.abort("obj", &id);
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchUpload")),
        "{}",
        a.body
    );
    // An upload of another key is not this key's.
    let other = c.create("other", &[]);
    let a = c.upload_part("obj", &other, 1, &[], &small);
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchUpload")),
        "{}",
        a.body
    );
    assert_eq!(c.abort("other", &other).status, 204);
    server.assert_no_uploads_left();
    // No bucket, no upload and no object: s3s-fs alone would create it.
    let a = c.send("POST", "/no-such-bucket/k?uploads", &[], vec![]);
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchBucket")),
        "{}",
        a.body
    );
    let a = c.send("PUT", "/no-such-bucket/k", &[], b"x".to_vec());
    assert_eq!(
        (a.status, a.code()),
        (404, Some("NoSuchBucket")),
        "{}",
        a.body
    );
    assert!(!server.root().join("no-such-bucket").exists());
}

#[test]
fn conditional_and_verified_puts() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let put = |body: &[u8], headers: &[(&str, &str)]| {
        c.send("PUT", &format!("/{BUCKET}/k"), headers, body.to_vec())
    };
    let none_match = [("if-none-match", "*")];
    assert_eq!(put(b"first", &none_match).status, 200);
    let a = put(b"second", &none_match);
    assert_eq!(
        (a.status, a.code()),
        (412, Some("PreconditionFailed")),
        "{}",
        a.body
    );
    // A body that does not match its digest does not replace the object.
    let md5 = content_md5(b"other");
    let a = put(b"second", &[("content-md5", &md5)]);
    assert_eq!((a.status, a.code()), (400, Some("BadDigest")), "{}", a.body);
    let crc = crc32c(b"other");
    let a = put(b"second", &[("x-amz-checksum-crc32c", &crc)]);
    assert_eq!((a.status, a.code()), (400, Some("BadDigest")), "{}", a.body);
    assert_eq!(c.get("k"), b"first");
    let (md5, crc) = (content_md5(b"second"), crc32c(b"second"));
    let a = put(
        b"second",
        &[("content-md5", &md5), ("x-amz-checksum-crc32c", &crc)],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(c.get("k"), b"second");

    // Completing onto an existing key with If-None-Match fails and leaves
    // the upload open, for the writer to abort.
    let id = c.create("k", &[]);
    let a = c.upload_part("k", &id, 1, &[], b"third");
    let e = a.header("etag").unwrap().to_string();
    let a = c.complete("k", &id, &[(1, &e, None)], &none_match);
    assert_eq!(
        (a.status, a.code()),
        (412, Some("PreconditionFailed")),
        "{}",
        a.body
    );
    let open = server.dangling_uploads();
    let want = Upload {
        bucket: BUCKET.into(),
        key: "k".into(),
        upload_id: id.clone(),
    };
    assert_eq!(open, [want]);
    assert!(!server.leftover_files().is_empty());
    assert_eq!(c.abort("k", &id).status, 204);
    server.assert_no_uploads_left();
    assert_eq!(c.get("k"), b"second");
    assert_eq!(server.requests(Op::PutObject), 5);
    assert_eq!(server.requests(Op::AbortMultipartUpload), 1);
}

#[test]
fn racing_conditional_writes_of_a_new_key_one_wins() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8u8)
            .map(|i| {
                let c = &c;
                s.spawn(move || {
                    let target = format!("/{BUCKET}/race");
                    c.send("PUT", &target, &[("if-none-match", "*")], data(64 << 10, i))
                        .status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 412).count(),
        7,
        "{statuses:?}"
    );
}

#[test]
fn injected_faults_hit_what_they_name() {
    let (_root, server) = server();
    let c = Client::new(&server);
    let id = c.create("obj", &[]);
    let part = data(5 * MIB, 6);

    // Every UploadPart of part 2 fails, retried or not; part 1 does not.
    server.fail_upload_part(2, S3ErrorCode::InternalError);
    let e1 = c.upload_part("obj", &id, 1, &[], &part);
    assert_eq!(e1.status, 200);
    for _ in 0..3 {
        let a = c.upload_part("obj", &id, 2, &[], b"tail");
        assert_eq!(
            (a.status, a.code()),
            (500, Some("InternalError")),
            "{}",
            a.body
        );
    }
    server.clear_faults();
    // Once, then not.
    server.fail_upload_part_times(2, S3ErrorCode::AccessDenied, 1);
    let a = c.upload_part("obj", &id, 2, &[], b"tail");
    assert_eq!(
        (a.status, a.code()),
        (403, Some("AccessDenied")),
        "{}",
        a.body
    );
    let a = c.upload_part("obj", &id, 2, &[], b"tail");
    assert_eq!(a.status, 200, "{}", a.body);
    let e2 = a.header("etag").unwrap().to_string();
    let e1 = e1.header("etag").unwrap().to_string();

    // A 200 whose body is an error, as S3 may answer CompleteMultipartUpload:
    // the upload stays open, and completes when asked again.
    server.fail_complete_in_body(S3ErrorCode::InternalError, Some(1));
    let parts = [(1, e1.as_str(), None), (2, e2.as_str(), None)];
    let a = c.complete("obj", &id, &parts, &[]);
    assert_eq!(
        (a.status, a.code()),
        (200, Some("InternalError")),
        "{}",
        a.body
    );
    assert_eq!(server.dangling_uploads().len(), 1);
    server.fail(Op::CompleteMultipartUpload, S3ErrorCode::SlowDown, Some(1));
    let a = c.complete("obj", &id, &parts, &[]);
    assert_eq!((a.status, a.code()), (503, Some("SlowDown")), "{}", a.body);
    let a = c.complete("obj", &id, &parts, &[]);
    assert_eq!((a.status, a.code()), (200, None), "{}", a.body);
    assert_eq!(c.get("obj"), [part, b"tail".to_vec()].concat());
    server.assert_no_uploads_left();
    assert_eq!(server.requests(Op::UploadPart), 6);
    assert_eq!(server.requests(Op::CompleteMultipartUpload), 3);
    assert_eq!(server.requests(Op::GetObject), 1);
}
