//! The loader handle: what consumers call `next`, `state` and `close` on.
//! It is `Sync`: several consumer threads may call `next` at once, and
//! `close` may come from any thread. Opening it is `open`; its stats are
//! `stats`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::dataset::Shard;
use crate::engine::shared::{DeliveryProgress, Item, Shared};
use crate::error::{Error, Fault, Result};
use crate::fetch::BackendKind;
use crate::fetch::fixed::FixedBuffers;
use crate::memory::{Arena, Batch};
use crate::plan::resume::State;
use crate::queue::RecvError;
use crate::sync::Locked;
use crate::topology::Claims;

/// What `next` returns when it does not fail: of a loader in this process
/// a [`Batch`]; of one attached to a node engine, that engine's batch.
#[derive(Debug)]
pub enum Next<B = Batch> {
    Batch(B),
    /// Every batch of this epoch was handed out.
    EndOfEpoch(u64),
    /// Nothing arrived before the time-out.
    Timeout,
    /// Every epoch is over; no batch will come.
    Finished,
}

impl<B> Next<B> {
    /// The same answer, its batch (if it is one) mapped by `f`.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> Next<C> {
        match self {
            Next::Batch(b) => Next::Batch(f(b)),
            Next::EndOfEpoch(e) => Next::EndOfEpoch(e),
            Next::Timeout => Next::Timeout,
            Next::Finished => Next::Finished,
        }
    }
}

/// Fixed facts of a loader, decided at open.
#[derive(Debug, Clone)]
pub(super) struct Setup {
    pub(super) backend: BackendKind,
    pub(super) uring_flags: &'static str,
    /// The chunks as fixed buffers, when the rings use them (each ring
    /// registers them once the prefault thread has the memory in).
    pub(super) fixed: Option<Arc<FixedBuffers>>,
    pub(super) workers: usize,
    pub(super) cpus: Vec<usize>,
    /// What decided the CPUs (`topology::Why::describe`).
    pub(super) placement: String,
    pub(super) notes: Vec<String>,
}

/// A running loader.
pub struct Loader {
    pub(super) shared: Arc<Shared>,
    pub(super) setup: Setup,
    /// The workers' CPUs, claimed against other engines until close.
    pub(super) claims: Mutex<Claims>,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(super) closed: AtomicBool,
}

impl Loader {
    /// The next batch, end of epoch, or time-out (`None`: wait for ever).
    pub fn next(&self, timeout: Option<Duration>) -> Result<Next> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let sh = &self.shared;
        let t0 = Instant::now();
        let got = sh.channel.pop_until(timeout.map(|t| t0 + t));
        let waited = t0.elapsed().as_nanos() as u64;
        let c = &sh.counters;
        c.consumer_wait_ns.fetch_add(waited, Ordering::Relaxed);
        match got {
            Ok(Item::Batch(mut b)) => {
                // Relaxed: distinct, increasing numbers in hand-out order.
                b.set_index(sh.delivered.fetch_add(1, Ordering::Relaxed));
                {
                    let mut p = sh.progress.locked();
                    if b.epoch() > p.epoch {
                        // Another consumer thread has not recorded the end
                        // marker yet.
                        *p = DeliveryProgress {
                            epoch: b.epoch(),
                            batches: 0,
                            samples: 0,
                            history: Vec::new(),
                        };
                    }
                    p.batches += 1;
                    // The samples of the order it stands for, those a
                    // transform left out included: what a resume skips.
                    p.samples += b.planned_len() as u64;
                }
                if c.batches_delivered.fetch_add(1, Ordering::Relaxed) == 0 {
                    let since = sh.started.elapsed().as_nanos() as u64;
                    c.time_to_first_batch_ns.store(since, Ordering::Relaxed);
                }
                c.samples_delivered
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                c.bytes_delivered.fetch_add(b.bytes(), Ordering::Relaxed);
                Ok(Next::Batch(b))
            }
            Ok(Item::EndOfEpoch(e)) => {
                let mut p = sh.progress.locked();
                if p.epoch <= e {
                    *p = DeliveryProgress {
                        epoch: e + 1,
                        batches: 0,
                        samples: 0,
                        history: Vec::new(),
                    };
                }
                Ok(Next::EndOfEpoch(e))
            }
            Ok(Item::Tail(_)) => Err(Error::internal(
                Fault::Invariant,
                "a stream's tail reached the ring",
            )),
            Err(RecvError::Timeout) => Ok(Next::Timeout),
            Err(RecvError::Closed) => match sh.failure() {
                Some(e) => Err(e),
                None if self.closed.load(Ordering::Acquire) || sh.stopping() => Err(Error::Closed),
                None => Ok(Next::Finished),
            },
        }
    }

    /// Stops the workers and frees what the loader holds. Batches already
    /// handed out stay valid until dropped (they keep the arena alive).
    /// Idempotent; other threads blocked in `next` return `Error::Closed`.
    pub fn close(&self) {
        // AcqRel: the first closer does the work; later ones see it done.
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.stop_all();
        let threads = std::mem::take(&mut *self.threads.locked());
        for t in threads {
            let _ = t.join();
        }
        // The cache's writes of what the workers read are done: its entries
        // are whole, and the chunks they held are back.
        if let Some(spool) = &self.shared.cache {
            // A writer of this loader's own (a node engine's serves its
            // other consumers too): the fills the disk could not keep up
            // with are given up rather than waited for.
            if !self.shared.pool.is_shared() {
                spool.close_spare(self.shared.started.elapsed());
            }
            spool.flush();
        }
        // The workers are gone: their CPUs are free for other engines.
        self.claims.locked().release();
        while self.shared.channel.try_pop().is_some() {}
        for q in &self.shared.streams {
            while q.try_pop().is_some() {}
        }
        if self.shared.pool.is_shared() {
            let sh = &self.shared;
            sh.pool.leave(sh.owner_base, sh.streams.len());
        }
    }

    /// The resume state after the batches handed out so far: give it back as
    /// `resume` (hex) to continue from here. See `crate::plan::resume` for the rule.
    pub fn state(&self) -> State {
        let sh = &self.shared;
        let p = sh.progress.locked().clone();
        State {
            fingerprint: sh.fingerprint,
            epoch: p.epoch,
            consumers: sh.plan_opts.consumers,
            consumer: sh.plan_opts.consumer,
            streams: sh.plan_opts.streams as u64,
            batches: p.batches,
            samples: p.samples,
            history: p.history,
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The memory every batch's bytes live in.
    pub fn arena(&self) -> &Arena {
        self.shared.pool.arena()
    }

    /// Shards of the dataset, in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shared.shards
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.close();
    }
}
