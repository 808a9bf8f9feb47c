//! Dataset URLs: WebDataset brace expansion, manifests, and the shards they
//! name (local files, HTTP and S3 objects).
//!
//! A URL names one shard (`/data/a.tar`, `file:///data/a.tar`), a set of
//! shards by brace expansion (`shard-{000000..000127}.tar`, `{train,val}`), or
//! a directory whose `.tar` files are taken in name order, an `http(s)://`
//! URL (its size learned by its first read), an `s3://bucket/key` object, an
//! `s3://bucket/prefix/` to list at every depth (see `crate::net::s3`), or a
//! key pattern `s3://bucket/train/**/shard-*.tar` (`glob.rs`), a Hugging
//! Face Hub dataset's file, directory or pattern
//! (`hf://datasets/ORG/NAME[@REVISION]/PATH`, `hub.rs`), or a manifest
//! (`*.manifest`, or the `manifest` key): one `URL [size [samples]]` per
//! line, so a job starts without listing or `HEAD`s, and the plan knows each
//! shard's sample count without reading it (`ringfeed index` writes one).
//!
//! A WebDataset shard index (`shardindex.json`) names shards with their
//! counts too, given as a URL or found beside the shards (`counts.rs`).
//!
//! `parse.rs` is the pure part (URLs, braces, manifest lines; no I/O),
//! `shardindex.rs` the pure reading of a shard index, `counts.rs` the
//! manifests and indexes read (local or remote) and found beside shards,
//! `estimate.rs` what a nominal epoch is planned from when no counts are
//! found (every shard's size, the samples in a few shards' first bytes),
//! `glob.rs` the pure key patterns,
//! `resolve.rs` the part that stats, lists, looks up hosts and checks the
//! first remote shard of each, `hub.rs` its part for the Hub; this file
//! holds what they produce, the [`Shard`]s.

mod counts;
mod estimate;
pub(crate) mod glob;
mod hub;
pub(crate) mod parse;
mod resolve;
pub(crate) mod shardindex;

use std::path::PathBuf;
use std::sync::Arc;

use crate::net::object::HttpObject;

pub use counts::{BESIDE, counts_beside};
pub use estimate::sample_shards;
pub use resolve::{
    cache_identity, cache_version, head_sizes, learn_counts, resolve, resolve_config,
    resolve_objects, resolve_with,
};

/// Where a shard's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Http(Arc<HttpObject>),
}

/// One shard to read.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The name used in errors and stats: the path or URL as given.
    pub name: String,
    pub source: Source,
    /// Bytes in the shard; `None` for a remote shard no manifest, listing or
    /// `HEAD` sized: the worker learns it from the shard's first read.
    pub size: Option<u64>,
    /// Samples in the shard, when a manifest gave them or the loader
    /// counted them (see `crate::plan`: splitting among consumers needs them).
    pub samples: Option<u64>,
}
