//! Stage 6 of the data path: the queues that carry batches from the workers
//! to the sequencer and from the sequencer to consumers.
//! - [`ring`]: a bounded lock-free MPMC ring (model-checked with loom);
//! - [`channel`]: blocking with deadlines on top of the ring;
//! - `sync`: the atomics the ring uses, swapped for loom's in the model test.

pub mod channel;
pub mod ring;
pub(crate) mod sync;

pub use channel::{Channel, RecvError};
pub use ring::Ring;
