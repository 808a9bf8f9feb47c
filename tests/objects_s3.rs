//! Whole objects on the S3-compatible server started here (s3s-fs behind
//! S3's write rules, `support::s3`): round trips of every size around the
//! part size with each checksum, written in one call and piece by piece,
//! read back with ranged GETs; a part that fails for good leaves no object
//! and no upload; retried faults lose nothing; concurrent writers to
//! different keys; overwrite refused unless asked; errors that name the
//! key, the part and S3's code, never a credential.

use std::sync::Arc;

use ringfeed_test_support as support;

use ringfeed::object::{self, ObjectWriter, Progress};
use ringfeed::{Config, Error};
use s3s::S3ErrorCode;
use support::pattern;
use support::s3::{ACCESS_KEY, Op, S3Server, SECRET_KEY};

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
            "part_size": {PART}, "parts_in_flight": 3, "max_attempts": 3 {extra}}}"#,
        s.endpoint()
    ))
    .unwrap()
}

fn url(key: &str) -> String {
    format!("s3://{BUCKET}/{key}")
}

#[test]
fn every_size_round_trips_with_each_checksum_in_one_call_and_in_pieces() {
    let (_root, s) = server();
    let sizes = [0, 1, PART - 1, PART, PART + 1, 3 * PART + PART / 2];
    for checksum in ["crc32c", "crc64nvme", "md5", "none"] {
        let c = cfg(&s, &format!(r#", "checksum": "{checksum}""#));
        for (i, &n) in sizes.iter().enumerate() {
            let data = pattern(i as u64 + 7, n);
            let key = format!("{checksum}/whole-{i}.bin");
            let progress = Arc::new(Progress::default());
            object::write(&url(&key), &data, &c, Some(Arc::clone(&progress))).unwrap();
            assert_eq!(progress.bytes(), n as u64, "{key}: progress");
            let got = object::read(&url(&key), &c, None).unwrap();
            assert!(got.as_slice() == &data[..], "{key}: bytes differ");

            // The same bytes in uneven pieces through a writer.
            let key = format!("{checksum}/pieces-{i}.bin");
            let mut w = ObjectWriter::open(&url(&key), &c, None).unwrap();
            for piece in data.chunks(1_000_003) {
                w.write(piece).unwrap();
            }
            assert_eq!(w.written(), n as u64);
            w.finish().unwrap();
            let got = object::read(&url(&key), &c, None).unwrap();
            assert!(got.as_slice() == &data[..], "{key}: bytes differ");
        }
    }
    // One PutObject below a part, a multipart upload from a part up.
    let small = sizes.iter().filter(|&&n| n < PART).count() as u64;
    let multi = sizes.len() as u64 - small;
    assert_eq!(s.requests(Op::PutObject), 4 * 2 * small);
    assert_eq!(s.requests(Op::CreateMultipartUpload), 4 * 2 * multi);
    assert_eq!(s.requests(Op::CompleteMultipartUpload), 4 * 2 * multi);
    s.assert_no_uploads_left();
}

#[test]
fn an_object_appears_only_when_complete() {
    let (root, s) = server();
    let c = cfg(&s, "");
    let path = root.path().join(BUCKET).join("late.bin");
    let mut w = ObjectWriter::open(&url("late.bin"), &c, None).unwrap();
    w.write(&pattern(1, 3 * PART)).unwrap();
    // Parts are uploading or uploaded: no object yet.
    assert!(!path.exists());
    let e = object::read(&url("late.bin"), &c, None).unwrap_err();
    assert!(
        e.to_string().contains("NoSuchKey") || e.to_string().contains("404"),
        "{e}"
    );
    w.finish().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), pattern(1, 3 * PART));
}

#[test]
fn a_part_that_fails_for_good_leaves_no_object_and_no_upload() {
    let (root, s) = server();
    let c = cfg(&s, "");
    for (code, what) in [
        (S3ErrorCode::InternalError, "InternalError"),
        (S3ErrorCode::AccessDenied, "AccessDenied"),
    ] {
        s.clear_faults();
        s.fail_upload_part(3, code);
        let key = format!("failed-{what}.bin");
        let mut w = ObjectWriter::open(&url(&key), &c, None).unwrap();
        // The failure surfaces at a later write or at finish.
        let r = w.write(&pattern(3, 6 * PART)).and_then(|()| w.finish());
        let e = r.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Part { part: 3, .. }), "{text}");
        assert!(
            text.contains(&key) && text.contains("part 3") && text.contains(what),
            "{text}"
        );
        assert!(!text.contains(SECRET_KEY), "{text}");
        assert!(
            !root.path().join(BUCKET).join(&key).exists(),
            "{key} exists"
        );
        s.assert_no_uploads_left();
        // Calls after the failure give it again.
        assert!(w.write(b"x").is_err());
        assert!(w.finish().is_err());
    }
    // Retryable faults that pass: the object is exact.
    s.clear_faults();
    s.fail_upload_part_times(2, S3ErrorCode::InternalError, 2);
    s.fail(Op::CreateMultipartUpload, S3ErrorCode::SlowDown, Some(1));
    s.fail_complete_in_body(S3ErrorCode::InternalError, Some(1));
    let data = pattern(4, 4 * PART + 9);
    object::write(&url("retried.bin"), &data, &c, None).unwrap();
    assert!(std::fs::read(root.path().join(BUCKET).join("retried.bin")).unwrap() == data);
    s.assert_no_uploads_left();
}

#[test]
fn a_writer_dropped_or_aborted_unfinished_leaves_nothing() {
    let (root, s) = server();
    let c = cfg(&s, "");
    let mut w = ObjectWriter::open(&url("dropped.bin"), &c, None).unwrap();
    w.write(&pattern(5, 2 * PART + 5)).unwrap();
    drop(w);
    let mut w = ObjectWriter::open(&url("aborted.bin"), &c, None).unwrap();
    w.write(&pattern(5, 2 * PART + 5)).unwrap();
    w.abort().unwrap();
    assert!(s.requests(Op::AbortMultipartUpload) >= 2);
    assert!(!root.path().join(BUCKET).join("dropped.bin").exists());
    assert!(!root.path().join(BUCKET).join("aborted.bin").exists());
    s.assert_no_uploads_left();
}

#[test]
fn overwrite_is_refused_unless_asked_and_racing_writers_leave_one_winner() {
    let (root, s) = server();
    let c = cfg(&s, "");
    for (key, n) in [("small.bin", 10), ("large.bin", 2 * PART + 1)] {
        object::write(&url(key), &pattern(1, n), &c, None).unwrap();
        // Refused at open, before any part is sent.
        let puts = s.requests(Op::PutObject) + s.requests(Op::UploadPart);
        let e = object::write(&url(key), &pattern(2, n), &c, None).unwrap_err();
        assert!(matches!(e, Error::Exists { .. }), "{key}: {e}");
        assert!(e.to_string().contains("already exists"), "{e}");
        assert_eq!(s.requests(Op::PutObject) + s.requests(Op::UploadPart), puts);
        assert!(std::fs::read(root.path().join(BUCKET).join(key)).unwrap() == pattern(1, n));
        object::write(
            &url(key),
            &pattern(2, n),
            &cfg(&s, r#", "overwrite": true"#),
            None,
        )
        .unwrap();
        assert!(std::fs::read(root.path().join(BUCKET).join(key)).unwrap() == pattern(2, n));
    }
    s.assert_no_uploads_left();

    // Two writers opened before either finished: the conditional
    // completion (and PutObject) refuses the second.
    for (key, n) in [("second-small.bin", 10), ("second-large.bin", 2 * PART + 1)] {
        let (mut a, mut b) = (
            ObjectWriter::open(&url(key), &c, None).unwrap(),
            ObjectWriter::open(&url(key), &c, None).unwrap(),
        );
        a.write(&pattern(3, n)).unwrap();
        b.write(&pattern(4, n)).unwrap();
        a.finish().unwrap();
        let e = b.finish().unwrap_err();
        assert!(matches!(e, Error::Exists { .. }), "{key}: {e}");
        assert!(e.to_string().contains("PreconditionFailed"), "{e}");
        assert!(std::fs::read(root.path().join(BUCKET).join(key)).unwrap() == pattern(3, n));
    }
    s.assert_no_uploads_left();

    // Four writers race for one new key: one wins whole, the others are
    // told it exists, and none leaves an upload behind.
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u64)
            .map(|i| {
                let c = c.clone();
                sc.spawn(move || {
                    object::write(&url("raced.bin"), &pattern(10 + i, 2 * PART), &c, None)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = (0..4).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, Error::Exists { .. }), "{e}");
        }
    }
    let got = std::fs::read(root.path().join(BUCKET).join("raced.bin")).unwrap();
    assert!(got == pattern(10 + winners[0] as u64, 2 * PART));
    s.assert_no_uploads_left();
}

#[test]
fn concurrent_writers_to_different_keys_each_get_their_bytes() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    std::thread::scope(|sc| {
        for i in 0..4u64 {
            let c = c.clone();
            sc.spawn(move || {
                let data = pattern(20 + i, 2 * PART + i as usize * 1000);
                object::write(&url(&format!("rank-{i}.bin")), &data, &c, None).unwrap();
            });
        }
    });
    for i in 0..4u64 {
        let got = object::read(&url(&format!("rank-{i}.bin")), &c, None).unwrap();
        assert!(got.as_slice() == &pattern(20 + i, 2 * PART + i as usize * 1000)[..]);
    }
    s.assert_no_uploads_left();
}

#[test]
fn s3_errors_name_key_and_code_and_never_a_credential() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    let e = object::write("s3://no-such-bucket/k.bin", b"abc", &c, None).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("NoSuchBucket") && text.contains("k.bin"),
        "{text}"
    );
    let e = object::read(&url("missing.bin"), &c, None).unwrap_err();
    assert!(e.to_string().contains("missing.bin"), "{e}");
    let bad = Config::for_objects(&format!(
        r#"{{"s3_endpoint": "{}", "aws_access_key_id": "{ACCESS_KEY}",
            "aws_secret_access_key": "wrong-secret-value", "s3_region": "us-east-1"}}"#,
        s.endpoint()
    ))
    .unwrap();
    let e = object::write(&url("denied.bin"), b"abc", &bad, None).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("SignatureDoesNotMatch") || text.contains("403"),
        "{text}"
    );
    assert!(
        !text.contains("wrong-secret-value") && !text.contains(SECRET_KEY),
        "{text}"
    );
}

#[test]
fn a_prefix_lists_every_object_for_a_model_directory() {
    let (_root, s) = server();
    let c = cfg(&s, "");
    let names = [
        "model/config.json",
        "model/model-00001.safetensors",
        "model/tokenizer.json",
    ];
    for (i, n) in names.iter().enumerate() {
        object::write(&url(n), &pattern(i as u64, 100 + i), &c, None).unwrap();
    }
    let listed = object::list(&[url("model/")], &c).unwrap();
    let got: Vec<_> = listed.iter().map(|s| (s.name.clone(), s.size)).collect();
    let want: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (url(n), Some(100 + i as u64)))
        .collect();
    assert_eq!(got, want);
}
