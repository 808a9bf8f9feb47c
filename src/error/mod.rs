//! Errors of every subsystem, as values with the context a user needs (which
//! shard, which byte offset, which configuration key), and their one mapping
//! to the stable status codes of the C ABI ([`status`]: the table of codes
//! and [`Error::status`], which `crate::ffi::status` exports).
//!
//! `Error` is `Clone`: a worker's failure is reported to every consumer that
//! calls `next` after it, so the value is shared, never consumed.

pub mod status;

use std::io;
use std::path::PathBuf;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong inside ringfeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The configuration JSON is malformed, or a key is unknown or has a bad value.
    #[error("configuration: {0}")]
    Config(String),
    /// A dataset URL could not be parsed or expanded.
    #[error("dataset URL `{}`: {reason}", crate::redact::url(url))]
    Url { url: String, reason: String },
    /// A shard could not be opened or read.
    #[error("{op} `{path}`: {message}")]
    Io {
        op: IoOp,
        path: PathBuf,
        message: String,
        errno: i32,
    },
    /// The bytes of a shard are not a valid tar archive.
    #[error("shard `{}`: {source}", crate::redact::url(shard))]
    Tar {
        shard: String,
        #[source]
        source: TarError,
    },
    /// Two members of one sample have the same field name.
    #[error(
        "shard `{}` at byte {offset}: duplicate field `{field}` in sample `{key}`",
        crate::redact::url(shard)
    )]
    DuplicateField {
        shard: String,
        offset: u64,
        key: String,
        field: String,
    },
    /// An image or label field of a sample could not be decoded or
    /// transformed (the engine's image pipeline, `crate::image`).
    #[error("field `{field}`: {reason}")]
    Image { field: String, reason: String },
    /// The memory arena could not be set up as configured.
    #[error("memory: {0}")]
    Memory(String),
    /// The budget cannot hold what the workers need at once.
    #[error(
        "memory budget of {budget} bytes is too small: every worker waits for a free chunk \
         while no batch is outstanding ({detail}); raise `memory_budget` or lower `batch_size`"
    )]
    BudgetTooSmall { budget: u64, detail: String },
    /// io_uring was required by configuration but could not be set up.
    #[error("io_uring: {0}")]
    IoUring(String),
    /// A network read failed for good (after its retries, or at once for
    /// errors that retrying cannot fix, such as 403 and 404).
    #[error("`{}`: {} ({} after {attempts} attempt{})", crate::redact::url(url), crate::redact::text(message), kind.name(), if *attempts == 1 { "" } else { "s" })]
    Http {
        url: String,
        kind: FailKind,
        message: String,
        attempts: u32,
    },
    /// A request was throttled (503 SlowDown, 429, an S3 throttling code)
    /// for the whole retry deadline (`retry_deadline_s`), its rate cut and
    /// its attempts backed off all along.
    #[error(
        "`{url}`: still throttled after {:.1} s and {attempts} attempts, past `retry_deadline_s` ({} s): {message}",
        *waited_ms as f64 / 1000.0,
        deadline_ms / 1000
    )]
    Throttled {
        url: String,
        attempts: u32,
        waited_ms: u64,
        deadline_ms: u64,
        message: String,
    },
    /// S3 refused a request for good: the bucket and key (or prefix), the
    /// HTTP status and S3's error code from the XML body. Never holds a
    /// credential: the body's other fields (which may echo the access key
    /// and the string to sign) are not kept.
    #[error("S3 bucket `{bucket}`, key `{key}`: {code} (HTTP {status}){}", explain.map(|e| format!(": {e}")).unwrap_or_default())]
    S3 {
        bucket: String,
        key: String,
        status: u16,
        /// `NoSuchKey`, `NoSuchBucket`, `AccessDenied`, ...; the HTTP
        /// reason when the body held none.
        code: String,
        explain: Option<&'static str>,
    },
    /// The Hugging Face Hub refused a request for good (an `hf://` URL:
    /// 401 or 403 for a private or gated dataset, 404 for a repository,
    /// revision or path it does not have, with the Hub's `X-Error-Code`),
    /// or answered what its API does not (not JSON, another shape, a page
    /// past the bound). Names the repository, the revision and the path;
    /// never the token.
    #[error("Hugging Face Hub {at}: {}", crate::redact::text(message))]
    Hub {
        /// The repository, revision and path (boxed: an `Error` stays
        /// small, as every `Result` carries one).
        at: Box<HubPlace>,
        /// The answer's HTTP status (a 200 for an answer of the wrong
        /// shape).
        status: u16,
        /// The Hub's `X-Error-Code` (`RepoNotFound`, `GatedRepo`,
        /// `RevisionNotFound`, `EntryNotFound`), when it sent one.
        code: Option<String>,
        message: String,
    },
    /// No usable AWS credentials, or their source failed.
    #[error("AWS credentials: {0}")]
    Credentials(String),
    /// A resume state is malformed, or does not fit this dataset or layout.
    #[error("resume state: {0}")]
    State(String),
    /// A shard's samples are not what the plan was made from (a manifest's
    /// sample count is wrong, or the shard changed).
    #[error("shard `{}`: {message}", crate::redact::url(shard))]
    Plan { shard: String, message: String },
    /// A fault inside ringfeed, not caused by the input: `fault` says
    /// which. Maps to `RINGFEED_ERR_PANIC`.
    #[error("internal error: {detail}")]
    Internal { fault: Fault, detail: String },
    /// The loader was closed while the call was in progress.
    #[error("the loader is closed")]
    Closed,
    /// The node engine this consumer is attached to cannot be reached or
    /// started, exited, or broke the transport: `failure` says which.
    #[error("node engine: {detail}")]
    Node {
        failure: NodeFailure,
        detail: String,
    },
    /// An error of the node engine's loader, passed on to the consumer with
    /// the status the engine gave it.
    #[error("{message}")]
    Remote { status: i32, message: String },
    /// A whole-object write found its target there already, and
    /// `overwrite` is false: nothing was written.
    #[error(
        "`{}` already exists ({how}); writes never replace an object unless `overwrite` is true",
        crate::redact::url(url)
    )]
    Exists { url: String, how: String },
    /// An object read in several requests (a shard's ranges, a whole
    /// object's parts, a cache fill) changed between them: an answer had
    /// another ETag or size than the version the read was pinned to, or
    /// the server refused `If-Match` with 412. Nothing of the read is
    /// returned, so no bytes of two versions are ever spliced.
    #[error(
        "`{url}` changed while it was read: the read is pinned to {expected}, an answer was \
         {seen}; no bytes of two versions are returned (read it again for the new version)"
    )]
    Changed {
        url: String,
        /// The version the read was pinned to (`ETag "..."`, `N bytes`).
        expected: String,
        /// What the answer said (another ETag or size, or `412 Precondition Failed`).
        seen: String,
    },
    /// One part of a whole-object read or write failed for good; the
    /// upload, if any, was aborted.
    #[error("`{}` part {part}: {source}", crate::redact::url(url))]
    Part {
        url: String,
        /// From 1, as S3 numbers parts.
        part: u32,
        source: Box<Error>,
    },
    /// The cache directory (`cache_dir`) is not private to this user:
    /// another user owns it (or the link naming it), or others may write
    /// into it. Its entries could be another user's forgeries, and what
    /// this loader wrote there would be theirs to read or replace: it is
    /// neither read nor written.
    #[error(
        "cache directory `{dir}`: {why}; a cache must be a directory of this user's that no \
         one else may write into (give `cache_dir` a new path, which is made with mode 0700)"
    )]
    CacheDir { dir: PathBuf, why: CacheDirRefusal },
}

/// Where on the Hub an [`Error::Hub`] happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubPlace {
    /// `ORG/NAME`.
    pub repo: String,
    /// As the URL gave it (`main` when it gave none).
    pub revision: String,
    /// In the repository; empty for the whole repository.
    pub path: String,
}

impl std::fmt::Display for HubPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dataset `{}` at revision `{}`", self.repo, self.revision)?;
        if !self.path.is_empty() {
            write!(f, ", path `{}`", self.path)?;
        }
        Ok(())
    }
}

/// Why a cache directory is refused ([`Error::CacheDir`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheDirRefusal {
    #[error("it belongs to uid {owner}, not to this user (uid {uid})")]
    NotOwned { owner: u32, uid: u32 },
    #[error(
        "its mode {mode:04o} lets others write into it, without the sticky bit that keeps them \
         from replacing this user's files"
    )]
    OpenToOthers { mode: u32 },
    #[error(
        "it is named by a symbolic link of uid {owner}, neither this user (uid {uid}) nor root"
    )]
    LinkNotOwned { owner: u32, uid: u32 },
}

impl Error {
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }

    pub(crate) fn io(op: IoOp, path: impl Into<PathBuf>, err: &io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            message: err.to_string(),
            errno: err.raw_os_error().unwrap_or(0),
        }
    }
}

/// A malformed tar stream; offsets are bytes from the start of the shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TarError {
    #[error("not a tar archive: no valid header at byte 0")]
    NotTar,
    #[error("empty file: not a tar archive")]
    Empty,
    #[error("corrupt header at byte {offset}: checksum {stored} stored, {computed} computed")]
    BadChecksum {
        offset: u64,
        stored: u64,
        computed: u64,
    },
    #[error("corrupt header at byte {offset}: bad numeric field `{field}`")]
    BadNumber { offset: u64, field: &'static str },
    #[error("corrupt pax extended header at byte {offset}: {reason}")]
    BadPax { offset: u64, reason: String },
    #[error("{what} at byte {offset} is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        offset: u64,
        what: String,
        size: u64,
        limit: u64,
    },
    /// The shard is a compressed tar (`.tar.gz` and the like): the engine
    /// reads members in place from the bytes fetched, which a compressed
    /// stream does not allow.
    #[error(
        "{format}-compressed, not a plain tar archive: ringfeed reads uncompressed shards \
         only; decompress it first (`{tool}`) or write the shards without compression"
    )]
    Compressed {
        format: &'static str,
        tool: &'static str,
    },
    /// A GNU sparse member (`tar --sparse`): its bytes are not stored as
    /// they are read (holes are left out), so it cannot be handed over in
    /// place. WebDataset would expand the holes; the engine refuses the
    /// shard rather than give different bytes.
    #[error(
        "member `{name}` at byte {offset} is a GNU sparse file, which ringfeed does not \
         expand; re-create the shard without `--sparse` so that the member is stored whole"
    )]
    Sparse { offset: u64, name: String },
    #[error("truncated at byte {offset}: {inside} needs {missing} more bytes")]
    Truncated {
        offset: u64,
        inside: String,
        missing: u64,
    },
}

/// What a failed local operation was doing: `open`, `stat` and `list` fail
/// on the dataset's names (a missing file), `read`, `create` and `write` on
/// the data or the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Open,
    Stat,
    List,
    Read,
    Create,
    Write,
}

impl IoOp {
    pub fn name(self) -> &'static str {
        match self {
            IoOp::Open => "open",
            IoOp::Stat => "stat",
            IoOp::List => "list",
            IoOp::Read => "read",
            IoOp::Create => "create",
            IoOp::Write => "write",
        }
    }
}

impl std::fmt::Display for IoOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which fault inside ringfeed ([`Error::Internal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A thread of ringfeed's panicked: a worker, the sequencer, a read or
    /// an upload thread.
    Panic,
    /// A thread could not be started, or stopped before its work was done.
    Thread,
    /// An invariant broke: a state the code means never to reach.
    Invariant,
    /// A value could not be written as JSON.
    Json,
}

/// What failed between a process and a node engine ([`Error::Node`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeFailure {
    /// The engine could not be started on demand: its program, its lock or
    /// log file, the fork, its socket or its metrics port.
    Start,
    /// No engine answers at the socket.
    Unreachable,
    /// The attach's reply never came: the engine was killed or replaced
    /// between the connect and its reply (an engine started on demand is
    /// started again for the next try).
    NoReply,
    /// The other side (the engine; on the engine's side, the consumer)
    /// exited or closed the connection, or waiting on it failed.
    Gone,
    /// A message, record, key or descriptor from the other side is not
    /// what the protocol says.
    Protocol,
    /// A system call on this side failed: mapping the arena, duplicating
    /// the connection, the user's runtime folder, drawing an identity.
    Local,
    /// The engine refused the consumer or its request: another job's
    /// keys, another user, another protocol version, a key of another
    /// engine.
    Refused,
    /// The engine serves as many connections as it may.
    Busy,
}

impl Error {
    /// An [`Error::Internal`] of `fault`, `detail` saying what happened.
    pub fn internal(fault: Fault, detail: impl Into<String>) -> Error {
        Error::Internal {
            fault,
            detail: detail.into(),
        }
    }

    /// An [`Error::Node`] of `failure`, `detail` saying what happened.
    pub fn node(failure: NodeFailure, detail: impl Into<String>) -> Error {
        Error::Node {
            failure,
            detail: detail.into(),
        }
    }

    /// What failed with the node engine, for an [`Error::Node`]; `None`
    /// for any other error.
    pub fn node_failure(&self) -> Option<NodeFailure> {
        match self {
            Error::Node { failure, .. } => Some(*failure),
            _ => None,
        }
    }
}

/// One table of the ways a network read fails: each kind, its name in the
/// stats (`retries` by kind) and whether retrying may help.
macro_rules! fail_kinds {
    ($($(#[$doc:meta])* $kind:ident = $name:literal, retry: $retry:literal;)*) => {
        /// Why a ranged read failed, as the retry policy sees it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum FailKind {
            $($(#[$doc])* $kind,)*
        }

        impl FailKind {
            /// Every kind, in the order of `index`.
            pub const ALL: &[FailKind] = &[$(FailKind::$kind,)*];

            pub fn retryable(self) -> bool {
                match self {
                    $(FailKind::$kind => $retry,)*
                }
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(FailKind::$kind => $name,)*
                }
            }

            /// Position in [`FailKind::ALL`] (the retry counters' index).
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

fail_kinds! {
    /// 503 Slow Down, 429: back off harder.
    Throttled = "throttled", retry: true;
    /// Other 5xx.
    ServerError = "server_error", retry: true;
    /// The connection was reset or closed before the body ended.
    Reset = "reset", retry: true;
    /// The body ended early, or the response does not match the range asked.
    Truncated = "truncated", retry: true;
    /// No byte arrived for the stall time-out.
    Stalled = "stalled", retry: true;
    /// The name did not resolve (temporarily: a name that does not exist
    /// is reported at once, by the dataset's resolver).
    Dns = "dns", retry: true;
    /// Nobody listens at the address.
    Refused = "refused", retry: true;
    /// 4xx other than 429 (403, 404, ...): retrying cannot help.
    Client = "client_error", retry: false;
    /// The server speaks something we do not (chunked ranges, garbage).
    Protocol = "protocol", retry: false;
    /// The TLS handshake failed: untrusted certificate, wrong name, ...
    Tls = "tls", retry: false;
    /// The object changed during a read pinned to one version (another
    /// ETag or size, or 412 to `If-Match`): another attempt would splice.
    Changed = "changed", retry: false;
    /// A redirect that is not followed: a loop, a chain past the bound
    /// (`crate::net::redirect::MAX_REDIRECTS`), `https` to `http`, a
    /// `Location` that is no http(s) URL.
    Redirect = "redirect", retry: false;
}
