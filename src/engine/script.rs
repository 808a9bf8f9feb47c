//! A scripted [`Reader`] for the engine's unit tests (the mock and
//! failure-injecting source of docs/design.md, "Tests and benchmarks"): it serves objects held in
//! memory, so a whole loader runs without files or sockets, and it plays the
//! ways a real backend behaves and breaks, drawn from a seed:
//! - completions in any order, and held back for some `wait` calls (delays
//!   are counted in calls, never in time, so a test cannot depend on speed);
//! - short reads (the worker must continue them);
//! - an error for a read that covers a chosen offset of an object;
//! - a panic in the n-th `submit`, before or after the read was queued (a
//!   bug in the backend, which the worker must survive without letting a
//!   read land in a chunk that went back to the pool).
//!
//! It also checks the contract the worker owes a backend: a chunk stays out
//! of the pool while a read into it is in flight. When a read is submitted
//! it records which check-out of each chunk the buffer covers
//! (`ChunkPool::checkout`); when the read completes, and when the reader is
//! dropped with reads still queued, every one of those chunks must still be
//! on the same check-out (not returned, not returned and taken again). What
//! it finds goes to the script's `violations`, and a read into a chunk that
//! moved on writes nothing.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::fetch::{Completion, ReadFail, ReadRequest, Reader, Target};
use crate::memory::ChunkPool;
use crate::sync::Locked;

/// What the readers of one loader serve and how they misbehave.
#[derive(Default)]
pub(crate) struct Script {
    /// Each object's bytes, by URL.
    pub objects: HashMap<String, Vec<u8>>,
    pub seed: u64,
    /// Give some reads short (fewer bytes than asked).
    pub short_reads: bool,
    /// Most `wait` calls a completion may be held back.
    pub max_delay: u32,
    /// A read covering this byte of this object fails with EIO.
    pub fail_at: Option<(String, u64)>,
    /// The n-th `submit` of all readers together (from 1) panics.
    pub panic_on_submit: Option<u64>,
    /// ... after queueing the read (else before).
    pub queue_then_panic: bool,
    /// `submit` calls so far. Relaxed: a count.
    pub attempts: AtomicU64,
    /// The n-th `wait` of all readers together (from 1) gives its
    /// completions and then fails, as a ring whose `submit_and_wait`
    /// fails after reaping can.
    pub fail_wait: Option<u64>,
    /// `wait` calls so far. Relaxed: a count.
    pub waits: AtomicU64,
    /// Broken promises seen (a read into a chunk that is back in the pool).
    pub violations: Mutex<Vec<String>>,
    /// Reads submitted, all readers together. Relaxed: a count.
    pub submitted: AtomicU64,
}

impl Script {
    /// A reader for one worker, drawing from its own stream of the seed.
    pub fn reader(self: &Arc<Self>, stream: usize, pool: &Arc<ChunkPool>) -> Box<dyn Reader> {
        Box::new(ScriptedReader {
            script: Arc::clone(self),
            pool: Arc::clone(pool),
            rng: self.seed ^ (stream as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            queued: Vec::new(),
        })
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.locked().clone()
    }

    fn violation(&self, what: String) {
        self.violations.locked().push(what);
    }
}

fn covers(at: &Option<(String, u64)>, url: &str, offset: u64, len: usize) -> bool {
    at.as_ref()
        .is_some_and(|(u, o)| u == url && (offset..offset + len as u64).contains(o))
}

struct Queued {
    req: ReadRequest,
    url: String,
    /// (chunk, check-out) of every chunk the buffer covers, at submission.
    chunks: Vec<(usize, Option<u64>)>,
    /// `wait` calls left before it may complete.
    due: u32,
}

struct ScriptedReader {
    script: Arc<Script>,
    pool: Arc<ChunkPool>,
    rng: u64,
    queued: Vec<Queued>,
}

impl ScriptedReader {
    /// SplitMix64: a fixed stream per seed, independent of any crate.
    fn draw(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.draw() % n }
    }

    /// The chunks `buf..buf + len` covers, with their check-out now.
    fn chunks(&self, req: &ReadRequest) -> Vec<(usize, Option<u64>)> {
        let base = self.pool.arena().base() as usize;
        let cs = self.pool.chunk_size();
        let first = (req.buf as usize - base) / cs;
        let last = (req.buf as usize + req.len.max(1) - 1 - base) / cs;
        (first..=last).map(|i| (i, self.pool.checkout(i))).collect()
    }

    /// A chunk of `q` that is not on the check-out it was on at submission.
    fn moved(&self, q: &Queued) -> Option<usize> {
        q.chunks
            .iter()
            .find(|&&(i, at)| at.is_none() || self.pool.checkout(i) != at)
            .map(|&(i, _)| i)
    }

    fn complete(&mut self, q: Queued) -> Completion {
        if let Some(chunk) = self.moved(&q) {
            self.script.violation(format!(
                "a read of {} at {} completed into chunk {chunk}, which went back to the pool",
                q.url, q.req.offset
            ));
            let Queued { req, .. } = q;
            return Completion {
                id: req.id,
                result: Err(ReadFail::Io(io::Error::other("chunk returned"))),
                copied: 0,
                total: None,
                timing: None,
            };
        }
        let Queued { req, url, .. } = q;
        let script = Arc::clone(&self.script);
        let data = &script.objects[&url];
        let mut n = req.len;
        if self.script.short_reads && n > 1 && self.draw() % 2 == 0 {
            n = 1 + self.below(n as u64 - 1) as usize;
        }
        let result = if covers(&self.script.fail_at, &url, req.offset, n) {
            Err(ReadFail::Io(io::Error::from_raw_os_error(libc::EIO)))
        } else {
            let start = (req.offset as usize).min(data.len());
            let n = n.min(data.len() - start);
            // SAFETY: the worker promised (`Reader::submit`) that `buf` holds
            // `len` >= n writable bytes, untouched by others until this
            // completion is returned; every chunk it covers was checked
            // above to be on the check-out it was on at submission.
            unsafe { std::ptr::copy_nonoverlapping(data[start..].as_ptr(), req.buf, n) };
            Ok(n)
        };
        Completion {
            id: req.id,
            result,
            copied: 0,
            // As an HTTP response's Content-Range says it.
            total: Some(data.len() as u64),
            timing: None,
        }
    }
}

impl Reader for ScriptedReader {
    unsafe fn submit(&mut self, req: ReadRequest) -> io::Result<()> {
        let Target::Http(obj) = &req.target else {
            return Err(io::Error::other("the scripted reader serves objects only"));
        };
        let url = obj.url.clone();
        if !self.script.objects.contains_key(&url) {
            return Err(io::Error::other(format!("no scripted object {url}")));
        }
        let attempt = self.script.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let panics = self.script.panic_on_submit == Some(attempt);
        if panics && !self.script.queue_then_panic {
            panic!(
                "scripted panic submitting a read of {url} at {}",
                req.offset
            );
        }
        self.script.submitted.fetch_add(1, Ordering::Relaxed);
        let due = self.below(u64::from(self.script.max_delay) + 1) as u32;
        let chunks = self.chunks(&req);
        if let Some(&(i, _)) = chunks.iter().find(|(_, at)| at.is_none()) {
            self.script.violation(format!(
                "a read of {url} at {} into chunk {i}, which is in the pool",
                req.offset
            ));
        }
        let offset = req.offset;
        self.queued.push(Queued {
            req,
            url,
            chunks,
            due,
        });
        if panics {
            panic!("scripted panic after queueing a read at {offset}");
        }
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> io::Result<()> {
        if self.queued.is_empty() {
            // A real backend would block for ever: the worker waited for a
            // read it already had back.
            self.script
                .violation("wait with no read in flight (a real backend blocks for ever)".into());
            return Err(io::Error::other("wait with no read in flight"));
        }
        let call = self.script.waits.fetch_add(1, Ordering::Relaxed) + 1;
        for q in &mut self.queued {
            q.due = q.due.saturating_sub(1);
        }
        // The due ones, and the soonest others until `min` are there.
        self.queued.sort_by_key(|q| q.due);
        let due = self.queued.iter().filter(|q| q.due == 0).count();
        let take = due.max(min).min(self.queued.len());
        let mut ready: Vec<Queued> = self.queued.drain(..take).collect();
        // Any order.
        for i in (1..ready.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            ready.swap(i, j);
        }
        for q in ready {
            let c = self.complete(q);
            out.push(c);
        }
        if self.script.fail_wait == Some(call) {
            return Err(io::Error::from_raw_os_error(libc::EINTR));
        }
        Ok(())
    }
}

impl Drop for ScriptedReader {
    fn drop(&mut self) {
        for q in &self.queued {
            if let Some(chunk) = self.moved(q) {
                self.script.violation(format!(
                    "chunk {chunk} went back to the pool while a read of {} at {} was in flight",
                    q.url, q.req.offset
                ));
            }
        }
    }
}
