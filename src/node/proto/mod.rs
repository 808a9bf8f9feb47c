//! The node engine's protocol, in one place: what crosses the socket
//! between an engine and the processes attached to it, as Rust types.
//!
//! - [`Request`] and [`Reply`]: the messages on the socket (JSON, one per
//!   `SOCK_SEQPACKET` message, at most [`MAX_MESSAGE`] bytes). The first
//!   message of every connection is a [`Request::Hello`] naming the
//!   protocol and library versions and the connection's [`Role`]: a
//!   consumer (a loader: its configuration; the engine opens its streams)
//!   or a holder (a process that keeps batches another process took: the
//!   main process of a DataLoader). Anything else first, a second hello,
//!   a request the role does not allow, garbage, a message too long or
//!   another version gets [`Reply::Refused`] with a status and a message,
//!   and the connection is closed; the engine goes on serving the others.
//! - `record.rs`: the records an engine writes into a consumer's ring
//!   (batch descriptors as offsets into the arena, epoch ends, errors).
//! - `key.rs`: a batch's key ([`Key`]), the capability a process shows to
//!   keep a batch it did not read.
//!
//! Rings carry two more things, each a `u64` per entry (`shm.rs`): a
//! consumer's releases (the batch number, the top bit set when the batch
//! was shipped to another process: see [`SHIPPED`]) and a holder's releases
//! (the batch number).

mod key;
pub mod record;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use key::{Cap, EngineId, Key};

/// The protocol's version: the hello's `protocol` must be this. Raised
/// whenever a message, a record or a ring entry changes meaning.
pub const PROTOCOL: u32 = 2;

/// The library's version: engine and consumers come from one release (the
/// records are this release's layout of a batch).
pub const LIBRARY: &str = env!("CARGO_PKG_VERSION");

/// The longest message either side sends or takes (an attach's
/// configuration with a long list of URLs, a stats reply).
pub const MAX_MESSAGE: usize = 1 << 20;

/// The top bit of a consumer's release: the batch was shipped to another
/// process, which may keep it (`Request::Claim`) after the consumer let go.
pub const SHIPPED: u64 = 1 << 63;

/// What a connection asks of the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The first message of a connection.
    Hello {
        protocol: u32,
        library: String,
        role: Role,
    },
    /// The consumer's loader's stats, or a holder's view of the engine.
    Stats,
    /// The name of shard `shard` of the dataset (consumers).
    Source { shard: u32 },
    /// Keep batch `batch` for this process until it releases it or exits
    /// (holders): the key's engine and capability must be the batch's.
    Claim {
        engine: EngineId,
        batch: u64,
        cap: Cap,
    },
}

/// Who a connection is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Role {
    /// A loader: the keys that fix its batches (the job's, checked against
    /// the engine's, and its own: rank, loader worker, resume state, start
    /// epoch). Never credentials: the engine reads with its own.
    Consumer { config: Map<String, Value> },
    /// A process that keeps batches other processes took.
    Holder,
}

/// What the engine answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// A consumer's loader is open; with the arena's memory file (read-only),
    /// the rings' memory file and two eventfds (records ready; records read
    /// or batches released).
    Attached {
        session: u64,
        engine: EngineId,
        arena_len: u64,
        /// The part of the arena in use unless more consumers attach than
        /// the engine expects: what a consumer registers with CUDA.
        budget_len: u64,
        /// The resume state before the first batch.
        state: String,
        pid: u32,
    },
    /// A holder is linked; with the arena's memory file (read-only), its
    /// release ring's memory file and its eventfd.
    Linked {
        engine: EngineId,
        arena_len: u64,
        pid: u32,
    },
    Stats {
        stats: Value,
        /// The consumer's counters, as the bytes of `Counts` in hex (absent
        /// for a holder).
        counts: Option<String>,
        node: NodeStats,
    },
    Source {
        name: Option<String>,
    },
    Claimed,
    Refused {
        status: i32,
        message: String,
    },
}

/// What the engine says of itself in every stats reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeStats {
    pub pid: u32,
    pub engine: EngineId,
    /// Consumers attached now, and since the start.
    pub consumers: u64,
    pub consumers_attached: u64,
    /// Holders linked now.
    pub holders: u64,
    /// Batches handed out and not freed, over all consumers.
    pub batches_held: u64,
    /// Of those, the asking consumer's (0 for a holder).
    pub batches_held_by_this_consumer: u64,
    /// Batches kept by processes other than the consumer that took them.
    pub batches_kept: u64,
    /// Batches shipped by their consumer and not yet kept by a receiver.
    pub batches_in_transit: u64,
}

impl Request {
    pub fn hello(role: Role) -> Request {
        Request::Hello {
            protocol: PROTOCOL,
            library: LIBRARY.to_string(),
            role,
        }
    }
}

/// Why a message is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Garbled(pub String);

impl std::fmt::Display for Garbled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message's bytes.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // A message of these types always serializes: keys are strings.
    serde_json::to_vec(msg).expect("a protocol message serializes")
}

/// A message from its bytes; `what` names it in the error.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T, Garbled> {
    if bytes.len() > MAX_MESSAGE {
        return Err(Garbled(format!(
            "{what} of {} bytes is over the protocol's {MAX_MESSAGE}",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| Garbled(format!("{what} is not one: {e}")))
}

/// Checks a hello's versions against this side's.
pub fn check_versions(protocol: u32, library: &str) -> Result<(), String> {
    if protocol != PROTOCOL {
        return Err(format!(
            "the peer speaks node protocol {protocol}, this side {PROTOCOL}: start the engine \
             from the same release as its consumers"
        ));
    }
    if library != LIBRARY {
        return Err(format!(
            "the peer's library is version {library:?}, this side's {LIBRARY}: start the engine \
             from the same release as its consumers"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_as_they_were_and_garbage_is_named() {
        let mut config = Map::new();
        config.insert("urls".into(), Value::String("a.tar".into()));
        let engine = EngineId::random().unwrap();
        for m in [
            Request::hello(Role::Consumer { config }),
            Request::hello(Role::Holder),
            Request::Stats,
            Request::Source { shard: 3 },
            Request::Claim {
                engine,
                batch: 9,
                cap: Cap(u64::MAX),
            },
        ] {
            let back: Request = decode(&encode(&m), "a request").unwrap();
            assert_eq!(back, m);
        }
        let r = Reply::Refused {
            status: -14,
            message: "no".into(),
        };
        assert_eq!(decode::<Reply>(&encode(&r), "a reply").unwrap(), r);
        for bad in [
            &b""[..],
            b"{",
            b"[]",
            b"{\"type\":\"hello\"}",
            b"{\"type\":\"source\",\"shard\":1,\"extra\":1}",
            b"{\"type\":\"launch\"}",
            b"{\"type\":\"claim\",\"engine\":\"zz\",\"batch\":1,\"cap\":\"00\"}",
            b"{\"type\":\"source\",\"shard\":-1}",
        ] {
            let e = decode::<Request>(bad, "a request").unwrap_err();
            assert!(e.0.contains("a request is not one"), "{e}");
        }
        let huge = vec![b' '; MAX_MESSAGE + 1];
        assert!(
            decode::<Request>(&huge, "a request")
                .unwrap_err()
                .0
                .contains("over the protocol's")
        );
        assert!(check_versions(PROTOCOL, LIBRARY).is_ok());
        assert!(
            check_versions(1, LIBRARY)
                .unwrap_err()
                .contains("protocol 1")
        );
        assert!(
            check_versions(PROTOCOL, "0.0.1")
                .unwrap_err()
                .contains("0.0.1")
        );
    }
}
