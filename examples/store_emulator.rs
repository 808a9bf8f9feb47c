//! The object-store emulator (tests/support/store/) as a program, for the
//! benchmarks (benches/object_store.sh) and for trying a client against
//! S3's shape of performance on one machine.
//!
//! ```text
//! store_emulator ROOT [--port N] [--latency MEDIAN:P99] [--conn-rate R]
//!                [--object-rate R] [--rate-limit N/s[:BURST]]
//!                [--rate-scope prefix|bucket] [--stall P:DURATION]
//!                [--stall-get N:DURATION]... [--threads N] [--seed N]
//!                [--unlimited] [--ignore-stdin]
//! ```
//!
//! Serves the files under ROOT as plain HTTP (`/path`) and as path-style
//! S3 (`/bucket/key`, each folder of ROOT a bucket; ListObjectsV2). Any
//! `Authorization` is accepted unverified: it models performance, not
//! authentication (`examples/s3_server.rs` verifies SigV4). The models,
//! each `off` to turn it off, and their defaults:
//!
//! - `--latency 20ms:120ms`: first-byte latency per request, lognormal with
//!   that median and p99, before the answer's head. Default off.
//! - `--conn-rate 90MB/s`: bandwidth per connection, paced smoothly.
//!   Default 90MB/s.
//! - `--object-rate 1250MB/s`: bandwidth per file, shared by every
//!   connection reading it (~10 Gbit/s per stored part). Default
//!   1250MB/s.
//! - `--rate-limit 5500/s[:BURST]`: requests a second per prefix (the first
//!   path segment under the bucket; `--rate-scope bucket`: per bucket),
//!   past which requests get 503 (`SlowDown` XML for S3 requests, a plain
//!   503 without `Retry-After` for others). BURST defaults to a tenth of a
//!   second's requests. Default 5500/s.
//! - `--stall 0.001:5s`: each GET's body stops halfway for 5 s with
//!   probability 0.001. Default off. `--stall-get 3:5s`: the 3rd GET (since
//!   start or reset) stalls so, for deterministic runs; repeatable.
//! - `--unlimited`: every model off (a plain fast server), before the
//!   options that follow turn some on.
//!
//! `--threads` (default 2) sets the runtime's workers, `--seed` (default
//! 0) the draws. Prints exactly one line on stdout, `http://127.0.0.1:PORT`,
//! once it listens (`--port 0`, the default: a free port), then serves until
//! its stdin closes (`--ignore-stdin`: until killed), and prints its
//! counters as one JSON line on stderr as it stops. `GET /_emulator/stats`
//! serves them, `GET` or `POST /_emulator/reset` zeroes them.
//!
//! Build: `cargo build --release --example store_emulator`, then
//! `target/release/examples/store_emulator`.

#[path = "../tests/support/store/mod.rs"]
mod store;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

struct Args {
    root: PathBuf,
    port: u16,
    opts: store::Options,
    ignore_stdin: bool,
}

const USAGE: &str = "usage: store_emulator ROOT [--port N] [--latency MEDIAN:P99] \
                     [--conn-rate R] [--object-rate R] [--rate-limit N/s[:BURST]] \
                     [--rate-scope prefix|bucket] [--stall P:DURATION] \
                     [--stall-get N:DURATION]... [--threads N] [--seed N] \
                     [--unlimited] [--ignore-stdin]";

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut root = None;
    let mut args = Args {
        root: PathBuf::new(),
        port: 0,
        opts: store::Options::default(),
        ignore_stdin: false,
    };
    while let Some(a) = argv.next() {
        match a.as_str() {
            "--ignore-stdin" => args.ignore_stdin = true,
            "--unlimited" => {
                args.opts = store::Options {
                    threads: args.opts.threads,
                    seed: args.opts.seed,
                    ..store::Options::unlimited()
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ if a.starts_with('-') => {
                let v = argv.next().ok_or_else(|| format!("{a} needs a value"))?;
                if a == "--port" {
                    args.port = v.parse().map_err(|_| format!("--port {v}: not a port"))?;
                } else if !args.opts.set(&a, &v)? {
                    return Err(format!("unknown option {a}\n{USAGE}"));
                }
            }
            _ if root.is_none() => root = Some(PathBuf::from(a)),
            _ => return Err(format!("one ROOT only, not also {a}")),
        }
    }
    args.root = root.ok_or("ROOT is missing")?;
    if !args.root.is_dir() {
        return Err(format!("{}: not a directory", args.root.display()));
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), String> {
    let server = store::StoreEmulator::start_on(&args.root, args.port, args.opts)
        .map_err(|e| format!("listen on 127.0.0.1:{}: {e}", args.port))?;
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
    let stats = serde_json::to_string(&server.stats()).map_err(|e| format!("stats: {e}"))?;
    eprintln!("{stats}");
    drop(server);
    Ok(())
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store_emulator: {e}");
            ExitCode::from(2)
        }
    }
}
