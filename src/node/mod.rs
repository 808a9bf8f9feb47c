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
//! - `session/`: one connection, a consumer's or a holder's;
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
//! [`attach`] attaches a consumer to the engine its configuration names
//! (`crate::consumer` chooses between it and a loader in this process).

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

use serde_json::{Map, Value};

pub use client::{NodeBatch, NodeLoader, NodeNext, ShardName};
pub use daemon::{NodeRun, auto_socket, node_program, runtime_dir};
pub use holder::{claim, keep, release};
pub use serve::{MAX_CONNECTIONS, MetricsSource, NodeOptions, serve, serve_with_metrics};

use crate::config::{Config, NodeMode};
use crate::error::{Error, Fault, NodeFailure, Result};

/// Attaches a consumer of `cfg` (`map`: its configuration as the JSON
/// object it came as) to the node engine its `node` key names: the socket
/// given, or (`auto`) this node's, where an engine is started on demand
/// when none answers.
pub fn attach(cfg: &Config, map: &Map<String, Value>) -> Result<NodeLoader> {
    // The job's keys and the consumer's own: nothing of the engine's, no
    // credential (docs: "What a consumer sends a node engine").
    let sent = Config::for_node_engine(map);
    let socket = match &cfg.node {
        NodeMode::Off => {
            return Err(Error::internal(
                Fault::Invariant,
                "attach asked of a configuration whose `node` is off",
            ));
        }
        NodeMode::Socket(p) => p.clone(),
        NodeMode::Auto => auto_socket(cfg)?,
    };
    if cfg.node != NodeMode::Auto {
        return NodeLoader::attach(&socket, &sent, cfg.cuda_register);
    }
    // An engine started on demand that lingers out serves what connected
    // before it removed its socket's name (`serve.rs`), so a consumer is
    // answered; one killed between the connect and the reply drops the
    // attach (its reply never comes). A new engine is started for the next
    // try, a few times at most.
    let mut tries = 0u64;
    loop {
        if sock::connect(&socket).is_err() {
            daemon::start_engine(&socket, map)?;
        }
        match NodeLoader::attach(&socket, &sent, cfg.cuda_register) {
            Err(Error::Node {
                failure: NodeFailure::NoReply,
                ..
            }) if tries < 3 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50 * tries));
            }
            r => return r,
        }
    }
}
