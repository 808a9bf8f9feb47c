//! `ringfeed get` and `ringfeed put` as a user runs them: round trips
//! through the tests' S3-compatible server (`examples/s3_server.rs`, run as
//! a program: this crate does not build the root crate's test support),
//! over HTTP from `ringfeed serve`, and between local files; a second
//! `put` refused with the library's message and `--overwrite` replacing; a
//! prefix or directory fetched into a directory of files; stdin and stdout;
//! bad URLs and missing objects failing with a message naming them; a get
//! stopped by Ctrl-C leaving no file.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

#[allow(dead_code)]
#[path = "common/s3.rs"]
mod s3;
use s3::{ACCESS_KEY, SECRET_KEY};

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");
const BUCKET: &str = "ckpt";
/// S3's smallest part: objects above it are multipart uploads.
const PART: &str = "5MiB";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The command with the S3 server's credentials in its environment (the
/// way a user gives them: never on the command line) and nothing of the
/// caller's AWS settings.
fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        // No profile files of the machine's user.
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent");
    c
}

fn run(args: &[&str]) -> Output {
    command(args).stdin(Stdio::null()).output().unwrap()
}

/// Runs and expects success; returns stderr (the summary line's stream).
fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stderr)
}

/// Runs and expects failure with `want` in stderr.
fn fails(args: &[&str], want: &str) -> String {
    let o = run(args);
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert!(err.contains(want), "{args:?}: `{want}` not in: {err}");
    assert!(
        !err.contains(SECRET_KEY),
        "{args:?} printed the secret: {err}"
    );
    err
}

/// Bytes of a pattern checkable anywhere, different per seed.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Files of `dir` (names), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `examples/store_emulator`, the object-store emulator.
fn store_emulator_bin() -> &'static Path {
    static BIN_PATH: OnceLock<PathBuf> = OnceLock::new();
    BIN_PATH.get_or_init(|| s3::example_bin("store_emulator"))
}

/// The tests' S3 server with the bucket [`BUCKET`].
struct S3(s3::S3);

impl S3 {
    fn start() -> S3 {
        S3(s3::S3::start(&[BUCKET]))
    }

    /// The flags naming the server.
    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = args.to_vec();
        v.extend(["--s3-endpoint", &self.0.endpoint, "--part-size", PART]);
        v
    }

    /// Files the server holds under the bucket, multipart state aside.
    fn stored(&self, key: &str) -> Vec<u8> {
        self.0.stored(BUCKET, key).unwrap()
    }
}

#[test]
fn put_and_get_round_trip_through_s3() {
    let s3 = S3::start();
    let tmp = tempfile::tempdir().unwrap();
    // Multipart (3 parts of 5 MiB, the last short) and a single PutObject.
    let big = bytes((12 << 20) + 123, 1);
    let small = bytes(1000, 2);
    let (big_path, small_path) = (tmp.path().join("big.bin"), tmp.path().join("small.bin"));
    std::fs::write(&big_path, &big).unwrap();
    std::fs::write(&small_path, &small).unwrap();
    let big_url = format!("s3://{BUCKET}/run/big.bin");
    let small_url = format!("s3://{BUCKET}/run/small.bin");

    let err = ok(&s3.args(&["put", s(&big_path), &big_url, "--parts-in-flight", "2"]));
    assert!(
        err.contains(&format!("put 1 object, {} bytes in ", big.len())) && err.contains("(s3)"),
        "{err}"
    );
    ok(&s3.args(&["put", s(&small_path), &small_url, "--checksum", "md5"]));
    assert_eq!(s3.stored("run/big.bin"), big);
    assert_eq!(s3.stored("run/small.bin"), small);

    // One object to a file, and to stdout.
    let got = tmp.path().join("got.bin");
    let err = ok(&s3.args(&["get", &big_url, "-o", s(&got)]));
    assert!(
        err.contains(&format!("got 1 object, {} bytes in ", big.len())) && err.contains("GB/s ("),
        "{err}"
    );
    assert_eq!(std::fs::read(&got).unwrap(), big);
    let o = run(&s3.args(&["get", &small_url, "-o", "-"]));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(o.stdout, small);

    // A prefix: a directory of files named after the keys' last segment.
    let dir = tmp.path().join("fetched");
    let err = ok(&s3.args(&["get", &format!("s3://{BUCKET}/run/"), "-o", s(&dir)]));
    assert!(err.contains("got 2 objects, "), "{err}");
    assert_eq!(names(&dir), ["big.bin", "small.bin"]);
    assert_eq!(std::fs::read(dir.join("big.bin")).unwrap(), big);
    assert_eq!(std::fs::read(dir.join("small.bin")).unwrap(), small);
    // Again: the files are there, and stay.
    fails(
        &s3.args(&["get", &format!("s3://{BUCKET}/run/"), "-o", s(&dir)]),
        "--overwrite",
    );
    assert_eq!(std::fs::read(dir.join("small.bin")).unwrap(), small);

    // A second put is refused with the library's message; --overwrite
    // replaces.
    let err = fails(
        &s3.args(&["put", s(&small_path), &big_url]),
        "already exists",
    );
    assert!(
        err.contains("run/big.bin") && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(s3.stored("run/big.bin"), big);
    ok(&s3.args(&["put", "--overwrite", s(&small_path), &big_url]));
    ok(&s3.args(&["get", "--overwrite", &big_url, "-o", s(&got)]));
    assert_eq!(std::fs::read(&got).unwrap(), small);
}

#[test]
fn put_streams_stdin_to_s3_in_parts() {
    let s3 = S3::start();
    let data = bytes((11 << 20) + 7, 3);
    let url = format!("s3://{BUCKET}/piped.bin");
    let mut child = command(&s3.args(&["put", "-", &url, "--checksum", "crc64nvme"]))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // In pieces smaller than a part, as a pipe delivers them.
    for piece in data.chunks(300_000) {
        stdin.write_all(piece).unwrap();
    }
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(&format!("put 1 object, {} bytes", data.len())),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(s3.stored("piped.bin"), data);
}

#[test]
fn s3_errors_name_the_object_and_leave_nothing() {
    let s3 = S3::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("f.bin");
    std::fs::write(&file, bytes(100, 4)).unwrap();
    // A key that is not there.
    let out = tmp.path().join("out");
    fails(
        &s3.args(&["get", &format!("s3://{BUCKET}/missing.bin"), "-o", s(&out)]),
        "missing.bin",
    );
    assert!(!out.exists());
    // A bucket that is not there.
    fails(
        &s3.args(&["put", s(&file), "s3://no-such-bucket/k"]),
        "no-such-bucket",
    );
    // No key to write to.
    fails(
        &s3.args(&["put", s(&file), &format!("s3://{BUCKET}")]),
        "s3://",
    );
    // Bad configuration, from a flag and from --config.
    fails(
        &s3.args(&["put", s(&file), "s3://ckpt/k", "--checksum", "sha3"]),
        "checksum",
    );
    fails(
        &s3.args(&["get", "s3://ckpt/k", "--config", "{\"parts_in_flight\": 0}"]),
        "parts_in_flight",
    );
    fails(
        &s3.args(&["get", "s3://ckpt/k", "--config", "[1]"]),
        "JSON object",
    );
}

/// `ringfeed serve DIR`'s URL, and the server (killed when dropped).
struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Served {
    let mut child = Command::new(BIN)
        .args(["serve", s(dir), "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    Served(child, url.trim().to_string())
}

#[test]
fn get_reads_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes((3 << 20) + 5, 5);
    std::fs::write(dir.path().join("weights.bin"), &data).unwrap();
    let server = serve(dir.path());
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("{}weights.bin", server.1);
    // Parts of 1 MiB, 4 at a time; default destination: the object's name
    // in the current directory.
    let o = command(&["get", &url, "--part-size", "1MiB", "--parts-in-flight", "4"])
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(tmp.path().join("weights.bin")).unwrap(), data);
    fails(&["get", &format!("{}missing.bin", server.1)], "missing.bin");
    // The server's root is no object.
    fails(&["get", &server.1, "-o", s(tmp.path())], "404");
    // HTTP servers take no uploads.
    fails(
        &["put", s(&tmp.path().join("weights.bin")), &url],
        "no uploads",
    );
}

/// Ctrl-C during a get into a file stops the read and leaves nothing
/// behind: no file, no temporary one; the exit status is a shell's for
/// SIGINT (130). The object comes from the object-store emulator at
/// 1 MB/s a connection, 2 parts in flight: 16 MiB take 8 s, and the
/// signal goes once the temporary file is there (the read has begun).
#[test]
fn get_interrupted_leaves_no_file() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("b")).unwrap();
    std::fs::write(root.path().join("b/big.bin"), bytes(16 << 20, 3)).unwrap();
    let mut emulator = Command::new(store_emulator_bin())
        .arg(root.path())
        .args(["--unlimited", "--conn-rate", "1MB/s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(emulator.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = format!("{}/b/big.bin", line.trim());
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("big.bin");
    let mut get = command(&[
        "get",
        &url,
        "-o",
        s(&dest),
        "--part-size",
        "1MiB",
        "--parts-in-flight",
        "2",
    ])
    .stdin(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let begun = std::time::Instant::now();
    while names(out.path()).is_empty() {
        assert!(
            get.try_wait().unwrap().is_none(),
            "get ended before its file was opened"
        );
        assert!(
            begun.elapsed().as_secs() < 120,
            "no temporary file after 2 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: signalling a child of this test, still running.
    assert_eq!(unsafe { libc::kill(get.id() as i32, libc::SIGINT) }, 0);
    let o = get.wait_with_output().unwrap();
    // The read stopped at the signal: the parts then in flight finished,
    // not the object (a read that went on to its end served all 16 MiB).
    let stats = {
        use std::io::Read;
        let addr = line.trim().trim_start_matches("http://");
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        write!(
            c,
            "GET /_emulator/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    };
    let _ = emulator.kill();
    let _ = emulator.wait();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(names(out.path()), Vec::<String>::new(), "{err}");
    let served: u64 = stats
        .split("\"bytes\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no bytes in the emulator's stats: {stats}"));
    assert!(
        served < 16 << 20,
        "the read went on to its end: {served} bytes served"
    );
}

#[test]
fn get_writes_into_a_pipe_and_never_replaces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = bytes(300_000, 9);
    let src = tmp.path().join("a.bin");
    std::fs::write(&src, &data).unwrap();
    let fifo = tmp.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    // With --overwrite too: a device or pipe is written into, as a shell
    // redirect would, never replaced by a file renamed over it.
    ok(&["get", s(&src), "-o", s(&fifo), "--overwrite"]);
    assert_eq!(reader.join().unwrap(), data);
    assert!(
        !std::fs::metadata(&fifo).unwrap().is_file(),
        "the pipe was replaced"
    );
}

#[test]
fn local_files_round_trip_and_are_never_replaced_unasked() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let (a, b) = (bytes(70_000, 6), bytes(5, 7));
    std::fs::write(src.join("a.bin"), &a).unwrap();
    std::fs::write(src.join("b.bin"), &b).unwrap();

    let dst = tmp.path().join("copy.bin");
    let err = ok(&[
        "put",
        s(&src.join("a.bin")),
        s(&dst),
        "--part-size",
        "64KiB",
    ]);
    assert!(
        err.contains("put 1 object, 70000 bytes") && err.contains("(local file)"),
        "{err}"
    );
    assert_eq!(std::fs::read(&dst).unwrap(), a);
    let err = fails(&["put", s(&src.join("b.bin")), s(&dst)], "already exists");
    assert!(
        err.contains(s(&dst)) && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(std::fs::read(&dst).unwrap(), a);
    ok(&[
        "put",
        "--overwrite",
        s(&src.join("b.bin")),
        &format!("file://{}", s(&dst)),
    ]);
    assert_eq!(std::fs::read(&dst).unwrap(), b);

    // A directory: a new directory of its files; no temporary file left.
    let out = tmp.path().join("out/nested");
    let err = ok(&["get", s(&src), "-o", s(&out)]);
    assert!(err.contains("got 2 objects, 70005 bytes"), "{err}");
    assert_eq!(names(&out), ["a.bin", "b.bin"]);
    assert_eq!(std::fs::read(out.join("a.bin")).unwrap(), a);
    // One object into a directory that exists: under its name there.
    let one = tmp.path().join("one");
    std::fs::create_dir(&one).unwrap();
    ok(&["get", s(&src.join("b.bin")), "-o", s(&one)]);
    assert_eq!(names(&one), ["b.bin"]);
    // Braces expand.
    let o = run(&["get", &format!("{}/{{a,b}}.bin", s(&src)), "-o", "-"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(o.stdout, [a.as_slice(), b.as_slice()].concat());

    // Missing objects and bad URLs.
    fails(&["get", s(&src.join("nope.bin"))], "nope.bin");
    fails(&["put", s(&src.join("nope.bin")), s(&dst)], "nope.bin");
    fails(&["get", "ftp://host/x"], "ftp");
    fails(
        &["put", s(&src.join("a.bin")), "ftp://host/x"],
        "unsupported scheme",
    );
    fails(&["get", &format!("{}/*.none", s(&src))], "*.none");
    assert_eq!(names(tmp.path()), ["copy.bin", "one", "out", "src"]);
}

/// The AWS CLI's `--endpoint-url` and `--no-sign-request` on every command
/// that reads S3, the `--s3-*` names kept as aliases.
#[test]
fn aws_cli_flag_names_reach_every_s3_command() {
    for cmd in ["bench", "ls", "index", "cat", "get", "put"] {
        let help = text(&run(&[cmd, "--help"]).stdout);
        for want in [
            "--endpoint-url <URL>",
            "--no-sign-request",
            "`s3_endpoint`",
            "`s3_unsigned`",
            "--s3-endpoint",
        ] {
            assert!(help.contains(want), "{cmd} --help lacks {want}:\n{help}");
        }
    }
    let s3 = S3::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("x.tar");
    let data = bytes(3000, 5);
    std::fs::write(&file, &data).unwrap();
    let ep = s3.0.endpoint.as_str();
    let url = format!("s3://{BUCKET}/data/a/x.tar");
    ok(&["put", s(&file), &url, "--endpoint-url", ep]);
    assert_eq!(s3.stored("data/a/x.tar"), data);
    // A prefix lists every depth; a pattern picks keys.
    for listed in [
        format!("s3://{BUCKET}/data/"),
        format!("s3://{BUCKET}/data/**/*.tar"),
    ] {
        let o = run(&["ls", &listed, "--endpoint-url", ep]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert!(
            text(&o.stdout).contains(&url),
            "{listed}: {}",
            text(&o.stdout)
        );
    }
    let out = tmp.path().join("back.tar");
    ok(&["get", &url, "-o", s(&out), "--endpoint-url", ep]);
    assert_eq!(std::fs::read(&out).unwrap(), data);
    // Unsigned requests reach the server, which wants signatures.
    fails(
        &[
            "ls",
            &format!("s3://{BUCKET}/data/"),
            "--endpoint-url",
            ep,
            "--no-sign-request",
        ],
        "403",
    );
    fails(
        &[
            "get",
            &url,
            "-o",
            s(&out),
            "--endpoint-url",
            ep,
            "--no-sign-request",
            "--overwrite",
        ],
        "403",
    );
}
