//! The one configuration of a loader. It arrives as JSON text through the C
//! ABI (`ringfeed_loader_open`), and the same keys are the CLI's flags and,
//! later, Python's keyword arguments. Every key is checked here: an unknown
//! key or a bad value is an error that names the key and says why.
//!
//! Sizes are integers (bytes) or strings with a unit: `"512MiB"`, `"8 MiB"`,
//! `"1GB"` (KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of 1000).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::memory::MemoryKind;
use crate::net::s3::S3Config;
use crate::plan::{PlanOptions, Remainder};

/// Which I/O path reads the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring when it can be set up, else threads.
    Auto,
    /// io_uring or an error.
    IoUring,
    /// One `pread` at a time per worker thread.
    Threads,
}

/// `"auto"`, `"on"` or `"off"` for a feature that needs a privilege.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toggle {
    Auto,
    On,
    Off,
}

impl Toggle {
    /// `None` for auto, else whether it is required.
    pub fn required(self) -> Option<bool> {
        match self {
            Toggle::Auto => None,
            Toggle::On => Some(true),
            Toggle::Off => Some(false),
        }
    }
}

/// A loader's configuration. See the README's configuration reference.
#[derive(Debug, Clone)]
pub struct Config {
    /// Dataset URLs: local paths, `file://` URLs, directories of `.tar`
    /// files, each with WebDataset brace expansion.
    pub urls: Vec<String>,
    /// Samples per batch.
    pub batch_size: usize,
    /// Drop the last, short batch of an epoch instead of delivering it.
    pub drop_last: bool,
    /// Bytes of the arena; all payload bytes live in it. 0 sizes it from the
    /// worker layout at open (see [`Config::effective_budget`]).
    pub memory_budget: u64,
    /// Bytes per chunk: the unit of reads and of memory accounting.
    pub chunk_size: u64,
    /// Reads each worker keeps in flight.
    pub reads_in_flight: usize,
    /// Worker threads, each reading one stream of the plan; 0 picks
    /// `AUTO_WORKERS` (at most one per shard). Part of the layout that
    /// decides the sample order, so it does not depend on the machine.
    pub workers: usize,
    /// Pin each worker to one CPU of the process's allowed set.
    pub pin_cpus: bool,
    pub io_backend: IoBackend,
    /// `None`: best available memory kind.
    pub memory_kind: Option<MemoryKind>,
    pub lock_memory: Toggle,
    pub register_buffers: Toggle,
    /// Back the arena with a memory file another process may map (see
    /// `ringfeed_loader_arena`): for consumers in a child process.
    pub shared_arena: bool,
    /// Ready batches the ring holds ahead of the consumer.
    /// Also the depth of each worker's queue to the sequencer (what they
    /// hold counts against the worker's share of the budget).
    pub prefetch_batches: usize,
    /// Passes over the dataset; 0 repeats forever.
    pub epochs: u64,
    /// A network read that receives no byte for this long fails as stalled
    /// (and is retried).
    pub stall_timeout_ms: u64,
    /// Attempts per network range, the first included.
    pub max_attempts: u32,
    /// PEM file of CA certificates for https:// (default: `AWS_CA_BUNDLE`,
    /// else the system's roots).
    pub ca_bundle: Option<std::path::PathBuf>,
    /// A manifest of shards (`URL [size]` per line), read before `urls`.
    pub manifest: Option<String>,
    /// S3 endpoint, region, addressing and credentials (`s3_*`, `aws_*`).
    /// Its `Debug` redacts the secrets.
    pub s3: S3Config,
    /// The epoch plan's seed.
    pub seed: u64,
    /// Permute the shards every epoch.
    pub shuffle: bool,
    /// Samples held by the shuffle buffers (0: no sample shuffle).
    pub shuffle_buffer: usize,
    /// Samples buffered before the first output; `None`: `shuffle_buffer`.
    pub shuffle_initial: Option<usize>,
    /// Draw shards with replacement, for ever (epochs of `samples_per_epoch`).
    pub resampled: bool,
    /// Samples per epoch over all ranks and loader workers (0: the data's).
    pub samples_per_epoch: u64,
    pub remainder: Remainder,
    /// This process's rank and the number of ranks.
    pub rank: u64,
    pub world_size: u64,
    /// This loader's index among the loader processes of one rank (PyTorch
    /// DataLoader workers), and their number.
    pub loader_worker: u64,
    pub loader_workers: u64,
    /// Resume states (hex) saved by `state`: see `crate::plan::resume`.
    pub resume: Vec<String>,
    /// The epoch to start at (each epoch has its own shuffle); `epochs`
    /// still counts from 0, so the loader runs `epoch..epochs`. A resume
    /// state overrides it.
    pub epoch: u64,
}

/// The automatic worker count. A fixed number, not one per CPU: the workers
/// are the plan's streams, so the sample order must not change with the
/// machine. One worker keeps ~10 GB/s of page-cache reads or ~3 GB/s of
/// network receives busy on one core (measured on the dev machine); four
/// cover a 100 Gbit/s NIC's share of a node's ranks.
pub const AUTO_WORKERS: usize = 4;

impl Default for Config {
    fn default() -> Self {
        Config {
            urls: Vec::new(),
            // A common per-GPU batch of image models; the trainer sets its own.
            batch_size: 32,
            // PyTorch DataLoader's default.
            drop_last: false,
            // Sized at open from the workers' read-ahead: see effective_budget.
            memory_budget: 0,
            // 8 MiB: the S3 part size the AWS CRT uses to reach line rate, and
            // the receive size at which one io_uring thread reached ~4 GB/s at
            // half the CPU of 256 KiB receives (measured on the dev machine).
            chunk_size: 8 << 20,
            // 4 in flight per worker: the CRT's ~4 requests per connection; for
            // page-cache reads 2 already overlap parse and copy.
            reads_in_flight: 4,
            workers: 0,
            pin_cpus: true,
            io_backend: IoBackend::Auto,
            memory_kind: None,
            lock_memory: Toggle::Auto,
            register_buffers: Toggle::Auto,
            // Private memory unless a consumer elsewhere needs to map it.
            shared_arena: false,
            // Eight batches ahead hides a slow read without pinning much.
            prefetch_batches: 8,
            epochs: 1,
            // S3 closes idle connections after 20 s; a range that sends
            // nothing for 10 s is better retried on a new connection.
            stall_timeout_ms: 10_000,
            // See retry::RetryPolicy: the SDKs' 3, raised for long jobs.
            max_attempts: 5,
            ca_bundle: None,
            // No manifest: shards come from `urls`.
            manifest: None,
            // No endpoint (AWS, or AWS_ENDPOINT_URL), region from the
            // environment or profile (else us-east-1), path-style only with
            // an endpoint, requests signed with the credential chain's keys.
            s3: S3Config::default(),
            // Seed 0, no shuffle: the shards in the order given, as a plain
            // streaming reader would.
            seed: 0,
            shuffle: false,
            shuffle_buffer: 0,
            shuffle_initial: None,
            resampled: false,
            samples_per_epoch: 0,
            // PyTorch's DistributedSampler pads by default: no sample is lost.
            remainder: Remainder::Pad,
            rank: 0,
            world_size: 1,
            loader_worker: 0,
            loader_workers: 1,
            resume: Vec::new(),
            epoch: 0,
        }
    }
}

impl Config {
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
        }
    }

    /// The budget in bytes: `memory_budget`, or when it is 0, room for every
    /// worker's reads in flight plus two chunks each (the one being parsed
    /// and a spill), plus 64 MiB for batches in the ring and with the
    /// consumer; at least 256 MiB, shared out among a rank's
    /// `loader_workers` (each a process with its own engine). The whole
    /// arena is locked and faulted in at open, so a budget far above the
    /// working set costs start-up time (about 2 s per GiB measured on the
    /// dev machine; 15-600 ms for 256 MiB of transparent huge pages,
    /// depending on how much the kernel must compact) for nothing: two
    /// DataLoader workers decoding JPEGs each opened 256 MiB and lost to
    /// WebDataset by that time alone (0.95x), and were ahead with 160 MiB.
    pub fn effective_budget(&self, workers: usize) -> u64 {
        if self.memory_budget != 0 {
            return self.memory_budget;
        }
        let reads = workers as u64 * (self.reads_in_flight as u64 + 2) * self.chunk_size;
        (reads + (64 << 20)).max((256 << 20) / self.loader_workers.max(1))
    }
}

/// Every key `from_json` accepts.
pub const KEYS: &[&str] = &[
    "urls",
    "batch_size",
    "drop_last",
    "memory_budget",
    "chunk_size",
    "reads_in_flight",
    "workers",
    "pin_cpus",
    "io_backend",
    "memory_kind",
    "lock_memory",
    "register_buffers",
    "shared_arena",
    "prefetch_batches",
    "epochs",
    "stall_timeout_ms",
    "max_attempts",
    "ca_bundle",
    "manifest",
    "s3_endpoint",
    "s3_region",
    "s3_path_style",
    "s3_unsigned",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "aws_profile",
    "seed",
    "shuffle",
    "shuffle_buffer",
    "shuffle_initial",
    "resampled",
    "samples_per_epoch",
    "remainder",
    "rank",
    "world_size",
    "loader_worker",
    "loader_workers",
    "resume",
    "epoch",
];

impl Config {
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
        let mut c = Config::default();
        for (key, v) in map {
            match key.as_str() {
                "urls" => c.urls = urls(key, v)?,
                "batch_size" => c.batch_size = positive(key, v)? as usize,
                "drop_last" => c.drop_last = boolean(key, v)?,
                "memory_budget" => c.memory_budget = size(key, v)?,
                "chunk_size" => c.chunk_size = size(key, v)?,
                "reads_in_flight" => c.reads_in_flight = positive(key, v)? as usize,
                "workers" => c.workers = integer(key, v)? as usize,
                "pin_cpus" => c.pin_cpus = boolean(key, v)?,
                "shared_arena" => c.shared_arena = boolean(key, v)?,
                "io_backend" => {
                    c.io_backend = match choice(key, v, &["auto", "io_uring", "threads"])? {
                        "auto" => IoBackend::Auto,
                        "io_uring" => IoBackend::IoUring,
                        _ => IoBackend::Threads,
                    }
                }
                "memory_kind" => {
                    c.memory_kind = match choice(key, v, &["auto", "hugetlb", "thp", "normal"])? {
                        "auto" => None,
                        "hugetlb" => Some(MemoryKind::Hugetlb),
                        "thp" => Some(MemoryKind::Thp),
                        _ => Some(MemoryKind::Normal),
                    }
                }
                "lock_memory" => c.lock_memory = toggle(key, v)?,
                "register_buffers" => c.register_buffers = toggle(key, v)?,
                "prefetch_batches" => c.prefetch_batches = positive(key, v)? as usize,
                "epochs" => c.epochs = integer(key, v)?,
                "ca_bundle" => {
                    let p = v
                        .as_str()
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| bad(key, "a file path", v))?;
                    c.ca_bundle = Some(p.into());
                }
                "stall_timeout_ms" => c.stall_timeout_ms = positive(key, v)?,
                "max_attempts" => {
                    c.max_attempts = u32::try_from(positive(key, v)?)
                        .ok()
                        .filter(|&n| n <= 100)
                        .ok_or_else(|| bad(key, "an integer from 1 to 100", v))?
                }
                "manifest" => c.manifest = Some(text(key, v)?),
                "s3_endpoint" => {
                    let e = text(key, v)?;
                    match crate::net::http::parse_url(&e) {
                        Ok(p) if p.target == "/" => {}
                        Ok(_) => return Err(bad(key, "scheme, host and port only, no path", v)),
                        Err(why) => {
                            return Err(Error::config(format!("`{key}`: \"{e}\": {why}")));
                        }
                    }
                    c.s3.endpoint = Some(e.trim_end_matches('/').to_string());
                }
                "s3_region" => {
                    let r = text(key, v)?;
                    if !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                        return Err(bad(key, "a region name such as \"us-east-1\"", v));
                    }
                    c.s3.region = Some(r);
                }
                "s3_path_style" => c.s3.path_style = Some(boolean(key, v)?),
                "s3_unsigned" => c.s3.unsigned = boolean(key, v)?,
                "aws_access_key_id" => c.s3.access_key_id = Some(secret(key, v)?),
                "aws_secret_access_key" => c.s3.secret_access_key = Some(secret(key, v)?),
                "aws_session_token" => c.s3.session_token = Some(secret(key, v)?),
                "aws_profile" => c.s3.profile = Some(text(key, v)?),
                "seed" => c.seed = integer(key, v)?,
                "shuffle" => c.shuffle = boolean(key, v)?,
                "shuffle_buffer" => c.shuffle_buffer = integer(key, v)? as usize,
                "shuffle_initial" => c.shuffle_initial = Some(integer(key, v)? as usize),
                "resampled" => c.resampled = boolean(key, v)?,
                "samples_per_epoch" => c.samples_per_epoch = integer(key, v)?,
                "remainder" => {
                    c.remainder = match choice(key, v, &["pad", "drop"])? {
                        "pad" => Remainder::Pad,
                        _ => Remainder::Drop,
                    }
                }
                "rank" => c.rank = integer(key, v)?,
                "epoch" => c.epoch = integer(key, v)?,
                "world_size" => c.world_size = positive(key, v)?,
                "loader_worker" => c.loader_worker = integer(key, v)?,
                "loader_workers" => c.loader_workers = positive(key, v)?,
                "resume" => {
                    let states = match v {
                        Value::Null => Vec::new(),
                        _ => urls(key, v)?,
                    };
                    for st in &states {
                        crate::plan::resume::State::from_hex(st)
                            .map_err(|e| Error::config(format!("`{key}`: {e}")))?;
                    }
                    c.resume = states;
                }
                _ => {
                    return Err(Error::config(format!(
                        "unknown key `{key}`; known keys: {}",
                        KEYS.join(", ")
                    )));
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the values together (each was checked alone when parsed).
    pub fn validate(&self) -> Result<()> {
        if self.urls.is_empty() && self.manifest.is_none() {
            return Err(Error::config(
                "`urls` is required: give one or more dataset URLs or paths (or a `manifest`)",
            ));
        }
        let s3 = &self.s3;
        if s3.access_key_id.is_some() != s3.secret_access_key.is_some() {
            return Err(Error::config(
                "`aws_access_key_id` and `aws_secret_access_key` must be given together",
            ));
        }
        if s3.session_token.is_some() && s3.access_key_id.is_none() {
            return Err(Error::config(
                "`aws_session_token` needs `aws_access_key_id` and `aws_secret_access_key`",
            ));
        }
        if s3.unsigned && (s3.access_key_id.is_some() || s3.profile.is_some()) {
            return Err(Error::config(
                "`s3_unsigned` is true but credentials or a profile are given; choose one",
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::config("`batch_size` must be at least 1"));
        }
        const MIN_CHUNK: u64 = 64 << 10;
        if self.chunk_size < MIN_CHUNK || self.chunk_size % 4096 != 0 {
            return Err(Error::config(format!(
                "`chunk_size` must be a multiple of 4096 and at least {MIN_CHUNK} bytes, got {}",
                self.chunk_size
            )));
        }
        if self.chunk_size > (1 << 30) {
            return Err(Error::config(format!(
                "`chunk_size` must be at most 1 GiB (the io_uring fixed-buffer limit), got {}",
                self.chunk_size
            )));
        }
        let chunks = self.memory_budget / self.chunk_size;
        if self.memory_budget != 0 && chunks < 4 {
            return Err(Error::config(format!(
                "`memory_budget` of {} bytes holds {chunks} chunks of {} bytes; at least 4 are needed",
                self.memory_budget, self.chunk_size
            )));
        }
        if self.reads_in_flight == 0 || self.prefetch_batches == 0 {
            return Err(Error::config(
                "`reads_in_flight` and `prefetch_batches` must be at least 1",
            ));
        }
        if self.reads_in_flight > 256 {
            return Err(Error::config(format!(
                "`reads_in_flight` must be at most 256, got {}",
                self.reads_in_flight
            )));
        }
        if self.consumers() > crate::plan::resume::MAX_CONSUMERS {
            return Err(Error::config(format!(
                "`world_size` × `loader_workers` is {}; at most {} consumers are supported",
                self.consumers(),
                crate::plan::resume::MAX_CONSUMERS
            )));
        }
        if self.prefetch_batches > 4096 {
            return Err(Error::config(format!(
                "`prefetch_batches` must be at most 4096, got {}",
                self.prefetch_batches
            )));
        }
        if self.batch_size > 1 << 20 {
            return Err(Error::config(format!(
                "`batch_size` must be at most 1048576, got {}",
                self.batch_size
            )));
        }
        if self.samples_per_epoch > 1 << 40 {
            return Err(Error::config(format!(
                "`samples_per_epoch` must be at most 2^40, got {}",
                self.samples_per_epoch
            )));
        }
        if self.epoch > crate::plan::resume::MAX_EPOCH {
            return Err(Error::config(format!(
                "`epoch` must be at most 2^48, got {}",
                self.epoch
            )));
        }
        if self.rank >= self.world_size {
            return Err(Error::config(format!(
                "`rank` {} must be below `world_size` {}",
                self.rank, self.world_size
            )));
        }
        if self.loader_worker >= self.loader_workers {
            return Err(Error::config(format!(
                "`loader_worker` {} must be below `loader_workers` {}",
                self.loader_worker, self.loader_workers
            )));
        }
        if self
            .shuffle_initial
            .is_some_and(|i| i > self.shuffle_buffer)
        {
            return Err(Error::config(format!(
                "`shuffle_initial` {} must be at most `shuffle_buffer` {}",
                self.shuffle_initial.unwrap_or(0),
                self.shuffle_buffer
            )));
        }
        if self.shuffle_buffer > 1 << 24 {
            return Err(Error::config(format!(
                "`shuffle_buffer` must be at most {} samples, got {}",
                1 << 24,
                self.shuffle_buffer
            )));
        }
        if self.resampled && self.samples_per_epoch == 0 {
            return Err(Error::config(
                "`resampled` draws shards for ever: set `samples_per_epoch` to give epochs a length",
            ));
        }
        if self.workers > 1024 {
            return Err(Error::config(format!(
                "`workers` must be at most 1024, got {}",
                self.workers
            )));
        }
        Ok(())
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn bad(key: &str, want: &str, v: &Value) -> Error {
    Error::config(format!("`{key}` must be {want}, got {v}"))
}

fn integer(key: &str, v: &Value) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| bad(key, "a non-negative integer", v))
}

fn positive(key: &str, v: &Value) -> Result<u64> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(bad(key, "a positive integer", v)),
    }
}

fn boolean(key: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad(key, "true or false", v))
}

fn choice<'a>(key: &str, v: &Value, allowed: &[&'a str]) -> Result<&'a str> {
    let s = v.as_str().ok_or_else(|| bad(key, "a string", v))?;
    allowed.iter().find(|a| **a == s).copied().ok_or_else(|| {
        Error::config(format!(
            "`{key}` must be one of {}, got \"{s}\"",
            allowed
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

fn toggle(key: &str, v: &Value) -> Result<Toggle> {
    if let Some(b) = v.as_bool() {
        return Ok(if b { Toggle::On } else { Toggle::Off });
    }
    Ok(match choice(key, v, &["auto", "on", "off"])? {
        "auto" => Toggle::Auto,
        "on" => Toggle::On,
        _ => Toggle::Off,
    })
}

fn urls(key: &str, v: &Value) -> Result<Vec<String>> {
    let list = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(key, "a string or an array of strings", i))
            })
            .collect::<Result<_>>()?,
        other => return Err(bad(key, "a string or an array of strings", other)),
    };
    if let Some(empty) = list.iter().find(|u| u.trim().is_empty()) {
        return Err(bad(key, "non-empty URLs", &Value::String(empty.clone())));
    }
    Ok(list)
}

fn text(key: &str, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ => Err(bad(key, "a non-empty string", v)),
    }
}

/// A credential: like `text`, but the message never shows the value.
fn secret(key: &str, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(s) if !s.trim().is_empty() && !s.contains(['\r', '\n']) => Ok(s.trim().to_string()),
        _ => Err(Error::config(format!(
            "`{key}` must be a non-empty string on one line (value not shown)"
        ))),
    }
}

fn size(key: &str, v: &Value) -> Result<u64> {
    match v {
        Value::Number(_) => integer(key, v),
        Value::String(s) => parse_size(s)
            .map_err(|why| Error::config(format!("`{key}`: cannot read \"{s}\" as a size: {why}"))),
        other => Err(bad(
            key,
            "a byte count or a size string such as \"512MiB\"",
            other,
        )),
    }
}

/// Parses `"512MiB"`, `"8 MiB"`, `"1GB"`, `"4096"`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err("it does not start with a number".into());
    }
    let n: u64 = num
        .parse()
        .map_err(|_| "the number is too large".to_string())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| "the size is too large".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        Config::from_json(json).unwrap_err().to_string()
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
        assert_eq!(c.batch_size, 32);
        assert_eq!(parse_size("1 GB").unwrap(), 1_000_000_000);
    }

    #[test]
    fn the_default_budget_is_the_reads_or_a_share_of_256_mib() {
        let c = |json: &str| Config::from_json(json).unwrap();
        const MIB: u64 = 1 << 20;
        // 4 workers x (4 reads + 2) x 8 MiB + 64 MiB = 256 MiB.
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(4), 256 * MIB);
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(1), 256 * MIB);
        assert_eq!(c(r#"{"urls": "a"}"#).effective_budget(6), 352 * MIB);
        // A rank's DataLoader workers share the floor, never below their reads.
        let two = c(r#"{"urls": "a", "loader_workers": 2}"#);
        assert_eq!(two.effective_budget(2), 160 * MIB);
        assert_eq!(two.effective_budget(1), 128 * MIB);
        let eight = c(r#"{"urls": "a", "loader_workers": 8}"#);
        assert_eq!(eight.effective_budget(1), 112 * MIB);
        let set = c(r#"{"urls": "a", "loader_workers": 8, "memory_budget": "1GiB"}"#);
        assert_eq!(set.effective_budget(1), 1024 * MIB);
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
        assert!(err(r#"{"urls":"a","chunk_size":1000}"#).contains("`chunk_size`"));
        assert!(err(r#"{"urls":"a","memory_budget":"16MiB"}"#).contains("at least 4 are needed"));
        assert!(err(r#"{"urls":[1]}"#).contains("`urls`"));
        assert!(err(r#"{"urls":[""]}"#).contains("`urls`"));
        assert!(err(r#"{}"#).contains("`urls` is required"));
        assert!(err(r#"{"urls":"a","reads_in_flight":100000}"#).contains("`reads_in_flight`"));
        assert!(err(r#"{"urls":"a","workers":1.5}"#).contains("`workers`"));
        assert!(err(r#"{"urls":"a","stall_timeout_ms":0}"#).contains("`stall_timeout_ms`"));
        assert!(err(r#"{"urls":"a","max_attempts":0}"#).contains("`max_attempts`"));
        assert!(err(r#"{"urls":"a","max_attempts":1000}"#).contains("from 1 to 100"));
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
    }
}
