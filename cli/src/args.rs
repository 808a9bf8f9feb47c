//! The command line: clap's structs for every command and the flags they
//! share, and [`config_for`], which turns the loader flags (and `--config`)
//! into the library's [`Config`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value, json};

use ringfeed::config::{Config, parse_size};
use ringfeed::serve::ServeOptions;

use crate::AnyResult;

#[derive(Parser)]
#[command(
    name = "ringfeed",
    version,
    about = "Stream WebDataset shards into zero-copy batches"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Write a synthetic WebDataset shard set into DIR.
    Gen(GenArgs),
    /// Stream a dataset and report GB/s, samples/s and CPU cost.
    Bench(BenchArgs),
    /// Serve the files of DIR over HTTP (GET, HEAD, Range) until Ctrl-C.
    Serve(ServeArgs),
    /// List the shards a dataset resolves to, with sizes (and sample counts).
    Ls(LsArgs),
    /// Write a manifest (`URL size samples` per line) of the dataset, or
    /// WebDataset's `shardindex.json` with `-o NAME.json`: with either
    /// (given as the dataset, or put beside the shards) loaders split the
    /// data among ranks exactly, by sample.
    Index(IndexArgs),
    /// Print each sample's key and field sizes, or one field's raw bytes.
    Cat(CatArgs),
    /// Run a node engine: consumers on this node (ranks, DataLoader
    /// workers) with `"node": "auto"` or `"node": SOCKET` attach to it and
    /// take their batches through shared memory.
    Node(NodeArgs),
    /// Print this machine's NICs, queues, interrupt CPUs and NUMA nodes, and
    /// the CPUs a loader would be pinned to.
    Topology(TopologyArgs),
    /// Read whole objects (S3, HTTP(S), local) and write them to files or
    /// stdout, with many ranged reads in flight.
    Get(GetArgs),
    /// Mount an s3://bucket/prefix/, an http(s):// directory listing or a
    /// local directory as a file system (FUSE): reads through the engine
    /// (read-ahead, the node's cache), new files written once as whole
    /// objects; runs until Ctrl-C, SIGTERM or `fusermount3 -u`.
    Mount(MountArgs),
    /// Write a file or stdin as one object (S3 or local), visible only once
    /// whole; never replaces one unless --overwrite.
    Put(PutArgs),
    /// Serve volumes to Kubernetes pods: a CSI node driver (gRPC on a Unix
    /// socket, driver name csi.ringfeed.dev) that runs a `ringfeed mount`
    /// for each volume published on the node.
    Csi(CsiArgs),
    /// Show what a cache directory (`cache_dir`) holds, or write the
    /// manifest of the sample counts its loaders learned.
    Cache(CacheArgs),
    /// Generate a dataset in a temporary directory, serve it on a loopback
    /// HTTP server and stream it over http://, checking every byte.
    Demo {
        /// Total size of the generated dataset.
        #[arg(long, default_value = "512MiB", value_parser = size_arg)]
        size: u64,
        /// Stream from the directory instead of over HTTP.
        #[arg(long)]
        local: bool,
        #[command(flatten)]
        opts: LoaderArgs,
        #[command(flatten)]
        report: ReportArgs,
    },
}

#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Dataset URLs or paths (brace expansion allowed); with the flags
    /// below, the configuration every consumer must agree with.
    pub(crate) urls: Vec<String>,
    /// Socket to listen on; default: the one consumers with `"node": "auto"`
    /// and the same dataset and epoch keys look for.
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    /// Exit once no consumer has been attached for this many milliseconds
    /// (default: run until killed).
    #[arg(long)]
    pub(crate) linger_ms: Option<u64>,
    /// Return once the socket listens, leaving the engine running in the
    /// background (how consumers start it on demand).
    #[arg(long)]
    pub(crate) daemon: bool,
    /// Read the configuration (a JSON object, `urls` included) from
    /// standard input instead of the arguments.
    #[arg(long)]
    pub(crate) config_stdin: bool,
    /// Serve the engine's metrics (Prometheus text: its consumers' loaders
    /// summed, the shared arena, consumers attached) at
    /// http://127.0.0.1:PORT/metrics (0: any free port; printed on stderr).
    #[arg(long, value_name = "PORT")]
    pub(crate) metrics_port: Option<u16>,
    /// The address the metrics are served on (default 127.0.0.1; 0.0.0.0
    /// for a scraper from outside, as Prometheus scraping a pod).
    #[arg(long, value_name = "ADDR", requires = "metrics_port")]
    pub(crate) metrics_addr: Option<std::net::IpAddr>,
    #[command(flatten)]
    pub(crate) opts: LoaderArgs,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Directory whose files are served.
    pub(crate) dir: PathBuf,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// Address to listen on (0.0.0.0 or :: for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) bind: String,
    /// Connections served at once.
    #[arg(long, default_value_t = ServeOptions::default().max_connections)]
    pub(crate) max_connections: usize,
    /// Print one line per request on stderr.
    #[arg(long)]
    pub(crate) log: bool,
}

#[derive(Args)]
pub(crate) struct LsArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    pub(crate) urls: Vec<String>,
    /// Stream every shard and print its sample count and field names.
    #[arg(long)]
    pub(crate) samples: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) opts: LoaderArgs,
}

#[derive(Args)]
pub(crate) struct TopologyArgs {
    /// Workers to place (default: the automatic count).
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct IndexArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    pub(crate) urls: Vec<String>,
    /// Write the manifest here instead of to stdout; a name ending in
    /// `.json` writes WebDataset's shard index (`shardindex.json`).
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) opts: LoaderArgs,
}

#[derive(Args)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    pub(crate) command: CacheCommand,
}

#[derive(Subcommand)]
pub(crate) enum CacheCommand {
    /// One line per entry: URL, bytes, samples (`-` when not counted),
    /// version (ETag or Last-Modified).
    Ls {
        /// The cache directory.
        dir: PathBuf,
    },
    /// A manifest (`URL size samples` per line) of the entries whose
    /// samples were counted: loaders given it split remote data among
    /// ranks without reading it first.
    Manifest {
        /// The cache directory.
        dir: PathBuf,
        /// Write the manifest here instead of to stdout.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

#[derive(Args)]
pub(crate) struct CatArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    pub(crate) urls: Vec<String>,
    /// Only the sample with this key.
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// With --key: write this field's raw bytes to stdout.
    #[arg(long, requires = "key")]
    pub(crate) field: Option<String>,
    /// Stop after this many samples.
    #[arg(long)]
    pub(crate) limit: Option<u64>,
    #[command(flatten)]
    pub(crate) opts: LoaderArgs,
}

#[derive(Args)]
pub(crate) struct GenArgs {
    /// Directory to write the shards into (created).
    pub(crate) dir: PathBuf,
    /// Number of shards.
    #[arg(long, default_value_t = 8)]
    pub(crate) shards: usize,
    /// Approximate size of each shard.
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    pub(crate) shard_size: u64,
    /// Mean size of each sample's main field.
    #[arg(long, default_value = "100KB", value_parser = size_arg)]
    pub(crate) sample_size: u64,
    /// Relative spread of the sample size (uniform in mean × (1 ± spread)).
    #[arg(long, default_value_t = 0.5)]
    pub(crate) spread: f64,
    /// Comma-separated field names; the first carries the sized payload.
    #[arg(long, default_value = "jpg,cls", value_delimiter = ',')]
    pub(crate) fields: Vec<String>,
    /// Seed of the sizes and of the content.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Dataset URLs or paths (brace expansion allowed).
    #[arg(required = true)]
    pub(crate) urls: Vec<String>,
    #[command(flatten)]
    pub(crate) opts: LoaderArgs,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// Configuration keys as flags.
#[derive(Args, Clone)]
pub(crate) struct LoaderArgs {
    /// Samples per batch (`batch_size`; default 32).
    #[arg(long)]
    pub(crate) batch_size: Option<u64>,
    /// Drop the short last batch of each epoch (`drop_last`).
    #[arg(long)]
    pub(crate) drop_last: bool,
    /// Bytes of the arena, e.g. 512MiB (`memory_budget`; default: sized
    /// from the workers).
    #[arg(long)]
    pub(crate) memory_budget: Option<String>,
    /// Bytes per chunk, the unit of reads, e.g. 8MiB, or auto (`chunk_size`;
    /// default auto: 8MiB, less for remote shards smaller than that).
    #[arg(long)]
    pub(crate) chunk_size: Option<String>,
    /// Reads each worker keeps in flight (`reads_in_flight`; default: 4 on local files, found as the reads go over the network).
    #[arg(long)]
    pub(crate) reads_in_flight: Option<u64>,
    /// Worker threads, each reading one stream of the plan (`workers`;
    /// default: up to 4, one per shard).
    #[arg(long)]
    pub(crate) workers: Option<u64>,
    /// Do not pin workers to CPUs.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// auto, io_uring or threads.
    #[arg(long)]
    pub(crate) io_backend: Option<String>,
    /// auto, hugetlb, thp or normal.
    #[arg(long)]
    pub(crate) memory_kind: Option<String>,
    /// Epochs to run, 0 for ever (`epochs`; default 1).
    #[arg(long)]
    pub(crate) epochs: Option<u64>,
    #[command(flatten)]
    pub(crate) s3: S3Args,
    /// More configuration keys as a JSON object (flags win); may be given
    /// several times, later objects' keys replacing earlier ones'.
    #[arg(long)]
    pub(crate) config: Vec<String>,
}

/// What `bench` and `demo` report.
#[derive(Args, Clone)]
pub(crate) struct ReportArgs {
    /// Check every field's bytes against the generator's pattern with this seed.
    #[arg(long)]
    pub(crate) verify: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Serve the loader's metrics (Prometheus text) at
    /// http://127.0.0.1:PORT/metrics while it runs (0: any free port; the
    /// address is printed on stderr).
    #[arg(long, value_name = "PORT")]
    pub(crate) metrics_port: Option<u16>,
}

#[derive(Args)]
pub(crate) struct GetArgs {
    /// Objects to read: s3://bucket/key, http(s):// URLs, local paths; a
    /// directory or an s3://bucket/prefix/ stands for the objects in it
    /// (one level), and braces expand.
    #[arg(required = true)]
    pub(crate) urls: Vec<String>,
    /// Where to write: a file when there is one object, a directory
    /// (created) for several, `-` for stdout; default: each object's name
    /// in the current directory.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// Replace files that exist.
    #[arg(long)]
    pub(crate) overwrite: bool,
    #[command(flatten)]
    pub(crate) opts: ObjectArgs,
}

#[derive(Args)]
pub(crate) struct MountArgs {
    /// What to mount: s3://bucket/prefix/, http(s)://host/dir/ (a server
    /// that answers a listing page), or a local directory.
    pub(crate) source: String,
    /// An empty directory to mount it on.
    pub(crate) mountpoint: PathBuf,
    /// Opening an existing file with O_TRUNC replaces its object (default:
    /// refused with EPERM, as Mountpoint for Amazon S3 does).
    #[arg(long)]
    pub(crate) allow_overwrite: bool,
    /// How long a directory listing, and the names and sizes the kernel
    /// caches, are trusted before the source is asked again (seconds).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub(crate) metadata_ttl: f64,
    /// The most a sequential reader's read-ahead grows to.
    #[arg(long, default_value = "256MiB", value_parser = size_arg)]
    pub(crate) read_ahead: u64,
    /// The memory the fetched blocks of remote files may hold.
    #[arg(long, default_value = "1GiB", value_parser = size_arg)]
    pub(crate) memory: u64,
    /// The kernel's own read-ahead on this mount (its
    /// /sys/class/bdi/<dev>/read_ahead_kb, set once mounted; root only, a
    /// warning otherwise): how much a stream of reads or a page fault of a
    /// mapping asks for ahead, in requests of up to 1 MiB. The kernel's
    /// default, 128 KiB, caps every request at 128 KiB. 0 leaves it.
    #[arg(long, default_value = "16MiB", value_parser = size_arg)]
    pub(crate) kernel_read_ahead: u64,
    /// The node's cache directory (key `cache_dir`, the loaders' entries):
    /// files read whole are read from it, or fill it.
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Threads answering the kernel's requests (each blocks on a read
    /// from the store while the others go on).
    #[arg(long, default_value_t = 16)]
    pub(crate) threads: usize,
    /// Let other users than the one mounting see the files (FUSE's
    /// allow_other; needs user_allow_other in /etc/fuse.conf unless root).
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// Mount read-only: every write, new file or directory is refused
    /// (EROFS), and no write bits are shown.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// The user id that owns every file and directory (default: the
    /// mounting user's).
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
    /// The group id of every file and directory (default: the mounting
    /// user's group).
    #[arg(long, value_name = "GID")]
    pub(crate) gid: Option<u32>,
    /// The permission bits of files, in octal (default 0644; the write
    /// bits are dropped on a read-only mount or an http(s):// source).
    #[arg(long, value_name = "MODE", value_parser = mode_arg)]
    pub(crate) file_mode: Option<u16>,
    /// The permission bits of directories, in octal (default 0755).
    #[arg(long, value_name = "MODE", value_parser = mode_arg)]
    pub(crate) dir_mode: Option<u16>,
    /// Return once mounted, leaving the mount running in the background;
    /// its log goes to --log-file (default: a file named on stderr).
    #[arg(long)]
    pub(crate) daemon: bool,
    /// Where the log goes with --daemon.
    #[arg(long)]
    pub(crate) log_file: Option<PathBuf>,
    /// Serve the mount's metrics (Prometheus text) at
    /// http://127.0.0.1:PORT/metrics (0: any free port; printed on stderr).
    #[arg(long, value_name = "PORT")]
    pub(crate) metrics_port: Option<u16>,
    /// The address the metrics are served on (default 127.0.0.1).
    #[arg(long, value_name = "ADDR", requires = "metrics_port")]
    pub(crate) metrics_addr: Option<std::net::IpAddr>,
    /// Serve a mount already made on MOUNTPOINT by a privileged parent,
    /// through its /dev/fuse descriptor FD, inherited (the CSI driver
    /// mounts as root and runs the mount as the cache's owner): nothing is
    /// mounted or unmounted by this process.
    #[arg(long, value_name = "FD", conflicts_with = "daemon")]
    pub(crate) fuse_fd: Option<i32>,
    #[command(flatten)]
    pub(crate) opts: ObjectArgs,
}

#[derive(Args)]
pub(crate) struct CsiArgs {
    /// The socket the kubelet calls, as its registrar gives it
    /// (unix:///PATH or a path).
    #[arg(long, default_value = "unix:///csi/csi.sock", value_name = "URL")]
    pub(crate) endpoint: String,
    /// This node's id, as the kubelet knows it (the node's name: the
    /// downward API's spec.nodeName).
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "check_volume",
        default_value = ""
    )]
    pub(crate) node_id: String,
    /// Check a PersistentVolume (JSON, as `kubectl get pv NAME -o json`
    /// prints it; `-` for stdin) as a publish of it would: print the
    /// `ringfeed mount` command it becomes, or the refusal and its CSI code
    /// (exit status 1). Nothing is served or mounted.
    #[arg(long, value_name = "FILE")]
    pub(crate) check_volume: Option<PathBuf>,
    /// Where the driver keeps a record of each published volume, so that a
    /// driver started again finds the mounts an earlier one made (a
    /// hostPath that lives as long as the node's mounts).
    #[arg(long, default_value = "/run/ringfeed/csi", value_name = "DIR")]
    pub(crate) state_dir: PathBuf,
    /// The node's cache directory (the node engine's `cache_dir`): every
    /// volume's mount reads it and fills it, unless the volume says
    /// `cache: none`.
    #[arg(long, value_name = "DIR")]
    pub(crate) cache_dir: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct PutArgs {
    /// The file to write, or `-` for stdin.
    pub(crate) file: PathBuf,
    /// Where: s3://bucket/key, a local path or a file:// URL.
    pub(crate) url: String,
    /// Replace the object if it exists (default: refuse).
    #[arg(long)]
    pub(crate) overwrite: bool,
    /// Checksum each part carries, verified by S3: crc32c, crc64nvme, md5
    /// or none (default crc32c).
    #[arg(long)]
    pub(crate) checksum: Option<String>,
    #[command(flatten)]
    pub(crate) opts: ObjectArgs,
}

/// The configuration of whole-object commands as flags.
#[derive(Args, Clone)]
pub(crate) struct ObjectArgs {
    /// Bytes per ranged read and per uploaded part (e.g. 8MiB, the default).
    #[arg(long)]
    pub(crate) part_size: Option<String>,
    /// Ranged reads or part uploads in flight at once (default: a remote
    /// object's reads on io_uring start at 8 and climb as their times show
    /// room, to 64; other reads and uploads keep 8).
    #[arg(long)]
    pub(crate) parts_in_flight: Option<u64>,
    #[command(flatten)]
    pub(crate) s3: S3Args,
    /// auto, io_uring or threads.
    #[arg(long)]
    pub(crate) io_backend: Option<String>,
    /// More configuration keys as a JSON object (flags win), e.g.
    /// credentials or `max_attempts`; may be given several times, later
    /// objects' keys replacing earlier ones'.
    #[arg(long)]
    pub(crate) config: Vec<String>,
}

/// S3 endpoint and addressing as flags; credentials come from the
/// environment, the AWS profile files or `--config`, never the command line
/// (where `ps` would show them). `--endpoint-url` and `--no-sign-request`
/// are the AWS CLI's names; the `--s3-*` ones stay as aliases.
#[derive(Args, Clone)]
pub(crate) struct S3Args {
    /// S3-compatible endpoint URL, as the AWS CLI's option (key
    /// `s3_endpoint`; default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
    /// profile's endpoint_url, else AWS).
    #[arg(
        long = "endpoint-url",
        visible_alias = "s3-endpoint",
        value_name = "URL"
    )]
    pub(crate) s3_endpoint: Option<String>,
    /// S3 region, as the AWS CLI's `--region` (key `s3_region`; default:
    /// AWS_REGION, the profile's, else us-east-1).
    #[arg(long = "region", visible_alias = "s3-region", value_name = "REGION")]
    pub(crate) s3_region: Option<String>,
    /// Address buckets as a path (endpoint/bucket/key), not a host name
    /// (`--force-path-style`, as Mountpoint for Amazon S3 names it).
    #[arg(long, visible_alias = "force-path-style")]
    pub(crate) s3_path_style: bool,
    /// Send unsigned requests, no credentials looked up (public buckets), as
    /// the AWS CLI's option (key `s3_unsigned`).
    #[arg(long = "no-sign-request", visible_alias = "s3-unsigned")]
    pub(crate) s3_unsigned: bool,
    /// AWS profile to take credentials and region from.
    #[arg(long)]
    pub(crate) aws_profile: Option<String>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Permission bits in octal (`644`, `0644`, `0o644`), at most 0777.
pub(crate) fn mode_arg(s: &str) -> Result<u16, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u16::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 && !digits.is_empty() && !digits.starts_with('+') => Ok(m),
        _ => Err(format!(
            "`{s}` is not permission bits in octal, 0 to 0777 (e.g. 0644)"
        )),
    }
}

pub(crate) fn config_for(urls: Vec<String>, a: &LoaderArgs) -> AnyResult<Config> {
    Ok(Config::from_map(&config_map_for(urls, a)?)?)
}

/// The configuration keys the flags and `--config` give, as JSON.
pub(crate) fn config_map_for(urls: Vec<String>, a: &LoaderArgs) -> AnyResult<Map<String, Value>> {
    let mut m: Map<String, Value> = Map::new();
    for text in &a.config {
        match serde_json::from_str(text)? {
            Value::Object(more) => m.extend(more),
            _ => return Err("--config must be a JSON object".into()),
        }
    }
    m.insert("urls".into(), json!(urls));
    let mut set = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    if let Some(v) = a.batch_size {
        set("batch_size", json!(v));
    }
    if a.drop_last {
        set("drop_last", json!(true));
    }
    if let Some(v) = &a.memory_budget {
        set("memory_budget", json!(v));
    }
    if let Some(v) = &a.chunk_size {
        set("chunk_size", json!(v));
    }
    if let Some(v) = a.reads_in_flight {
        set("reads_in_flight", json!(v));
    }
    if let Some(v) = a.workers {
        set("workers", json!(v));
    }
    if a.no_pin {
        set("pin_cpus", json!(false));
    }
    if let Some(v) = &a.io_backend {
        set("io_backend", json!(v));
    }
    if let Some(v) = &a.memory_kind {
        set("memory_kind", json!(v));
    }
    if let Some(v) = a.epochs {
        set("epochs", json!(v));
    }
    s3_keys(&a.s3, &mut set);
    Ok(m)
}

/// The configuration keys of the S3 flags.
fn s3_keys(s3: &S3Args, set: &mut impl FnMut(&str, Value)) {
    if let Some(v) = &s3.s3_endpoint {
        set("s3_endpoint", json!(v));
    }
    if let Some(v) = &s3.s3_region {
        set("s3_region", json!(v));
    }
    if s3.s3_path_style {
        set("s3_path_style", json!(true));
    }
    if s3.s3_unsigned {
        set("s3_unsigned", json!(true));
    }
    if let Some(v) = &s3.aws_profile {
        set("aws_profile", json!(v));
    }
}

/// The configuration of `get` and `put`: `--config` objects, then the flags.
pub(crate) fn object_config(a: &ObjectArgs, more: &[(&str, Value)]) -> AnyResult<Config> {
    let mut m: Map<String, Value> = Map::new();
    for text in &a.config {
        match serde_json::from_str(text)? {
            Value::Object(keys) => m.extend(keys),
            _ => return Err("--config must be a JSON object".into()),
        }
    }
    let mut set = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    if let Some(v) = &a.part_size {
        set("part_size", json!(v));
    }
    if let Some(v) = a.parts_in_flight {
        set("parts_in_flight", json!(v));
    }
    if let Some(v) = &a.io_backend {
        set("io_backend", json!(v));
    }
    s3_keys(&a.s3, &mut set);
    for (k, v) in more {
        set(k, v.clone());
    }
    Ok(Config::for_objects(&Value::Object(m).to_string())?)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every option and argument of every command, with the command's path.
    fn all_args(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String, bool)>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            out.push((path.to_string(), id.to_string(), a.get_help().is_some()));
        }
        for sub in cmd.get_subcommands() {
            all_args(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_option_of_every_command_has_a_help_line() {
        let mut args = Vec::new();
        all_args(&Cli::command(), "ringfeed", &mut args);
        assert!(args.len() > 50, "{}", args.len());
        let bare: Vec<String> = args
            .iter()
            .filter(|(_, _, help)| !help)
            .map(|(path, id, _)| format!("{path} --{id}"))
            .collect();
        assert!(bare.is_empty(), "options without a help line: {bare:#?}");
    }
}
