//! The `ringfeed` command: `gen` writes a synthetic WebDataset, `bench`
//! streams a dataset and reports throughput and cost, `serve` serves a
//! directory over HTTP, `ls`, `index` and `cat` look at a dataset
//! (`cli/inspect.rs`),
//! and `demo` generates shards in a temporary directory and streams them
//! from an embedded loopback server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use ringfeed::config::{Config, parse_size};
use ringfeed::serve::{ServeOptions, Server};
use ringfeed::synth::{self, GenOptions};
use ringfeed::{Loader, Next};

mod inspect;

#[derive(Parser)]
#[command(
    name = "ringfeed",
    version,
    about = "Stream WebDataset shards into zero-copy batches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic WebDataset shard set into DIR.
    Gen(GenArgs),
    /// Stream a dataset and report GB/s, samples/s and CPU cost.
    Bench(BenchArgs),
    /// Serve the files of DIR over HTTP (GET, HEAD, Range) until Ctrl-C.
    Serve(ServeArgs),
    /// List the shards a dataset resolves to, with sizes (and sample counts).
    Ls(LsArgs),
    /// Write a manifest (`URL size samples` per line) of the dataset: with
    /// it, loaders split the data among ranks without counting samples.
    Index(IndexArgs),
    /// Print each sample's key and field sizes, or one field's raw bytes.
    Cat(CatArgs),
    /// Generate a dataset in a temporary directory, serve it on a loopback
    /// HTTP server and stream it over http://, checking every byte.
    Demo {
        /// Total size of the generated dataset.
        #[arg(long, default_value = "512MiB", value_parser = size_arg)]
        size: u64,
        /// Stream from the directory instead of over HTTP.
        #[arg(long)]
        local: bool,
        #[command(flatten)]
        opts: LoaderArgs,
        #[command(flatten)]
        report: ReportArgs,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Directory whose files are served.
    dir: PathBuf,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to listen on (0.0.0.0 or :: for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// Connections served at once.
    #[arg(long, default_value_t = ServeOptions::default().max_connections)]
    max_connections: usize,
    /// Print one line per request on stderr.
    #[arg(long)]
    log: bool,
}

#[derive(Args)]
struct LsArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    urls: Vec<String>,
    /// Stream every shard and print its sample count and field names.
    #[arg(long)]
    samples: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    opts: LoaderArgs,
}

#[derive(Args)]
struct IndexArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    urls: Vec<String>,
    /// Write the manifest here instead of to stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    #[command(flatten)]
    opts: LoaderArgs,
}

#[derive(Args)]
struct CatArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    urls: Vec<String>,
    /// Only the sample with this key.
    #[arg(long)]
    key: Option<String>,
    /// With --key: write this field's raw bytes to stdout.
    #[arg(long, requires = "key")]
    field: Option<String>,
    /// Stop after this many samples.
    #[arg(long)]
    limit: Option<u64>,
    #[command(flatten)]
    opts: LoaderArgs,
}

#[derive(Args)]
struct GenArgs {
    dir: PathBuf,
    /// Number of shards.
    #[arg(long, default_value_t = 8)]
    shards: usize,
    /// Approximate size of each shard.
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    shard_size: u64,
    /// Mean size of each sample's main field.
    #[arg(long, default_value = "100KB", value_parser = size_arg)]
    sample_size: u64,
    /// Relative spread of the sample size (uniform in mean × (1 ± spread)).
    #[arg(long, default_value_t = 0.5)]
    spread: f64,
    /// Comma-separated field names; the first carries the sized payload.
    #[arg(long, default_value = "jpg,cls", value_delimiter = ',')]
    fields: Vec<String>,
    /// Seed of the sizes and of the content.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct BenchArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    urls: Vec<String>,
    #[command(flatten)]
    opts: LoaderArgs,
    #[command(flatten)]
    report: ReportArgs,
}

/// Configuration keys as flags.
#[derive(Args, Clone)]
struct LoaderArgs {
    #[arg(long)]
    batch_size: Option<u64>,
    #[arg(long)]
    drop_last: bool,
    #[arg(long)]
    memory_budget: Option<String>,
    #[arg(long)]
    chunk_size: Option<String>,
    #[arg(long)]
    reads_in_flight: Option<u64>,
    #[arg(long)]
    workers: Option<u64>,
    /// Do not pin workers to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// auto, io_uring or threads.
    #[arg(long)]
    io_backend: Option<String>,
    /// auto, hugetlb, thp or normal.
    #[arg(long)]
    memory_kind: Option<String>,
    #[arg(long)]
    epochs: Option<u64>,
    /// More configuration keys as a JSON object (flags win).
    #[arg(long)]
    config: Option<String>,
}

/// What `bench` and `demo` report.
#[derive(Args, Clone)]
struct ReportArgs {
    /// Check every field's bytes against the generator's pattern with this seed.
    #[arg(long)]
    verify: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gen(a) => gen_cmd(a),
        Command::Bench(a) => bench(a.urls, &a.opts, &a.report),
        Command::Serve(a) => serve_cmd(a),
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
        Command::Demo {
            size,
            local,
            opts,
            report,
        } => demo(size, local, &opts, report),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringfeed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn gen_cmd(a: GenArgs) -> AnyResult<()> {
    let o = GenOptions {
        shards: a.shards,
        shard_bytes: a.shard_size,
        sample_bytes: a.sample_size,
        spread: a.spread,
        fields: a.fields,
        seed: a.seed,
    };
    let r = generate(&a.dir, &o)?;
    println!(
        "wrote {} shards, {} samples, {:.2} GB: {}",
        r.paths.len(),
        r.samples,
        r.file_bytes as f64 / 1e9,
        r.pattern
    );
    Ok(())
}

fn generate(dir: &std::path::Path, o: &GenOptions) -> AnyResult<synth::GenReport> {
    let bar = ProgressBar::new(o.shards as u64 * o.shard_bytes);
    bar.set_style(ProgressStyle::with_template(
        "gen {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec}",
    )?);
    let r = synth::generate(dir, o, |n| bar.inc(n))?;
    bar.finish_and_clear();
    Ok(r)
}

fn serve_cmd(a: ServeArgs) -> AnyResult<()> {
    // An IPv6 literal needs brackets before the port.
    let addr = if a.bind.contains(':') && !a.bind.starts_with('[') {
        format!("[{}]:{}", a.bind, a.port)
    } else {
        format!("{}:{}", a.bind, a.port)
    };
    let server = Server::bind(
        &addr,
        &a.dir,
        ServeOptions {
            max_connections: a.max_connections,
            access_log: a.log,
            ..ServeOptions::default()
        },
    )?;
    // The URL alone on stdout, for scripts; the rest on stderr.
    println!("{}", server.url());
    std::io::Write::flush(&mut std::io::stdout())?;
    let example = std::fs::read_dir(server.root())
        .ok()
        .and_then(|d| {
            let mut tars: Vec<String> = d
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".tar"))
                .collect();
            tars.sort();
            tars.into_iter().next()
        })
        .unwrap_or_else(|| "shard.tar".into());
    eprintln!(
        "serving {} on {} (Ctrl-C stops); try: ringfeed ls {}{example}",
        server.root().display(),
        server.url(),
        server.url()
    );
    loop {
        // Serves on its own threads; this one only keeps the process alive.
        std::thread::park();
    }
}

fn demo(size: u64, local: bool, opts: &LoaderArgs, mut report: ReportArgs) -> AnyResult<()> {
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
    if local {
        eprintln!("streaming {}", r.pattern);
        return bench(vec![r.pattern], opts, &report);
    }
    let server = Server::bind("127.0.0.1:0", dir.path(), ServeOptions::default())?;
    let name = std::path::Path::new(&r.pattern)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the generated pattern has no file name")?;
    let url = format!("{}{name}", server.url());
    eprintln!("serving them on {} (loopback)", server.url());
    eprintln!("streaming {url}");
    bench(vec![url], opts, &report)?;
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

pub(crate) fn config_for(urls: Vec<String>, a: &LoaderArgs) -> AnyResult<Config> {
    let mut m: Map<String, Value> = match &a.config {
        Some(text) => match serde_json::from_str(text)? {
            Value::Object(m) => m,
            _ => return Err("--config must be a JSON object".into()),
        },
        None => Map::new(),
    };
    m.insert("urls".into(), json!(urls));
    let mut set = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    if let Some(v) = a.batch_size {
        set("batch_size", json!(v));
    }
    if a.drop_last {
        set("drop_last", json!(true));
    }
    if let Some(v) = &a.memory_budget {
        set("memory_budget", json!(v));
    }
    if let Some(v) = &a.chunk_size {
        set("chunk_size", json!(v));
    }
    if let Some(v) = a.reads_in_flight {
        set("reads_in_flight", json!(v));
    }
    if let Some(v) = a.workers {
        set("workers", json!(v));
    }
    if a.no_pin {
        set("pin_cpus", json!(false));
    }
    if let Some(v) = &a.io_backend {
        set("io_backend", json!(v));
    }
    if let Some(v) = &a.memory_kind {
        set("memory_kind", json!(v));
    }
    if let Some(v) = a.epochs {
        set("epochs", json!(v));
    }
    Ok(Config::from_map(&m)?)
}

/// User plus system CPU time of the whole process, and its peak RSS in bytes.
fn rusage() -> (Duration, u64) {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(u.ru_utime) + tv(u.ru_stime), u.ru_maxrss as u64 * 1024)
}

fn bench(urls: Vec<String>, a: &LoaderArgs, out: &ReportArgs) -> AnyResult<()> {
    let source = urls.join(" ");
    let cfg = config_for(urls, a)?;
    let epochs = cfg.epochs.max(1);
    let loader = Loader::open(cfg)?;
    let budget = loader.stats().arena_bytes;
    let total: u64 = loader.shards().iter().map(|s| s.size).sum::<u64>() * epochs;
    let bar = ProgressBar::new(total);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
    )?);
    let (cpu0, _) = rusage();
    let t0 = Instant::now();
    let mut bad = 0u64;
    loop {
        match loader.next(Some(Duration::from_secs(60)))? {
            Next::Batch(b) => {
                if let Some(seed) = out.verify {
                    for s in b.samples() {
                        for (name, data) in s.fields() {
                            if !synth::verify(seed, s.key(), name, data) {
                                bad += 1;
                            }
                        }
                    }
                }
                bar.inc(b.bytes());
            }
            Next::EndOfEpoch(e) => bar.set_message(format!("epoch {e} done")),
            Next::Timeout => bar.set_message("waiting for data"),
            Next::Finished => break,
        }
    }
    let wall = t0.elapsed();
    let (cpu1, rss) = rusage();
    bar.finish_and_clear();
    let s = loader.stats();
    loader.close();
    let secs = wall.as_secs_f64();
    let gbs = s.bytes_delivered as f64 / secs / 1e9;
    let cpu = (cpu1 - cpu0).as_secs_f64();
    let report = json!({
        "bytes": s.bytes_delivered,
        "samples": s.samples_delivered,
        "batches": s.batches_delivered,
        "seconds": secs,
        "gb_per_s": gbs,
        "samples_per_s": s.samples_delivered as f64 / secs,
        "cpu_seconds": cpu,
        "cpu_s_per_gb": cpu / (s.bytes_delivered as f64 / 1e9),
        "copied_per_delivered": s.bytes_copied as f64 / s.bytes_delivered.max(1) as f64,
        "peak_rss_bytes": rss,
        "memory_budget": budget,
        "verify_failures": out.verify.map(|_| bad),
        "source": source,
        "stats": s,
    });
    if out.json {
        println!("{report}");
    } else {
        println!("source        {source} ({} shards)", s.shards_total);
        println!(
            "delivered     {:.3} GB in {:.2} s: {:.2} GB/s, {:.0} samples/s",
            s.bytes_delivered as f64 / 1e9,
            secs,
            gbs,
            s.samples_delivered as f64 / secs
        );
        println!(
            "cpu           {:.3} s, {:.3} CPU-s per GB",
            cpu,
            cpu / (s.bytes_delivered as f64 / 1e9)
        );
        println!(
            "copied        {:.4} bytes per byte delivered",
            s.bytes_copied as f64 / s.bytes_delivered.max(1) as f64
        );
        println!(
            "memory        {} ({} MiB arena, locked: {}), peak RSS {} MiB",
            s.memory_kind,
            s.arena_bytes >> 20,
            s.memory_locked,
            rss >> 20
        );
        println!(
            "io backend    {} (flags: {}, registered buffers: {}), {} workers",
            s.io_backend,
            if s.io_uring_flags.is_empty() {
                "-"
            } else {
                s.io_uring_flags
            },
            s.buffers_registered,
            s.workers
        );
        println!(
            "samples       {} in {} batches; {} entries skipped, {} samples dropped, {} padded",
            s.samples_delivered,
            s.batches_delivered,
            s.entries_skipped,
            s.samples_dropped,
            s.samples_padded
        );
        if s.consumers > 1 || s.batches_skipped > 0 || s.shuffle_copied > 0 {
            println!(
                "epochs        consumer {} of {}; {} batches replayed to resume; shuffle copied {} bytes",
                s.consumer, s.consumers, s.batches_skipped, s.shuffle_copied
            );
        }
        if let Some(seed) = out.verify {
            println!("verified      every field against seed {seed}: {bad} mismatches");
        }
        for n in &s.notes {
            println!("note          {n}");
        }
    }
    if bad > 0 {
        return Err(format!("{bad} fields did not match the generator's content").into());
    }
    Ok(())
}
