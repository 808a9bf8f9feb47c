//! What a `NodePublishVolume` asks for, turned into the `ringfeed mount`
//! command that serves it, or refused with the CSI code and a message
//! naming the field, attribute or mount option at fault — pure: no file,
//! process or network is touched here.
//!
//! A volume is named by the PersistentVolume's `volumeAttributes` (the
//! request's volume context: [`ATTRIBUTES`]) and its `mountOptions` (the
//! capability's mount flags: [`OPTIONS`], an allow-list). Both become
//! flags of `ringfeed mount`; the same flag given twice with two values
//! is refused naming both places. Each value is checked here as the
//! mount would check it (sizes, numbers, modes, the configuration keys
//! through the library's own parser), so a bad value is the kubelet's
//! `InvalidArgument` naming it, not a mount process that fails later.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use serde_json::json;
use tonic::Code;

use super::proto::VolumeCapability;
use super::proto::volume_capability::{AccessType, access_mode::Mode};

/// The CSI spec's bound on a string field (volume id, attribute keys and
/// values): 128 bytes ("Size Limits"); `target_path` is exempt from it.
pub(crate) const MAX_STRING: usize = 128;
/// The spec's bound on a map field (the volume context): 4 KiB in all.
pub(crate) const MAX_MAP: usize = 4096;
/// A path the kernel takes (`PATH_MAX`, with its NUL).
const MAX_PATH: usize = 4095;
/// A URL of a source: S3 keys are at most 1,024 bytes; the rest is room
/// for a scheme, a host and an escaped prefix.
const MAX_SOURCE: usize = 2048;

/// The volume context's keys the kubelet adds itself (pod information
/// when the CSIDriver object asks for it, service account tokens): taken,
/// and not used.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";
/// The key that marks an inline (ephemeral) volume of a pod's spec.
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";

/// A request refused: its gRPC code and why, naming what is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(Code::InvalidArgument, message)
    }
}

/// The volume attributes a PersistentVolume may give, and the mount flag
/// each becomes (`source`, `access` and `cache` are the driver's own).
pub(crate) const ATTRIBUTES: &[(&str, &str)] = &[
    (
        "source",
        "what to mount: s3://bucket/prefix/ or an http(s):// listing",
    ),
    ("region", "--region"),
    ("endpointUrl", "--endpoint-url"),
    ("pathStyle", "--s3-path-style (true or false)"),
    ("noSignRequest", "--no-sign-request (true or false)"),
    (
        "access",
        "read-only or write-once (new files as whole objects)",
    ),
    ("cache", "node (the driver's --cache-dir) or none"),
    ("uid", "--uid"),
    ("gid", "--gid"),
    ("fileMode", "--file-mode"),
    ("dirMode", "--dir-mode"),
];

/// How a mount option's value is checked.
#[derive(Clone, Copy)]
enum Check {
    /// No value: the flag alone.
    Flag,
    /// A configuration key of the library, checked by its parser.
    Key(&'static str),
    Size,
    Id,
    Mode,
    Seconds,
    Threads,
}

/// The mount options a PersistentVolume's `mountOptions` may hold: the
/// `ringfeed mount` flag, the other names it is known by, and its check.
/// What is not here is refused by name: the driver decides the cache
/// directory, the log, the daemon and the metrics; `--config` could carry
/// any key.
const OPTIONS: &[(&str, &[&str], Check)] = &[
    ("read-only", &["ro"], Check::Flag),
    ("allow-overwrite", &[], Check::Flag),
    // Always on (the kernel checks the modes shown): taken, changes nothing.
    ("allow-other", &[], Check::Flag),
    ("region", &["s3-region"], Check::Key("s3_region")),
    ("endpoint-url", &["s3-endpoint"], Check::Key("s3_endpoint")),
    ("s3-path-style", &["force-path-style"], Check::Flag),
    ("no-sign-request", &["s3-unsigned"], Check::Flag),
    ("uid", &[], Check::Id),
    ("gid", &[], Check::Id),
    ("file-mode", &[], Check::Mode),
    ("dir-mode", &[], Check::Mode),
    ("part-size", &[], Check::Key("part_size")),
    ("parts-in-flight", &[], Check::Key("parts_in_flight")),
    ("read-ahead", &[], Check::Size),
    ("kernel-read-ahead", &[], Check::Size),
    ("memory", &[], Check::Size),
    ("metadata-ttl", &[], Check::Seconds),
    ("threads", &[], Check::Threads),
];

/// The names of the mount options allowed, for messages and docs.
pub(crate) fn option_names() -> Vec<&'static str> {
    OPTIONS.iter().map(|(n, _, _)| *n).collect()
}

/// What the driver itself brings to every volume.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    /// The node's cache directory (`--cache-dir`), given to each mount
    /// unless its volume says `cache: none`.
    pub(crate) cache_dir: Option<PathBuf>,
}

/// A publish as the kubelet asks it.
pub(crate) struct Publish<'a> {
    pub(crate) volume_id: &'a str,
    pub(crate) target_path: &'a str,
    pub(crate) capability: Option<&'a VolumeCapability>,
    pub(crate) readonly: bool,
    pub(crate) context: &'a HashMap<String, String>,
}

/// The mount that serves a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) volume_id: String,
    pub(crate) source: String,
    pub(crate) target: PathBuf,
    /// The arguments of `ringfeed` (`mount SOURCE TARGET --flag=value...`):
    /// what runs, and what a second publish of the target must match.
    pub(crate) args: Vec<String>,
    pub(crate) read_only: bool,
    /// The configuration keys the mount will read its source with
    /// (region, endpoint, addressing), for the driver's look at the source.
    pub(crate) config: serde_json::Map<String, serde_json::Value>,
}

/// Checks a volume id: given, within the spec's bound, printable.
pub(crate) fn volume_id(id: &str) -> Result<(), Refusal> {
    if id.is_empty() {
        return Err(Refusal::invalid("`volume_id` is required"));
    }
    if id.len() > MAX_STRING {
        return Err(Refusal::invalid(format!(
            "`volume_id` is {} bytes, past the CSI bound of {MAX_STRING}",
            id.len()
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(Refusal::invalid(format!(
            "`volume_id` {id:?} holds a control character"
        )));
    }
    Ok(())
}

/// Checks a target path: given, absolute, no `.` or `..` in it, within
/// `PATH_MAX`, no NUL or other control character; gives it as a path.
pub(crate) fn target_path(t: &str) -> Result<PathBuf, Refusal> {
    if t.is_empty() {
        return Err(Refusal::invalid("`target_path` is required"));
    }
    if t.len() > MAX_PATH {
        return Err(Refusal::invalid(format!(
            "`target_path` is {} bytes, past PATH_MAX ({MAX_PATH})",
            t.len()
        )));
    }
    if t.chars().any(char::is_control) {
        return Err(Refusal::invalid(format!(
            "`target_path` {t:?} holds a control character"
        )));
    }
    let p = Path::new(t);
    if !p.is_absolute() {
        return Err(Refusal::invalid(format!(
            "`target_path` `{t}` is not an absolute path"
        )));
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || t.contains("/./")
        || t.ends_with("/.")
    {
        return Err(Refusal::invalid(format!(
            "`target_path` `{t}` holds `.` or `..`"
        )));
    }
    if p.parent().is_none() {
        return Err(Refusal::invalid("`target_path` is `/`"));
    }
    Ok(p.to_path_buf())
}

/// One setting for the mount: its value (none for a flag) and where it
/// came from, for the message when two places disagree.
struct Setting {
    value: Option<String>,
    from: String,
}

/// The settings of one volume, by the `ringfeed mount` flag's name.
#[derive(Default)]
struct Settings(BTreeMap<&'static str, Setting>);

impl Settings {
    fn set(
        &mut self,
        flag: &'static str,
        value: Option<String>,
        from: String,
    ) -> Result<(), Refusal> {
        if let Some(old) = self.0.get(flag) {
            if old.value != value {
                return Err(Refusal::invalid(format!(
                    "{} and {} disagree (both set --{flag})",
                    old.from, from
                )));
            }
            return Ok(());
        }
        self.0.insert(flag, Setting { value, from });
        Ok(())
    }

    fn has(&self, flag: &str) -> bool {
        self.0.contains_key(flag)
    }
}

/// Checks `value` of the option `flag` (named `what` in a message).
fn check(c: Check, flag: &str, value: Option<&str>, what: &str) -> Result<(), Refusal> {
    let value = match (c, value) {
        (Check::Flag, None) => return Ok(()),
        (Check::Flag, Some(_)) => {
            return Err(Refusal::invalid(format!("{what}: --{flag} takes no value")));
        }
        (_, None) => return Err(Refusal::invalid(format!("{what}: --{flag} needs a value"))),
        (_, Some(v)) => v,
    };
    let bad = |why: String| Refusal::invalid(format!("{what}: {why}"));
    match c {
        Check::Flag => Ok(()),
        Check::Key(key) => {
            let one =
                serde_json::Value::Object([(key.to_string(), json!(value))].into_iter().collect());
            ringfeed::Config::for_objects(&one.to_string())
                .map(|_| ())
                .map_err(|e| bad(e.to_string()))
        }
        Check::Size => ringfeed::config::parse_size(value)
            .map(|_| ())
            .map_err(|e| bad(format!("`{value}` is not a size: {e}"))),
        Check::Id => {
            if value.bytes().all(|b| b.is_ascii_digit()) && value.parse::<u32>().is_ok() {
                Ok(())
            } else {
                Err(bad(format!(
                    "`{value}` is not a user or group id (0 to 4294967295)"
                )))
            }
        }
        Check::Mode => crate::args::mode_arg(value).map(|_| ()).map_err(bad),
        Check::Seconds => match value.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(()),
            _ => Err(bad(format!(
                "`{value}` is not a number of seconds, 0 or more"
            ))),
        },
        Check::Threads => match value.parse::<usize>() {
            // Each thread answers one kernel request at a time; past a
            // thousand they would only wait on the memory budget.
            Ok(n) if (1..=1024).contains(&n) => Ok(()),
            _ => Err(bad(format!("`{value}` is not a thread count, 1 to 1024"))),
        },
    }
}

/// A mount option as a PV's `mountOptions` holds it: `name`, `name=value`,
/// `--name`, `--name=value` or `name value`; gives the flag and its value.
fn mount_option(raw: &str) -> Result<(&'static str, Check, Option<String>), Refusal> {
    if raw.chars().any(char::is_control) {
        return Err(Refusal::invalid(format!(
            "mount option {raw:?} holds a control character"
        )));
    }
    let text = raw.trim();
    let text = text.strip_prefix("--").unwrap_or(text);
    if text.is_empty() {
        return Err(Refusal::invalid("an empty mount option"));
    }
    let (name, value) = match text.find(['=', ' ']) {
        Some(i) => (&text[..i], Some(text[i + 1..].trim().to_string())),
        None => (text, None),
    };
    let found = OPTIONS
        .iter()
        .find(|(n, aliases, _)| *n == name || aliases.contains(&name));
    match found {
        Some((flag, _, c)) => {
            check(*c, flag, value.as_deref(), &format!("mount option `{raw}`"))?;
            Ok((flag, *c, value))
        }
        None => Err(Refusal::invalid(format!(
            "mount option `{name}` is not allowed (allowed: {})",
            option_names().join(", ")
        ))),
    }
}

/// `true` or `false`, as a boolean attribute must be.
fn boolean(key: &str, v: &str) -> Result<bool, Refusal> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Refusal::invalid(format!(
            "volume attribute `{key}`: `{v}` is not true or false"
        ))),
    }
}

/// Whether a source takes writes (an `http(s)://` listing or a Hub
/// dataset does not).
fn writable(source: &str) -> bool {
    source.starts_with("s3://")
}

/// Checks the `source` attribute's form (the driver then lists it).
fn source(v: Option<&String>) -> Result<String, Refusal> {
    let Some(v) = v else {
        return Err(Refusal::invalid(
            "volume attribute `source` is required (s3://bucket/prefix/, an https:// listing or \
             hf://datasets/ORG/NAME)",
        ));
    };
    let bad = |why: &str| Refusal::invalid(format!("volume attribute `source` `{v}`: {why}"));
    if v.len() > MAX_SOURCE {
        return Err(bad("too long"));
    }
    if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("holds a space or a control character"));
    }
    if let Some(rest) = v.strip_prefix("s3://") {
        if rest.split('/').next().is_none_or(str::is_empty) {
            return Err(bad("names no bucket"));
        }
        return Ok(v.clone());
    }
    if let Some(rest) = v
        .strip_prefix("https://")
        .or_else(|| v.strip_prefix("http://"))
    {
        if rest.split('/').next().is_none_or(str::is_empty) {
            return Err(bad("names no host"));
        }
        return Ok(v.clone());
    }
    if let Some(rest) = v.strip_prefix("hf://") {
        // The form (datasets only, the revision) is the Hub client's to
        // check: the driver lists the source before mounting it.
        if rest.is_empty() {
            return Err(bad("names no dataset"));
        }
        return Ok(v.clone());
    }
    Err(bad(
        "not an s3://, http(s):// or hf:// URL (a node's own directory is a hostPath volume, not \
         this driver's)",
    ))
}

/// Checks the capability: a mount (block access is refused), an access
/// mode of the spec's, a file system type of ours or none. Gives whether
/// the mode allows writes.
fn capability(cap: Option<&VolumeCapability>) -> Result<(Vec<String>, bool), Refusal> {
    let Some(cap) = cap else {
        return Err(Refusal::invalid("`volume_capability` is required"));
    };
    let flags = match &cap.access_type {
        None => {
            return Err(Refusal::invalid(
                "`volume_capability.access_type` is required (mount)",
            ));
        }
        Some(AccessType::Block(_)) => {
            return Err(Refusal::new(
                Code::FailedPrecondition,
                "`volume_capability` asks for block access: a ringfeed volume is a file system \
                 (volumeMode: Filesystem)",
            ));
        }
        Some(AccessType::Mount(m)) => {
            if !["", "fuse", "fuse.ringfeed", "ringfeed"].contains(&m.fs_type.as_str()) {
                return Err(Refusal::invalid(format!(
                    "`volume_capability.mount.fs_type` `{}` is not ours (leave it empty)",
                    m.fs_type
                )));
            }
            m.mount_flags.clone()
        }
    };
    let Some(access) = &cap.access_mode else {
        return Err(Refusal::invalid(
            "`volume_capability.access_mode` is required",
        ));
    };
    let writes = match Mode::try_from(access.mode) {
        Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly) => false,
        Ok(Mode::SingleNodeWriter | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter) => {
            true
        }
        Ok(Mode::Unknown) | Err(_) => {
            return Err(Refusal::invalid(format!(
                "`volume_capability.access_mode` {} is not a mode of CSI v1.3.0 (1 to 5)",
                access.mode
            )));
        }
    };
    Ok((flags, writes))
}

/// The mount that serves `p`, or why not.
pub(crate) fn plan(p: &Publish<'_>, node: &Node) -> Result<Plan, Refusal> {
    volume_id(p.volume_id)?;
    let target = target_path(p.target_path)?;
    let (flags, mode_writes) = capability(p.capability)?;
    let total: usize = p.context.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_MAP {
        return Err(Refusal::invalid(format!(
            "the volume context is {total} bytes, past the CSI bound of {MAX_MAP}"
        )));
    }
    if p.context.get(EPHEMERAL).is_some_and(|v| v == "true") {
        return Err(Refusal::invalid(format!(
            "volume attribute `{EPHEMERAL}`: inline (ephemeral) volumes are not served: a pod's \
             author would choose what the driver's credentials read; use a PersistentVolume"
        )));
    }
    let source = source(p.context.get("source"))?;
    let mut s = Settings::default();
    let mut access = None;
    let mut cache = None;
    let mut keys: Vec<&String> = p.context.keys().collect();
    keys.sort();
    for key in keys {
        let v = &p.context[key];
        let from = format!("volume attribute `{key}`");
        if key.starts_with(KUBELET_PREFIX) || key == "source" {
            continue;
        }
        if v.len() > MAX_STRING || key.len() > MAX_STRING {
            return Err(Refusal::invalid(format!(
                "{from} is past the CSI bound of {MAX_STRING} bytes"
            )));
        }
        let (flag, c, value) = match key.as_str() {
            "access" => {
                match v.as_str() {
                    "read-only" | "write-once" => access = Some(v.as_str()),
                    _ => {
                        return Err(Refusal::invalid(format!(
                            "{from}: `{v}` is not read-only or write-once"
                        )));
                    }
                }
                continue;
            }
            "cache" => {
                match v.as_str() {
                    "none" => cache = Some(false),
                    "node" if node.cache_dir.is_some() => cache = Some(true),
                    "node" => {
                        return Err(Refusal::new(
                            Code::FailedPrecondition,
                            format!("{from}: `node`, but the driver runs without --cache-dir"),
                        ));
                    }
                    _ => {
                        return Err(Refusal::invalid(format!(
                            "{from}: `{v}` is not node or none"
                        )));
                    }
                }
                continue;
            }
            "region" => ("region", Check::Key("s3_region"), Some(v.clone())),
            "endpointUrl" => ("endpoint-url", Check::Key("s3_endpoint"), Some(v.clone())),
            "pathStyle" | "noSignRequest" => {
                if !boolean(key, v)? {
                    continue;
                }
                let flag = if key == "pathStyle" {
                    "s3-path-style"
                } else {
                    "no-sign-request"
                };
                (flag, Check::Flag, None)
            }
            "uid" => ("uid", Check::Id, Some(v.clone())),
            "gid" => ("gid", Check::Id, Some(v.clone())),
            "fileMode" => ("file-mode", Check::Mode, Some(v.clone())),
            "dirMode" => ("dir-mode", Check::Mode, Some(v.clone())),
            _ => {
                let known: Vec<&str> = ATTRIBUTES.iter().map(|(k, _)| *k).collect();
                return Err(Refusal::invalid(format!(
                    "unknown volume attribute `{key}` (known: {})",
                    known.join(", ")
                )));
            }
        };
        check(c, flag, value.as_deref(), &from)?;
        s.set(flag, value, from)?;
    }
    for raw in &flags {
        let (flag, _, value) = mount_option(raw)?;
        s.set(flag, value, format!("mount option `{raw}`"))?;
    }
    if access == Some("write-once") && !writable(&source) {
        return Err(Refusal::invalid(format!(
            "volume attribute `access`: write-once, but `{source}` takes no writes (an http(s):// \
             listing is read-only)"
        )));
    }
    let read_only = p.readonly
        || !mode_writes
        || access == Some("read-only")
        || s.has("read-only")
        || !writable(&source);
    let mut args = vec![
        "mount".to_string(),
        source.clone(),
        target.to_string_lossy().into_owned(),
        // Pods run as any user: the modes shown decide who may do what
        // (the mount asks the kernel for `default_permissions`).
        "--allow-other".to_string(),
    ];
    let mut config = serde_json::Map::new();
    for (flag, set) in &s.0 {
        if matches!(*flag, "allow-other" | "read-only") {
            continue;
        }
        match &set.value {
            Some(v) => args.push(format!("--{flag}={v}")),
            None => args.push(format!("--{flag}")),
        }
        let key = match *flag {
            "region" => Some(("s3_region", json!(set.value))),
            "endpoint-url" => Some(("s3_endpoint", json!(set.value))),
            "s3-path-style" => Some(("s3_path_style", json!(true))),
            "no-sign-request" => Some(("s3_unsigned", json!(true))),
            _ => None,
        };
        if let Some((k, v)) = key {
            config.insert(k.to_string(), v);
        }
    }
    if read_only {
        args.push("--read-only".to_string());
    }
    if cache != Some(false)
        && let Some(dir) = &node.cache_dir
    {
        args.push(format!("--cache-dir={}", dir.display()));
    }
    Ok(Plan {
        volume_id: p.volume_id.to_string(),
        source,
        target,
        args,
        read_only,
        config,
    })
}

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
