//! ringfeed: a data-loader engine for ML training.
//!
//! The data path, one folder per stage (see `docs/architecture.md`):
//! [`dataset`] names the shards, [`plan`] decides which samples each
//! consumer gets and in which order, [`fetch`] reads byte ranges (io_uring
//! or threads; over [`net`] for HTTP and S3) into chunks of the [`memory`]
//! arena, [`tar`] walks the members in place, [`engine`] groups them into
//! samples and batches (shuffled) and sequences them into the [`queue`]s,
//! and [`ffi`] hands them to C, C++ and Python. [`serve`] and [`synth`] are
//! not on the data path: a file server and a shard generator for the CLI,
//! the demo and the tests.

pub mod cache; // the local cache tier: entries on disk, the directory, the writer
pub mod config; // the configuration keys, parsed and checked
pub mod consumer; // what a consumer holds: a loader in this process or attached to a node engine
pub mod dataset; // URLs, braces and manifests → shards (and the resolver)
pub mod engine; // the loader: start-up, workers, shuffler, sequencer, stats
pub mod error; // the one error type and its kinds
pub(crate) mod fetch; // the read backends: io_uring, threads, HTTP over both
pub mod ffi; // the C ABI
#[doc(hidden)]
pub mod fuzzing; // the parsers of outside bytes, for fuzz/ and its corpus test
pub mod image; // the image pipeline: decode, crop, resize, flip into a batch tensor
pub mod log; // the log sink the embedding program sets, and what the engine says
pub mod memory; // the arena, the chunk pool, batches
pub mod mount; // a file system over a source (the CLI's `mount` speaks FUSE for it)
pub mod net; // HTTP, TLS, retries, S3
pub mod node; // one engine per node: consumers attach over shared memory
pub mod object; // whole objects: parallel ranged reads, multipart writes
pub mod plan; // epoch plans, shuffle order, resume states (pure)
pub(crate) mod queue; // the lock-free ring and the blocking channel
pub mod redact; // credentials in URLs taken out of what is printed or stored
pub mod serve; // a small HTTP file server (CLI `serve`, demo, tests)
pub(crate) mod sync; // the one way a lock is taken: poisoned or not
pub mod synth; // deterministic shard generator and checker (CLI `gen`, tests)
pub mod tar; // the tar walk over chunks, header parsing, counting
pub mod topology; // NICs, queues, NUMA nodes; where the I/O threads run

pub use config::Config;
pub use engine::{Loader, Next, PlanSummary, Stats, plan_summary};
pub use error::{Error, Fault, NodeFailure, Result};
