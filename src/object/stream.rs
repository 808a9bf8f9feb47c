//! An object read in order through a window of reused part buffers, each
//! part written to a sink once it and every part before it are in:
//! `ringfeed get` to a file, stdout or a device in a few parts' memory.
//!
//! Why not the whole object first: its bytes would land in a fresh mapping
//! of its size, and faulting that in costs more than the transfer where
//! first touches are dear (on this project's VMs the host backs a page at
//! its first touch: ~2 ms a MB, `benches/first_touch.sh`, so 2 s of CPU
//! for a 1 GiB object that the emulator's S3 model sends in 1 s). A window
//! slot is faulted in once and reused for the parts after it.
//!
//! The window has room for twice the most parts in flight (as many being
//! received while as many completed ones wait for a slower part before
//! them), at most `WINDOW_BYTES`. A part goes to the lowest free slot (so the slots touched are as
//! many as were ever in use at once, not the window's size) and only once
//! it is within the window of the first part not yet written; a slot is
//! free again once its part is written. A part that fails for good, or a
//! sink that refuses a write, stops new parts; those in flight are waited
//! for before the window's memory goes, and the error names the part or
//! the sink.
//!
//! On the thread backend (no io_uring, or `io_backend` = `"threads"`) the
//! object is read whole, its parts on as many threads, then written: the
//! window's order would serialize the threads' reads.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Instant;

use super::Progress;
use super::read::{
    Job, Landing, ReadReport, open_ring, own_memory, parts, read_shard, shard_size, target_of,
};
use crate::config::Config;
use crate::dataset::Shard;
use crate::error::{Error, IoOp, Result};
use crate::fetch::{BackendKind, NetOptions};

/// The most memory a window takes (unless a part alone is larger): one
/// object is served at ~1.25 GB/s by S3 (~10 Gbit/s per stored part); at
/// ~115 ms per 8 MiB GET that is 17 parts in flight, and as many again
/// waiting on a slower part before them: 32 slots of 8 MiB. A found count
/// of parts in flight goes past that at a far store (to 64 at once, then
/// down towards the object's limit), and a window of twice it held the
/// whole of a 1 GiB object: the memory the stream is there to save.
const WINDOW_BYTES: usize = 256 << 20;

/// Reads `shard` in order into `sink` (named `sink_name` in errors).
/// Bytes already written stay written when the read fails after them.
/// `stop`, asked as parts complete, ends the read early when it says so
/// (an error naming the sink; the parts in flight are waited for).
pub fn stream_shard(
    shard: &Shard,
    cfg: &Config,
    net: &NetOptions,
    sink: &mut dyn Write,
    sink_name: &str,
    progress: Option<&Progress>,
    stop: Option<&dyn Fn() -> bool>,
) -> Result<ReadReport> {
    let started = Instant::now();
    let size = shard_size(shard)?;
    let list: Vec<(u64, usize)> = parts(size, cfg.part_size).collect();
    let (target, _file) = target_of(shard)?;
    let probe = Job::new(
        shard,
        size,
        std::ptr::null_mut(),
        target,
        &list,
        cfg,
        progress,
    );
    let mut notes = Vec::new();
    let Some(mut ring) = open_ring(cfg, net, probe.most, &mut notes)? else {
        // The whole read opens its own backend and says why in its notes.
        let buf = read_shard(shard, cfg, net, progress)?;
        write_all(sink, sink_name, buf.as_slice())?;
        flush(sink, sink_name)?;
        return Ok(buf.report.clone());
    };
    let slot = list.first().map_or(0, |p| p.1);
    let slots = (2 * probe.most)
        .min(WINDOW_BYTES.div_ceil(slot.max(1)))
        .min(list.len())
        .max(1);
    let memory = own_memory(slots * slot.max(1), cfg)?;
    notes.extend(memory.report().notes.iter().cloned());
    let job = probe.into_dst(memory.base());
    let mut window = Window {
        base: memory.base(),
        slot,
        slots,
        free: (0..slots).collect(),
        slot_of: vec![None; list.len()],
        written: 0,
        parts: &list,
        sink,
        sink_name,
        broken: false,
        stop,
    };
    job.on_ring(&mut ring, &mut window)?;
    flush(window.sink, sink_name)?;
    Ok(ReadReport {
        bytes: size,
        parts: list.len(),
        backend: BackendKind::IoUring,
        seconds: started.elapsed().as_secs_f64(),
        notes,
    })
}

fn write_all(sink: &mut dyn Write, name: &str, bytes: &[u8]) -> Result<()> {
    sink.write_all(bytes)
        .map_err(|e| Error::io(IoOp::Write, name, &e))
}

fn flush(sink: &mut dyn Write, name: &str) -> Result<()> {
    sink.flush().map_err(|e| Error::io(IoOp::Write, name, &e))
}

/// The slots of the window and the parts in them.
struct Window<'a> {
    base: *mut u8,
    /// Bytes a slot holds: the part size (the last part may be shorter).
    slot: usize,
    slots: usize,
    /// The slots no part holds, lowest first.
    free: BTreeSet<usize>,
    /// Each part's slot while it is in flight or waits to be written;
    /// `Some` and landed once it is in.
    slot_of: Vec<Option<(usize, bool)>>,
    /// Parts written so far: the next one to write.
    written: usize,
    parts: &'a [(u64, usize)],
    sink: &'a mut dyn Write,
    sink_name: &'a str,
    /// A write to the sink failed: the read is stopping.
    broken: bool,
    stop: Option<&'a dyn Fn() -> bool>,
}

impl Landing for Window<'_> {
    fn place(&mut self, i: usize, _: *mut u8, _: u64) -> Option<*mut u8> {
        if i >= self.written + self.slots {
            return None;
        }
        let s = self.free.pop_first()?;
        self.slot_of[i] = Some((s, false));
        // SAFETY: s < slots, and the mapping holds slots × slot bytes.
        Some(unsafe { self.base.add(s * self.slot) })
    }

    fn landed(&mut self, i: usize) -> Result<()> {
        if let Some((_, landed)) = &mut self.slot_of[i] {
            *landed = true;
        }
        if self.broken {
            // The sink refused a write: nothing more goes to it (a part
            // written again would follow a part of it already there).
            return Ok(());
        }
        while let Some(Some((s, true))) = self.slot_of.get(self.written).copied() {
            let len = self.parts[self.written].1;
            // SAFETY: the slot holds this part, whole: its read completed,
            // and nothing writes the slot until it is free and given to
            // another part, after this.
            let bytes = unsafe { std::slice::from_raw_parts(self.base.add(s * self.slot), len) };
            if let Err(e) = write_all(self.sink, self.sink_name, bytes) {
                self.broken = true;
                return Err(e);
            }
            self.slot_of[self.written] = None;
            self.free.insert(s);
            self.written += 1;
        }
        Ok(())
    }

    fn go_on(&mut self) -> Result<()> {
        if self.stop.is_some_and(|stop| stop()) {
            let why = std::io::Error::other("stopped before the object's end");
            return Err(Error::io(IoOp::Write, self.sink_name, &why));
        }
        Ok(())
    }
}
