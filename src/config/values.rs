//! What a key's value may be: the value types of the configuration
//! ([`IoBackend`], [`Toggle`]) and one parser per kind of value (an integer,
//! a size, a choice, a secret, ...). Each takes the key for its message, so
//! every error names the key and says what was expected; the key table in
//! `keys.rs` picks one per key.

use std::path::PathBuf;

use serde_json::Value;

use crate::cache::{FillMode, MinFree};
use crate::error::{Error, Result};
use crate::memory::MemoryKind;
pub use crate::net::s3::upload::Checksum;
use crate::plan::Remainder;

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

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn bad(key: &str, want: &str, v: &Value) -> Error {
    Error::config(format!("`{key}` must be {want}, got {v}"))
}

pub(super) fn integer(key: &str, v: &Value) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| bad(key, "a non-negative integer", v))
}

pub(super) fn positive(key: &str, v: &Value) -> Result<u64> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(bad(key, "a positive integer", v)),
    }
}

/// A positive integer, or `"auto"` (0).
pub(super) fn auto_or_positive(key: &str, v: &Value) -> Result<u64> {
    match (v.as_u64(), v.as_str()) {
        (Some(n), _) if n > 0 => Ok(n),
        (_, Some("auto")) => Ok(0),
        _ => Err(bad(key, "a positive integer or \"auto\"", v)),
    }
}

pub(super) fn boolean(key: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad(key, "true or false", v))
}

pub(super) fn choice<'a>(key: &str, v: &Value, allowed: &[&'a str]) -> Result<&'a str> {
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

pub(super) fn toggle(key: &str, v: &Value) -> Result<Toggle> {
    if let Some(b) = v.as_bool() {
        return Ok(if b { Toggle::On } else { Toggle::Off });
    }
    Ok(match choice(key, v, &["auto", "on", "off"])? {
        "auto" => Toggle::Auto,
        "on" => Toggle::On,
        _ => Toggle::Off,
    })
}

/// Where a loader's batches come from: its own engine, or a node engine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodeMode {
    /// An engine in this process.
    #[default]
    Off,
    /// The node engine of this user and dataset, started if none runs.
    Auto,
    /// The node engine listening at this socket (started by `ringfeed node`).
    Socket(std::path::PathBuf),
}

pub(super) fn node_mode(key: &str, v: &Value) -> Result<NodeMode> {
    if v.as_bool() == Some(false) {
        return Ok(NodeMode::Off);
    }
    match v.as_str() {
        Some("off") => Ok(NodeMode::Off),
        Some("auto") => Ok(NodeMode::Auto),
        Some(p) if p.starts_with('/') && !p.contains('\0') => Ok(NodeMode::Socket(p.into())),
        _ => Err(bad(
            key,
            "\"off\", \"auto\" or the absolute path of a node engine's socket",
            v,
        )),
    }
}

pub(super) fn urls(key: &str, v: &Value) -> Result<Vec<String>> {
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

/// A CPU list: kernel list text (`"0-3,8"`) or an array of CPU numbers;
/// not empty.
pub(super) fn cpu_list(key: &str, v: &Value) -> Result<Vec<usize>> {
    let want = "a CPU list (\"0-3,8\") or an array of CPU numbers";
    let mut cpus = match v {
        Value::String(s) => crate::topology::parse_cpu_list(s)
            .map_err(|e| Error::config(format!("`{key}` must be {want}: {e}")))?,
        Value::Array(items) => items
            .iter()
            .map(|i| match i.as_u64() {
                Some(n) if n < libc::CPU_SETSIZE as u64 => Ok(n as usize),
                _ => Err(bad(key, want, i)),
            })
            .collect::<Result<Vec<_>>>()?,
        other => return Err(bad(key, want, other)),
    };
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.is_empty() {
        return Err(bad(key, "a non-empty CPU list", v));
    }
    Ok(cpus)
}

/// `"auto"` (`None`) or a NUMA node number.
pub(super) fn numa_node(key: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::String(s) if s == "auto" => Ok(None),
        _ => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| bad(key, "\"auto\" or a NUMA node number", v)),
    }
}

pub(super) fn text(key: &str, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ => Err(bad(key, "a non-empty string", v)),
    }
}

/// A key suffix (`s3_suffix`): any string, `""` included, on one line.
pub(super) fn suffix(key: &str, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(s) if !s.chars().any(char::is_control) => Ok(s.to_string()),
        _ => Err(bad(
            key,
            "a string without control characters (\"\" for every key)",
            v,
        )),
    }
}

/// A credential: like `text`, but the message never shows the value.
pub(super) fn secret(key: &str, v: &Value) -> Result<String> {
    match v.as_str() {
        Some(s) if !s.trim().is_empty() && !s.contains(['\r', '\n']) => Ok(s.trim().to_string()),
        _ => Err(Error::config(format!(
            "`{key}` must be a non-empty string on one line (value not shown)"
        ))),
    }
}

pub(super) fn size(key: &str, v: &Value) -> Result<u64> {
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

/// A size, or "auto" (0): the engine picks it at open.
pub(super) fn size_or_auto(key: &str, v: &Value) -> Result<u64> {
    match v.as_str() {
        Some("auto") => Ok(0),
        _ => size(key, v),
    }
}

pub(super) fn fill_mode(key: &str, v: &Value) -> Result<FillMode> {
    Ok(match choice(key, v, &["spare", "always"])? {
        "spare" => FillMode::Spare,
        _ => FillMode::Always,
    })
}

/// A size above 0.
pub(super) fn positive_size(key: &str, v: &Value) -> Result<u64> {
    match size(key, v)? {
        0 => Err(bad(key, "a size above 0", v)),
        n => Ok(n),
    }
}

/// A free-space floor: a size, or a percentage from 0 to 99 ("10%").
pub(super) fn min_free(key: &str, v: &Value) -> Result<MinFree> {
    if let Some(p) = v.as_str().and_then(|s| s.trim().strip_suffix('%')) {
        return match p.trim().parse::<f64>() {
            Ok(f) if (0.0..100.0).contains(&f) => Ok(MinFree::Fraction(f / 100.0)),
            _ => Err(bad(
                key,
                "a size, or a percentage from 0 to 99 such as \"10%\"",
                v,
            )),
        };
    }
    size(key, v).map(MinFree::Bytes)
}

pub(super) fn checksum(key: &str, v: &Value) -> Result<Checksum> {
    Ok(
        match choice(key, v, &["crc32c", "crc64nvme", "md5", "none"])? {
            "crc32c" => Checksum::Crc32c,
            "crc64nvme" => Checksum::Crc64Nvme,
            "md5" => Checksum::Md5,
            _ => Checksum::None,
        },
    )
}

pub(super) fn io_backend(key: &str, v: &Value) -> Result<IoBackend> {
    Ok(match choice(key, v, &["auto", "io_uring", "threads"])? {
        "auto" => IoBackend::Auto,
        "io_uring" => IoBackend::IoUring,
        _ => IoBackend::Threads,
    })
}

/// `None` for `"auto"`: the best available kind.
pub(super) fn memory_kind(key: &str, v: &Value) -> Result<Option<MemoryKind>> {
    Ok(
        match choice(key, v, &["auto", "hugetlb", "thp", "normal"])? {
            "auto" => None,
            "hugetlb" => Some(MemoryKind::Hugetlb),
            "thp" => Some(MemoryKind::Thp),
            _ => Some(MemoryKind::Normal),
        },
    )
}

pub(super) fn remainder(key: &str, v: &Value) -> Result<Remainder> {
    Ok(match choice(key, v, &["pad", "drop"])? {
        "pad" => Remainder::Pad,
        _ => Remainder::Drop,
    })
}

pub(super) fn file_path(key: &str, v: &Value) -> Result<PathBuf> {
    let p = v
        .as_str()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad(key, "a file path", v))?;
    Ok(p.into())
}

pub(super) fn attempts(key: &str, v: &Value) -> Result<u32> {
    u32::try_from(positive(key, v)?)
        .ok()
        .filter(|&n| n <= 100)
        .ok_or_else(|| bad(key, "an integer from 1 to 100", v))
}

/// An S3 endpoint: scheme, host and port, without the trailing `/`.
pub(super) fn endpoint(key: &str, v: &Value) -> Result<String> {
    let e = text(key, v)?;
    match crate::net::http::parse_url(&e) {
        Ok(p) if p.target == "/" => {}
        Ok(_) => return Err(bad(key, "scheme, host and port only, no path", v)),
        Err(why) => {
            return Err(Error::config(format!("`{key}`: \"{e}\": {why}")));
        }
    }
    Ok(e.trim_end_matches('/').to_string())
}

pub(super) fn region(key: &str, v: &Value) -> Result<String> {
    let r = text(key, v)?;
    if !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(bad(key, "a region name such as \"us-east-1\"", v));
    }
    Ok(r)
}

/// Resume states: one (a string) or a list; null means none. Each is
/// checked to be a well-formed state here; whether it fits the dataset is
/// decided at open.
pub(super) fn resume_states(key: &str, v: &Value) -> Result<Vec<String>> {
    let states = match v {
        Value::Null => Vec::new(),
        _ => urls(key, v)?,
    };
    for st in &states {
        crate::plan::resume::State::from_hex(st)
            .map_err(|e| Error::config(format!("`{key}`: {e}")))?;
    }
    Ok(states)
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

/// What a sample whose image cannot be made does: `fail` or `skip`.
pub(super) fn image_errors(key: &str, v: &Value) -> Result<crate::image::OnError> {
    Ok(match choice(key, v, &["fail", "skip"])? {
        "fail" => crate::image::OnError::Fail,
        _ => crate::image::OnError::Skip,
    })
}

/// The `transform` spec: an object, or its JSON text; `null` or `""` is
/// none.
pub(super) fn transform(key: &str, v: &Value) -> Result<Option<crate::image::Transform>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        Value::String(s) => crate::image::Transform::parse(s).map(Some),
        Value::Object(_) => crate::image::Transform::from_value(v).map(Some),
        other => Err(Error::Config(format!(
            "`{key}`: expected an object of field name -> spec (or its JSON text), got {other}"
        ))),
    }
}
