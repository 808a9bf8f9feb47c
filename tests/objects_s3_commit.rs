//! Whether an S3 object is there, and whether a write that lost its last
//! answer is done, against the S3-compatible server started here:
//!
//! - `object::exists` says absent only on 404 `NoSuchKey`; a key a policy
//!   denies (403 `AccessDenied`), an expired token (400 `ExpiredToken`), a
//!   missing bucket and a 5xx past its retries are errors naming S3's code;
//! - a multipart completion that S3 did while the connection dropped its
//!   answer is reported done (the object there is this upload's, by its
//!   ETag and size), whether the retry meets `PreconditionFailed`
//!   (`If-None-Match: *`) or `NoSuchUpload` (`overwrite`); the controls:
//!   at the lower layer the retried completion fails so though the object
//!   is there, and when another writer's object is what stands at the key
//!   the write is still `Error::Exists`, nothing of this upload left.

use ringfeed_test_support as support;

use ringfeed::net::s3::Env;
use ringfeed::net::s3::list::S3Client;
use ringfeed::net::s3::upload::{Checksum, multipart_etag};
use ringfeed::object::{self, ObjectWriter};
use ringfeed::{Config, Error};
use s3s::S3ErrorCode;
use support::pattern;
use support::s3::{ACCESS_KEY, Completion, OTHER_WRITER_BYTES, Op, S3Server, SECRET_KEY};

const BUCKET: &str = "ckpt";
const PART: usize = 5 << 20;

fn server() -> (tempfile::TempDir, S3Server) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join(BUCKET)).unwrap();
    let s = S3Server::start(root.path());
    (root, s)
}

fn cfg(s: &S3Server, extra: &str) -> Config {
    Config::for_objects(&format!(
        r#"{{"s3_endpoint": "{}", "aws_access_key_id": "{ACCESS_KEY}",
            "aws_secret_access_key": "{SECRET_KEY}", "s3_region": "us-east-1",
            "part_size": {PART}, "parts_in_flight": 2, "max_attempts": 3 {extra}}}"#,
        s.endpoint()
    ))
    .unwrap()
}

fn url(key: &str) -> String {
    format!("s3://{BUCKET}/{key}")
}

/// The S3 error `e` is, as (status, code); panics naming it otherwise.
fn s3_code(e: &Error) -> (u16, &str) {
    match e {
        Error::S3 { status, code, .. } => (*status, code.as_str()),
        other => panic!("not an S3 error: {other:?}"),
    }
}

#[test]
fn exists_is_absent_only_on_no_such_key_and_other_answers_are_their_errors() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    object::write(&url("there.bin"), b"x", &c, None).unwrap();
    object::write(&url("empty.bin"), b"", &c, None).unwrap();
    object::write(&url("denied/there.bin"), b"x", &c, None).unwrap();
    assert!(object::exists(&url("there.bin"), &c).unwrap());
    assert!(object::exists(&url("empty.bin"), &c).unwrap());
    assert!(!object::exists(&url("missing.bin"), &c).unwrap());

    s.deny(BUCKET, "denied/", S3ErrorCode::AccessDenied);
    s.deny(BUCKET, "expired/", S3ErrorCode::ExpiredToken);
    for key in ["denied/there.bin", "denied/missing.bin"] {
        let e = object::exists(&url(key), &c).unwrap_err();
        assert_eq!(s3_code(&e), (403, "AccessDenied"), "{key}: {e}");
        assert!(e.to_string().contains(key), "{e}");
    }
    let e = object::exists(&url("expired/k"), &c).unwrap_err();
    assert_eq!(s3_code(&e), (400, "ExpiredToken"), "{e}");
    let e = object::exists("s3://no-such-bucket/k", &c).unwrap_err();
    assert_eq!(s3_code(&e), (404, "NoSuchBucket"), "{e}");

    // A 5xx on every attempt: an error after the retries, not "absent".
    s.clear_faults();
    let before = s.requests(Op::GetObject);
    s.fail(Op::GetObject, S3ErrorCode::InternalError, None);
    let e = object::exists(&url("missing.bin"), &c).unwrap_err();
    assert_eq!(s.requests(Op::GetObject) - before, 3, "every attempt: {e}");
    assert_eq!(s3_code(&e).1, "InternalError", "{e}");
    s.clear_faults();
    assert!(!object::exists(&url("missing.bin"), &c).unwrap());

    // Local paths: there, or not.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    assert!(!object::exists(file.to_str().unwrap(), &c).unwrap());
    std::fs::write(&file, b"x").unwrap();
    assert!(object::exists(file.to_str().unwrap(), &c).unwrap());
}

#[test]
fn a_completion_whose_answer_was_lost_is_reported_done() {
    let (_root, s) = server();
    for (i, overwrite) in [(0, false), (1, true)] {
        let c = cfg(&s, &format!(r#", "overwrite": {overwrite}"#));
        let data = pattern(40 + i, 2 * PART + PART / 2);
        let key = format!("lost-answer-{i}.bin");
        let completions = s.requests(Op::CompleteMultipartUpload);
        s.complete_as(Completion::LoseAnswer, Some(1));
        object::write(&url(&key), &data, &c, None)
            .unwrap_or_else(|e| panic!("overwrite {overwrite}: {e}"));
        assert_eq!(
            s.requests(Op::CompleteMultipartUpload) - completions,
            2,
            "the completion was retried"
        );
        let got = object::read(&url(&key), &c, None).unwrap();
        assert!(got.as_slice() == &data[..], "{key}: bytes differ");
        s.assert_no_uploads_left();
    }
}

#[test]
fn control_the_retried_completion_itself_fails_though_the_object_is_there() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    let client = S3Client::new(&c.s3, &Env::process()).unwrap();
    let key = "raw.bin";
    let id = client.create_upload(BUCKET, key, Checksum::None).unwrap();
    let data = pattern(9, PART + 10);
    let timeout = std::time::Duration::from_secs(60);
    let parts = [(1, &data[..PART]), (2, &data[PART..])]
        .into_iter()
        .map(|(n, body)| {
            let body = bytes::Bytes::copy_from_slice(body);
            client
                .upload_part(BUCKET, key, &id, n, body, Checksum::None, timeout)
                .unwrap()
        })
        .collect::<Vec<_>>();
    s.complete_as(Completion::LoseAnswer, Some(1));
    let lost = client
        .complete_upload(BUCKET, key, &id, &parts, Checksum::None, false)
        .unwrap_err();
    assert_eq!(lost.code, None, "no answer: {lost:?}");
    let retry = client
        .complete_upload(BUCKET, key, &id, &parts, Checksum::None, false)
        .unwrap_err();
    assert_eq!(
        retry.code.as_deref(),
        Some("PreconditionFailed"),
        "{retry:?}"
    );
    let unconditional = client
        .complete_upload(BUCKET, key, &id, &parts, Checksum::None, true)
        .unwrap_err();
    assert_eq!(
        unconditional.code.as_deref(),
        Some("NoSuchUpload"),
        "{unconditional:?}"
    );
    // Yet the object is there, and its ETag is the one the parts make:
    // what the writer compares.
    let head = client
        .head(BUCKET, key)
        .unwrap()
        .expect("the object is there");
    assert_eq!(head.etag, multipart_etag(&parts));
    assert_eq!(head.size, Some(data.len() as u64));
}

#[test]
fn control_another_writers_object_at_the_key_is_still_exists() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    let data = pattern(77, 2 * PART);
    let key = "raced.bin";
    s.complete_as(Completion::OtherWriterFirst, Some(1));
    let mut w = ObjectWriter::open(&url(key), &c, None).unwrap();
    w.write(&data).unwrap();
    let e = w.finish().unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e:?}");
    let got = object::read(&url(key), &c, None).unwrap();
    assert_eq!(
        got.as_slice(),
        OTHER_WRITER_BYTES,
        "the other writer's object stands"
    );
    // This upload was aborted: no parts left behind.
    s.assert_no_uploads_left();
    assert_eq!(s.requests(Op::AbortMultipartUpload), 1);
}
