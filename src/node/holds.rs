//! Who holds each batch a node engine handed out, and when it is freed:
//! the pure core of the engine's promise that a batch stays valid until
//! every process holding it released it or exited, whatever happens to the
//! processes it passed through.
//!
//! A batch is held by:
//! - its **consumer** (the loader that took it), until the consumer
//!   releases it, or the consumer's process exits;
//! - **in transit**, when the consumer released it as shipped to another
//!   process (a DataLoader worker pickled it for the main process): until
//!   a receiver keeps it, or the consumer's process exits (then nobody can
//!   have it but a receiver that already kept it);
//! - each **holder** (a process that showed the batch's key: a receiver)
//!   that kept it, as many times as it kept it, until it released it that
//!   many times or its process exited.
//!
//! It is freed when none holds it. Holds end at a release or a process's
//! exit, never at a closed connection: a consumer that closed its loader
//! still holds the batches it did not release.
//!
//! Keys carry a capability drawn at random for each batch: a claim with
//! another one, or for a batch gone, is refused by name. Releases come
//! through each party's own ring: a number the party does not hold is
//! ignored (and counted), so no one can free what another holds.
//!
//! Generic over the batch (`B`) so the rules are tested without an engine;
//! dropping a `B` the table gives back is what frees its memory, and the
//! caller does it outside its lock.

use std::collections::HashMap;

/// A connection of the engine: a consumer's session or a holder's link.
pub type Party = u64;

/// What the table does with a batch's memory when a holder keeps it.
pub trait Kept {
    /// The first process other than the consumer keeps the batch: its
    /// memory is charged to `holder`'s pool owner from now on.
    fn charge_to(&self, owner: usize);
}

struct Entry<B> {
    batch: B,
    cap: u64,
    consumer: Party,
    /// The consumer has not released it.
    by_consumer: bool,
    /// Released as shipped and not yet kept by anyone.
    in_transit: bool,
    /// Holders keeping it, with how many times.
    holders: Vec<(Party, u32)>,
    /// Some holder kept it once: it reached its receiver, so the consumer's
    /// shipped release leaves nothing in transit.
    kept_once: bool,
}

impl<B> Entry<B> {
    fn free(&self) -> bool {
        !self.by_consumer && !self.in_transit && self.holders.is_empty()
    }
}

/// Why a claim or a release was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No batch of that number is held: freed (its holders released it or
    /// exited) or never handed out.
    Gone,
    /// The key's capability is not the batch's: forged, or garbled.
    WrongCapability,
    /// The holder keeps no such batch.
    NotKept,
}

impl Refusal {
    pub fn explain(&self, batch: u64) -> String {
        match self {
            Refusal::Gone => format!(
                "batch {batch} is no longer held: every process that held it released it or \
                 exited before this one kept it (its memory may hold other batches now)"
            ),
            Refusal::WrongCapability => {
                format!("the key's capability is not batch {batch}'s: the key is forged or garbled")
            }
            Refusal::NotKept => format!("this process keeps no batch {batch}"),
        }
    }
}

/// Counts for the stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub held: u64,
    pub kept: u64,
    pub in_transit: u64,
}

pub struct Holds<B> {
    entries: HashMap<u64, Entry<B>>,
    next: u64,
    /// Releases that named a batch their sender did not hold.
    pub ignored: u64,
}

impl<B: Kept> Default for Holds<B> {
    fn default() -> Self {
        Holds {
            entries: HashMap::new(),
            next: 1,
            ignored: 0,
        }
    }
}

impl<B: Kept> Holds<B> {
    /// A batch handed to `consumer`, with its capability; returns its number
    /// (never 0, never reused, below the ring's shipped bit).
    pub fn insert(&mut self, consumer: Party, cap: u64, batch: B) -> u64 {
        let id = self.next;
        self.next += 1;
        self.entries.insert(
            id,
            Entry {
                batch,
                cap,
                consumer,
                by_consumer: true,
                in_transit: false,
                holders: Vec::new(),
                kept_once: false,
            },
        );
        id
    }

    fn take_if_free(&mut self, id: u64) -> Option<B> {
        if self.entries.get(&id).is_some_and(Entry::free) {
            return self.entries.remove(&id).map(|e| e.batch);
        }
        None
    }

    /// The consumer released batch `id` (`shipped`: after handing it to
    /// another process, which may still keep it). Returns the batch when
    /// freed.
    pub fn consumer_release(&mut self, consumer: Party, id: u64, shipped: bool) -> Option<B> {
        match self.entries.get_mut(&id) {
            Some(e) if e.consumer == consumer && e.by_consumer => {
                e.by_consumer = false;
                // Kept already (and perhaps let go of since): it reached
                // its receiver, whose hold is what remains, if any.
                e.in_transit = shipped && !e.kept_once;
            }
            _ => {
                self.ignored += 1;
                return None;
            }
        }
        self.take_if_free(id)
    }

    /// `holder` keeps batch `id` (it showed `cap`); `holder_owner` is its
    /// pool owner, charged with the batch's memory the first time any
    /// holder keeps it.
    pub fn claim(
        &mut self,
        holder: Party,
        holder_owner: usize,
        id: u64,
        cap: u64,
    ) -> Result<(), Refusal> {
        let e = self.entries.get_mut(&id).ok_or(Refusal::Gone)?;
        if e.cap != cap {
            return Err(Refusal::WrongCapability);
        }
        if e.holders.is_empty() {
            e.batch.charge_to(holder_owner);
        }
        e.in_transit = false;
        e.kept_once = true;
        match e.holders.iter_mut().find(|(h, _)| *h == holder) {
            Some((_, n)) => *n += 1,
            None => e.holders.push((holder, 1)),
        }
        Ok(())
    }

    /// `holder` releases one keep of batch `id`.
    pub fn holder_release(&mut self, holder: Party, id: u64) -> Result<Option<B>, Refusal> {
        let Some(e) = self.entries.get_mut(&id) else {
            self.ignored += 1;
            return Err(Refusal::NotKept);
        };
        let Some(at) = e.holders.iter().position(|(h, _)| *h == holder) else {
            self.ignored += 1;
            return Err(Refusal::NotKept);
        };
        e.holders[at].1 -= 1;
        if e.holders[at].1 == 0 {
            e.holders.swap_remove(at);
        }
        Ok(self.take_if_free(id))
    }

    /// The process of consumer `consumer` exited: what it held, and what it
    /// shipped that no one kept, is freed.
    pub fn consumer_exited(&mut self, consumer: Party) -> Vec<B> {
        let ids: Vec<u64> = self
            .entries
            .iter_mut()
            .filter(|(_, e)| e.consumer == consumer)
            .map(|(id, e)| {
                e.by_consumer = false;
                e.in_transit = false;
                *id
            })
            .collect();
        ids.into_iter()
            .filter_map(|id| self.take_if_free(id))
            .collect()
    }

    /// The process of holder `holder` exited: what it kept is freed unless
    /// someone else holds it.
    pub fn holder_exited(&mut self, holder: Party) -> Vec<B> {
        let ids: Vec<u64> = self
            .entries
            .iter_mut()
            .filter_map(|(id, e)| {
                let before = e.holders.len();
                e.holders.retain(|(h, _)| *h != holder);
                (e.holders.len() != before).then_some(*id)
            })
            .collect();
        ids.into_iter()
            .filter_map(|id| self.take_if_free(id))
            .collect()
    }

    /// Batches the consumer `consumer` still holds or shipped unkept: while
    /// there are any, its session waits for their releases or its exit.
    pub fn pending_for(&self, consumer: Party) -> usize {
        self.entries
            .values()
            .filter(|e| e.consumer == consumer && (e.by_consumer || e.in_transit))
            .count()
    }

    /// Batches `holder` keeps.
    pub fn kept_by(&self, holder: Party) -> usize {
        self.entries
            .values()
            .filter(|e| e.holders.iter().any(|(h, _)| *h == holder))
            .count()
    }

    pub fn tally(&self) -> Tally {
        let mut t = Tally {
            held: self.entries.len() as u64,
            ..Tally::default()
        };
        for e in self.entries.values() {
            t.kept += u64::from(!e.holders.is_empty());
            t.in_transit += u64::from(e.in_transit);
        }
        t
    }

    /// Batch `id`, while it is held.
    pub fn get(&self, id: u64) -> Option<&B> {
        self.entries.get(&id).map(|e| &e.batch)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A batch that says when it is freed and to whom it was charged.
    struct Probe {
        freed: Rc<Cell<u32>>,
        charged: Rc<Cell<Option<usize>>>,
    }

    impl Kept for Probe {
        fn charge_to(&self, owner: usize) {
            self.charged.set(Some(owner));
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.freed.set(self.freed.get() + 1);
        }
    }

    type Seen = (Rc<Cell<u32>>, Rc<Cell<Option<usize>>>);

    fn probe() -> (Probe, Seen) {
        let (f, c) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(None)));
        (
            Probe {
                freed: f.clone(),
                charged: c.clone(),
            },
            (f, c),
        )
    }

    const WORKER: Party = 1;
    const MAIN: Party = 2;
    const OTHER: Party = 3;

    #[test]
    fn a_batch_shipped_and_kept_outlives_its_consumer_until_the_keeper_lets_go() {
        let mut h = Holds::default();
        let (b, (freed, charged)) = probe();
        let id = h.insert(WORKER, 42, b);
        // The worker pickles it and lets go: in transit.
        assert!(h.consumer_release(WORKER, id, true).is_none());
        assert_eq!(h.tally().in_transit, 1);
        // The main process keeps it, twice (two items of one batch).
        h.claim(MAIN, 9, id, 42).unwrap();
        h.claim(MAIN, 9, id, 42).unwrap();
        assert_eq!(charged.get(), Some(9), "charged to the keeper");
        assert_eq!(
            h.tally(),
            Tally {
                held: 1,
                kept: 1,
                in_transit: 0
            }
        );
        // The worker is killed: the batch stays.
        drop(h.consumer_exited(WORKER));
        assert_eq!(freed.get(), 0);
        assert!(h.holder_release(MAIN, id).unwrap().is_none());
        let gone = h.holder_release(MAIN, id).unwrap();
        assert!(gone.is_some());
        drop(gone);
        assert_eq!(freed.get(), 1);
        assert_eq!(h.tally().held, 0);
        // Too late now, and a release of what it no longer keeps.
        assert_eq!(h.claim(MAIN, 9, id, 42), Err(Refusal::Gone));
        assert!(matches!(h.holder_release(MAIN, id), Err(Refusal::NotKept)));
    }

    #[test]
    fn in_transit_and_held_batches_go_with_their_consumers_process() {
        let mut h = Holds::default();
        let (a, (fa, _)) = probe();
        let (b, (fb, _)) = probe();
        let (c, (fc, _)) = probe();
        let a = h.insert(WORKER, 1, a);
        let b = h.insert(WORKER, 2, b);
        let c = h.insert(WORKER, 3, c);
        assert!(h.consumer_release(WORKER, a, true).is_none()); // in a queue, never received
        h.claim(MAIN, 9, b, 2).unwrap(); // received
        assert!(h.consumer_release(WORKER, b, true).is_none());
        assert_eq!(h.pending_for(WORKER), 2, "a in transit, c held");
        // Control: while the worker lives, nothing of it is freed.
        assert_eq!((fa.get(), fb.get(), fc.get()), (0, 0, 0));
        drop(h.consumer_exited(WORKER));
        assert_eq!((fa.get(), fb.get(), fc.get()), (1, 0, 1));
        assert_eq!(h.pending_for(WORKER), 0);
        // Its keeper exits: freed.
        drop(h.holder_exited(MAIN));
        assert_eq!(fb.get(), 1);
        let _ = c;
    }

    #[test]
    fn only_the_capability_keeps_and_only_holders_release() {
        let mut h = Holds::default();
        let (b, (freed, _)) = probe();
        let id = h.insert(WORKER, 0xfeed, b);
        assert_eq!(h.claim(OTHER, 9, id, 0xbeef), Err(Refusal::WrongCapability));
        assert_eq!(h.claim(OTHER, 9, id + 1, 0xfeed), Err(Refusal::Gone));
        // Another process releasing what it does not keep, the consumer's
        // release from another session, a doubled release: ignored.
        assert!(matches!(h.holder_release(OTHER, id), Err(Refusal::NotKept)));
        assert!(h.consumer_release(MAIN, id, false).is_none());
        h.claim(MAIN, 9, id, 0xfeed).unwrap();
        assert!(h.consumer_release(WORKER, id, false).is_none());
        assert!(h.consumer_release(WORKER, id, false).is_none());
        assert_eq!(h.ignored, 3);
        assert_eq!(freed.get(), 0, "kept by the main process");
        // A second keeper: freed when both have let go.
        h.claim(OTHER, 10, id, 0xfeed).unwrap();
        assert!(h.holder_release(MAIN, id).unwrap().is_none());
        drop(h.holder_release(OTHER, id).unwrap());
        assert_eq!(freed.get(), 1);
    }

    #[test]
    fn a_keep_before_the_consumers_shipped_release_leaves_nothing_in_transit() {
        let mut h = Holds::default();
        let (b, (freed, _)) = probe();
        let id = h.insert(WORKER, 5, b);
        h.claim(MAIN, 9, id, 5).unwrap();
        assert!(h.consumer_release(WORKER, id, true).is_none());
        assert_eq!(h.tally().in_transit, 0);
        drop(h.holder_release(MAIN, id).unwrap());
        assert_eq!(freed.get(), 1);
        // Kept and let go of before the consumer's shipped release comes:
        // freed by that release, not left in transit.
        let (b, (freed, _)) = probe();
        let id = h.insert(WORKER, 7, b);
        h.claim(MAIN, 9, id, 7).unwrap();
        assert!(h.holder_release(MAIN, id).unwrap().is_none());
        drop(h.consumer_release(WORKER, id, true));
        assert_eq!(freed.get(), 1);
        assert_eq!(h.tally(), Tally::default());
        // A plain release of a batch never shipped frees it at once.
        let (b, (freed, _)) = probe();
        let id = h.insert(WORKER, 6, b);
        drop(h.consumer_release(WORKER, id, false));
        assert_eq!(freed.get(), 1);
    }
}
