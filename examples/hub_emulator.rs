//! The Hugging Face Hub emulator (tests/support/hub/) as a program, for
//! the Python tests and the benchmarks: an API host and a content host on
//! 127.0.0.1, as the Hub's two.
//!
//! ```text
//! hub_emulator ROOT [--port N] [--token TOKEN] [--private ORG/NAME]...
//!              [--gated ORG/NAME]... [--page N] [--url-ttl DURATION]
//!              [--retry-after SECONDS] [--latency DURATION] [--same-host]
//!              [--threads N] [--ignore-stdin]
//! ```
//!
//! Serves the repositories under ROOT (a folder `ORG/NAME` each) as the
//! Hub's datasets: the revision and tree APIs, `resolve/` answering 302
//! to the content host with a signed URL that expires (`--url-ttl`,
//! default 1h), the content host checking it and serving ranges. A
//! `--private` repository answers 401 without `Authorization: Bearer
//! TOKEN`; a `--gated` one is never granted. `--page` sets the tree's
//! page (default 1000), `--latency` a wait before every answer (default
//! none), `--same-host` serves the content from the API host itself.
//! `GET /_hub/stats` answers the counters as JSON; `POST /_hub/set?
//! throttle_api=N|throttle_resolves=N|expire_after=N|deny_after=N|
//! echo_token=1|garbage=KIND` sets a control (tests/support/hub/mod.rs:
//! `Controls`, `Garbage::parse`).
//!
//! Prints exactly one line on stdout, the endpoint (`HF_ENDPOINT`,
//! `http://127.0.0.1:PORT`), once it listens, then serves until its stdin
//! closes (`--ignore-stdin`: until killed), and prints its counters as one
//! JSON line on stderr as it stops.
//!
//! Build: `cargo build --example hub_emulator`.

#[path = "../tests/support/store/mod.rs"]
mod store;

#[path = "../tests/support/hub/mod.rs"]
mod hub;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: hub_emulator ROOT [--port N] [--token TOKEN] [--private ORG/NAME]... \
                     [--gated ORG/NAME]... [--page N] [--url-ttl DURATION] \
                     [--retry-after SECONDS] [--latency DURATION] [--same-host] [--threads N] \
                     [--ignore-stdin]";

struct Args {
    root: PathBuf,
    port: u16,
    opts: hub::Options,
    ignore_stdin: bool,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut root = None;
    let mut args = Args {
        root: PathBuf::new(),
        port: 0,
        opts: hub::Options::default(),
        ignore_stdin: false,
    };
    while let Some(a) = argv.next() {
        match a.as_str() {
            "--ignore-stdin" => args.ignore_stdin = true,
            "--same-host" => args.opts.same_host = true,
            "-h" | "--help" => return Err(USAGE.into()),
            _ if a.starts_with('-') => {
                let v = argv.next().ok_or_else(|| format!("{a} needs a value"))?;
                let bad = |why: &str| format!("{a} {v}: {why}");
                let count = || {
                    v.parse::<u64>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("not a positive number"))
                };
                match a.as_str() {
                    "--port" => args.port = v.parse().map_err(|_| bad("not a port"))?,
                    "--token" => args.opts.token = Some(v.clone()),
                    "--private" => args.opts.private.push(v.clone()),
                    "--gated" => args.opts.gated.push(v.clone()),
                    "--page" => args.opts.page = count()? as usize,
                    "--threads" => args.opts.threads = count()? as usize,
                    "--retry-after" => args.opts.retry_after = count()?,
                    "--url-ttl" => {
                        args.opts.url_ttl = store::model::parse_duration(&v).map_err(|e| bad(&e))?
                    }
                    "--latency" => {
                        args.opts.latency =
                            Some(store::model::parse_duration(&v).map_err(|e| bad(&e))?)
                    }
                    _ => return Err(format!("unknown option {a}\n{USAGE}")),
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
    let server = hub::HubEmulator::start_on(&args.root, args.port, args.opts)
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
    eprintln!("{}", server.stats().json());
    drop(server);
    Ok(())
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hub_emulator: {e}");
            ExitCode::from(2)
        }
    }
}
