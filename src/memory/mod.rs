//! Where every byte lives: the arena (one mapping, huge pages, locked), the
//! chunk pool and the references that keep chunks alive, and the batches
//! that point into them.
//! - [`arena`]: the mapping and the chunk pool;
//! - [`batch`]: samples and batches as views into chunks.

pub mod arena;
pub mod batch;

pub use arena::*;
pub use batch::*;
