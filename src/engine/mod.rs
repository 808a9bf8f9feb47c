//! The loader: owns the arena, the workers and the ring for one dataset, and
//! is what consumers call `next` on. It is `Sync`: several consumer threads
//! may call `next` at once, and `close` may come from any thread.
//!
//! Each worker reads one stream of the epoch plan (`crate::plan`) and pushes
//! its batches into its own queue; the sequencer thread takes them
//! round-robin (the plan's delivery order), merges the streams' short last
//! batches at the end of each epoch, skips what a resume state says was
//! delivered, and feeds the ring that `next` pops.

//!
//! The files, in the order a batch passes them: `open` (start-up, with
//! `planning`: the counts and the plan's start, `start_plan`: every
//! decision of the start as one value, from the configuration and the
//! machine's facts, and `setup`: the arena, placement, fixed buffers, CUDA
//! and a node engine's shared parts),
//! `threads` (the thread mains), `worker` (the read loop over a stream's
//! shards), `reading` (its reads in flight, the next shards' begun early,
//! completions applied, every read drained), `tier` (what the cache does
//! for a remote shard's read), `assemble`
//! (members into samples and batches), `shuffler` (the shuffle buffer within
//! the worker's share of memory), `sequencer` (streams into the ring in the
//! plan's order, each batch through `transform` first when the loader has
//! one: the image pipeline), `loader` (the handle consumers hold), with
//! `shared` (what the threads share), `counters` and `stats` (what they
//! count). `script` and `tests` are the unit tests over scripted readers.
//! No file imports one that comes after it in this list: `counters`/`transform` ← `shared` ← `shuffler` ←
//! `assemble`/`tier` ← `reading` ← `worker` ← `sequencer`/`threads` ←
//! `loader` ← `setup`/`planning`/`stats` ← `start_plan` ← `open`.

mod assemble;
mod counters;
mod loader;
mod open;
mod planning;
mod reading;
#[cfg(test)]
mod script;
mod sequencer;
mod setup;
mod shared;
mod shuffler;
mod start_plan;
mod stats;
#[cfg(test)]
mod tests;
mod threads;
mod tier;
mod transform;
mod worker;

pub use counters::{
    Counts, RINGFEED_BACKEND_IO_URING, RINGFEED_BACKEND_THREADS, RINGFEED_MEMORY_HUGETLB,
    RINGFEED_MEMORY_NORMAL, RINGFEED_MEMORY_THP,
};
pub use loader::{Loader, Next};
pub(crate) use planning::resolve_counted;
pub use planning::{PlanSummary, plan_summary};
pub(crate) use setup::{EngineNet, engine_net_threads};
pub use stats::{Stats, prometheus};
