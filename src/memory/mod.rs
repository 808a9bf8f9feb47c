//! Where every byte lives: the arena (one mapping, huge pages, locked), the
//! chunk pool and the references that keep chunks alive, and the batches
//! that point into them.
//! - `mapping.rs`: the arena's mapping (huge pages, `mlock`, prefault, the
//!   shared memory file) and what was obtained;
//! - `pool.rs`: the chunk pool over it (free runs, owners and quotas, the
//!   reserve, waiting and stuck detection);
//! - `chunk.rs`: [`ChunkRef`], the counted check-out handle of a run;
//! - `batch.rs`: a sealed batch, the view handed to consumers (its
//!   descriptors are the C ABI's `ringfeed_sample` and `ringfeed_field`);
//! - `builder.rs`: assembling batches, and samples held outside one.

mod batch;
mod builder;
mod chunk;
mod mapping;
mod pool;

// The files are private; every item is named `crate::memory::X`.
pub use batch::{Batch, NO_SOURCE, RawField, RawSample, SampleView, ShardNames};
pub use builder::{BatchBuilder, Held};
pub use chunk::ChunkRef;
pub use mapping::{Arena, ArenaOptions, ArenaReport, MemoryKind};
pub use pool::{ChunkPool, MAX_OWNERS, NO_OWNER, PoolUse};
