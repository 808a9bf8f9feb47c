//! Whole objects from local files and a real HTTP server started here:
//! every size around the part size read back byte for byte on both
//! backends, into the library's memory and a caller's buffer; faults
//! retried; garbage, missing objects and an object that changes under the
//! read named; objects streamed in order through a window of reused part
//! buffers, after faults too, and a sink that refuses named; local writes
//! that appear only whole and never replace a file unless asked. (S3 reads and writes: `tests/objects_s3.rs`.)

use std::path::Path;
use std::sync::atomic::Ordering;

use ringfeed_test_support as support;

use ringfeed::object::{self, ObjectWriter};
use ringfeed::{Config, Error};
use support::{Server, pattern};

const PART: u64 = 64 << 10;

fn cfg(extra: &str) -> Config {
    let text =
        format!(r#"{{"part_size": {PART}, "parts_in_flight": 4, "max_attempts": 4 {extra}}}"#);
    Config::for_objects(&text).unwrap()
}

const SIZES: [usize; 8] = [
    0,
    1,
    PART as usize - 1,
    PART as usize,
    PART as usize + 1,
    3 * PART as usize,
    7 * PART as usize + 333,
    40 * PART as usize + 5,
];

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let name = format!("obj-{i}.bin");
            let data = pattern(i as u64 + 1, n);
            std::fs::write(dir.join(&name), &data).unwrap();
            (name, data)
        })
        .collect()
}

#[test]
fn local_and_http_objects_of_every_size_read_back_exactly_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    for backend in ["io_uring", "threads"] {
        let c = cfg(&format!(r#", "io_backend": "{backend}""#));
        for (name, data) in &objs {
            for url in [
                dir.path().join(name).display().to_string(),
                server.url(name),
            ] {
                let progress = object::Progress::default();
                let got = object::read(&url, &c, Some(&progress)).unwrap();
                assert_eq!(got.len(), data.len(), "{url}");
                assert!(
                    got.as_slice() == &data[..],
                    "{url} on {backend}: bytes differ"
                );
                assert_eq!(got.report.backend.name(), backend);
                assert_eq!(got.report.parts as u64, (data.len() as u64).div_ceil(PART));
                assert_eq!(progress.bytes(), data.len() as u64);

                let mut buf = vec![0xAAu8; data.len() + 3];
                let (n, _) = object::read_into(&url, &c, &mut buf, None).unwrap();
                assert_eq!(n as usize, data.len());
                assert!(
                    buf[..data.len()] == data[..],
                    "{url}: read_into bytes differ"
                );
                assert_eq!(
                    &buf[data.len()..],
                    &[0xAA; 3],
                    "{url}: wrote past the object"
                );
            }
        }
    }
    // Parts in flight at once: several ranged GETs of one object, each a
    // part, none twice. Hedging off: on a loaded machine a part far behind
    // its peers is asked for again on a fresh connection, as it should be
    // (tests/hedge.rs), and CI once saw one range twice here.
    let big = &objs[7];
    let before = server.faults.ranges.lock().unwrap().len();
    object::read(&server.url(&big.0), &cfg(r#", "hedge": false"#), None).unwrap();
    let ranges = server.faults.ranges.lock().unwrap()[before..].to_vec();
    assert_eq!(
        ranges.len() as u64,
        (big.1.len() as u64).div_ceil(PART),
        "{ranges:?}"
    );
}

#[test]
fn a_caller_buffer_too_small_is_named_before_any_read() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let (name, data) = &objs[5];
    let mut buf = vec![0u8; data.len() - 1];
    let gets = server.faults.gets.load(Ordering::SeqCst);
    let e = object::read_into(&server.url(name), &cfg(""), &mut buf, None).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&format!("is {} bytes", data.len())), "{text}");
    assert!(
        text.contains(&format!("holds {}", data.len() - 1)),
        "{text}"
    );
    assert_eq!(
        server.faults.gets.load(Ordering::SeqCst),
        gets,
        "no GET before the check"
    );
}

#[test]
fn faults_are_retried_per_part_and_the_bytes_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let (name, data) = &objs[7];
    for backend in ["io_uring", "threads"] {
        let f = &server.faults;
        f.throttle.store(2, Ordering::SeqCst);
        f.server_error.store(1, Ordering::SeqCst);
        f.reset.store(2, Ordering::SeqCst);
        f.truncate.store(2, Ordering::SeqCst);
        let c = cfg(&format!(
            r#", "io_backend": "{backend}", "max_attempts": 10"#
        ));
        let got = object::read(&server.url(name), &c, None).unwrap();
        assert!(
            got.as_slice() == &data[..],
            "{backend}: bytes differ after faults"
        );
        for (what, left) in [
            ("throttle", &f.throttle),
            ("server_error", &f.server_error),
            ("reset", &f.reset),
            ("truncate", &f.truncate),
        ] {
            assert_eq!(
                left.load(Ordering::SeqCst),
                0,
                "{backend}: {what} not all fired"
            );
        }
    }
}

/// A sink that takes `room` bytes, then refuses as a closed pipe does.
struct Sink {
    got: Vec<u8>,
    room: usize,
}

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.got.len() + b.len() > self.room {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        self.got.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn stream(url: &str, c: &Config, sink: &mut Sink) -> ringfeed::Result<object::ReadReport> {
    let net = ringfeed::net::NetOptions::for_config(c);
    let shard = object::one(url, c, &net)?;
    object::stream_shard(&shard, c, &net, sink, "the sink", None, None)
}

#[test]
fn streamed_objects_of_every_size_arrive_whole_and_in_order_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    for backend in ["io_uring", "threads"] {
        let c = cfg(&format!(
            r#", "io_backend": "{backend}", "max_attempts": 10"#
        ));
        for (name, data) in &objs {
            for url in [
                dir.path().join(name).display().to_string(),
                server.url(name),
            ] {
                let mut sink = Sink {
                    got: Vec::new(),
                    room: usize::MAX,
                };
                let r = stream(&url, &c, &mut sink).unwrap();
                assert!(sink.got == data[..], "{url} on {backend}: bytes differ");
                assert_eq!(r.backend.name(), backend);
                assert_eq!(r.bytes, data.len() as u64);
            }
        }
    }
}

/// Parts retried after faults (resets and truncations mid-body, 503s, a
/// 500) complete after the parts behind them, and their slots are reused
/// by later parts as soon as they are written: the bytes still arrive
/// whole and in order (41 parts through a window of 8 slots), many times
/// over, so that a receive that wrote into a slot after its part was
/// given back would show as bytes that differ.
#[test]
fn streamed_parts_retried_after_faults_arrive_in_order_through_reused_slots() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let (name, data) = &objs[7];
    for backend in ["io_uring", "threads"] {
        let c = cfg(&format!(
            r#", "io_backend": "{backend}", "max_attempts": 10"#
        ));
        for round in 0..20 {
            let f = &server.faults;
            f.reset.store(3, Ordering::SeqCst);
            f.truncate.store(3, Ordering::SeqCst);
            f.throttle.store(2, Ordering::SeqCst);
            f.server_error.store(1, Ordering::SeqCst);
            let mut sink = Sink {
                got: Vec::new(),
                room: usize::MAX,
            };
            stream(&server.url(name), &c, &mut sink).unwrap();
            assert!(
                sink.got == data[..],
                "{backend}, round {round}: bytes differ after faults"
            );
            for (what, left) in [("reset", &f.reset), ("truncate", &f.truncate)] {
                assert_eq!(
                    left.load(Ordering::SeqCst),
                    0,
                    "{backend}: {what} not all fired"
                );
            }
        }
    }
}

#[test]
fn a_sink_that_refuses_is_named_and_stops_the_parts() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let (name, data) = &objs[7];
    let parts = (data.len() as u64).div_ceil(PART) as usize;
    // GETs are counted: no hedge's twin (see the test above).
    let c = cfg(r#", "io_backend": "io_uring", "hedge": false"#);
    let gets = |s: &Server| s.faults.gets.load(Ordering::SeqCst);

    let before = gets(&server);
    let mut sink = Sink {
        got: Vec::new(),
        room: 2 * PART as usize,
    };
    let e = stream(&server.url(name), &c, &mut sink).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::Io { .. }) && text.contains("the sink"),
        "{text}"
    );
    assert!(
        sink.got == data[..2 * PART as usize],
        "the bytes before the refusal"
    );
    // No part is asked for once a part could not be written: the two
    // parts written, the one refused, and at most the window's 8 slots.
    let asked = gets(&server) - before;
    assert!(
        asked <= 3 + 8,
        "{asked} GETs of {parts} parts after the refusal"
    );

    // Control: the same read into a sink with room asks for every part.
    let before = gets(&server);
    let mut sink = Sink {
        got: Vec::new(),
        room: usize::MAX,
    };
    stream(&server.url(name), &c, &mut sink).unwrap();
    assert_eq!(gets(&server) - before, parts);
}

/// A stream whose caller gives up (`stop` says so once a part is in) ends
/// with an error naming the sink and asks for no more parts than the
/// window held; the control, never stopped, asks for every part.
#[test]
fn a_stream_stopped_by_its_caller_ends_early_and_names_the_sink() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let (name, data) = &objs[7];
    let parts = (data.len() as u64).div_ceil(PART) as usize;
    // GETs are counted: no hedge's twin.
    let c = cfg(r#", "io_backend": "io_uring", "hedge": false"#);
    let net = ringfeed::net::NetOptions::for_config(&c);
    let url = server.url(name);
    let gets = |s: &Server| s.faults.gets.load(Ordering::SeqCst);
    for stopped in [true, false] {
        let shard = object::one(&url, &c, &net).unwrap();
        let before = gets(&server);
        let mut sink = Sink {
            got: Vec::new(),
            room: usize::MAX,
        };
        let stop = || stopped;
        let r = object::stream_shard(&shard, &c, &net, &mut sink, "the sink", None, Some(&stop));
        let asked = gets(&server) - before;
        if stopped {
            let text = r.unwrap_err().to_string();
            assert!(
                text.contains("the sink") && text.contains("stopped"),
                "{text}"
            );
            assert!(asked <= 8, "{asked} GETs of {parts} parts after the stop");
            assert!(sink.got.len() < data.len());
        } else {
            r.unwrap();
            assert_eq!(asked, parts);
            assert!(sink.got == data[..]);
        }
    }
}

#[test]
fn missing_garbage_and_failing_objects_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    let server = Server::start(dir.path().to_path_buf());
    let c = cfg(r#", "max_attempts": 2"#);

    let e = object::read(&server.url("nope.bin"), &c, None).unwrap_err();
    assert!(
        e.to_string().contains("nope.bin") && e.to_string().contains("404"),
        "{e}"
    );
    let e = object::read(&dir.path().join("nope.bin").display().to_string(), &c, None).unwrap_err();
    assert!(e.to_string().contains("nope.bin"), "{e}");
    for bad in ["http://", "s3://", "ftp://x/y", "http://[::1/x"] {
        let e = object::read(bad, &c, None).unwrap_err();
        assert!(matches!(e, Error::Url { .. }), "{bad}: {e}");
    }

    // A server that always fails a part: the error names the part.
    let (name, _) = &objs[6];
    server.faults.server_error.store(1000, Ordering::SeqCst);
    let e = object::read(&server.url(name), &c, None).unwrap_err();
    server.faults.server_error.store(0, Ordering::SeqCst);
    let text = e.to_string();
    assert!(matches!(e, Error::Part { .. }), "{text}");
    assert!(text.contains(name) && text.contains("part "), "{text}");
    assert!(text.contains("after 2 attempts"), "{text}");

    // Garbage for an answer.
    server.faults.garbage.store(true, Ordering::SeqCst);
    let e = object::read(&server.url(name), &c, None).unwrap_err();
    server.faults.garbage.store(false, Ordering::SeqCst);
    assert!(e.to_string().contains(name), "{e}");

    // A directory names several objects: read one by one.
    let e = object::read(&dir.path().display().to_string(), &c, None).unwrap_err();
    assert!(e.to_string().contains("names 8 objects"), "{e}");
}

#[test]
fn an_object_that_changes_under_the_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(9, 10 * PART as usize);
    let path = dir.path().join("grows.bin");
    std::fs::write(&path, &data).unwrap();
    let server = Server::start(dir.path().to_path_buf());
    // Sized by HEAD, then the object grows before the GETs.
    let c = cfg("");
    let shard = object::one(
        &server.url("grows.bin"),
        &c,
        &ringfeed::net::NetOptions::for_config(&c),
    )
    .unwrap();
    std::fs::write(&path, pattern(9, 11 * PART as usize)).unwrap();
    let e = object::read::read_shard(&shard, &c, &ringfeed::net::NetOptions::for_config(&c), None)
        .unwrap_err();
    assert!(e.to_string().contains("changed while it was read"), "{e}");
}

#[test]
fn a_directory_lists_every_file_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let objs = files(dir.path());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let listed = object::list(&[dir.path().display().to_string()], &cfg("")).unwrap();
    let got: Vec<_> = listed
        .iter()
        .map(|s| {
            (
                Path::new(&s.name)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string(),
                s.size,
            )
        })
        .collect();
    let want: Vec<_> = objs
        .iter()
        .map(|(n, d)| (n.clone(), Some(d.len() as u64)))
        .collect();
    assert_eq!(got, want);
    let empty = tempfile::tempdir().unwrap();
    let e = object::list(&[empty.path().display().to_string()], &cfg("")).unwrap_err();
    assert!(e.to_string().contains("holds no files"), "{e}");
}

#[test]
fn local_writes_appear_whole_and_never_replace_a_file_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg("");
    for (i, &n) in SIZES.iter().enumerate() {
        let path = dir.path().join(format!("w-{i}.bin"));
        let url = path.display().to_string();
        let data = pattern(100 + i as u64, n);
        let mut w = ObjectWriter::open(&url, &c, None).unwrap();
        for piece in data.chunks(10_007) {
            w.write(piece).unwrap();
            assert!(!path.exists(), "visible before finish");
        }
        w.finish().unwrap();
        assert!(std::fs::read(&path).unwrap() == data, "{url}");
        // Written again: refused, the first stays.
        let e = object::write(&url, b"other", &c, None).unwrap_err();
        assert!(matches!(e, Error::Exists { .. }), "{e}");
        assert!(e.to_string().contains("overwrite"), "{e}");
        assert!(std::fs::read(&path).unwrap() == data);
    }
    // With overwrite: replaced.
    let url = dir.path().join("w-1.bin").display().to_string();
    object::write(&url, b"other", &cfg(r#", "overwrite": true"#), None).unwrap();
    assert_eq!(std::fs::read(dir.path().join("w-1.bin")).unwrap(), b"other");

    // A pipe (or a device) is never replaced by a file, overwrite or not.
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let e = object::write(
        &fifo.display().to_string(),
        b"x",
        &cfg(r#", "overwrite": true"#),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(
        !std::fs::metadata(&fifo).unwrap().is_file(),
        "the pipe was replaced"
    );
    std::fs::remove_file(&fifo).unwrap();

    // Dropped or aborted unfinished: nothing is left, not even a
    // temporary file.
    let url = dir.path().join("dropped.bin").display().to_string();
    let mut w = ObjectWriter::open(&url, &c, None).unwrap();
    w.write(&pattern(1, 1000)).unwrap();
    drop(w);
    let mut w = ObjectWriter::open(&url, &c, None).unwrap();
    w.write(&pattern(1, 1000)).unwrap();
    w.abort().unwrap();
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    let want: Vec<_> = (0..SIZES.len()).map(|i| format!("w-{i}.bin")).collect();
    assert_eq!(names, want);

    // Two writers race for one new name: exactly one wins.
    let url = dir.path().join("raced.bin").display().to_string();
    let (mut a, mut b) = (
        ObjectWriter::open(&url, &c, None).unwrap(),
        ObjectWriter::open(&url, &c, None).unwrap(),
    );
    a.write(b"aaaa").unwrap();
    b.write(b"bbbb").unwrap();
    a.finish().unwrap();
    let e = b.finish().unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    assert_eq!(
        std::fs::read(dir.path().join("raced.bin")).unwrap(),
        b"aaaa"
    );
    // Calls after the end are errors, not crashes.
    assert!(b.write(b"x").is_err());
    assert!(a.finish().is_err());
}

#[test]
fn writes_to_http_and_bad_targets_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg("");
    let e = object::write("http://127.0.0.1:9/x", b"x", &c, None).unwrap_err();
    assert!(e.to_string().contains("no uploads"), "{e}");
    let e = object::write(
        &dir.path().join("no/such/dir/x").display().to_string(),
        b"x",
        &c,
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("no/such/dir"), "{e}");
    let e = object::write("s3://bucket/", b"x", &c, None).unwrap_err();
    assert!(e.to_string().contains("prefix"), "{e}");
    let e = ObjectWriter::open("s3://b/k", &cfg(r#", "part_size": "1MiB""#), None).unwrap_err();
    assert!(e.to_string().contains("at least 5 MiB"), "{e}");
    for bad in [
        r#"{"part_size": 10}"#,
        r#"{"parts_in_flight": 0}"#,
        r#"{"parts_in_flight": 1000}"#,
        r#"{"checksum": "sha3"}"#,
        r#"{"overwrite": "yes"}"#,
        r#"[1]"#,
        r#"{"urlz": 1}"#,
    ] {
        let e = Config::for_objects(bad).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
    }
    assert!(Config::for_objects("").is_ok());
}
