//! A consumer's feeder thread: takes its loader's batches, enters each in
//! the engine's table of holds with a fresh capability, and writes its
//! record into the consumer's ring (waiting while the ring is full).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::node;
use crate::engine::{Loader, Next};
use crate::error::{Error, Fault, NodeFailure};
use crate::node::engine::Engine;
use crate::node::proto::{Cap, record};
use crate::node::shm::Rings;
use crate::node::sock;
use crate::sync::Locked;

/// What the feeder and the session share for one consumer.
pub(super) struct Feed {
    /// Shared with the engine's table of loaders (its metrics).
    pub(super) loader: Arc<Loader>,
    pub(super) rings: Rings,
    pub(super) ready: OwnedFd,
    pub(super) party: u64,
    pub(super) stop: AtomicBool,
    /// The consumer read records (room in the ring) or released batches.
    pub(super) room: (Mutex<()>, Condvar),
    /// The batches written into the ring and not yet read, each with the
    /// ring position its record ends at: what the consumer never took when
    /// it leaves.
    pub(super) unread: Mutex<std::collections::VecDeque<(u64, u64)>>,
}

impl Feed {
    /// Forgets the records the consumer has read.
    pub(super) fn prune_unread(&self) {
        let tail = self.rings.consumed();
        let mut u = self.unread.locked();
        while u.front().is_some_and(|&(end, _)| end <= tail) {
            u.pop_front();
        }
    }
}

/// Pushes one record (of batch `id`, if it is one), waiting while the ring
/// is full; `false` once stopped.
fn push(feed: &Feed, rec: &[u8], id: Option<u64>) -> bool {
    loop {
        if feed.rings.push_record(rec) {
            if let Some(id) = id {
                feed.unread.locked().push_back((feed.rings.written(), id));
            }
            sock::notify(&feed.ready);
            return true;
        }
        if feed.stop.load(Ordering::Acquire) {
            return false;
        }
        let g = feed.room.0.locked();
        let _ = feed.room.1.wait_timeout(g, Duration::from_millis(50));
    }
}

fn failed(feed: &Feed, e: &Error) {
    push(
        feed,
        &record::encode_failed(e.status(), &e.to_string()),
        None,
    );
}

pub(super) fn run_feed(feed: &Feed, engine: &Engine) {
    let arena = feed.loader.arena();
    let (base, len) = (arena.base().cast_const(), arena.len());
    let mut buf = Vec::new();
    loop {
        if feed.stop.load(Ordering::Acquire) {
            return;
        }
        let rec = match feed.loader.next(Some(Duration::from_millis(200))) {
            Ok(Next::Batch(b)) => {
                let cap = match Cap::random() {
                    Ok(c) => c,
                    Err(e) => {
                        return failed(
                            feed,
                            &node(NodeFailure::Local, format!("a batch's capability: {e}")),
                        );
                    }
                };
                let state = feed.loader.state().to_hex();
                // The number is the table's; the record is written with it
                // once the batch is in, so a release can never precede it.
                // Encoded under the table's lock taken for the insert: the
                // batch lives in the table from here on.
                let (id, encoded) = {
                    let mut holds = engine.holds.locked();
                    let id = holds.insert(feed.party, cap.0, b);
                    let b = holds.get(id).expect("just inserted");
                    let encoded = record::encode_batch(b, id, cap.0, &state, base, len, &mut buf)
                        .map_err(|e| Error::internal(Fault::Invariant, e));
                    (id, encoded)
                };
                let fits = || buf.len() <= feed.rings.max_record();
                if encoded.is_err() || !fits() {
                    engine.release(|holds| holds.consumer_release(feed.party, id, false));
                }
                if let Err(e) = encoded {
                    return failed(feed, &e);
                }
                if !fits() {
                    let e = node(
                        NodeFailure::Protocol,
                        format!(
                            "a batch's descriptor takes {} bytes, over the ring's {}: lower \
                         `batch_size`",
                            buf.len(),
                            feed.rings.max_record()
                        ),
                    );
                    return failed(feed, &e);
                }
                engine.whole.first_out.store(true, Ordering::Release);
                if !push(feed, &buf, Some(id)) {
                    // Stopped before its record went out: never the
                    // consumer's.
                    engine.release(|holds| holds.consumer_release(feed.party, id, false));
                    return;
                }
                continue;
            }
            Ok(Next::EndOfEpoch(e)) => {
                record::encode_end_of_epoch(e, &feed.loader.state().to_hex())
            }
            Ok(Next::Timeout) => continue,
            Ok(Next::Finished) => {
                push(feed, &record::encode_finished(), None);
                return;
            }
            Err(Error::Closed) if feed.stop.load(Ordering::Acquire) => return,
            Err(e) => return failed(feed, &e),
        };
        if !push(feed, &rec, None) {
            return;
        }
    }
}
