//! The configuration keys, each declared once: the `config_keys!` table
//! below gives each key its `Config` field, type, default (with its reason)
//! and parser, and makes from it the `Config` struct, its `Default`, the
//! list of keys ([`KEYS`]) and the dispatch that parses a key's value
//! (`Config::set`). Adding a key is one entry here (and its row in the
//! configuration reference, docs/configuration.md, which a test below checks).

use std::path::PathBuf;

use serde_json::Value;

use super::values::{
    attempts, auto_or_positive, boolean, checksum, cpu_list, endpoint, file_path, fill_mode,
    image_errors, integer, io_backend, memory_kind, min_free, node_mode, numa_node, positive,
    positive_size, region, remainder, resume_states, secret, size, size_or_auto, suffix, text,
    toggle, transform, urls,
};
use super::{Checksum, IoBackend, NodeMode, Toggle};
use crate::cache::{FillMode, MinFree};
use crate::error::{Error, Result};
use crate::memory::MemoryKind;
use crate::net::s3::S3Config;
use crate::plan::Remainder;

/// The automatic worker count. A fixed number, not one per CPU: the workers
/// are the plan's streams, so the sample order must not change with the
/// machine. Four cover a 100 Gbit/s NIC's share of a node's ranks (what one
/// worker keeps busy: docs/decisions.md, "Defaults and the figures behind
/// them").
pub const AUTO_WORKERS: usize = 4;

/// The chunk size where `chunk_size` is auto and the shards are local,
/// large or of sizes not known at open: the S3 part size the AWS CRT uses
/// to reach line rate, and a receive size large enough that the receives'
/// CPU per GB stops falling (docs/decisions.md, "Defaults and the figures
/// behind them").
pub const DEFAULT_CHUNK: u64 = 8 << 20;

/// Reads a worker keeps in flight on local files when `reads_in_flight` is
/// auto: for page-cache reads 2 already overlap parse and copy, and 4
/// keep an NVMe drive's queue busy from each of the 4 workers.
pub const LOCAL_READS: usize = 4;

/// The most network reads a worker keeps in flight when `reads_in_flight`
/// is auto: 4 workers x 64 reads of 8 MiB is 2 GiB in flight, 17 GB/s at
/// S3's ~115 ms per 8 MiB read, past a 100 Gbit/s NIC; the memory budget
/// bounds it first.
pub const AUTO_READS_MAX: usize = 64;

/// Whole-object parts in flight where `parts_in_flight` is auto and the
/// count is not found as the reads go, and where a remote object's found
/// count starts: boto3's transfer manager's 10 threads, less the two CPUs
/// such a node spends on the rest.
pub const PARTS_IN_FLIGHT: usize = 8;

/// The most the default memory budget grows to for remote shards (the
/// measured bandwidth-delay product of a far object store is what it is
/// for): 2 GiB holds 4 workers x 64 reads of 8 MiB; 12.5 GB/s at ~115 ms
/// per read needs 1.4 GB in flight. Never more than a sixteenth of the
/// machine's memory (`REMOTE_BUDGET_SHARE`), never less than 256 MiB.
pub const REMOTE_BUDGET_MAX: u64 = 2 << 30;

/// The share of the machine's memory the default budget may take for
/// remote shards: a node of 8 ranks then keeps half its memory for them.
pub const REMOTE_BUDGET_SHARE: u64 = 16;

/// Where a key belongs when consumers share a node engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The job's: the dataset, the epoch settings and the layout of
    /// consumers and streams, which together fix every consumer's samples
    /// and their order. Every consumer of one engine gives them alike (the
    /// engine refuses one that does not, naming the key), and they name
    /// the engine's socket (`"node": "auto"`).
    Job,
    /// The consumer's own: which consumer it is and where it starts (a
    /// consumer of an engine gives its own).
    Consumer,
    /// The engine's: memory, threads, I/O, the cache, how to reach S3. A
    /// consumer of an engine does not send them: the engine has its own.
    Engine,
    /// Credentials: the engine's, never sent by a consumer.
    Secret,
    /// Not a key: a field filled by keys of their own (`s3`).
    Parts,
}

/// Expands the block when the two scopes are the same ident.
macro_rules! if_scope {
    (Job, Job, $b:block) => {
        $b
    };
    (Consumer, Consumer, $b:block) => {
        $b
    };
    ($want:ident, $got:ident, $b:block) => {};
}

/// `stringify!($name)`, ignoring the rest: names a key in [`KEYS`] from an
/// entry whose parser is not wanted there.
macro_rules! key_name {
    ($name:ident, $($ignored:tt)*) => {
        stringify!($name)
    };
}

/// Makes `Config`, its `Default`, [`KEYS`] and `Config::set` from a table
/// that starts with `|key, v|` (the names the parsers use for the key and
/// its JSON value) and has one entry per field, ending in `;`:
///
/// - `field: Type = default => parser;` a field set by the key of its name,
///   to the parser's value;
/// - `field: Type = default, keys { key => sub = parser; ... };` a field
///   whose parts `field.sub` are set by keys of other names (the `s3_*` and
///   `aws_*` keys fill `Config::s3`).
///
/// Fields, keys and the list in the unknown-key message keep the table's
/// order.
macro_rules! config_keys {
    (
        |$key:ident, $v:ident|
        $(
            $(#[$attr:meta])*
            [$scope:ident] $field:ident: $ty:ty = $default:expr
            $(=> $parse:expr)?
            $(, keys { $([$sub_scope:ident] $sub_key:ident => $sub:ident = $sub_parse:expr;)+ })?
            ;
        )*
    ) => {
        /// A loader's configuration. See docs/configuration.md.
        #[derive(Debug, Clone)]
        pub struct Config {
            $(
                $(#[$attr])*
                pub $field: $ty,
            )*
        }

        impl Default for Config {
            fn default() -> Self {
                Config {
                    $($field: $default,)*
                }
            }
        }

        /// Every key `from_json` accepts.
        pub const KEYS: &[&str] = &[
            $(
                $(key_name!($field, $parse),)?
                $($(stringify!($sub_key),)+)?
            )*
        ];

        /// Every key with its [`Scope`], in the table's order.
        pub const KEY_SCOPES: &[(&str, Scope)] = &[
            $(
                $((key_name!($field, $parse), Scope::$scope),)?
                $($((stringify!($sub_key), Scope::$sub_scope),)+)?
            )*
        ];

        impl Config {
            /// Each key of the job's scope with its value as it reads, in
            /// the table's order: what every consumer of one node engine
            /// must give alike.
            pub fn job_values(&self) -> Vec<(&'static str, String)> {
                let mut out = Vec::new();
                $(
                    $(if_scope!(Job, $scope, {
                        let _ = stringify!($parse);
                        out.push((stringify!($field), format!("{:?}", self.$field)));
                    });)?
                    $($(if_scope!(Job, $sub_scope, {
                        out.push((stringify!($sub_key), format!("{:?}", self.$field.$sub)));
                    });)+)?
                )*
                out
            }

            /// Takes `from`'s keys of the consumer's scope: a node engine's
            /// configuration made one consumer's.
            pub fn take_consumer_keys(&mut self, from: &Config) {
                $(
                    $(if_scope!(Consumer, $scope, {
                        let _ = stringify!($parse);
                        self.$field = from.$field.clone();
                    });)?
                    $($(if_scope!(Consumer, $sub_scope, {
                        self.$field.$sub = from.$field.$sub.clone();
                    });)+)?
                )*
            }
        }

        impl Config {
            /// Sets the field of `key` from its JSON value; an unknown key is
            /// an error that lists the known ones.
            pub(super) fn set(&mut self, $key: &str, $v: &Value) -> Result<()> {
                match $key {
                    $(
                        $(stringify!($field) => self.$field = $parse,)?
                        $($(stringify!($sub_key) => self.$field.$sub = $sub_parse,)+)?
                    )*
                    _ => return Err(unknown_key($key)),
                }
                Ok(())
            }
        }
    };
}

fn unknown_key(key: &str) -> Error {
    let hint = closest_key(key).map_or(String::new(), |k| format!("did you mean `{k}`? "));
    Error::config(format!(
        "unknown key `{key}`; {hint}known keys: {}",
        KEYS.join(", ")
    ))
}

/// The known key nearest to `key` by edit distance (insertions, deletions,
/// substitutions, and swaps of neighbours, each 1), when it is near enough
/// to be a slip: at most 2 edits, or 1 for keys of 4 letters or less.
pub fn closest_key(key: &str) -> Option<&'static str> {
    let limit = if key.chars().count() <= 4 { 1 } else { 2 };
    KEYS.iter()
        .map(|k| (edit_distance(&key.to_ascii_lowercase(), k), *k))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// Optimal string alignment distance between `a` and `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

config_keys! {
    |key, v|

    /// Dataset URLs: local paths, `file://` URLs, directories of `.tar`
    /// files, each with WebDataset brace expansion.
    [Job] urls: Vec<String> = Vec::new() => urls(key, v)?;

    /// Samples per batch.
    // A common per-GPU batch of image models; the trainer sets its own.
    [Job] batch_size: usize = 32 => positive(key, v)? as usize;

    /// Drop the last, short batch of an epoch instead of delivering it.
    // PyTorch DataLoader's default.
    [Job] drop_last: bool = false => boolean(key, v)?;

    /// Bytes of the arena; all payload bytes live in it. 0 sizes it from the
    /// worker layout at open (see [`Config::effective_budget`]).
    // Sized at open from the workers' read-ahead: see effective_budget.
    [Engine] memory_budget: u64 = 0 => size(key, v)?;

    /// Bytes per chunk: the unit of reads and of memory accounting; 0
    /// (auto): [`DEFAULT_CHUNK`], or for remote shards smaller than that
    /// read, a chunk of whole MiB whose read holds one (chosen at open).
    // Auto: a chunk holds one read, and a read of a 1 MiB shard took all of
    // an 8 MiB chunk, so a far store's budget held a quarter of the reads
    // it could have (see `engine::setup::auto_chunk`).
    [Engine] chunk_size: u64 = 0 => size_or_auto(key, v)?;

    /// Reads each worker keeps in flight; 0 (auto): `LOCAL_READS` for
    /// local files, and for network reads as many as the link needs,
    /// found as the reads go (`crate::net::inflight`).
    // Auto: a fixed count is either too few for a far object store (S3
    // needs ~40 reads of 8 MiB in flight for 3 GB/s) or memory held for
    // nothing on loopback.
    [Engine] reads_in_flight: usize = 0 => integer(key, v)? as usize;

    /// Bytes per second the network reads aim for; 0: as fast as the link
    /// allows. Caps the reads in flight at what the target needs.
    // 0: a loader's job is to keep the consumer fed; a target is for
    // leaving the link to others.
    [Engine] target_throughput: u64 = 0 => size(key, v)?;

    /// Worker threads, each reading one stream of the plan; 0 picks
    /// `AUTO_WORKERS` (at most one per shard). Part of the layout that
    /// decides the sample order, so it does not depend on the machine.
    [Job] workers: usize = 0 => integer(key, v)? as usize;

    /// Pin each worker to one CPU of the process's allowed set (placed by
    /// NIC queue and NUMA node: `crate::topology`).
    [Engine] pin_cpus: bool = true => boolean(key, v)?;

    /// The CPUs the workers are pinned to instead of the placement's
    /// choice; each must be in the process's allowed set.
    // None: placed by NIC queue, NUMA node and other engines' claims.
    [Engine] cpus: Option<Vec<usize>> = None => Some(cpu_list(key, v)?);

    /// The NUMA node of the workers and the arena instead of the NIC's;
    /// `None` is "auto".
    // Auto: the node of the NIC the data arrives on, where its DMA lands.
    [Engine] numa_node: Option<usize> = None => numa_node(key, v)?;

    /// Threads that receive HTTP and S3 ranges for the workers (io_uring
    /// backend); 0 picks one per two allowed CPUs, at most one per worker.
    /// Placement only: the sample order does not depend on it.
    // Why one thread receives for several workers: docs/decisions.md,
    // "Network threads receive for the workers".
    [Engine] net_threads: usize = 0 => integer(key, v)? as usize;

    [Engine] io_backend: IoBackend = IoBackend::Auto => io_backend(key, v)?;

    /// `None`: best available memory kind.
    [Engine] memory_kind: Option<MemoryKind> = None => memory_kind(key, v)?;

    [Engine] lock_memory: Toggle = Toggle::Auto => toggle(key, v)?;

    [Engine] register_buffers: Toggle = Toggle::Auto => toggle(key, v)?;

    /// Read local shards with O_DIRECT, past the page cache: `On` wherever
    /// the file system takes it (others are read buffered, said in the
    /// stats notes), `Off` never, `Auto` when the local shards add up to
    /// more than the machine's memory (`fetch::direct`).
    // Auto: data the page cache can hold reads faster buffered from the
    // second epoch on; data larger than memory is cold every epoch, and
    // direct reads skip the copy and leave the page cache to others
    // (docs/decisions.md).
    [Engine] direct_io: Toggle = Toggle::Auto => toggle(key, v)?;

    /// Back the arena with a memory file another process may map (see
    /// `ringfeed_loader_arena`): for consumers in a child process.
    // Private memory unless a consumer elsewhere needs to map it.
    [Engine] shared_arena: bool = false => boolean(key, v)?;

    /// Ready batches the ring holds ahead of the consumer.
    /// Also the depth of each worker's queue to the sequencer (what they
    /// hold counts against the worker's share of the budget).
    // Eight batches ahead hides a slow read without pinning much.
    [Engine] prefetch_batches: usize = 8 => positive(key, v)? as usize;

    /// The image pipeline run on each batch before it is handed out: a
    /// JSON object (or its text) of field name -> image spec or label type
    /// (see docs/images.md). Each image field of a batch becomes one
    /// contiguous tensor of the batch's images, each label field an array
    /// of numbers, and the samples' fields point into them.
    // None: batches hand over the fields' bytes as they are in the shards.
    [Consumer] transform: Option<crate::image::Transform> = None => transform(key, v)?;

    /// What a sample whose image or label cannot be made (corrupt,
    /// truncated, an unsupported format, a missing field) does: `"fail"`
    /// fails the loader with an error naming the field, the sample's key
    /// and its shard; `"skip"` leaves the sample out of its batch (which
    /// is that much shorter), counts it in `images_skipped` and logs the
    /// shard, key, field and reason at warning level.
    // Fail: a corrupt dataset is news the user wants at once; skipping is
    // a choice made knowing the data.
    [Consumer] image_errors: crate::image::OnError = crate::image::OnError::Fail => image_errors(key, v)?;

    /// Threads that run `transform` on a batch's samples (0: one per CPU
    /// the process may use).
    // The decode is CPU-bound and a batch's samples are independent: all
    // the CPUs, as the I/O threads mostly wait.
    [Engine] transform_threads: usize = 0 => integer(key, v)? as usize;

    /// The memory the `transform`'s image decodes may hold at once,
    /// shared by its threads: each decode reserves its pixels, the JPEG
    /// decoder's buffers and the resize's scratch before it sizes a
    /// buffer, waiting while the others hold too much; an image over the
    /// whole budget is decoded smaller (never below the output's size) or
    /// refused, an error `image_errors` fails or skips. Reported in the
    /// stats (`decode_memory_peak`, `images_over_budget`).
    // 1 GiB: the largest image Pillow accepts (179 M pixels) still decodes
    // whole, one at a time (src/image/budget.rs).
    [Engine] decode_memory: u64 = crate::image::budget::DEFAULT_DECODE_MEMORY => positive_size(key, v)?;

    /// Passes over the dataset; 0 repeats forever.
    [Consumer] epochs: u64 = 1 => integer(key, v)?;

    /// A network read that receives no byte for this long fails as stalled
    /// (and is retried).
    // S3 closes idle connections after 20 s; a range that sends
    // nothing for 10 s is better retried on a new connection.
    [Engine] stall_timeout_ms: u64 = 10_000 => positive(key, v)?;

    /// Attempts per network request, the first included, for failures
    /// other than throttling (resets, time-outs, 5xx); throttled requests
    /// are retried until `retry_deadline_s`.
    // See retry::RetryPolicy: the SDKs' 3, raised for long jobs.
    [Engine] max_attempts: u32 = 5 => attempts(key, v)?;

    /// Seconds a network request may keep failing, from its first
    /// failure, before it fails for good: throttled (503 SlowDown, 429)
    /// until then, other failures until then or `max_attempts`.
    // See retry::DEFAULT_DEADLINE: S3 repartitions over minutes.
    [Engine] retry_deadline_s: u64 = 600 => positive(key, v)?;

    /// Re-request a network range far behind its peers on a fresh
    /// connection: one still waiting for its head past its host's recent
    /// p95 first byte, or whose body takes four times its peers' p99; the
    /// first answer wins. At most a tenth more requests.
    // S3's first-byte tail (p99 of 120 ms and more against a 20 ms
    // median) is what a read waits on; see net::tail.
    [Engine] hedge: bool = true => boolean(key, v)?;

    /// Hand each https session to the kernel's TLS once its handshake is
    /// done, where the kernel has it (`CONFIG_TLS`): the records are
    /// opened by the kernel, the body received as plaintext straight into
    /// the arena. false: always opened in user space (rustls). The stats'
    /// `tls_records` and notes say which happened and why.
    // A kernel without TLS, or a seccomp profile refusing it, is asked
    // once per process (fetch::ktls).
    [Engine] kernel_tls: bool = true => boolean(key, v)?;

    /// PEM file of CA certificates for https:// (default: `AWS_CA_BUNDLE`,
    /// else the system's roots).
    [Engine] ca_bundle: Option<PathBuf> = None => Some(file_path(key, v)?);

    /// A manifest of shards (`URL [size]` per line), read before `urls`.
    // No manifest: shards come from `urls`.
    [Job] manifest: Option<String> = None => Some(text(key, v)?);

    /// S3 endpoint, region, addressing and credentials (`s3_*`, `aws_*`).
    /// Its `Debug` redacts the secrets.
    // No endpoint (AWS, or AWS_ENDPOINT_URL), region from the
    // environment or profile (else us-east-1), path-style only with
    // an endpoint, requests signed with the credential chain's keys.
    [Parts] s3: S3Config = S3Config::default(), keys {
        [Job] s3_endpoint => endpoint = Some(endpoint(key, v)?);
        [Engine] s3_region => region = Some(region(key, v)?);
        [Engine] s3_path_style => path_style = Some(boolean(key, v)?);
        [Engine] s3_unsigned => unsigned = boolean(key, v)?;
        [Secret] aws_access_key_id => access_key_id = Some(secret(key, v)?);
        [Secret] aws_secret_access_key => secret_access_key = Some(secret(key, v)?);
        [Secret] aws_session_token => session_token = Some(secret(key, v)?);
        [Engine] aws_profile => profile = Some(text(key, v)?);
        [Job] s3_suffix => suffix = Some(suffix(key, v)?);
    };

    /// The epoch plan's seed.
    // Seed 0, no shuffle: the shards in the order given, as a plain
    // streaming reader would.
    [Job] seed: u64 = 0 => integer(key, v)?;

    /// Permute the shards every epoch.
    [Job] shuffle: bool = false => boolean(key, v)?;

    /// Samples held by the shuffle buffers (0: no sample shuffle).
    [Job] shuffle_buffer: usize = 0 => integer(key, v)? as usize;

    /// Samples buffered before the first output; `None`: `shuffle_buffer`.
    [Job] shuffle_initial: Option<usize> = None => Some(integer(key, v)? as usize);

    /// Draw shards with replacement, for ever (epochs of `samples_per_epoch`).
    [Job] resampled: bool = false => boolean(key, v)?;

    /// Samples per epoch over all ranks and loader workers (0: the data's).
    [Job] samples_per_epoch: u64 = 0 => integer(key, v)?;

    // PyTorch's DistributedSampler pads by default: no sample is lost.
    [Job] remainder: Remainder = Remainder::Pad => remainder(key, v)?;

    /// This process's rank and the number of ranks.
    [Consumer] rank: u64 = 0 => integer(key, v)?;

    [Job] world_size: u64 = 1 => positive(key, v)?;

    /// This loader's index among the loader processes of one rank (PyTorch
    /// DataLoader workers), and their number.
    [Consumer] loader_worker: u64 = 0 => integer(key, v)?;

    [Job] loader_workers: u64 = 1 => positive(key, v)?;

    /// Take batches from a node engine instead of opening one in this
    /// process: `"auto"` attaches to this user's engine for the dataset
    /// (starting `ringfeed node` when none runs), a path to the engine
    /// listening there (`ringfeed node --socket`).
    // An engine in the process, as a library is expected to behave; the
    // node engine is for many consumers on one node (ringfeed.torch turns
    // it on when a rank has DataLoader workers).
    [Consumer] node: NodeMode = NodeMode::Off => node_mode(key, v)?;

    /// Resume states (hex) saved by `state`: see `crate::plan::resume`.
    [Consumer] resume: Vec<String> = Vec::new() => resume_states(key, v)?;

    /// The epoch to start at (each epoch has its own shuffle); `epochs`
    /// still counts from 0, so the loader runs `epoch..epochs`. A resume
    /// state overrides it.
    [Consumer] epoch: u64 = 0 => integer(key, v)?;

    /// Register the arena with the CUDA runtime (`cudaHostRegister`,
    /// loaded at run time) so host-to-device copies DMA from it: `On`
    /// registers or fails at open, `Off` never tries, `Auto` registers when
    /// a runtime loads and a device takes it, else says why in the notes.
    // Auto: free where CUDA is, and where it is not the loader runs the same.
    [Consumer] cuda_register: Toggle = Toggle::Auto => toggle(key, v)?;

    /// Whole objects (`crate::object`): bytes per ranged GET of a read and
    /// per part of a multipart upload.
    // 8 MiB: the part size of the AWS CRT and boto3's transfer manager,
    // above S3's 5 MiB minimum part.
    [Engine] part_size: u64 = 8 << 20 => size(key, v)?;

    /// Whole objects: ranged GETs or part uploads in flight at once;
    /// `"auto"` (0 here): a remote object's reads start at 8 and climb as
    /// the measured read times show the link has room, to 64
    /// (`crate::net::inflight`); local reads, the thread backend's and
    /// uploads keep 8.
    // 8: boto3's transfer manager's 10 threads, less the two CPUs such a
    // node spends on the rest: past 8 a 2-CPU host gains nothing on
    // loopback, but at S3's ~115 ms per 8 MiB GET 8 carry ~0.6 GB/s.
    [Engine] parts_in_flight: usize = 0 => auto_or_positive(key, v)? as usize;

    /// Whole-object writes: the checksum each part carries, which S3
    /// verifies before it keeps the part.
    // CRC32C: what the AWS SDKs send by default, at memory speed.
    [Engine] checksum: Checksum = Checksum::Crc32c => checksum(key, v)?;

    /// Whole-object writes: replace an object that exists. Off: the write
    /// is conditional (`If-None-Match: *`) and fails when the key exists.
    // Write-once: a checkpoint never silently replaces another.
    [Engine] overwrite: bool = false => boolean(key, v)?;

    /// A local directory (NVMe) that keeps remote shards for later epochs
    /// and later runs, shared by every process on the node that names it
    /// (`crate::cache`). Unset: no cache.
    // Off unless asked: a cache takes disk space the user must grant.
    [Engine] cache_dir: Option<PathBuf> = None => Some(file_path(key, v)?);

    /// The most bytes the cache's entries take; past it the least recently
    /// used are evicted.
    // JuiceFS's default cache size.
    [Engine] cache_size: u64 = 100 << 30 => positive_size(key, v)?;

    /// Free space the cache leaves on its file system: a size, or a
    /// percentage of the file system ("10%").
    // JuiceFS's default free-space ratio: room for the job's own
    // checkpoints and logs on the same disk.
    [Engine] cache_min_free: MinFree = MinFree::Fraction(0.1) => min_free(key, v)?;

    /// When remote shards are written to the cache: `"spare"` only with
    /// the disk's spare bandwidth (a shard whose pieces find the writer
    /// behind is left for a later read to fill, so reads never wait for
    /// the disk), `"always"` every shard read whole (reads wait for a disk
    /// slower than the network).
    // Spare: the cache must never slow the epoch that fills it.
    [Engine] cache_fill: FillMode = FillMode::Spare => fill_mode(key, v)?;

    /// Read cache entries with O_DIRECT: `On` wherever the file system
    /// takes it (others buffered, said in the notes), `Off` never, `Auto`
    /// like `On`.
    // Auto = on: a cache is for data the page cache does not keep.
    [Engine] cache_direct: Toggle = Toggle::Auto => toggle(key, v)?;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn an_unknown_key_suggests_the_nearest_known_one() {
        for (typo, want) in [
            ("batch_sise", Some("batch_size")),
            ("bach_size", Some("batch_size")),
            ("BATCH_SIZE", Some("batch_size")),
            ("shufle", Some("shuffle")),
            ("chunksize", Some("chunk_size")),
            ("epohcs", Some("epochs")),
            ("cache-dir", Some("cache_dir")),
            ("sed", Some("seed")),
            ("colour", None),
            ("zz", None),
        ] {
            assert_eq!(closest_key(typo), want, "{typo}");
        }
        let mut c = Config::default();
        let e = c
            .set("bach_size", &serde_json::json!(3))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown key `bach_size`; did you mean `batch_size`?"),
            "{e}"
        );
        let e = c
            .set("colour", &serde_json::json!(3))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }

    /// The lines of docs/configuration.md from its title to its first
    /// section (`## `): the reference and its key table.
    fn reference_section(page: &str) -> Vec<&str> {
        let mut lines = page.lines();
        lines
            .by_ref()
            .find(|l| l.trim_end() == "# Configuration reference")
            .expect("docs/configuration.md starts with `# Configuration reference`");
        lines.take_while(|l| !l.starts_with("## ")).collect()
    }

    /// The keys in the first column of the section's key table (`| key |
    /// default | meaning |`), each as often as it is listed.
    fn listed_keys(section: &[&str]) -> BTreeMap<String, usize> {
        let mut keys = BTreeMap::new();
        let mut in_table = false;
        for line in section {
            let line = line.trim();
            if !line.starts_with('|') {
                in_table = false;
                continue;
            }
            let first = line.split('|').nth(1).unwrap_or("").trim();
            if first == "key" {
                in_table = true;
                continue;
            }
            if !in_table || first.starts_with("---") {
                continue;
            }
            // `rank`, `world_size`: every backquoted name of the cell.
            for name in first.split('`').skip(1).step_by(2) {
                *keys.entry(name.to_string()).or_insert(0) += 1;
            }
        }
        keys
    }

    #[test]
    fn the_configuration_reference_lists_exactly_the_accepted_keys() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/configuration.md"
        ))
        .expect("docs/configuration.md");
        let listed = listed_keys(&reference_section(&page));
        assert!(!listed.is_empty(), "no key table in docs/configuration.md");
        let twice: Vec<_> = listed.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "listed more than once: {twice:?}");
        let missing: Vec<_> = KEYS.iter().filter(|k| !listed.contains_key(**k)).collect();
        assert!(
            missing.is_empty(),
            "accepted but not in docs/configuration.md: {missing:?}"
        );
        let unknown: Vec<_> = listed
            .keys()
            .filter(|k| !KEYS.contains(&k.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "in docs/configuration.md but not accepted: {unknown:?}"
        );
    }

    #[test]
    fn every_key_has_one_scope_and_the_job_and_consumer_keys_are_what_they_were() {
        assert_eq!(KEY_SCOPES.len(), KEYS.len());
        let of = |scope| -> Vec<&str> {
            KEY_SCOPES
                .iter()
                .filter(|(_, s)| *s == scope)
                .map(|(k, _)| *k)
                .collect()
        };
        let mut job = of(Scope::Job);
        job.sort();
        assert_eq!(
            job,
            [
                "batch_size",
                "drop_last",
                "loader_workers",
                "manifest",
                "remainder",
                "resampled",
                "s3_endpoint",
                "s3_suffix",
                "samples_per_epoch",
                "seed",
                "shuffle",
                "shuffle_buffer",
                "shuffle_initial",
                "urls",
                "workers",
                "world_size",
            ]
        );
        let mut consumer = of(Scope::Consumer);
        consumer.sort();
        assert_eq!(
            consumer,
            [
                "cuda_register",
                "epoch",
                "epochs",
                "image_errors",
                "loader_worker",
                "node",
                "rank",
                "resume",
                "transform"
            ]
        );
        let mut secret = of(Scope::Secret);
        secret.sort();
        assert_eq!(
            secret,
            [
                "aws_access_key_id",
                "aws_secret_access_key",
                "aws_session_token"
            ]
        );
        // The job's values name every job key, and change with each.
        let base = Config::default();
        assert_eq!(base.job_values().len(), job.len());
        for key in &job {
            let mut other = Config::default();
            let v = match *key {
                "urls" => serde_json::json!(["x.tar"]),
                "manifest" => serde_json::json!("m"),
                "s3_endpoint" => serde_json::json!("http://127.0.0.1:1"),
                "s3_suffix" => serde_json::json!(".x"),
                "drop_last" | "shuffle" | "resampled" => serde_json::json!(true),
                "remainder" => serde_json::json!("drop"),
                _ => serde_json::json!(3),
            };
            other.set(key, &v).unwrap();
            assert_ne!(base.job_identity(), other.job_identity(), "{key}");
            assert_eq!(base.disagreement(&other).map(|d| d.0), Some(*key));
        }
        // A consumer's keys are taken over, and no other.
        let mut from = Config::default();
        for (k, v) in [
            ("rank", serde_json::json!(1)),
            ("world_size", serde_json::json!(2)),
            ("epoch", serde_json::json!(4)),
            ("seed", serde_json::json!(9)),
        ] {
            from.set(k, &v).unwrap();
        }
        let mut to = Config::default();
        to.take_consumer_keys(&from);
        assert_eq!((to.rank, to.epoch), (1, 4));
        assert_eq!((to.world_size, to.seed), (1, 0));
    }

    #[test]
    fn every_listed_key_is_parsed_and_no_other() {
        let mut seen = std::collections::HashSet::new();
        for key in KEYS {
            assert!(seen.insert(key), "`{key}` is declared twice");
            let e = Config::default().set(key, &Value::Null).err();
            let e = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(!e.contains("unknown key"), "{key}: {e}");
        }
        let e = Config::default()
            .set("batch_sise", &Value::Null)
            .unwrap_err();
        assert!(
            e.to_string().contains("known keys: urls, batch_size, "),
            "{e}"
        );
    }
}
