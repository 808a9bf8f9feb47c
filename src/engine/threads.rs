//! The thread mains: each sets up its part (a worker pins itself and makes
//! its own reader), runs inside a panic catch, and turns what ended it into
//! the loader's failure or a clean stop.

use std::sync::{Arc, mpsc};

use crate::engine::sequencer::sequence;
use crate::engine::shared::Shared;
use crate::engine::worker::Worker;
use crate::error::{Error, Fault};
use crate::fetch::fixed::FixedBuffers;
use crate::fetch::net_thread::NetLink;
use crate::fetch::threads::ThreadReader;
use crate::fetch::uring::UringReader;
use crate::fetch::{BackendKind, Reader};
use crate::memory::{ChunkPool, cuda};
use crate::topology;

/// The longest the prefault thread waits for the first batch: long
/// against a loopback or page-cache first batch (10-50 ms), short against an
/// epoch, so the rings get their fixed buffers early in any case.
const PREFAULT_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Makes a worker's reader on the worker's thread, from its stream and the
/// pool its reads land in.
pub(crate) type MakeReader = Arc<dyn Fn(usize, &Arc<ChunkPool>) -> Box<dyn Reader> + Send + Sync>;

/// How each worker gets its reader.
#[derive(Clone)]
pub(super) enum Readers {
    /// The backend start-up chose: io_uring (into fixed buffers when
    /// `registered`) or threads.
    Backend {
        kind: BackendKind,
        fixed: Option<Arc<FixedBuffers>>,
    },
    /// Made by a function: the engine's unit tests drive workers with
    /// scripted readers (no files, no sockets).
    #[cfg_attr(not(test), allow(dead_code))]
    Made(MakeReader),
}

/// A network thread: receives the HTTP ranges its workers hand it until the
/// loader closes (`net_thread.rs`).
pub(super) fn net_main(shared: Arc<Shared>, link: Arc<NetLink>, id: usize, entries: u32) {
    let seed = (std::process::id() as u64) << 32
        ^ (id as u64) << 16
        ^ shared.started.elapsed().as_nanos() as u64;
    let net = shared.net.clone();
    // Only the link is kept: the loader's state goes with the workers.
    drop(shared);
    link.run(net, seed, entries);
}

pub(super) fn worker_main(
    shared: Arc<Shared>,
    stream: usize,
    cpu: Option<usize>,
    readers: Readers,
    ready: mpsc::Sender<std::result::Result<Option<String>, Error>>,
) {
    let mut note = None;
    if let Some(cpu) = cpu
        && let Err(e) = topology::pin_current_thread(cpu)
    {
        note = Some(format!("pinning to CPU {cpu} failed ({e})"));
    }
    let entries = (shared.cfg.read_depth().ring * 2)
        .next_power_of_two()
        .max(8) as u32;
    // Jitter seeds differ per worker and per run.
    let seed = (std::process::id() as u64) << 32
        ^ cpu.unwrap_or(0) as u64
        ^ shared.started.elapsed().as_nanos() as u64;
    let mut reader: Box<dyn Reader> =
        match &readers {
            Readers::Made(make) => make(stream, &shared.pool),
            Readers::Backend {
                kind: BackendKind::Threads,
                ..
            } => Box::new(ThreadReader::new(shared.net.clone(), seed)),
            Readers::Backend {
                kind: BackendKind::IoUring,
                fixed,
            } => match UringReader::new(entries, fixed.clone(), shared.net.clone(), seed).and_then(
                |r| match shared.net_links.len() {
                    0 => Ok(r),
                    // A node engine's links take the file reads too.
                    n => r.with_net_thread(
                        Arc::clone(&shared.net_links[shared.owner(stream) % n]),
                        !shared.own_net_links,
                    ),
                },
            ) {
                Ok(r) => Box::new(r),
                Err(e) => {
                    let _ = ready.send(Err(Error::IoUring(format!(
                        "worker ring setup failed: {e}"
                    ))));
                    return;
                }
            },
        };
    let _ = ready.send(Ok(note));
    drop(ready);
    shared.pool.worker_running(true);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Worker::new(&shared, &mut *reader, stream).run()
    }));
    shared.pool.worker_running(false);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(Error::Closed)) if shared.stopping() => {}
        Ok(Err(e)) => shared.fail(e),
        Err(panic) => {
            shared.fail(Error::internal(
                Fault::Panic,
                format!("a worker panicked: {}", panic_message(&*panic)),
            ));
        }
    }
    drop(reader);
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic")
}

pub(super) fn sequencer_main(shared: Arc<Shared>) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sequence(&shared)));
    match result {
        // Every epoch went out: `next` returns Finished once the ring is empty.
        Ok(Ok(())) => {}
        // Stopped by close or by a worker's failure (already recorded).
        Ok(Err(Error::Closed)) if shared.stopping() => {}
        Ok(Err(e)) => shared.fail(e),
        Err(panic) => shared.fail(Error::internal(
            Fault::Panic,
            format!("the sequencer panicked: {}", panic_message(&*panic)),
        )),
    }
    shared.channel.close();
}

/// Faults the arena in, chunk by chunk from the last one (the pool hands
/// out the first ones first, so this thread and the workers' first reads
/// meet in the middle instead of queueing on the same pages), then lets the
/// rings register the chunks as fixed buffers and registers the arena with
/// CUDA (`cuda`: `cuda_register` "auto" found a runtime). It starts once the first
/// batch is out (or after `PREFAULT_AFTER`): zeroing the arena is some
/// 40 ms of a core per 256 MiB, which the first batch should not share.
/// Stops when the loader does.
pub(super) fn prefault_main(
    shared: Arc<Shared>,
    fixed: Option<Arc<FixedBuffers>>,
    cuda: Option<&'static cuda::Runtime>,
) {
    let begun = std::time::Instant::now();
    // Relaxed: a hint when to start, nothing is read through it.
    while shared
        .counters
        .time_to_first_batch_ns
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
        && begun.elapsed() < PREFAULT_AFTER
    {
        if shared.stopping() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let pool = &shared.pool;
    let cs = pool.chunk_size();
    // A shared pool's arena is its engine's to populate.
    let own = if pool.is_shared() {
        0
    } else if super::shared::faults_in_on_reads(&shared.cfg, &shared.shards) {
        // The default arena of remote shards is sized for a far store's
        // reads in flight; on a near one most of it is never read into.
        // Fault in what a local dataset's default holds, and let the rest
        // fault in as reads first land in it.
        let local = shared.cfg.effective_budget(shared.streams.len(), None);
        pool.chunk_count().min((local / cs as u64) as usize)
    } else {
        pool.chunk_count()
    };
    for i in (0..own).rev() {
        if shared.stopping() {
            return;
        }
        pool.arena().populate(i * cs, cs);
    }
    // The chunks faulted in, and no more: pinning the rest would fault it
    // in on the first ring's thread.
    if let Some(f) = fixed {
        f.set_ready(own);
    }
    if let Some(rt) = cuda {
        // A refusal is kept by the arena; the stats notes give it.
        let _ = pool.arena().register_cuda(rt);
    }
    if let Some(t) = &shared.transform {
        t.register_cuda_later();
    }
}
