//! Helpers of the node engine's tests (`tests/node.rs`,
//! `tests/node_trust.rs`): a generated dataset, the job's configuration,
//! an engine served from a thread, consumers attached through `Attached`,
//! and a batch as plain bytes to compare.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use ringfeed::consumer::{AnyBatch, AnyNext, Attached};
use ringfeed::node::{self, NodeOptions};
use ringfeed::synth::{GenOptions, generate};
use serde_json::{Map, Value, json};

pub struct Dataset {
    pub dir: tempfile::TempDir,
    pub shards: Vec<String>,
    /// Every sample's key, sorted.
    pub keys: Vec<Vec<u8>>,
}

/// The generator's seed for `dataset()`: `synth::verify` checks a field's
/// bytes with it.
pub const DATASET_SEED: u64 = 11;

pub fn dataset() -> &'static Dataset {
    static D: OnceLock<Dataset> = OnceLock::new();
    D.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let o = GenOptions {
            shards: 5,
            shard_bytes: 600 << 10,
            sample_bytes: 9000,
            spread: 0.5,
            fields: vec!["bin".into(), "cls".into()],
            seed: DATASET_SEED,
        };
        let r = generate(dir.path(), &o, |_| {}).unwrap();
        let shards = r.paths.iter().map(|p| p.display().to_string()).collect();
        let mut keys: Vec<Vec<u8>> = (r.shard_samples.iter().enumerate())
            .flat_map(|(i, &n)| (0..n).map(move |j| ringfeed::synth::sample_key(i, j).into_bytes()))
            .collect();
        keys.sort();
        Dataset { dir, shards, keys }
    })
}

/// The job's configuration: shuffled, two epochs, 2 ranks x 2 loader workers.
pub fn job() -> Map<String, Value> {
    let v = json!({
        "urls": dataset().shards,
        "batch_size": 7,
        "seed": 3,
        "shuffle": true,
        "shuffle_buffer": 40,
        "epochs": 2,
        "world_size": 2,
        "loader_workers": 2,
        "workers": 2,
        "memory_budget": "48MiB",
        "chunk_size": "1MiB",
    });
    v.as_object().unwrap().clone()
}

/// An engine on a socket in a new directory, served from a thread.
pub fn engine(config: Map<String, Value>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let listener = node::sock::listen(&socket).unwrap();
    let opts = NodeOptions {
        socket: socket.clone(),
        config: ringfeed::Config::from_map(&config).unwrap(),
        linger: None,
    };
    std::thread::spawn(move || node::serve(listener, opts).unwrap());
    (dir, socket)
}

pub fn open(mut cfg: Map<String, Value>, node: Option<&Path>) -> ringfeed::Result<Attached> {
    if let Some(s) = node {
        cfg.insert("node".into(), json!(s));
    }
    Attached::open_json(&Value::Object(cfg).to_string())
}

/// One batch as a consumer sees it: epoch, index, and per sample its key
/// and each field's name and bytes.
pub type Seen = (u64, u64, Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>);

pub fn view(b: &AnyBatch) -> Seen {
    let fields = b.raw_fields();
    let samples = b
        .raw_samples()
        .iter()
        .map(|s| {
            // SAFETY: the batch is alive; its pointers are valid.
            unsafe {
                let key = std::ffi::CStr::from_ptr(s.key).to_bytes().to_vec();
                let start = s.fields.offset_from(fields.as_ptr()) as usize;
                let f = fields[start..start + s.field_count]
                    .iter()
                    .map(|f| {
                        (
                            std::ffi::CStr::from_ptr(f.name).to_bytes().to_vec(),
                            std::slice::from_raw_parts(f.data, f.len).to_vec(),
                        )
                    })
                    .collect();
                (key, f)
            }
        })
        .collect();
    (b.epoch(), b.index(), samples)
}

/// Every batch (and epoch end, as an empty marker) to the end, and the
/// resume state after each.
pub fn drain(l: &Attached) -> Vec<(Option<Seen>, String)> {
    let mut out = Vec::new();
    loop {
        match l.next(Some(Duration::from_secs(60))).unwrap() {
            AnyNext::Batch(b) => out.push((Some(view(&b)), l.state_hex())),
            AnyNext::EndOfEpoch(_) => out.push((None, l.state_hex())),
            AnyNext::Finished => return out,
            AnyNext::Timeout => panic!("no batch for 60 s"),
        }
    }
}

/// `c` on one rank with one stream per consumer and no shuffle buffer: the
/// engine expects `loader_workers` (2) streams.
pub fn small(mut c: Map<String, Value>) -> Map<String, Value> {
    c.insert("world_size".into(), json!(1));
    c.insert("workers".into(), json!(1));
    c.insert("shuffle_buffer".into(), json!(0));
    c
}

pub fn consumer(rank: u64, worker: u64) -> Map<String, Value> {
    let mut c = job();
    c.insert("rank".into(), json!(rank));
    c.insert("loader_worker".into(), json!(worker));
    c
}
