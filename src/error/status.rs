//! The status codes of the C ABI, declared once beside the errors: the
//! `statuses!` table below gives each its name, value and documentation,
//! and makes from it the `RINGFEED_*` constants and [`STATUSES`] (which
//! `ringfeed_status_name` reads and `tests/header.rs` writes into
//! `include/ringfeed.h` as `#define`s), so a code is added in one place.
//! Also here: the one mapping from an [`Error`] to its status
//! ([`Error::status`]), a fact of the error wherever it is reported (the C
//! ABI, a node engine's refusal to a consumer). `crate::ffi::status`
//! exports them.
//!
//! Values never change once released: C programs and the Python package
//! compile them in.

use std::ffi::CStr;

use super::{Error, IoOp};

/// One status code of the C ABI.
#[derive(Debug, Clone, Copy)]
pub struct Status {
    /// The value the entry points return.
    pub code: i32,
    /// The C name, `RINGFEED_...`.
    pub name: &'static CStr,
    /// Its documentation: the doc comment's lines, each ending in `\n` and
    /// starting with the space after `///`.
    pub doc: &'static str,
}

/// `name` (NUL-terminated) as a C string, at compile time.
const fn c_name(name: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(name.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a status name holds a NUL"),
    }
}

/// Makes the constants and [`STATUSES`] from one list of
/// `/// doc` `NAME = value;` entries.
macro_rules! statuses {
    ($( $(#[doc = $doc:literal])* $name:ident = $code:literal; )*) => {
        $(
            $(#[doc = $doc])*
            pub const $name: i32 = $code;
        )*

        /// Every status code, in the header's order.
        pub const STATUSES: &[Status] = &[$(
            Status {
                code: $code,
                name: c_name(concat!(stringify!($name), "\0")),
                doc: concat!($($doc, "\n",)*),
            },
        )*];
    };
}

statuses! {
    /// Success; for `ringfeed_loader_next`, a batch was written.
    RINGFEED_OK = 0;
    /// `ringfeed_loader_next`: every batch of the current epoch was handed out.
    RINGFEED_END_OF_EPOCH = 1;
    /// `ringfeed_loader_next`: no batch arrived within the time-out.
    RINGFEED_TIMEOUT = 2;
    /// `ringfeed_loader_next`: every epoch is over; no batch will come.
    RINGFEED_FINISHED = 3;
    /// A pointer argument is NULL or misaligned, or a string is not UTF-8.
    RINGFEED_ERR_INVALID_ARGUMENT = -1;
    /// The loader handle is unknown or closed, or the batch was already released.
    RINGFEED_ERR_INVALID_HANDLE = -2;
    /// The configuration is malformed, or a key is unknown or has a bad value,
    /// or no AWS credentials could be found for `s3://` URLs, or the cache
    /// directory (`cache_dir`) is not private to this user.
    RINGFEED_ERR_CONFIG = -3;
    /// A dataset URL is malformed, unsupported, or names nothing, or the server
    /// refused it for good (HTTP 4xx; S3 NoSuchKey, NoSuchBucket, AccessDenied;
    /// the Hugging Face Hub's RepoNotFound, GatedRepo, RevisionNotFound,
    /// EntryNotFound), or a redirect was not followed (a loop, too many, https
    /// to http),
    /// or an object changed while it was read (another ETag or size, or 412 to
    /// `If-Match`): no bytes of two versions are returned.
    RINGFEED_ERR_DATASET = -4;
    /// Reading a shard failed.
    RINGFEED_ERR_IO = -5;
    /// A shard is not a valid WebDataset tar (corrupt, truncated, duplicate field),
    /// or a sample's image or label field cannot be decoded or transformed.
    RINGFEED_ERR_FORMAT = -6;
    /// Memory could not be set up as configured, or the budget is too small.
    RINGFEED_ERR_MEMORY = -7;
    /// The caller's buffer is too small; the needed size was written.
    RINGFEED_ERR_BUFFER_TOO_SMALL = -8;
    /// The loader was closed while the call waited.
    RINGFEED_ERR_CLOSED = -9;
    /// An internal error: a Rust panic caught at the boundary or in an engine
    /// thread, or a thread that could not be started.
    RINGFEED_ERR_PANIC = -10;
    /// io_uring was required by the configuration but is not available.
    RINGFEED_ERR_IO_URING = -11;
    /// A network read failed after its retries (throttling, 5xx, resets,
    /// truncation, stalls, refused connections).
    RINGFEED_ERR_NETWORK = -12;
    /// A resume state (well formed: a malformed one is `RINGFEED_ERR_CONFIG`)
    /// does not fit this dataset, its epoch settings or its layout, or an
    /// elastic resume lacks an old consumer's state; or a shard's samples do not
    /// match the plan (a manifest's sample count is wrong).
    RINGFEED_ERR_STATE = -13;
    /// The node engine (`"node"`) could not be reached or started, refused the
    /// consumer (another user, a configuration that disagrees with the
    /// engine's on a dataset or epoch key), exited, or broke the transport.
    RINGFEED_ERR_NODE = -14;
    /// A whole-object write found the object there already (S3 answered
    /// `PreconditionFailed` to `If-None-Match: *`, or the local file exists)
    /// and `overwrite` is false. Nothing was written.
    RINGFEED_ERR_EXISTS = -15;
}

impl Error {
    /// The status C sees for this error: the one mapping from errors to
    /// status codes.
    pub fn status(&self) -> i32 {
        match self {
            Error::Config(_) => RINGFEED_ERR_CONFIG,
            Error::Url { .. } => RINGFEED_ERR_DATASET,
            Error::Io {
                op: IoOp::Open | IoOp::List | IoOp::Stat,
                ..
            } => RINGFEED_ERR_DATASET,
            Error::Io { .. } => RINGFEED_ERR_IO,
            Error::Tar { .. } | Error::DuplicateField { .. } | Error::Image { .. } => {
                RINGFEED_ERR_FORMAT
            }
            Error::Memory(_) | Error::BudgetTooSmall { .. } => RINGFEED_ERR_MEMORY,
            Error::IoUring(_) => RINGFEED_ERR_IO_URING,
            Error::Closed => RINGFEED_ERR_CLOSED,
            Error::Internal { .. } => RINGFEED_ERR_PANIC,
            Error::Http { kind, .. } if !kind.retryable() && *kind != super::FailKind::Protocol => {
                RINGFEED_ERR_DATASET
            }
            Error::Http { .. } | Error::Throttled { .. } => RINGFEED_ERR_NETWORK,
            // Missing or denied objects and buckets are the dataset's fault;
            // S3's 5xx codes (InternalError, SlowDown) are the network's.
            Error::S3 { status, .. } if *status < 500 => RINGFEED_ERR_DATASET,
            Error::S3 { .. } => RINGFEED_ERR_NETWORK,
            // The Hub's refusals (a private, gated or missing dataset,
            // revision or path) are the dataset's; its 5xx, and answers
            // its API does not document, the network's.
            Error::Hub { status, .. } if (400..500).contains(status) && *status != 429 => {
                RINGFEED_ERR_DATASET
            }
            Error::Hub { .. } => RINGFEED_ERR_NETWORK,
            Error::Credentials(_) => RINGFEED_ERR_CONFIG,
            Error::State(_) | Error::Plan { .. } => RINGFEED_ERR_STATE,
            Error::Node { .. } => RINGFEED_ERR_NODE,
            Error::Remote { status, .. } => *status,
            Error::Exists { .. } => RINGFEED_ERR_EXISTS,
            // The data is not one object any more: the dataset's, as a
            // 412 to `If-Match` is a refusal for good.
            Error::Changed { .. } => RINGFEED_ERR_DATASET,
            Error::Part { source, .. } => source.status(),
            // The configuration names a directory that cannot be used.
            Error::CacheDir { .. } => RINGFEED_ERR_CONFIG,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::error::FailKind;

    #[test]
    fn s3_errors_map_to_dataset_network_and_config() {
        let s3 = |status, code: &str| Error::S3 {
            bucket: "b".into(),
            key: "k".into(),
            status,
            code: code.into(),
            explain: None,
        };
        assert_eq!(s3(404, "NoSuchKey").status(), RINGFEED_ERR_DATASET);
        assert_eq!((s3(404, "NoSuchBucket")).status(), RINGFEED_ERR_DATASET);
        assert_eq!((s3(403, "AccessDenied")).status(), RINGFEED_ERR_DATASET);
        assert_eq!((s3(503, "SlowDown")).status(), RINGFEED_ERR_NETWORK);
        assert_eq!(
            (Error::Credentials("none".into())).status(),
            RINGFEED_ERR_CONFIG
        );
        let http = Error::Http {
            url: "s3://b/k".into(),
            kind: FailKind::Client,
            message: "HTTP 403".into(),
            attempts: 1,
        };
        assert_eq!((http).status(), RINGFEED_ERR_DATASET);
    }

    #[test]
    fn every_status_has_one_name_and_one_value() {
        let names: HashSet<_> = STATUSES.iter().map(|s| s.name).collect();
        let codes: HashSet<_> = STATUSES.iter().map(|s| s.code).collect();
        assert_eq!(names.len(), STATUSES.len());
        assert_eq!(codes.len(), STATUSES.len());
        for s in STATUSES {
            let name = s.name.to_str().unwrap();
            assert!(name.starts_with("RINGFEED_"), "{name}");
            assert!(!s.doc.trim().is_empty(), "{name} has no doc");
        }
        assert_eq!(STATUSES[0].name, c"RINGFEED_OK");
        assert_eq!(STATUSES[0].doc.lines().count(), 1);
        assert!(STATUSES[0].doc.starts_with(" Success"));
    }

    /// Each kind of error, and the status C sees for it. The match below
    /// has no wildcard: a new variant does not compile until it is listed.
    #[test]
    fn every_error_maps_to_its_status() {
        use crate::error::{FailKind, TarError};
        let io = |op| Error::io(op, "/x", &std::io::Error::from_raw_os_error(2));
        let http = |kind| Error::Http {
            url: "u".into(),
            kind,
            message: "m".into(),
            attempts: 1,
        };
        let s3 = |status| Error::S3 {
            bucket: "b".into(),
            key: "k".into(),
            status,
            code: "c".into(),
            explain: None,
        };
        let hub = |status| Error::Hub {
            at: Box::new(crate::error::HubPlace {
                repo: "o/n".into(),
                revision: "main".into(),
                path: String::new(),
            }),
            status,
            code: None,
            message: "m".into(),
        };
        let mut cases = vec![
            (hub(401), RINGFEED_ERR_DATASET),
            (hub(404), RINGFEED_ERR_DATASET),
            (hub(429), RINGFEED_ERR_NETWORK),
            (hub(502), RINGFEED_ERR_NETWORK),
            (hub(200), RINGFEED_ERR_NETWORK),
            (Error::Config("c".into()), RINGFEED_ERR_CONFIG),
            (
                Error::Url {
                    url: "u".into(),
                    reason: "r".into(),
                },
                RINGFEED_ERR_DATASET,
            ),
            (
                Error::Tar {
                    shard: "s".into(),
                    source: TarError::NotTar,
                },
                RINGFEED_ERR_FORMAT,
            ),
            (
                Error::DuplicateField {
                    shard: "s".into(),
                    offset: 0,
                    key: "k".into(),
                    field: "f".into(),
                },
                RINGFEED_ERR_FORMAT,
            ),
            (Error::Memory("m".into()), RINGFEED_ERR_MEMORY),
            (
                Error::BudgetTooSmall {
                    budget: 1,
                    detail: "d".into(),
                },
                RINGFEED_ERR_MEMORY,
            ),
            (Error::IoUring("u".into()), RINGFEED_ERR_IO_URING),
            (s3(403), RINGFEED_ERR_DATASET),
            (s3(404), RINGFEED_ERR_DATASET),
            (s3(500), RINGFEED_ERR_NETWORK),
            (s3(503), RINGFEED_ERR_NETWORK),
            (Error::Credentials("c".into()), RINGFEED_ERR_CONFIG),
            (Error::State("s".into()), RINGFEED_ERR_STATE),
            (
                Error::Plan {
                    shard: "s".into(),
                    message: "m".into(),
                },
                RINGFEED_ERR_STATE,
            ),
            (
                Error::internal(crate::error::Fault::Panic, "i"),
                RINGFEED_ERR_PANIC,
            ),
            (Error::Closed, RINGFEED_ERR_CLOSED),
            (
                Error::node(crate::error::NodeFailure::Gone, "n"),
                RINGFEED_ERR_NODE,
            ),
            (
                Error::Remote {
                    status: RINGFEED_ERR_FORMAT,
                    message: "m".into(),
                },
                RINGFEED_ERR_FORMAT,
            ),
            (
                Error::Exists {
                    url: "s3://b/k".into(),
                    how: "h".into(),
                },
                RINGFEED_ERR_EXISTS,
            ),
            (
                Error::Changed {
                    url: "s3://b/k".into(),
                    expected: "ETag \"1\"".into(),
                    seen: "ETag \"2\"".into(),
                },
                RINGFEED_ERR_DATASET,
            ),
            (
                // A part's failure has its cause's status.
                Error::Part {
                    url: "s3://b/k".into(),
                    part: 3,
                    source: Box::new(s3(403)),
                },
                RINGFEED_ERR_DATASET,
            ),
            (
                Error::CacheDir {
                    dir: "/c".into(),
                    why: crate::error::CacheDirRefusal::OpenToOthers { mode: 0o777 },
                },
                RINGFEED_ERR_CONFIG,
            ),
        ];
        cases.push((
            Error::Image {
                field: "jpg".into(),
                reason: "JPEG: Premature end of JPEG file".into(),
            },
            RINGFEED_ERR_FORMAT,
        ));
        for (op, want) in [
            (IoOp::Open, RINGFEED_ERR_DATASET),
            (IoOp::Stat, RINGFEED_ERR_DATASET),
            (IoOp::List, RINGFEED_ERR_DATASET),
            (IoOp::Read, RINGFEED_ERR_IO),
            (IoOp::Create, RINGFEED_ERR_IO),
            (IoOp::Write, RINGFEED_ERR_IO),
        ] {
            cases.push((io(op), want));
        }
        for &kind in FailKind::ALL {
            // Failures retrying cannot fix are the dataset's (a 404, a
            // refused certificate), except a server that speaks garbage.
            let want = if kind.retryable() || kind == FailKind::Protocol {
                RINGFEED_ERR_NETWORK
            } else {
                RINGFEED_ERR_DATASET
            };
            cases.push((http(kind), want));
        }
        cases.push((
            Error::Throttled {
                url: "u".into(),
                attempts: 40,
                waited_ms: 600_000,
                deadline_ms: 600_000,
                message: "HTTP 503 Slow Down".into(),
            },
            RINGFEED_ERR_NETWORK,
        ));
        for (e, want) in &cases {
            // Every variant is listed (no wildcard).
            match e {
                Error::Config(_)
                | Error::Url { .. }
                | Error::Io { .. }
                | Error::Tar { .. }
                | Error::DuplicateField { .. }
                | Error::Image { .. }
                | Error::Memory(_)
                | Error::BudgetTooSmall { .. }
                | Error::IoUring(_)
                | Error::Http { .. }
                | Error::Throttled { .. }
                | Error::S3 { .. }
                | Error::Hub { .. }
                | Error::Credentials(_)
                | Error::State(_)
                | Error::Plan { .. }
                | Error::Internal { .. }
                | Error::Closed
                | Error::Node { .. }
                | Error::Remote { .. }
                | Error::Exists { .. }
                | Error::Changed { .. }
                | Error::Part { .. }
                | Error::CacheDir { .. } => {}
            }
            let code = e.status();
            assert_eq!(code, *want, "{e}");
            assert!(STATUSES.iter().any(|s| s.code == code), "{e}: {code}");
        }
    }
}
