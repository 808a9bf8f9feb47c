//! What a consumer holds: a loader in this process ([`Attached::Local`], the
//! engine's own) or one attached to a node engine ([`Attached::Node`],
//! `crate::node`), chosen by the configuration's `node` key, and a batch of
//! either. The C ABI (`crate::ffi`) and the CLI's `bench` open loaders
//! through it; a loader in this process is the engine's alone, with nothing
//! of `crate::node` on its path.

use std::time::Duration;

use serde_json::Value;

use crate::config::{Config, NodeMode};
use crate::engine::{Counts, Loader, Next};
use crate::error::{Error, Fault, Result};
use crate::memory::Batch;
use crate::node::{self, NodeBatch, NodeLoader, ShardName};

/// A loader in this process, or one attached to a node engine.
pub enum Attached {
    Local(Loader),
    Node(NodeLoader),
}

/// A batch of either kind of loader.
#[derive(Debug)]
pub enum AnyBatch {
    Local(Batch),
    Node(NodeBatch),
}

/// What `next` returns when it does not fail.
pub type AnyNext = Next<AnyBatch>;

impl Attached {
    /// Opens a loader from a JSON configuration: in this process, or, by
    /// its `node` key, attached to a node engine (started if `auto` finds
    /// none).
    pub fn open_json(text: &str) -> Result<Attached> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(format!("not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Loader::open_json(text).map(Attached::Local);
        };
        let cfg = Config::from_map(&map)?;
        if cfg.transform.is_some() && cfg.node != NodeMode::Off {
            // A node engine ships batches as places in its arena; the
            // transform's tensors are not there.
            return Err(Error::Config(
                "`transform` does not work with `node` yet: open the loader in this process \
                 (`node`: \"off\")"
                    .into(),
            ));
        }
        match cfg.node {
            NodeMode::Off => Loader::open(cfg).map(Attached::Local),
            _ => node::attach(&cfg, &map).map(Attached::Node),
        }
    }

    pub fn next(&self, timeout: Option<Duration>) -> Result<AnyNext> {
        Ok(match self {
            Attached::Local(l) => l.next(timeout)?.map(AnyBatch::Local),
            Attached::Node(n) => n.next(timeout)?.map(AnyBatch::Node),
        })
    }

    /// The resume state (hex) after the batches taken so far.
    pub fn state_hex(&self) -> String {
        match self {
            Attached::Local(l) => l.state().to_hex(),
            Attached::Node(n) => n.state_hex(),
        }
    }

    /// The stats as JSON text, and the counters.
    pub fn stats(&self) -> Result<(String, Counts)> {
        match self {
            Attached::Local(l) => {
                let s = l.stats();
                let text = serde_json::to_string(&s)
                    .map_err(|e| Error::internal(Fault::Json, e.to_string()))?;
                Ok((text, s.counts))
            }
            Attached::Node(n) => n.stats(),
        }
    }

    /// The memory file of the arena (`None`: private), its first byte in
    /// this process, its length.
    pub fn arena(&self) -> Option<(i32, *const u8, usize)> {
        match self {
            Attached::Local(l) => {
                let a = l.arena();
                a.shared_fd().map(|fd| (fd, a.base().cast_const(), a.len()))
            }
            Attached::Node(n) => Some(n.arena()),
        }
    }

    pub fn close(&self) {
        match self {
            Attached::Local(l) => l.close(),
            Attached::Node(n) => n.close(),
        }
    }
}

/// The name of the shard a sample came from: known in this process, or a
/// node engine's to give ([`ShardName::ask`], a round trip).
pub enum Source {
    Known(Option<String>),
    Ask(ShardName),
}

impl Source {
    /// The name, asking the engine where it has it.
    pub fn name(self) -> Result<Option<String>> {
        match self {
            Source::Known(n) => Ok(n),
            Source::Ask(a) => a.ask(),
        }
    }
}

impl AnyBatch {
    /// The name of the shard sample `i` came from (`Known(None)`: none, or
    /// no such sample).
    pub fn source(&self, i: usize) -> Source {
        match self {
            AnyBatch::Local(b) => Source::Known(b.source(i).map(str::to_string)),
            AnyBatch::Node(b) => match b.source(i) {
                Some(ask) => Source::Ask(ask),
                None => Source::Known(None),
            },
        }
    }

    /// The key of a node engine's batch (`NodeBatch::key`); `None` for a
    /// batch of a loader in this process.
    pub fn node_key(&self) -> Option<String> {
        match self {
            AnyBatch::Local(_) => None,
            AnyBatch::Node(b) => Some(b.key()),
        }
    }

    /// The key of a node engine's batch handed to another process
    /// (`NodeBatch::ship`); `None` for a batch of a loader in this process.
    pub fn ship(&self) -> Option<String> {
        match self {
            AnyBatch::Local(_) => None,
            AnyBatch::Node(b) => Some(b.ship()),
        }
    }
    pub fn epoch(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.epoch(),
            AnyBatch::Node(b) => b.epoch(),
        }
    }
    pub fn index(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.index(),
            AnyBatch::Node(b) => b.index(),
        }
    }
    pub fn bytes(&self) -> u64 {
        match self {
            AnyBatch::Local(b) => b.bytes(),
            AnyBatch::Node(b) => b.bytes(),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            AnyBatch::Local(b) => b.len(),
            AnyBatch::Node(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn raw_samples(&self) -> &[crate::memory::RawSample] {
        match self {
            AnyBatch::Local(b) => b.raw_samples(),
            AnyBatch::Node(b) => b.raw_samples(),
        }
    }
    pub fn raw_fields(&self) -> &[crate::memory::RawField] {
        match self {
            AnyBatch::Local(b) => b.raw_fields(),
            AnyBatch::Node(b) => b.raw_fields(),
        }
    }
}
