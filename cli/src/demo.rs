//! `ringfeed demo`: generate shards in a temporary directory, serve them on
//! a loopback server in this process, and bench the loader over http://
//! (or from the directory with `--local`), checking every byte and that
//! every generated sample arrived exactly once per epoch.

use ringfeed::serve::{ServeOptions, Server};
use ringfeed::synth::GenOptions;

use crate::AnyResult;
use crate::args::{LoaderArgs, ReportArgs, config_for};
use crate::bench::bench;
use crate::generate::generate;
use crate::tally::{Expected, whole_run_epochs};

pub(crate) fn demo(
    size: u64,
    local: bool,
    opts: &LoaderArgs,
    mut report: ReportArgs,
) -> AnyResult<()> {
    let dir = tempfile::Builder::new().prefix("ringfeed-demo").tempdir()?;
    let o = GenOptions {
        shards: 8,
        shard_bytes: (size / 8).max(1 << 20),
        seed: 42,
        ..GenOptions::default()
    };
    eprintln!(
        "generating {:.2} GB of WebDataset shards in {}",
        size as f64 / 1e9,
        dir.path().display()
    );
    let r = generate(dir.path(), &o)?;
    report.verify = report.verify.or(Some(42));
    // Bytes right is not enough: every generated sample must arrive, once
    // per epoch. Where the configuration itself changes that, say so.
    let cfg = config_for(vec![r.pattern.clone()], opts)?;
    let expect = match whole_run_epochs(&cfg) {
        Ok(epochs) => Some(Expected::of(&r, &o.fields, epochs)),
        Err(why) => {
            eprintln!("samples are not counted: {why}");
            None
        }
    };
    if local {
        eprintln!("streaming {}", r.pattern);
        return bench(vec![r.pattern], opts, &report, expect.as_ref());
    }
    let server = Server::bind("127.0.0.1:0", dir.path(), ServeOptions::default())?;
    let name = std::path::Path::new(&r.pattern)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the generated pattern has no file name")?;
    let url = format!("{}{name}", server.url());
    eprintln!("serving them on {} (loopback)", server.url());
    eprintln!("streaming {url}");
    bench(vec![url], opts, &report, expect.as_ref())?;
    let s = server.stats();
    if !report.json {
        // The server runs in this process: its CPU is inside the `cpu` line.
        println!(
            "server        {} requests over {} connections, {:.3} GB sent, {:.3} CPU-s \
             (in-process: included in `cpu` above)",
            s.requests,
            s.connections,
            s.body_bytes as f64 / 1e9,
            s.cpu_ns as f64 / 1e9
        );
    }
    Ok(())
}
