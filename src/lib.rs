//! ringfeed: a data-loader engine for ML training.
//!
//! Shards are read by per-worker io_uring instances into a pinned, huge-page
//! arena ([`arena`]), walked as WebDataset tar ([`tar`], [`sample`]) without
//! copying, grouped into batches ([`batch`]) and handed to consumers through a
//! lock-free ring ([`ring`]). C and C++ reach it through [`ffi`]; the CLI is
//! `src/main.rs`. [`serve`] is not on the data path: it is a small file
//! server for `ringfeed serve` and for the demo's loopback HTTP source.
//! See DESIGN.md for the map.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod arena;
pub mod batch;
pub mod channel;
pub mod config;
pub mod dataset;
pub mod error;
pub mod ffi;
pub mod http;
pub mod io;
pub mod loader;
pub mod plan;
pub mod resume;
pub mod retry;
pub mod ring;
pub mod s3;
pub mod sample;
pub mod serve;
mod shuffle;
pub mod synth;
pub mod tar;
pub mod tls;
pub mod topology;

mod sync;
mod worker;

pub use config::Config;
pub use error::{Error, Result};
pub use loader::{Loader, Next, Stats};
