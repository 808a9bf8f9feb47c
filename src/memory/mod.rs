//! Where every byte lives: the arena (one mapping, huge pages, locked), the
//! chunk pool and the references that keep chunks alive, and the batches
//! that point into them.
//! - `mapping.rs`: the arena's mapping (huge pages, `mlock`, prefault, the
//!   shared memory file) and what was obtained;
//! - `cuda.rs`: the mapping registered with the CUDA runtime (loaded with
//!   `dlopen`) for DMA to the GPU;
//! - `numa.rs`: binding the arena to a NUMA node (`mbind`);
//! - `pool.rs`: the chunk pool over it (free runs, owners and quotas, the
//!   reserve, waiting and stuck detection);
//! - `chunk.rs`: [`ChunkRef`], the counted check-out handle of a run;
//! - `batch.rs`: a sealed batch, the view handed to consumers (its
//!   descriptors are the C ABI's `ringfeed_sample` and `ringfeed_field`);
//! - `builder.rs`: assembling batches, and samples held outside one.

mod batch;
mod builder;
mod chunk;
pub mod cuda;
mod mapping;
mod numa;
mod pool;

// The files are private; every item is named `crate::memory::X`. What a
// consumer holds (batches and their views, the arena they live in) is
// public; how the engine fills them is the crate's.
pub use batch::{Batch, RawField, RawSample, SampleView};
pub use mapping::{Arena, ArenaReport, MemoryKind};

pub(crate) use batch::{NO_SOURCE, ShardNames};
pub(crate) use builder::{BatchBuilder, HeldSample};
pub(crate) use chunk::ChunkRef;
pub(crate) use mapping::ArenaOptions;
pub(crate) use pool::{ChunkPool, NO_OWNER};
