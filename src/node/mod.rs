//! One engine per node: consumers (ranks, DataLoader workers; C, C++ or
//! Python) attach to a node engine over a Unix socket and take their
//! batches through shared memory, instead of each opening an engine of its
//! own. Each consumer gets exactly the batches, in exactly the order, that
//! an engine of its own would give it; a batch handed out stays valid until
//! every process holding it released it or exited, whatever happens to the
//! processes it passed through; and a consumer can only hurt itself.
//!
//! The engine's side:
//! - `engine.rs`: what every connection shares (the arena and its pool, the
//!   dataset and its network threads, the table of holds, the counters);
//! - `holds.rs`: who holds each batch, and when it is freed (pure);
//! - `session.rs`: one connection, a consumer's or a holder's;
//! - `serve.rs`: the accept loop and the engine's end ([`serve`]);
//! - `metrics.rs`: the engine's metrics;
//! - `daemon.rs`: the engine as a process: its socket's name, the start on
//!   demand, the body of `ringfeed node` ([`daemon::run`]).
//!
//! The consumer's side:
//! - `client.rs`: a consumer's loader ([`NodeLoader`]);
//! - `holder.rs`: this process keeping batches other processes took, by
//!   their keys ([`claim`], [`keep`], [`release`]).
//!
//! Between them: `proto/` (the messages as types, the ring records, the
//! batch keys), `shm.rs` (the rings in shared memory) and `sock.rs` (the
//! system calls).
//!
//! [`Attached`] is what the C ABI holds: a loader in this process or one
//! attached to a node engine, chosen by the configuration's `node` key.

mod client;
pub mod daemon;
mod engine;
mod holder;
mod holds;
mod metrics;
pub mod proto;
mod serve;
mod session;
mod shm;
pub mod sock;

use std::time::Duration;

use serde_json::Value;

pub use client::{NodeBatch, NodeLoader, NodeNext};
pub use daemon::{NodeRun, auto_socket, node_program, runtime_dir};
pub use holder::{claim, keep, release};
pub use serve::{MAX_CONNECTIONS, MetricsSource, NodeOptions, serve, serve_with_metrics};

use crate::config::{Config, NodeMode};
use crate::engine::{Counts, Loader, Next};
use crate::error::{Error, Fault, NodeFailure, Result};
use crate::memory::Batch;

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
#[derive(Debug)]
pub enum AnyNext {
    Batch(AnyBatch),
    EndOfEpoch(u64),
    Timeout,
    Finished,
}

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
        // The job's keys and the consumer's own: nothing of the engine's,
        // no credential (docs: "What a consumer sends a node engine").
        let sent = Config::for_node_engine(&map);
        let socket = match &cfg.node {
            NodeMode::Off => return Loader::open(cfg).map(Attached::Local),
            NodeMode::Socket(p) => p.clone(),
            NodeMode::Auto => {
                let socket = auto_socket(&cfg)?;
                // An engine started on demand that lingers out serves what
                // connected before it removed its socket's name
                // (`serve.rs`), so a consumer is answered; one killed
                // between the connect and the reply drops the attach (its
                // reply never comes). A new engine is started for the next
                // try, a few times at most.
                let mut tries = 0u64;
                loop {
                    if sock::connect(&socket).is_err() {
                        daemon::start_engine(&socket, &map)?;
                    }
                    match NodeLoader::attach(&socket, &sent, cfg.cuda_register) {
                        Err(Error::Node {
                            failure: NodeFailure::NoReply,
                            ..
                        }) if tries < 3 => {
                            tries += 1;
                            std::thread::sleep(Duration::from_millis(50 * tries));
                        }
                        r => return r.map(Attached::Node),
                    }
                }
            }
        };
        NodeLoader::attach(&socket, &sent, cfg.cuda_register).map(Attached::Node)
    }

    pub fn next(&self, timeout: Option<Duration>) -> Result<AnyNext> {
        Ok(match self {
            Attached::Local(l) => match l.next(timeout)? {
                Next::Batch(b) => AnyNext::Batch(AnyBatch::Local(b)),
                Next::EndOfEpoch(e) => AnyNext::EndOfEpoch(e),
                Next::Timeout => AnyNext::Timeout,
                Next::Finished => AnyNext::Finished,
            },
            Attached::Node(n) => match n.next(timeout)? {
                NodeNext::Batch(b) => AnyNext::Batch(AnyBatch::Node(b)),
                NodeNext::EndOfEpoch(e) => AnyNext::EndOfEpoch(e),
                NodeNext::Timeout => AnyNext::Timeout,
                NodeNext::Finished => AnyNext::Finished,
            },
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

    /// The name of the shard sample `i` of `b` came from.
    pub fn source(&self, b: &AnyBatch, i: usize) -> Result<Option<String>> {
        match b {
            AnyBatch::Local(b) => Ok(b.source(i).map(str::to_string)),
            AnyBatch::Node(b) => match (self, b.source_index(i)) {
                (Attached::Node(n), Some(s)) => n.shard_name(s),
                _ => Ok(None),
            },
        }
    }

    /// The name of the shard at `index` of a batch of this loader
    /// (`NodeBatch::source_index`): a node engine is asked; a loader in
    /// this process has no such batches.
    pub fn source_of(&self, index: Option<u32>) -> Result<Option<String>> {
        match (self, index) {
            (Attached::Node(n), Some(s)) => n.shard_name(s),
            _ => Ok(None),
        }
    }

    pub fn close(&self) {
        match self {
            Attached::Local(l) => l.close(),
            Attached::Node(n) => n.close(),
        }
    }
}

impl AnyBatch {
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
