//! `ringfeed get`: whole objects read with the library's ranged reads in
//! flight, streamed in order through a window of a few parts
//! (`ringfeed::object::stream`) into files through the library's own
//! `ObjectWriter` (a temporary file renamed into place, so a file appears
//! only whole and never replaces one unless `--overwrite`), to stdout or
//! into a device or pipe. Memory stays at the window's, whatever the
//! object's size: reading an object whole first took its size in fresh
//! memory, whose first touch cost more than the transfer on a VM.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use ringfeed::net::NetOptions;
use ringfeed::object::{self, ObjectWriter, Progress};

use crate::AnyResult;
use crate::args::{GetArgs, object_config};
use crate::transfer::{self, Bars, WritingGuard};

/// Where the objects go.
enum Dest {
    Stdout,
    /// One object written into an existing device or pipe (`/dev/null`, a
    /// FIFO), as a shell redirect would: there is no file to rename over.
    Stream(PathBuf),
    /// One object to this file.
    File(PathBuf),
    /// Each object to its name in this directory.
    Dir(PathBuf),
}

/// The last path segment of an object's URL or path: its file name.
fn file_name(url: &str) -> AnyResult<&str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    match path.rsplit('/').next() {
        Some(n) if !n.is_empty() && n != "." && n != ".." => Ok(n),
        _ => Err(format!("`{url}` has no file name to write it under; give -o FILE").into()),
    }
}

fn destination(output: Option<&Path>, objects: usize) -> AnyResult<Dest> {
    Ok(match output {
        Some(p) if p.as_os_str() == "-" => Dest::Stdout,
        Some(p) if objects == 1 && is_special(p) => Dest::Stream(p.to_path_buf()),
        Some(p) if objects == 1 && !p.is_dir() => Dest::File(p.to_path_buf()),
        Some(p) => {
            std::fs::create_dir_all(p)
                .map_err(|e| format!("create directory `{}`: {e}", p.display()))?;
            Dest::Dir(p.to_path_buf())
        }
        None => Dest::Dir(PathBuf::from(".")),
    })
}

/// An existing path that is neither a regular file nor a directory.
fn is_special(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `ringfeed get`.
pub(crate) fn get(a: GetArgs) -> AnyResult<()> {
    transfer::install_interrupt_handler();
    let cfg = object_config(&a.opts, &[("overwrite", json!(a.overwrite))])?;
    let net = NetOptions::for_config(&cfg);
    let shards = object::list(&a.urls, &cfg)?;
    if shards.is_empty() {
        return Err(format!("{} names no object", a.urls.join(" ")).into());
    }
    let dest = destination(a.output.as_deref(), shards.len())?;
    let sizes: Option<u64> = shards.iter().map(|s| s.size).sum();
    let mut bars = Bars::new(sizes, shards.len());
    let mut total = 0u64;
    let mut backend = "";
    for (i, shard) in shards.iter().enumerate() {
        let path = match &dest {
            Dest::Stdout | Dest::Stream(_) => None,
            Dest::File(p) => Some(p.clone()),
            Dest::Dir(d) => Some(d.join(file_name(&shard.name)?)),
        };
        let local = |p: &PathBuf| p.display().to_string();
        let progress = Arc::new(Progress::default());
        bars.start_object(&shard.name, shard.size, Arc::clone(&progress));
        let p = Some(progress.as_ref());
        let report = match (&path, &dest) {
            (None, Dest::Stream(to)) => {
                let name = to.display().to_string();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(to)
                    .map_err(|e| format!("opening `{name}`: {e}"))?;
                object::stream_shard(shard, &cfg, &net, &mut f, &name, p, None)?
            }
            (None, _) => {
                let mut out = io::stdout().lock();
                object::stream_shard(shard, &cfg, &net, &mut out, "stdout", p, None)?
            }
            (Some(to), _) => {
                let _writing = WritingGuard::new();
                // Fails before any byte is fetched when a file is in the way.
                let mut w =
                    ObjectWriter::open(&local(to), &cfg, None).map_err(transfer::explain)?;
                let mut sink = Interruptible(&mut w);
                // Ctrl-C stops the read as the next part completes.
                let stop = || transfer::check_interrupt().is_err();
                let read =
                    object::stream_shard(shard, &cfg, &net, &mut sink, &local(to), p, Some(&stop));
                // Ctrl-C during the read stopped it: nothing is kept.
                let read = transfer::check_interrupt().and_then(|()| Ok(read?));
                match read {
                    Ok(report) => {
                        w.finish().map_err(transfer::explain)?;
                        report
                    }
                    Err(e) => {
                        let _ = w.abort();
                        return Err(e);
                    }
                }
            }
        };
        bars.finish_object(report.bytes);
        total += report.bytes;
        backend = report.backend.name();
        bars.object_done(i + 1, shards.len());
    }
    let seconds = bars.started.elapsed().as_secs_f64();
    bars.clear();
    eprintln!(
        "{}",
        transfer::summary("got", shards.len(), total, seconds, backend)
    );
    Ok(())
}

/// A file being written, fed by the read's parts; refuses once Ctrl-C
/// came, which stops the read.
struct Interruptible<'a>(&'a mut ObjectWriter);

impl Write for Interruptible<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if transfer::check_interrupt().is_err() {
            // Not `ErrorKind::Interrupted`: `write_all` retries that.
            return Err(io::Error::other("interrupted"));
        }
        self.0.write(b).map_err(io::Error::other)?;
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::file_name;

    #[test]
    fn objects_are_named_after_their_last_path_segment() {
        assert_eq!(file_name("s3://b/run/model.bin").unwrap(), "model.bin");
        assert_eq!(file_name("http://h:1/w/a.bin?v=2#x").unwrap(), "a.bin");
        assert_eq!(file_name("/data/x.tar").unwrap(), "x.tar");
        assert_eq!(file_name("x.tar").unwrap(), "x.tar");
        for bad in ["http://h/", "s3://b/p/..", "/data/."] {
            let e = file_name(bad).unwrap_err().to_string();
            assert!(e.contains("-o FILE"), "{bad}: {e}");
        }
    }
}
