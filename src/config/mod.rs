//! The one configuration of a loader. It arrives as JSON text through the C
//! ABI (`ringfeed_loader_open`), and the same keys are the CLI's flags and
//! Python's keyword arguments. Every key is checked here: an unknown
//! key or a bad value is an error that names the key and says why.
//!
//! Sizes are integers (bytes) or strings with a unit: `"512MiB"`, `"8 MiB"`,
//! `"1GB"` (KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of 1000).
//!
//! - `keys.rs`: the table of keys, one entry each (field, default and its
//!   reason, parser), which makes `Config`, its `Default` and [`KEYS`];
//! - `values.rs`: the value types ([`IoBackend`], [`Toggle`]) and the
//!   parsers of values, [`parse_size`] among them;
//! - `validate.rs`: the checks of the keys together;
//! - `depth.rs`: the reads a worker keeps in flight ([`ReadDepth`]),
//!   `reads_in_flight`'s default worked out in one place.

mod depth;
mod keys;
mod validate;
mod values;

use serde_json::{Map, Value};

pub use depth::ReadDepth;
pub use keys::{
    AUTO_READS_MAX, AUTO_WORKERS, Config, DEFAULT_CHUNK, KEY_SCOPES, KEYS, LOCAL_READS,
    PARTS_IN_FLIGHT, REMOTE_BUDGET_MAX, REMOTE_BUDGET_SHARE, Scope,
};
pub use values::{Checksum, IoBackend, NodeMode, Toggle, parse_size};

use crate::error::{Error, Result};
use crate::plan::PlanOptions;
use values::kind_of;

impl Config {
    /// The first key of the job's scope ([`Scope::Job`]) on which `other`
    /// differs from this configuration, with both values as they read.
    pub fn disagreement(&self, other: &Config) -> Option<(&'static str, String, String)> {
        self.job_values()
            .into_iter()
            .zip(other.job_values())
            .find(|((_, a), (_, b))| a != b)
            .map(|((k, a), (_, b))| (k, a, b))
    }

    /// The job's keys and values as one line: what names a node engine's
    /// socket (`"node": "auto"`).
    pub fn job_identity(&self) -> String {
        self.job_values()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("|")
    }

    /// The keys of `map` a consumer sends a node engine: the job's, for
    /// the engine to check, and the consumer's own. Never the engine's
    /// (memory, threads, I/O: it has its own) nor credentials (it reads
    /// with its own).
    pub fn for_node_engine(map: &Map<String, Value>) -> Map<String, Value> {
        map.iter()
            .filter(|(k, _)| {
                KEY_SCOPES
                    .iter()
                    .any(|(key, s)| key == k && matches!(s, Scope::Job | Scope::Consumer))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Consumers of the dataset: ranks × loader workers.
    pub fn consumers(&self) -> u64 {
        self.world_size.saturating_mul(self.loader_workers)
    }

    /// The plan's options for `streams` streams.
    pub fn plan_options(&self, streams: usize) -> PlanOptions {
        PlanOptions {
            seed: self.seed,
            shuffle: self.shuffle,
            shuffle_buffer: self.shuffle_buffer,
            shuffle_initial: self.shuffle_initial.unwrap_or(self.shuffle_buffer),
            resampled: self.resampled,
            samples_per_epoch: self.samples_per_epoch,
            remainder: self.remainder,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            consumers: self.consumers(),
            consumer: self.rank * self.loader_workers + self.loader_worker,
            streams,
            // Set at open where the counts are missing (`crate::engine`).
            nominal: None,
        }
    }

    /// The budget in bytes: `memory_budget`, or when it is 0, room for every
    /// worker's reads in flight plus two chunks each (the one being parsed
    /// and a spill), plus 64 MiB for batches in the ring and with the
    /// consumer; at least 256 MiB, shared out among a rank's
    /// `loader_workers` (each a process with its own engine). With remote
    /// shards, at least `remote` (the caller's bound for the bandwidth-delay
    /// product of a far object store, see `REMOTE_BUDGET_MAX`), shared out
    /// alike. The arena is locked as it faults in, and faulted in by a
    /// background thread after the first batch, so a large budget costs no
    /// start-up time (what faulting at open cost: docs/decisions.md,
    /// "Defaults and the figures behind them").
    pub fn effective_budget(&self, workers: usize, remote: Option<u64>) -> u64 {
        if self.memory_budget != 0 {
            return self.memory_budget;
        }
        let floor = (256 << 20).max(remote.unwrap_or(0)) / self.loader_workers.max(1);
        self.reads_and_batches(workers).max(floor)
    }

    /// Room for `workers` streams' reads in flight plus two chunks each,
    /// and 64 MiB for the batches in the ring and with the consumer.
    fn reads_and_batches(&self, workers: usize) -> u64 {
        workers as u64 * (self.read_depth().local as u64 + 2) * self.chunk() + (64 << 20)
    }

    /// Bytes per chunk: `chunk_size`, or [`DEFAULT_CHUNK`] while it is auto
    /// (a loader sets it at open from its shards: `engine::setup::auto_chunk`;
    /// a node engine's pool takes the default).
    pub fn chunk(&self) -> u64 {
        match self.chunk_size {
            0 => DEFAULT_CHUNK,
            n => n,
        }
    }

    /// Whole-object parts in flight at once where the count is not found
    /// as the reads go (local reads, the thread backend, uploads):
    /// `parts_in_flight`, or [`PARTS_IN_FLIGHT`] when it is auto.
    pub fn fixed_parts(&self) -> usize {
        match self.parts_in_flight {
            0 => PARTS_IN_FLIGHT,
            n => n,
        }
    }

    /// A node engine's arena: `memory_budget`, or by default room for each
    /// consumer expected on the node (`loader_workers` per rank, and
    /// `LOCAL_WORLD_SIZE` ranks, as torchrun sets it for the first consumer
    /// that starts the engine; without it, `world_size` up to 8) to read
    /// ahead and keep batches as a standalone loader of its streams does,
    /// at least 256 MiB. Each stream's share is then what it would have in
    /// a loader of its own, less the per-process floor a standalone loader
    /// takes (a share of 256 MiB) where the dataset is named as local files:
    /// with one stream per consumer that floor is most of it, and four
    /// standalone loaders' arenas together came to less than one engine's
    /// with it (docs/benchmarks.md, "One engine per node"). Otherwise the
    /// floor stays: what a standalone loader takes for each consumer.
    pub fn node_budget(&self) -> u64 {
        if self.memory_budget != 0 {
            return self.memory_budget;
        }
        let workers = self.workers_or_auto();
        if !self.names_local_files_only() {
            // Shards that may be remote (the engine sizes its arena before
            // it resolves them): the floor stays, whose share sets how many
            // ranges a stream keeps in flight to a far store.
            return self.node_consumers() * self.effective_budget(workers, None);
        }
        (self.node_consumers() * self.reads_and_batches(workers)).max(256 << 20)
    }

    /// Whether the dataset is named as local paths only: no manifest, no
    /// shard index, no URL with a scheme other than `file://`.
    fn names_local_files_only(&self) -> bool {
        self.manifest.is_none()
            && self.urls.iter().all(|u| {
                (!u.contains("://") || u.starts_with("file://"))
                    && !u.ends_with(".manifest")
                    && !u.ends_with(".json")
            })
    }

    /// The consumers a node engine expects (see [`Config::node_budget`]).
    pub fn node_consumers(&self) -> u64 {
        let ranks = std::env::var("LOCAL_WORLD_SIZE")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(self.world_size.min(8))
            .clamp(1, 1024);
        ranks * self.loader_workers.max(1)
    }

    /// The streams a node engine expects: its expected consumers' streams.
    pub fn node_streams(&self) -> usize {
        self.node_consumers() as usize * self.workers_or_auto()
    }

    /// `workers`, or `AUTO_WORKERS` when it is 0 (auto: one per shard up
    /// to that many).
    pub fn workers_or_auto(&self) -> usize {
        match self.workers {
            0 => AUTO_WORKERS,
            n => n,
        }
    }

    /// Parses a JSON object of configuration keys.
    pub fn from_json(text: &str) -> Result<Config> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(format!("not valid JSON: {e}")))?;
        match value {
            Value::Object(map) => Config::from_map(&map),
            other => Err(Error::config(format!(
                "expected a JSON object of keys, got {}",
                kind_of(&other)
            ))),
        }
    }

    /// Applies the keys of `map` over the defaults, then validates.
    pub fn from_map(map: &Map<String, Value>) -> Result<Config> {
        let c = Config::keys_of(map)?;
        c.validate()?;
        Ok(c)
    }

    /// The cache tier's settings, when `cache_dir` names one.
    pub fn cache_options(&self) -> Option<crate::cache::CacheOptions> {
        Some(crate::cache::CacheOptions {
            dir: self.cache_dir.clone()?,
            size: self.cache_size,
            min_free: self.cache_min_free,
        })
    }

    /// The configuration of a whole-object read or write (`crate::object`):
    /// the same keys, where `urls` is not required (the call names the
    /// object) and the loader's layout is not checked. Empty text is `{}`.
    pub fn for_objects(text: &str) -> Result<Config> {
        let text = if text.trim().is_empty() { "{}" } else { text };
        let map = match serde_json::from_str(text)
            .map_err(|e| Error::config(format!("not valid JSON: {e}")))?
        {
            Value::Object(map) => map,
            other => {
                return Err(Error::config(format!(
                    "expected a JSON object of keys, got {}",
                    kind_of(&other)
                )));
            }
        };
        let c = Config::keys_of(&map)?;
        c.validate_s3()?;
        c.validate_objects()?;
        Ok(c)
    }

    fn keys_of(map: &Map<String, Value>) -> Result<Config> {
        let mut c = Config::default();
        for (key, v) in map {
            c.set(key, v)?;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        Config::from_json(json).unwrap_err().to_string()
    }

    #[test]
    fn node_takes_off_auto_or_an_absolute_socket_path_only() {
        for bad in [
            r#"5"#,
            r#""sometimes""#,
            r#""run/node.sock""#,
            r#"true"#,
            r#"[]"#,
        ] {
            let e = err(&format!(r#"{{"node": {bad}}}"#));
            assert!(e.contains("`node` must be"), "{bad}: {e}");
        }
        let node = |v: &str| {
            Config::from_json(&format!(r#"{{"urls": "a.tar", "node": {v}}}"#))
                .unwrap()
                .node
        };
        assert_eq!(
            node(r#""/run/x.sock""#),
            NodeMode::Socket("/run/x.sock".into())
        );
        assert_eq!(node("false"), NodeMode::Off);
        assert_eq!(node(r#""auto""#), NodeMode::Auto);
    }

    #[test]
    fn defaults_apply_and_sizes_take_units() {
        let c = Config::from_json(
            r#"{"urls": "a.tar", "memory_budget": "256MiB", "chunk_size": 1048576}"#,
        )
        .unwrap();
        assert_eq!(c.urls, vec!["a.tar"]);
        assert_eq!(c.memory_budget, 256 << 20);
        assert_eq!(c.chunk_size, 1 << 20);
        assert_eq!(c.chunk(), 1 << 20);
        assert_eq!(c.batch_size, 32);
        // Auto (the default, or by name) is 0 until open; the default chunk
        // stands for it until then.
        for json in [
            r#"{"urls": "a.tar"}"#,
            r#"{"urls": "a.tar", "chunk_size": "auto"}"#,
        ] {
            let c = Config::from_json(json).unwrap();
            c.validate().unwrap();
            assert_eq!((c.chunk_size, c.chunk()), (0, DEFAULT_CHUNK), "{json}");
        }
        assert_eq!(parse_size("1 GB").unwrap(), 1_000_000_000);
    }

    #[test]
    fn a_node_engine_s_default_budget_is_its_consumers_streams_reads_and_batches() {
        const MIB: u64 = 1 << 20;
        let c = |j: &str| Config::from_json(j).unwrap();
        // 2 ranks x 2 workers, one stream each: 4 x (6 chunks of 8 MiB +
        // 64 MiB), not 4 standalone loaders' 128 MiB floors (512 MiB).
        let one = c(r#"{"urls":"a","world_size":2,"loader_workers":2,"workers":1}"#);
        assert_eq!(one.node_consumers(), 4);
        assert_eq!(one.node_budget(), 448 * MIB);
        assert_eq!(one.effective_budget(1, None), 128 * MIB);
        // Auto streams (4 each): what standalone loaders take, their reads
        // being above the floor.
        let auto = c(r#"{"urls":"a","world_size":2,"loader_workers":2}"#);
        assert_eq!(auto.node_budget(), 4 * auto.effective_budget(4, None));
        assert_eq!(auto.node_budget(), 1024 * MIB);
        // One consumer of one stream: at least 256 MiB; a budget given is
        // kept.
        assert_eq!(c(r#"{"urls":"a","workers":1}"#).node_budget(), 256 * MIB);
        let set = c(r#"{"urls":"a","world_size":2,"memory_budget":"96MiB"}"#);
        assert_eq!(set.node_budget(), 96 * MIB);
        // Shards that may be remote keep the floor: each consumer's reads
        // in flight to a far store follow its share.
        for remote in [
            r#""urls":"http://h/a.tar""#,
            r#""urls":"s3://b/a.tar""#,
            r#""urls":"set.manifest""#,
            r#""urls":"a","manifest":"m.manifest""#,
            r#""urls":"shardindex.json""#,
        ] {
            let r = c(&format!(
                r#"{{{remote},"world_size":2,"loader_workers":2,"workers":1}}"#
            ));
            assert_eq!(r.node_budget(), 512 * MIB, "{remote}");
        }
        let file = c(r#"{"urls":"file:///d/a.tar","world_size":2,"loader_workers":2,"workers":1}"#);
        assert_eq!(file.node_budget(), 448 * MIB);
    }

    #[test]
    fn the_default_budget_is_the_reads_or_a_share_of_256_mib() {
        let c = |json: &str| Config::from_json(json).unwrap();
        const MIB: u64 = 1 << 20;
        // 4 workers x (4 reads + 2) x 8 MiB + 64 MiB = 256 MiB.
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(4, None), 256 * MIB);
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(1, None), 256 * MIB);
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(6, None), 352 * MIB);
        // A rank's DataLoader workers share the floor, never below their reads.
        let two = c(r#"{"urls": "a", "loader_workers": 2}"#);
        assert_eq!(two.effective_budget(2, None), 160 * MIB);
        assert_eq!(two.effective_budget(1, None), 128 * MIB);
        let eight = c(r#"{"urls": "a", "loader_workers": 8}"#);
        assert_eq!(eight.effective_budget(1, None), 112 * MIB);
        let set = c(r#"{"urls": "a", "loader_workers": 8, "memory_budget": "1GiB"}"#);
        assert_eq!(set.effective_budget(1, None), 1024 * MIB);
        // Remote shards: the caller's bound, shared among the DataLoader
        // workers; a budget given is kept.
        assert_eq!(
            c(r#"{"urls": "a"}"#).effective_budget(4, Some(1536 * MIB)),
            1536 * MIB
        );
        assert_eq!(two.effective_budget(2, Some(1536 * MIB)), 768 * MIB);
        assert_eq!(set.effective_budget(1, Some(1536 * MIB)), 1024 * MIB);
    }

    #[test]
    fn bad_input_names_the_key_and_the_reason() {
        assert!(err("[1]").contains("expected a JSON object"));
        assert!(err("{").contains("not valid JSON"));
        assert!(err(r#"{"urls":"a","batch_sise":3}"#).contains("unknown key `batch_sise`"));
        assert!(
            err(r#"{"urls":"a","batch_size":0}"#)
                .contains("`batch_size` must be a positive integer")
        );
        assert!(err(r#"{"urls":"a","batch_size":"8"}"#).contains("`batch_size`"));
        assert!(err(r#"{"urls":"a","drop_last":1}"#).contains("`drop_last` must be true or false"));
        assert!(
            err(r#"{"urls":"a","memory_budget":"12 parsecs"}"#).contains("unknown unit `parsecs`")
        );
        assert!(err(r#"{"urls":"a","memory_budget":"x"}"#).contains("`memory_budget`"));
        assert!(err(r#"{"urls":"a","memory_budget":-5}"#).contains("`memory_budget`"));
        assert!(err(r#"{"urls":"a","io_backend":"epoll"}"#).contains("\"io_uring\""));
        assert!(err(r#"{"urls":"a","memory_kind":"huge"}"#).contains("`memory_kind`"));
        assert!(err(r#"{"urls":"a","lock_memory":"maybe"}"#).contains("`lock_memory`"));
        assert!(
            err(r#"{"urls":"a","direct_io":"always"}"#)
                .contains(r#"`direct_io` must be one of "auto", "on", "off", got "always""#)
        );
        assert!(err(r#"{"urls":"a","direct_io":1}"#).contains("`direct_io` must be a string"));
        assert!(err(r#"{"urls":"a","chunk_size":1000}"#).contains("`chunk_size`"));
        assert!(
            err(r#"{"urls":"a","memory_budget":"16MiB","chunk_size":"8MiB"}"#)
                .contains("at least 4 are needed")
        );
        assert!(
            err(r#"{"urls":"a","memory_budget":"3MiB"}"#)
                .contains("(the least `chunk_size` auto picks); at least 4 are needed")
        );
        assert!(err(r#"{"urls":[1]}"#).contains("`urls`"));
        assert!(err(r#"{"urls":[""]}"#).contains("`urls`"));
        assert!(err(r#"{}"#).contains("`urls` is required"));
        assert!(err(r#"{"urls":"a","reads_in_flight":100000}"#).contains("`reads_in_flight`"));
        assert!(err(r#"{"urls":"a","workers":1.5}"#).contains("`workers`"));
        assert!(err(r#"{"urls":"a","stall_timeout_ms":0}"#).contains("`stall_timeout_ms`"));
        assert!(err(r#"{"urls":"a","max_attempts":0}"#).contains("`max_attempts`"));
        assert!(err(r#"{"urls":"a","max_attempts":1000}"#).contains("from 1 to 100"));
        for bad in ["0", "-5", "1.5", "\"10m\"", "null"] {
            let e = err(&format!(r#"{{"urls":"a","retry_deadline_s":{bad}}}"#));
            assert!(e.contains("`retry_deadline_s`"), "{bad}: {e}");
        }
        for bad in ["-1", "1.5", "\"fast\"", "\"2 GB/s per link\"", "null", "[]"] {
            let e = err(&format!(r#"{{"urls":"a","target_throughput":{bad}}}"#));
            assert!(e.contains("`target_throughput`"), "{bad}: {e}");
        }
        for bad in ["-1", "2.5", "\"auto\"", "null"] {
            let e = err(&format!(r#"{{"urls":"a","reads_in_flight":{bad}}}"#));
            assert!(e.contains("`reads_in_flight`"), "{bad}: {e}");
        }
        for bad in ["0", "-1", "2.5", "\"AUTO\"", "\"8\"", "null", "[]", "257"] {
            let e = err(&format!(r#"{{"urls":"a","parts_in_flight":{bad}}}"#));
            assert!(e.contains("`parts_in_flight`"), "{bad}: {e}");
        }
        let parts = |v: &str| {
            let c = Config::from_json(&format!(r#"{{"urls":"a","parts_in_flight":{v}}}"#)).unwrap();
            (c.parts_in_flight, c.fixed_parts())
        };
        assert_eq!(parts("\"auto\""), (0, PARTS_IN_FLIGHT));
        assert_eq!(parts("3"), (3, 3));
        assert_eq!(
            Config::from_json(r#"{"urls":"a"}"#)
                .unwrap()
                .parts_in_flight,
            0
        );
        for key in ["hedge", "kernel_tls"] {
            for bad in ["1", "\"yes\"", "null", "[]"] {
                let e = err(&format!(r#"{{"urls":"a","{key}":{bad}}}"#));
                assert!(e.contains(&format!("`{key}`")), "{bad}: {e}");
            }
        }
        assert!(
            !Config::from_json(r#"{"urls":"a","kernel_tls":false}"#)
                .unwrap()
                .kernel_tls
        );
        assert!(
            !Config::from_json(r#"{"urls":"a","hedge":false}"#)
                .unwrap()
                .hedge
        );
        // 0 is auto; a target reads as bytes per second.
        let c = Config::from_json(r#"{"urls":"a","reads_in_flight":0,"target_throughput":"2GB"}"#)
            .unwrap();
        assert_eq!((c.reads_in_flight, c.target_throughput), (0, 2_000_000_000));
        assert!(err(r#"{"urls":"a","ca_bundle":""}"#).contains("`ca_bundle`"));
        assert!(err(r#"{"urls":"a","ca_bundle":7}"#).contains("`ca_bundle`"));
        assert!(
            err(r#"{"urls":"a","shared_arena":"yes"}"#)
                .contains("`shared_arena` must be true or false")
        );
    }

    #[test]
    fn epoch_keys_reject_bad_values_by_name() {
        let cases = [
            (r#""seed":-1"#, "`seed`"),
            (r#""shuffle":"yes""#, "`shuffle` must be true or false"),
            (r#""shuffle_buffer":1.5"#, "`shuffle_buffer`"),
            (
                r#""shuffle_buffer":100000000"#,
                "`shuffle_buffer` must be at most",
            ),
            (
                r#""shuffle_buffer":4,"shuffle_initial":5"#,
                "`shuffle_initial` 5",
            ),
            (r#""resampled":true"#, "set `samples_per_epoch`"),
            (r#""samples_per_epoch":"many""#, "`samples_per_epoch`"),
            (r#""samples_per_epoch":2000000000000"#, "at most 2^40"),
            (r#""remainder":"round""#, "`remainder`"),
            (r#""world_size":0"#, "`world_size`"),
            (
                r#""rank":2,"world_size":2"#,
                "`rank` 2 must be below `world_size` 2",
            ),
            (
                r#""loader_worker":1"#,
                "`loader_worker` 1 must be below `loader_workers` 1",
            ),
            (r#""loader_workers":0"#, "`loader_workers`"),
            (r#""world_size":70000"#, "consumers are supported"),
            (r#""epoch":1000000000000000000"#, "`epoch` must be at most"),
            (r#""resume":{}"#, "`resume`"),
            (r#""resume":["RFST"]"#, "`resume`"),
            (
                r#""prefetch_batches":5000"#,
                "`prefetch_batches` must be at most 4096",
            ),
            (r#""batch_size":2000000"#, "`batch_size` must be at most"),
        ];
        for (extra, want) in cases {
            let e = err(&format!(r#"{{"urls":"a",{extra}}}"#));
            assert!(e.contains(want), "{extra}: {e}");
        }
        // A state is accepted in either form, one or a list; null means none.
        let c = Config::from_json(r#"{"urls":"a","resume":null}"#).unwrap();
        assert!(c.resume.is_empty());
    }

    #[test]
    fn s3_keys_are_checked_and_secrets_never_echoed() {
        let c = Config::from_json(
            r#"{"urls":"s3://b/k.tar","s3_endpoint":"http://127.0.0.1:9000/","s3_region":"eu-west-1",
                "s3_path_style":false,"aws_access_key_id":"AKID","aws_secret_access_key":"SECRETVALUE1",
                "aws_session_token":"TOKENVALUE1","aws_profile":"p"}"#,
        )
        .unwrap();
        assert_eq!(c.s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.s3.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.s3.path_style, Some(false));
        let d = format!("{c:?}");
        assert!(
            !d.contains("SECRETVALUE1") && !d.contains("TOKENVALUE1"),
            "{d}"
        );
        let c = Config::from_json(r#"{"manifest":"m.manifest"}"#).unwrap();
        assert_eq!(c.manifest.as_deref(), Some("m.manifest"));
        assert!(err(r#"{"urls":"a","s3_endpoint":"ftp://x"}"#).contains("`s3_endpoint`"));
        assert!(err(r#"{"urls":"a","s3_endpoint":"http://x/path"}"#).contains("no path"));
        assert!(err(r#"{"urls":"a","s3_region":"us east"}"#).contains("`s3_region`"));
        assert!(err(r#"{"urls":"a","s3_unsigned":"yes"}"#).contains("`s3_unsigned`"));
        assert!(err(r#"{"urls":"a","manifest":""}"#).contains("`manifest`"));
        assert!(err(r#"{"urls":"a","aws_access_key_id":"A"}"#).contains("together"));
        let e = err(r#"{"urls":"a","aws_secret_access_key":123456789}"#);
        assert!(
            e.contains("`aws_secret_access_key`") && !e.contains("123456789"),
            "{e}"
        );
        assert!(
            err(r#"{"urls":"a","aws_access_key_id":"A","aws_secret_access_key":"S","s3_unsigned":true}"#)
                .contains("`s3_unsigned`")
        );
        assert!(err(r#"{"urls":"a","aws_session_token":"T"}"#).contains("`aws_session_token`"));
        // `s3_suffix`: unset (the default by kind), any ending, or "" for all.
        assert_eq!(
            Config::from_json(r#"{"urls":"a"}"#).unwrap().s3.suffix,
            None
        );
        for v in ["", ".tar.gz"] {
            let c = Config::from_json(&format!(r#"{{"urls":"a","s3_suffix":"{v}"}}"#)).unwrap();
            assert_eq!(c.s3.suffix.as_deref(), Some(v));
        }
        assert!(err(r#"{"urls":"a","s3_suffix":"a\nb"}"#).contains("`s3_suffix`"));
        assert!(err(r#"{"urls":"a","s3_suffix":1}"#).contains("`s3_suffix`"));
    }

    #[test]
    fn cache_keys_take_their_values_and_name_bad_ones() {
        let c = Config::from_json(
            r#"{"urls":"a","cache_dir":"/nvme/c","cache_size":"2GiB","cache_min_free":"5%",
                "cache_fill":"always","cache_direct":"off"}"#,
        )
        .unwrap();
        let o = c.cache_options().unwrap();
        assert_eq!(
            (o.size, o.min_free),
            (2 << 30, crate::cache::MinFree::Fraction(0.05))
        );
        assert_eq!(c.cache_fill, crate::cache::FillMode::Always);
        let c = Config::from_json(r#"{"urls":"a","cache_min_free":"1GiB"}"#).unwrap();
        assert_eq!(c.cache_min_free, crate::cache::MinFree::Bytes(1 << 30));
        assert!(c.cache_options().is_none(), "no cache_dir, no cache");
        for (bad, key) in [
            (r#""cache_dir":"""#, "cache_dir"),
            (r#""cache_dir":5"#, "cache_dir"),
            (r#""cache_size":0"#, "cache_size"),
            (r#""cache_size":"lots""#, "cache_size"),
            (r#""cache_min_free":"150%""#, "cache_min_free"),
            (r#""cache_min_free":"x%""#, "cache_min_free"),
            (r#""cache_min_free":-1"#, "cache_min_free"),
            (r#""cache_fill":"sometimes""#, "cache_fill"),
            (r#""cache_direct":"maybe""#, "cache_direct"),
        ] {
            let e = err(&format!(r#"{{"urls":"a",{bad}}}"#));
            assert!(e.contains(&format!("`{key}`")), "{bad}: {e}");
        }
    }
}
