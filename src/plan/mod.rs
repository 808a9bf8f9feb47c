//! The epoch plan: which samples one consumer delivers in an epoch, and in
//! what order. Pure: no I/O, no clocks, no threads; the same inputs give the
//! same plan on every machine (the random numbers come from our own
//! xoshiro256** seeded through SplitMix64, not from a crate whose stream may
//! change between versions).
//!
//! The model, one epoch at a time:
//!
//! 1. **Shard order.** The shards, permuted per epoch when `shuffle` is on.
//! 2. **Global sequence.** Their samples, concatenated in that order (a
//!    resumed elastic epoch leaves out the samples already delivered).
//! 3. **Split.** `consumers` = ranks × loader workers. Consumer `c` takes the
//!    positions `[c·N/C, (c+1)·N/C)` of the global sequence, so each shard is
//!    read by one consumer, or by two where a boundary cuts it (split by
//!    sample index). Every consumer yields the same count `L`: `N/C` rounded
//!    down (`remainder = drop`, the few extra samples are counted as dropped)
//!    or up (`pad`: the short consumers repeat samples of their own share,
//!    counted as padded), or `samples_per_epoch / C` when that is set.
//!    `resampled` draws shards with replacement instead (endless data, with
//!    an epoch of `samples_per_epoch`). Where the counts are not all known
//!    a *nominal epoch* splits the shards whole instead (consumer `c` takes
//!    the order's positions `c, c + C, ...`) and every consumer stops after
//!    the same `PlanOptions::nominal` samples (`nominal.rs` works it out).
//! 4. **Streams.** The consumer's segments are dealt round-robin to its
//!    `streams` (one reading thread each). Each stream runs its own seeded
//!    shuffle buffer and cuts its output into batches.
//! 5. **Delivery.** Batches go out round-robin over the streams (batch k of
//!    stream 0, of stream 1, ..., then k+1); the streams' short last batches
//!    are merged in stream order at the end of the epoch. The counts of
//!    batches are therefore the same on every consumer: `ceil(L / batch)`,
//!    or `floor` with `drop_last`.
//!
//! [`consumer_order`] runs steps 1–5 on sample indices; the engine runs the
//! same code ([`ShuffleBuffer`], [`Delivery`]) on real samples, so the tests
//! of this module are tests of the engine's order.
//!
//! One file per concern: `rng.rs` (the seeded generator), `epoch.rs` (the
//! options, the shard order and the split: [`plan_epoch`]), `buffer.rs`
//! ([`ShuffleBuffer`]), `delivery.rs` ([`Delivery`] and the simulation of a
//! plan's order), `resume.rs` (resume states and where to start),
//! `nominal.rs` (a nominal epoch's length when the counts are unknown).

mod buffer;
mod delivery;
mod epoch;
#[cfg(test)]
mod fixtures;
mod nominal;
pub mod resume;
mod rng;

// What tests and bindings outside the crate may ask of the plan is public:
// the options, and the order a consumer gets. The rest is the engine's.
pub use delivery::{SampleRef, consumer_order, nominal_order};
pub use epoch::{PlanOptions, Remainder};

pub(crate) use buffer::ShuffleBuffer;
pub(crate) use delivery::{Delivery, delivered_by, replayed};
pub(crate) use epoch::{ConsumerPlan, Delivered, Segment, plan_epoch};
pub(crate) use nominal::{Nominal, Sampled, estimated_length, given_length};
