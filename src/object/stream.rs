//! An object read in order through a window of reused part buffers and
//! written to a sink as its head part completes: `ringfeed get -o -` (or
//! into a device or pipe) of an object of any size in a few parts' memory.
//!
//! Why not the whole object first: its bytes would land in a fresh
//! mapping of its size, and on the dev machine faulting that in (a fault,
//! a zeroed page and its accounting per 4 KiB) cost the process more than
//! the receives' copy did (see `populate.rs`); a window of a few parts is
//! faulted in once and reused for every part after.
//!
//! The window has `2 × parts_in_flight` slots: `parts_in_flight` being
//! received while as many completed ones wait for a slower part before
//! them, so one slow part does not stop the submissions at once. Part `i`
//! goes to slot `i % slots`, and is submitted only once the part that had
//! the slot before it is written. A part that fails for good, or a sink
//! that refuses a write, stops new parts; those in flight are waited for
//! before the window's memory goes, and the error names the part or the
//! sink.
//!
//! On the thread backend (no io_uring, or `io_backend` = `"threads"`) the
//! object is read whole, its parts on as many threads, then written: the
//! window's order would serialize the threads' reads.

use std::io::Write;
use std::time::Instant;

use super::Progress;
use super::read::{Job, Plan, ReadReport, open_ring, own_memory, read_shard, shard_size};
use crate::dataset::Shard;
use crate::error::{Error, IoOp, Result};
use crate::fetch::{BackendKind, NetOptions, Reader};

/// Reads `shard` in order into `sink` (named `sink_name` in errors).
/// Bytes already written stay written when the read fails after them.
pub fn stream_shard(
    shard: &Shard,
    cfg: &crate::config::Config,
    net: &NetOptions,
    sink: &mut dyn Write,
    sink_name: &str,
    progress: Option<&Progress>,
) -> Result<ReadReport> {
    let started = Instant::now();
    let write = |sink: &mut dyn Write, bytes: &[u8]| {
        sink.write_all(bytes)
            .map_err(|e| Error::io(IoOp::Write, sink_name, &e))
    };
    let in_flight = cfg.parts_in_flight.max(1);
    let mut notes = Vec::new();
    let Some(mut ring) = open_ring(cfg, net, in_flight, &mut notes)? else {
        let buf = read_shard(shard, cfg, net, progress)?;
        write(sink, buf.as_slice())?;
        let mut report = buf.report.clone();
        notes.append(&mut report.notes);
        report.notes = notes;
        return Ok(report);
    };
    let size = shard_size(shard)?;
    let plan = Plan::new(shard, size, cfg)?;
    let slot = plan.parts.first().map_or(0, |p| p.1);
    let slots = (2 * in_flight).min(plan.parts.len()).max(1);
    let window = own_memory(slots * slot, cfg)?;
    notes.extend(window.report().notes.iter().cloned());
    let job = Job {
        shard,
        size,
        dst: window.base(),
        target: plan.target.clone(),
        pin: plan.pin.clone(),
        parts: &plan.parts,
        in_flight,
        progress,
        ahead: None,
        window: Some((slots, slot)),
    };
    let count = plan.parts.len();
    let mut next = 0;
    let mut written = 0;
    let mut out_standing = 0;
    let mut complete = vec![false; slots];
    let mut first_error: Option<Error> = None;
    let mut done = Vec::new();
    loop {
        while first_error.is_none()
            && out_standing < in_flight
            && next < count
            && next < written + slots
        {
            // SAFETY: the slot is this part's alone until it is written
            // (the part before it in the slot is), and the window and the
            // file outlive the read: this loop ends only once nothing is
            // in flight.
            match unsafe { ring.submit(job.request(next)) } {
                Ok(()) => {
                    next += 1;
                    out_standing += 1;
                }
                Err(e) => first_error = Some(Error::IoUring(format!("submit: {e}"))),
            }
        }
        while first_error.is_none() && written < next && complete[written % slots] {
            complete[written % slots] = false;
            let len = plan.parts[written].1;
            // SAFETY: the slot's part is complete: nothing writes it until
            // it is submitted again, after this.
            let bytes = unsafe { std::slice::from_raw_parts(job.place(written), len) };
            match write(sink, bytes) {
                Ok(()) => written += 1,
                Err(e) => first_error = Some(e),
            }
        }
        if out_standing == 0 {
            break;
        }
        if let Err(e) = ring.wait(1, &mut done) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // The window cannot go while reads are in flight into it.
            return Err(Error::Internal(format!(
                "io_uring wait failed with reads in flight: {e}"
            )));
        }
        for c in done.drain(..) {
            out_standing -= 1;
            let i = c.id as usize;
            match job.check(c) {
                Ok(()) => complete[i % slots] = true,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    sink.flush()
        .map_err(|e| Error::io(IoOp::Write, sink_name, &e))?;
    Ok(ReadReport {
        bytes: size,
        parts: count,
        backend: BackendKind::IoUring,
        seconds: started.elapsed().as_secs_f64(),
        populated: 0,
        notes,
    })
}
