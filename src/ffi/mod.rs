//! The C ABI. Every `extern "C"` function here is a thin shell: it checks its
//! pointers and handles, runs the Rust API inside a panic boundary, and maps
//! the result to a status code, leaving a message for `ringfeed_last_error`.
//! The conventions are written once, at the top of `include/ringfeed.h`
//! (from `cbindgen.toml`).
//!
//! Handles are not pointers to Rust memory: a loader handle is a number
//! looked up in a registry, and a batch is found by its `handle` field. So a
//! closed loader, a released batch, or garbage gives an error, never a read of
//! freed memory.
//!
//! One file per concern:
//!
//! - [`boundary`]: the panic boundary, the failure type (`Fail`), the
//!   thread's last error, pointer checks, and the handle tables every entry
//!   point looks loaders, batches, objects and writers up in, each entry
//!   refused in another process than its own; [`fork`]: those tables' locks
//!   held across `fork()`;
//! - [`status`]: the status codes, declared once in one table, their names
//!   and the one mapping from [`crate::Error`] to a status;
//! - [`types`]: the C types (the opaque loader, `ringfeed_batch`);
//!   `ringfeed_stats` and the constants of its fields are the engine's
//!   `Counts` (`crate::engine::counters`), which cbindgen reads too;
//! - [`loader`], [`batch`], [`stats`], [`object`] (whole objects read and
//!   written, and writer handles), [`plan`] (an epoch's length asked
//!   ahead): the entry points, by the object they act on; `config`: the keys a configuration may hold; [`version`]:
//!   the library's version; [`log`]: the log callback.
//!
//! `include/ringfeed.h` is generated from this module tree by cbindgen (run
//! by `tests/header.rs`, which starts at this file and follows the `mod`
//! lines below: the header's functions come file by file in that order).
//! cbindgen does not expand macros: the status codes' `#define`s are written
//! by `tests/header.rs` from [`status::STATUSES`].

#![allow(non_camel_case_types)]

mod batch;
mod boundary;
mod config;
mod fork;
mod image;
mod loader;
mod log;
mod object;
mod plan;
mod stats;
pub mod status;
mod types;
mod version;

pub use batch::*;
pub use config::*;
pub use image::*;
pub use loader::*;
pub use log::*;
pub use object::*;
pub use plan::*;
pub use stats::*;
pub use status::*;
pub use types::*;
pub use version::*;

pub use crate::engine::{
    RINGFEED_BACKEND_IO_URING, RINGFEED_BACKEND_THREADS, RINGFEED_MEMORY_HUGETLB,
    RINGFEED_MEMORY_NORMAL, RINGFEED_MEMORY_THP,
};
