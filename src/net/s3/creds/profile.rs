//! The AWS shared files (`~/.aws/config`, `~/.aws/credentials`, or the
//! paths in `AWS_CONFIG_FILE` and `AWS_SHARED_CREDENTIALS_FILE`): their INI
//! dialect, which profile applies, and a profile's keys. The profile source
//! of the chain reads its keys here, and so do the region and endpoint
//! settings of `crate::net::s3`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::net::s3::{Env, S3Config};

/// Sections of an INI file (`[name]`, `key = value`, `#`/`;` comments).
pub type Ini = BTreeMap<String, BTreeMap<String, String>>;

/// Parses the AWS shared files' INI dialect. Keys are lower-cased; values
/// are trimmed; lines indented under a key (nested `s3 =` settings) are
/// skipped.
pub fn parse_ini(text: &str) -> Ini {
    let mut out = Ini::new();
    let mut section: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            section = Some(name);
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            continue;
        }
        if let (Some(s), Some((k, v))) = (&section, line.split_once('=')) {
            out.entry(s.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`.
pub fn credentials_path(env: &Env) -> Option<PathBuf> {
    env.get("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/credentials")))
}

/// `AWS_CONFIG_FILE`, else `~/.aws/config`.
pub fn config_path(env: &Env) -> Option<PathBuf> {
    env.get("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/config")))
}

/// `aws_profile`, else `AWS_PROFILE`, else `default`.
pub fn profile_name(cfg: &S3Config, env: &Env) -> String {
    cfg.profile
        .clone()
        .or_else(|| env.get("AWS_PROFILE").map(str::to_string))
        .unwrap_or_else(|| "default".to_string())
}

fn read_ini(path: &Option<PathBuf>) -> Ini {
    path.as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_ini(&t))
        .unwrap_or_default()
}

/// The config file's sections (`[sso-session NAME]` among them).
pub fn config_sections(env: &Env) -> Ini {
    read_ini(&config_path(env))
}

/// A profile's keys: the config file's `[profile NAME]` (or `[default]`),
/// overridden by the credentials file's `[NAME]`.
pub fn profile(env: &Env, name: &str) -> Option<BTreeMap<String, String>> {
    let config = read_ini(&config_path(env));
    let creds = read_ini(&credentials_path(env));
    let mut found = None;
    let config_section = if name == "default" {
        config
            .get("default")
            .or_else(|| config.get("profile default"))
    } else {
        config.get(&format!("profile {name}"))
    };
    if let Some(s) = config_section {
        found = Some(s.clone());
    }
    if let Some(s) = creds.get(name) {
        found.get_or_insert_with(BTreeMap::new).extend(s.clone());
    }
    found
}

/// One value of a profile (e.g. `region`).
pub fn profile_value(env: &Env, name: &str, key: &str) -> Option<String> {
    profile(env, name)?
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
}
