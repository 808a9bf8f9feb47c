//! `ringfeed put`: a file or stdin streamed into the library's
//! `ObjectWriter` (`ringfeed::object::write`) a part at a time, so memory
//! stays at the writer's parts in flight whatever the size. The object
//! appears only once whole; an error or Ctrl-C drops the writer, which
//! aborts the write (no S3 upload, no temporary file left).

use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;

use serde_json::{Value, json};

use ringfeed::object::{ObjectWriter, Progress};

use crate::AnyResult;
use crate::args::{PutArgs, object_config};
use crate::transfer::{self, Bars, WritingGuard};

/// Fills `buf` from `r` as far as it goes: fewer bytes only at the end.
/// A read interrupted by Ctrl-C returns to check the flag.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> AnyResult<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => transfer::check_interrupt()?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

/// `ringfeed put`.
pub(crate) fn put(a: PutArgs) -> AnyResult<()> {
    transfer::install_interrupt_handler();
    let mut more = vec![("overwrite", json!(a.overwrite))];
    if let Some(c) = &a.checksum {
        more.push(("checksum", Value::String(c.clone())));
    }
    let cfg = object_config(&a.opts, &more)?;
    let stdin = a.file.as_os_str() == "-";
    let (mut input, size): (Box<dyn Read>, Option<u64>) = if stdin {
        (Box::new(io::stdin().lock()), None)
    } else {
        let f = File::open(&a.file).map_err(|e| format!("open `{}`: {e}", a.file.display()))?;
        let size = f.metadata().ok().map(|m| m.len());
        (Box::new(f), size)
    };
    let part = usize::try_from(cfg.part_size).map_err(|_| "--part-size too large")?;
    let mut buf = vec![0u8; part];
    let progress = Arc::new(Progress::default());
    let _writing = WritingGuard::new();
    let mut w =
        ObjectWriter::open(&a.url, &cfg, Some(Arc::clone(&progress))).map_err(transfer::explain)?;
    let mut bars = Bars::new(size, 1);
    bars.start_object(&a.url, size, progress);
    loop {
        transfer::check_interrupt()?;
        let n = fill(&mut *input, &mut buf)?;
        if n == 0 {
            break;
        }
        w.write(&buf[..n])?;
    }
    transfer::check_interrupt()?;
    w.finish().map_err(transfer::explain)?;
    let total = w.written();
    bars.finish_object(total);
    let seconds = bars.started.elapsed().as_secs_f64();
    bars.clear();
    let how = if a.url.starts_with("s3://") {
        "s3"
    } else {
        "local file"
    };
    eprintln!("{}", transfer::summary("put", 1, total, seconds, how));
    Ok(())
}
