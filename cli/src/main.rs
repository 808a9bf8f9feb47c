//! The `ringfeed` command: `gen` writes a synthetic WebDataset, `bench`
//! streams a dataset and reports throughput and cost, `serve` serves a
//! directory over HTTP, `ls`, `index` and `cat` look at a dataset,
//! `topology` prints what the engine reads of the machine and where a
//! loader's workers would run, `node` runs a node engine, and `demo`
//! generates shards in a temporary directory and streams them from an
//! embedded loopback server; `get` and `put` read and write whole objects, `mount` shows a
//! source as a file system (FUSE), and `csi` serves such mounts to
//! Kubernetes pods as volumes (a CSI node driver).
//!
//! This file parses the command line and dispatches; the flags are in
//! `args.rs`, each command in its own file (`generate.rs`, `bench.rs`,
//! `serve.rs`, `demo.rs`, `topology.rs`, `inspect.rs` for `ls`, `index`
//! and `cat`, `get.rs` and `put.rs` with `transfer.rs` for what they share).

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

use std::io::Write as _;

mod args;
mod bench;
mod cache;
mod csi;
mod demo;
mod generate;
mod get;
mod inspect;
mod mount;
mod node;
mod put;
mod serve;
mod tally;
mod topology;
mod transfer;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The library's warnings (each fallback once, the first retry of each
    // kind) on stderr, beside the command's own output.
    ringfeed::log::set(
        Some(Box::new(|level, msg| {
            let what = match level {
                ringfeed::log::Level::Error => "error",
                _ => "warning",
            };
            // Called on engine threads: a closed stderr must not panic one.
            let _ = writeln!(std::io::stderr(), "ringfeed: {what}: {msg}");
        })),
        ringfeed::log::Level::Warn,
    );
    let result = match cli.command {
        Command::Gen(a) => generate::gen_cmd(a),
        Command::Bench(a) => bench::bench(a.urls, &a.opts, &a.report, None),
        Command::Serve(a) => serve::serve_cmd(a),
        Command::Node(a) => node::node_cmd(a),
        Command::Ls(a) => inspect::ls(a.urls, a.samples, a.json, &a.opts),
        Command::Index(a) => inspect::index(a.urls, a.output.as_deref(), &a.opts),
        Command::Cat(a) => inspect::cat(
            a.urls,
            &inspect::CatArgs {
                key: a.key,
                field: a.field,
                limit: a.limit,
            },
            &a.opts,
        ),
        Command::Topology(a) => topology::topology_cmd(a),
        Command::Get(a) => get::get(a),
        Command::Put(a) => put::put(a),
        Command::Mount(a) => mount::mount_cmd(a),
        Command::Csi(a) => csi::csi_cmd(a),
        Command::Cache(a) => cache::cache_cmd(a),
        Command::Demo {
            size,
            local,
            opts,
            report,
        } => demo::demo(size, local, &opts, report),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<transfer::Interrupted>() => {
            eprintln!("ringfeed: {e}");
            ExitCode::from(transfer::INTERRUPTED_EXIT)
        }
        Err(e) => {
            // The context may quote a URL as the user typed it.
            let msg = e.to_string();
            eprintln!("ringfeed: error: {}", ringfeed::redact::text(&msg));
            ExitCode::FAILURE
        }
    }
}

pub(crate) type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;
