//! `ringfeed ls`, `ringfeed index` and `ringfeed cat`: looking at a
//! dataset. `ls` shows what the URLs resolve to (the library's own
//! resolution, so a listing and a training job agree) and, with
//! `--samples`, streams each shard through a loader of its own to count its
//! samples; `cat` streams the dataset through the loader and prints sample
//! keys and field sizes, or one field's raw bytes.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::time::Duration;

use serde_json::json;

use ringfeed::config::Config;
use ringfeed::net::NetOptions;
use ringfeed::{Loader, Next};

use crate::AnyResult;
use crate::args::{LoaderArgs, config_for};

/// Inspection reads one shard or a few samples: one worker keeps the
/// dataset's order, and a 64 MiB arena (8 chunks of 8 MiB) is faulted in at
/// open in ~0.1 s instead of the 0.5 s of the 256 MiB default. Flags win.
fn inspect_config(urls: Vec<String>, a: &LoaderArgs) -> AnyResult<Config> {
    let mut a = a.clone();
    a.workers = a.workers.or(Some(1));
    a.memory_budget = a.memory_budget.or(Some("64MiB".into()));
    config_for(urls, &a)
}

/// The network options `Loader::open` uses for this configuration (the
/// library's `NetOptions::for_config`, so the two cannot drift apart).
fn net_options(cfg: &Config) -> NetOptions {
    NetOptions::for_config(cfg)
}

/// The shards of `cfg`'s URLs, each with its size: a loader learns a remote
/// shard's size when it reads it, a listing asks for every size at once
/// (`HEAD`s in parallel). The S3 keys (`--endpoint-url`, `--no-sign-request`,
/// `s3_suffix` in `--config`) apply as they do for a loader.
fn sized_shards(cfg: &Config) -> AnyResult<Vec<ringfeed::dataset::Shard>> {
    let net = net_options(cfg);
    let mut shards = ringfeed::dataset::resolve_config(cfg, &net)?;
    ringfeed::dataset::head_sizes(&mut shards, &net)?;
    Ok(shards)
}

/// Bytes in a shard `sized_shards` gave.
fn size(s: &ringfeed::dataset::Shard) -> u64 {
    s.size.unwrap_or_default()
}

/// Samples and field names of one shard, streamed through a loader.
struct ShardCount {
    samples: u64,
    fields: BTreeSet<String>,
}

fn count_shard(name: &str, a: &LoaderArgs) -> AnyResult<ShardCount> {
    let loader = Loader::open(inspect_config(vec![name.to_string()], a)?)?;
    let mut c = ShardCount {
        samples: 0,
        fields: BTreeSet::new(),
    };
    loop {
        match loader.next(Some(Duration::from_secs(60)))? {
            Next::Batch(b) => {
                for s in b.samples() {
                    c.samples += 1;
                    for (f, _) in s.fields() {
                        c.fields.insert(String::from_utf8_lossy(f).into_owned());
                    }
                }
            }
            Next::EndOfEpoch(_) => {}
            Next::Timeout => return Err(format!("`{name}`: no data for 60 s").into()),
            Next::Finished => return Ok(c),
        }
    }
}

/// `ringfeed ls`.
pub fn ls(urls: Vec<String>, samples: bool, json: bool, a: &LoaderArgs) -> AnyResult<()> {
    let cfg = config_for(urls.clone(), a)?;
    let shards = sized_shards(&cfg)?;
    if shards.is_empty() {
        return Err("the URLs name no shard".into());
    }
    let mut out = io::stdout().lock();
    let total: u64 = shards.iter().map(size).sum();
    let mut total_samples = 0u64;
    let mut rows = Vec::new();
    for s in &shards {
        let count = if samples {
            Some(count_shard(&s.name, a)?)
        } else {
            None
        };
        if let Some(c) = &count {
            total_samples += c.samples;
        }
        if json {
            rows.push(json!({
                "name": s.name,
                "size": size(s),
                "samples": count.as_ref().map(|c| c.samples),
                "fields": count.as_ref().map(|c| c.fields.iter().collect::<Vec<_>>()),
            }));
            continue;
        }
        let line = match &count {
            Some(c) => format!(
                "{:>14}  {:>8} samples  {:<16}  {}",
                size(s),
                c.samples,
                c.fields.iter().cloned().collect::<Vec<_>>().join(","),
                s.name
            ),
            None => format!("{:>14}  {}", size(s), s.name),
        };
        if !write_or_quit(writeln!(out, "{line}"))? {
            return Ok(());
        }
    }
    let summary = if json {
        json!({"shards": rows, "total_bytes": total,
               "total_samples": samples.then_some(total_samples)})
        .to_string()
    } else {
        format!(
            "{} shard{}, {total} bytes ({:.3} GB){}",
            shards.len(),
            if shards.len() == 1 { "" } else { "s" },
            total as f64 / 1e9,
            if samples {
                format!(", {total_samples} samples")
            } else {
                String::new()
            }
        )
    };
    write_or_quit(writeln!(out, "{summary}"))?;
    Ok(())
}

/// `ringfeed index`: a manifest (`URL size samples` per line) of the
/// dataset, so loaders split it among consumers without counting. Local
/// shards are counted from their headers alone; remote ones are streamed.
pub fn index(urls: Vec<String>, output: Option<&std::path::Path>, a: &LoaderArgs) -> AnyResult<()> {
    let cfg = config_for(urls, a)?;
    let shards = sized_shards(&cfg)?;
    if shards.is_empty() {
        return Err("the URLs name no shard".into());
    }
    let bar = indicatif::ProgressBar::new(shards.len() as u64);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{spinner} indexing {pos}/{len} shards {msg}",
    )?);
    let mut counts = Vec::with_capacity(shards.len());
    for s in &shards {
        bar.set_message(s.name.clone());
        let n = match &s.source {
            ringfeed::dataset::Source::File(path) => ringfeed::tar::count_file_samples(path)?,
            _ => count_shard(&s.name, a)?.samples,
        };
        counts.push(n);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let total: u64 = counts.iter().sum();
    let json = output.is_some_and(|p| p.extension().is_some_and(|e| e == "json"));
    let text = if json {
        shardindex(&shards, &counts)
    } else {
        let mut text = format!(
            "# ringfeed manifest: URL size samples ({} shards)\n",
            shards.len()
        );
        for (s, n) in shards.iter().zip(&counts) {
            text.push_str(&format!("{} {} {n}\n", s.name, size(s)));
        }
        text
    };
    match output {
        Some(p) => {
            std::fs::write(p, &text).map_err(|e| format!("write `{}`: {e}", p.display()))?;
            eprintln!("{}: {} shards, {total} samples", p.display(), shards.len());
        }
        None => {
            write_or_quit(io::stdout().lock().write_all(text.as_bytes()))?;
        }
    }
    Ok(())
}

/// WebDataset's shard index (`shardindex.json`, as its `wids` readers and
/// ringfeed read it): the shards named within their common folder, which
/// `base` names, so the file works beside the shards and anywhere else.
fn shardindex(shards: &[ringfeed::dataset::Shard], counts: &[u64]) -> String {
    let folder = |name: &str| name.rfind('/').map_or("", |i| &name[..i]).to_string();
    let base = folder(&shards[0].name);
    let common = shards.iter().all(|s| folder(&s.name) == base);
    let list: Vec<serde_json::Value> = shards
        .iter()
        .zip(counts)
        .map(|(s, n)| {
            let url = match common {
                true => s.name[base.len() + 1..].to_string(),
                false => s.name.clone(),
            };
            serde_json::json!({"url": url, "nsamples": n, "filesize": size(s)})
        })
        .collect();
    let mut index = serde_json::json!({
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "shardlist": list,
    });
    if common && !base.is_empty() {
        index["base"] = serde_json::json!(format!("{base}/"));
    }
    let mut text = serde_json::to_string_pretty(&index).unwrap_or_default();
    text.push('\n');
    text
}

/// Ok(false) when stdout was closed by the reader (`| head`): stop quietly.
fn write_or_quit(r: io::Result<()>) -> AnyResult<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(format!("writing to stdout: {e}").into()),
    }
}

/// What `cat` prints.
pub struct CatArgs {
    pub key: Option<String>,
    pub field: Option<String>,
    pub limit: Option<u64>,
}

/// `ringfeed cat`.
pub fn cat(urls: Vec<String>, c: &CatArgs, a: &LoaderArgs) -> AnyResult<()> {
    let loader = Loader::open(inspect_config(urls, a)?)?;
    let mut out = io::stdout().lock();
    let mut seen = 0u64;
    let mut printed = 0u64;
    loop {
        let b = match loader.next(Some(Duration::from_secs(60)))? {
            Next::Batch(b) => b,
            Next::EndOfEpoch(_) => continue,
            Next::Timeout => return Err("no data for 60 s".into()),
            Next::Finished => break,
        };
        for s in b.samples() {
            seen += 1;
            if c.key.as_deref().is_some_and(|k| s.key() != k.as_bytes()) {
                continue;
            }
            if let Some(f) = &c.field {
                let Some((_, data)) = s.fields().find(|(n, _)| *n == f.as_bytes()) else {
                    let names: Vec<_> = s
                        .fields()
                        .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
                        .collect();
                    return Err(format!(
                        "sample `{}` has no field `{f}`; its fields: {}",
                        String::from_utf8_lossy(s.key()),
                        names.join(", ")
                    )
                    .into());
                };
                write_or_quit(out.write_all(data).and_then(|()| out.flush()))?;
                return Ok(());
            }
            let mut line = String::from_utf8_lossy(s.key()).into_owned();
            for (n, d) in s.fields() {
                line.push_str(&format!("  {}:{}", String::from_utf8_lossy(n), d.len()));
            }
            if !write_or_quit(writeln!(out, "{line}"))? {
                return Ok(());
            }
            printed += 1;
            if c.key.is_some() || c.limit.is_some_and(|l| printed >= l) {
                return Ok(());
            }
        }
    }
    if let Some(k) = &c.key {
        return Err(format!("sample `{k}` not found in the {seen} samples of the dataset").into());
    }
    Ok(())
}
