//! `ringfeed cache`: what a cache directory (`cache_dir`) holds, and the
//! manifest of the sample counts its loaders learned.

use std::io::Write;
use std::path::Path;

use ringfeed::cache::Cache;

use crate::AnyResult;
use crate::args::{CacheArgs, CacheCommand};

pub(crate) fn cache_cmd(a: CacheArgs) -> AnyResult<()> {
    match a.command {
        CacheCommand::Ls { dir } => ls(&dir),
        CacheCommand::Manifest { dir, output } => manifest(&dir, output.as_deref()),
    }
}

/// The directory's entries by URL (the directory is only read).
fn contents(dir: &Path) -> AnyResult<Vec<(ringfeed::cache::Identity, Option<u64>)>> {
    if !dir.is_dir() {
        return Err(format!("`{}` is not a directory", dir.display()).into());
    }
    let mut entries = Cache::contents(dir);
    entries.sort_by(|a, b| a.0.object.cmp(&b.0.object));
    Ok(entries)
}

fn ls(dir: &Path) -> AnyResult<()> {
    let entries = contents(dir)?;
    let mut out = std::io::stdout().lock();
    let (mut bytes, mut counted) = (0u64, 0usize);
    for (id, samples) in &entries {
        bytes += id.len;
        counted += usize::from(samples.is_some());
        let n = samples.map_or("-".to_string(), |n| n.to_string());
        writeln!(out, "{}\t{}\t{n}\t{}", id.object, id.len, id.version)?;
    }
    eprintln!(
        "{}: {} entries, {bytes} bytes, {counted} with sample counts",
        dir.display(),
        entries.len()
    );
    Ok(())
}

fn manifest(dir: &Path, output: Option<&Path>) -> AnyResult<()> {
    let entries = contents(dir)?;
    let mut lines: Vec<(String, u64, u64)> = entries
        .into_iter()
        .filter_map(|(id, n)| Some((id.object, id.len, n?)))
        .collect();
    lines.sort();
    let mut text = format!(
        "# ringfeed manifest: URL size samples ({} shards, counted by loaders with cache_dir {})\n",
        lines.len(),
        dir.display()
    );
    for (url, size, n) in &lines {
        text.push_str(&format!("{url} {size} {n}\n"));
    }
    match output {
        Some(p) => {
            std::fs::write(p, &text).map_err(|e| format!("write `{}`: {e}", p.display()))?;
            eprintln!("{}: {} shards", p.display(), lines.len());
        }
        None => std::io::stdout().lock().write_all(text.as_bytes())?,
    }
    Ok(())
}
