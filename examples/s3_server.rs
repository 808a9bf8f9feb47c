//! The tests' S3-compatible server (tests/support/s3/: s3s with SigV4
//! verification over s3s-fs, answering writes as S3 does) as a program, for
//! the tests of other languages and for benchmarks.
//!
//! ```text
//! s3_server ROOT [--port N] [--addr IP] [--bucket NAME]... [--fail-part N:CODE]...
//!                [--deny BUCKET/PREFIX:CODE]... [--hold-complete]
//!                [--hold-parts FILE] [--threads N] [--ignore-stdin]
//! ```
//!
//! Serves ROOT (created if missing), each folder of it a bucket; `--bucket`
//! creates one. Prints exactly one line on stdout, `http://127.0.0.1:PORT`,
//! once it listens (`--port 0`, the default: a free port; `--addr IP`: on
//! that address instead of 127.0.0.1, as in a network namespace a test
//! made for it), then serves
//! until killed or until its stdin closes, so that it stops when the
//! process that started it with a pipe dies (`--ignore-stdin`: until
//! killed only). `--fail-part 2:InternalError` makes every UploadPart of
//! part 2 fail with that S3 error code (e.g. `InternalError`, 500;
//! `AccessDenied`, 403; `SlowDown`, 503). `--deny ckpt/denied/:AccessDenied`
//! makes every request on a key of bucket `ckpt` under `denied/` fail so,
//! as a bucket policy would (an empty prefix: every key). `--hold-complete`
//! makes every CompleteMultipartUpload wait, never answered, and print
//! `s3_server: holding CompleteMultipartUpload of BUCKET/KEY` on stderr: a
//! test kills its writer there, after every part is uploaded.
//! `--hold-parts FILE` makes every UploadPart wait, unanswered, while FILE
//! exists (its body read first), printing `s3_server: holding UploadPart N
//! of BUCKET/KEY` on stderr: a store slow to take a checkpoint's parts, for
//! as long as the test keeps the file.
//!
//! Requests must be signed (SigV4, any region) with the test credentials:
//! access key `AKIARINGFEEDTEST`, secret key
//! `ringfeed-test-secret-0123456789abcdef` (`AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` for an AWS SDK). They are `ACCESS_KEY` and
//! `SECRET_KEY` of the module.
//!
//! Build: `cargo build --release --example s3_server`, then
//! `target/release/examples/s3_server`.

#[path = "../tests/support/s3/mod.rs"]
mod s3;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Runtime threads when `--threads` is not given: enough to keep a few
/// concurrent part uploads of a benchmark busy on disk and checksums.
const DEFAULT_THREADS: usize = 4;

struct Args {
    root: PathBuf,
    port: u16,
    addr: std::net::IpAddr,
    buckets: Vec<String>,
    fail_parts: Vec<(i32, s3s::S3ErrorCode)>,
    denials: Vec<(String, String, s3s::S3ErrorCode)>,
    hold_complete: bool,
    hold_parts: Option<PathBuf>,
    threads: usize,
    ignore_stdin: bool,
}

const USAGE: &str = "usage: s3_server ROOT [--port N] [--addr IP] [--bucket NAME]... \
                     [--fail-part N:CODE]... [--deny BUCKET/PREFIX:CODE]... \
                     [--hold-complete] [--hold-parts FILE] [--threads N] [--ignore-stdin]";

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut root = None;
    let mut args = Args {
        root: PathBuf::new(),
        port: 0,
        addr: std::net::Ipv4Addr::LOCALHOST.into(),
        buckets: Vec::new(),
        fail_parts: Vec::new(),
        denials: Vec::new(),
        hold_complete: false,
        hold_parts: None,
        threads: DEFAULT_THREADS,
        ignore_stdin: false,
    };
    while let Some(a) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--port" => {
                let v = value()?;
                args.port = v.parse().map_err(|_| format!("--port {v}: not a port"))?;
            }
            "--bucket" => args.buckets.push(value()?),
            "--addr" => {
                let v = value()?;
                args.addr = v
                    .parse()
                    .map_err(|_| format!("--addr {v}: not an IP address"))?;
            }
            "--fail-part" => args.fail_parts.push(fail_part(&value()?)?),
            "--deny" => args.denials.push(deny(&value()?)?),
            "--hold-complete" => args.hold_complete = true,
            "--hold-parts" => args.hold_parts = Some(PathBuf::from(value()?)),
            "--threads" => {
                let v = value()?;
                args.threads = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("--threads {v}: not a positive number"))?;
            }
            "--ignore-stdin" => args.ignore_stdin = true,
            "-h" | "--help" => return Err(USAGE.into()),
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ if root.is_none() => root = Some(PathBuf::from(a)),
            _ => return Err(format!("one ROOT only, not also {a}")),
        }
    }
    args.root = root.ok_or("ROOT is missing")?;
    Ok(args)
}

/// `N:CODE`, CODE one of S3's error codes that has an HTTP status.
fn fail_part(v: &str) -> Result<(i32, s3s::S3ErrorCode), String> {
    let (n, code) = v
        .split_once(':')
        .ok_or_else(|| format!("--fail-part {v}: not N:CODE"))?;
    let n: i32 = n
        .parse()
        .ok()
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| format!("--fail-part {v}: part number not in 1..=10000"))?;
    let code = s3s::S3ErrorCode::from_bytes(code.as_bytes())
        .filter(|c| c.status_code().is_some())
        .ok_or_else(|| format!("--fail-part {v}: {code} is not an S3 error code"))?;
    Ok((n, code))
}

/// `BUCKET/PREFIX:CODE` (the prefix may be empty), CODE one of S3's error
/// codes that has an HTTP status.
fn deny(v: &str) -> Result<(String, String, s3s::S3ErrorCode), String> {
    let (place, code) = v
        .rsplit_once(':')
        .ok_or_else(|| format!("--deny {v}: not BUCKET/PREFIX:CODE"))?;
    let (bucket, prefix) = place.split_once('/').unwrap_or((place, ""));
    if bucket.is_empty() {
        return Err(format!("--deny {v}: no bucket"));
    }
    let code = s3s::S3ErrorCode::from_bytes(code.as_bytes())
        .filter(|c| c.status_code().is_some())
        .ok_or_else(|| format!("--deny {v}: {code} is not an S3 error code"))?;
    Ok((bucket.to_string(), prefix.to_string(), code))
}

fn run(args: Args) -> Result<(), String> {
    let root = &args.root;
    let dirs = std::iter::once(root.clone()).chain(args.buckets.iter().map(|b| root.join(b)));
    for dir in dirs {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let server = s3::S3Server::start_at(root, args.addr, args.port, args.threads)
        .map_err(|e| format!("listen on {}:{}: {e}", args.addr, args.port))?;
    for (n, code) in args.fail_parts {
        server.fail_upload_part(n, code);
    }
    for (bucket, prefix, code) in args.denials {
        server.deny(&bucket, &prefix, code);
    }
    if args.hold_complete {
        server.complete_as(s3::Completion::Hold, None);
    }
    if let Some(file) = &args.hold_parts {
        server.hold_parts_while(file);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", server.endpoint())
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))?;
    drop(out);
    if args.ignore_stdin {
        loop {
            std::thread::park();
        }
    }
    // Until end of file or an error: either way the parent is gone.
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    drop(server);
    Ok(())
}

fn main() -> ExitCode {
    let result = parse(std::env::args().skip(1)).and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("s3_server: {e}");
            ExitCode::from(2)
        }
    }
}
