//! The profile source of the chain: what kind of profile `name` is, and
//! its credentials. In the order the Rust SDK takes them: a `role_arn`
//! (with a `web_identity_token_file`; or assumed with its
//! `source_profile`'s credentials, which may be a role in turn, or with
//! its `credential_source`), an SSO profile, a `credential_process`,
//! static keys.

use std::collections::BTreeMap;

use super::assume::{assume_role, sts_region};
use super::process::from_process;
use super::sso::{from_sso, is_sso};
use super::{
    Credentials, config_sections, from_container, from_env, from_imds, profile, static_keys,
    web_identity,
};
use crate::net::s3::Env;

/// Most profiles one `source_profile` chain may pass through: the SDKs
/// allow chains; a longer one than this is a mistake, not a design.
const MAX_CHAIN: usize = 8;

/// The credentials of profile `name` in the shared files; `None` when it
/// is missing or holds nothing that gives credentials (only a region, say).
pub fn from_profile(env: &Env, name: &str) -> Result<Option<Credentials>, String> {
    let mut seen = Vec::new();
    resolve(env, name, &mut seen)
}

fn resolve(env: &Env, name: &str, seen: &mut Vec<String>) -> Result<Option<Credentials>, String> {
    let Some(p) = profile(env, name) else {
        return Ok(None);
    };
    if seen.iter().any(|s| s == name) || seen.len() >= MAX_CHAIN {
        seen.push(name.to_string());
        return Err(format!(
            "the source_profile chain {} loops or is too long (at most {MAX_CHAIN})",
            seen.join(" → ")
        ));
    }
    seen.push(name.to_string());
    if let (Some(role), Some(token_file)) = (p.get("role_arn"), p.get("web_identity_token_file")) {
        let session = p
            .get("role_session_name")
            .map_or("ringfeed-session", String::as_str);
        let source = format!("profile `{name}` (web identity)");
        return web_identity(
            env,
            token_file,
            role,
            session,
            &sts_region(env, &p),
            &source,
        )
        .map(Some);
    }
    if p.contains_key("role_arn") {
        let source = role_source(env, name, &p, seen)?;
        return assume_role(env, name, &p, &source).map(Some);
    }
    if is_sso(&p) {
        return from_sso(env, name, &p, &config_sections(env)).map(Some);
    }
    if let Some(cmd) = p.get("credential_process").filter(|c| !c.trim().is_empty()) {
        return from_process(name, cmd).map(Some).map_err(|e| e.to_string());
    }
    static_keys(name, &p)
}

/// The credentials a role profile assumes its role with.
fn role_source(
    env: &Env,
    name: &str,
    p: &BTreeMap<String, String>,
    seen: &mut Vec<String>,
) -> Result<Credentials, String> {
    if let Some(source) = p.get("source_profile") {
        // A profile that is its own source uses its own static keys (the
        // SDKs' rule), rather than looping.
        if source == name {
            return static_keys(name, p)?.ok_or_else(|| {
                format!("profile `{name}` is its own source_profile but has no aws_access_key_id/aws_secret_access_key")
            });
        }
        if profile(env, source).is_none() {
            return Err(format!(
                "source_profile `{source}` of profile `{name}` is not in the shared files"
            ));
        }
        return resolve(env, source, seen)?.ok_or_else(|| {
            format!("source_profile `{source}` of profile `{name}` gives no credentials")
        });
    }
    if let Some(cs) = p.get("credential_source") {
        let found = match cs.as_str() {
            "Environment" => from_env(env)?,
            "Ec2InstanceMetadata" => from_imds(env)?,
            "EcsContainer" => from_container(env)?,
            _ => {
                return Err(format!(
                    "profile `{name}`: credential_source `{cs}` is not Environment, Ec2InstanceMetadata or EcsContainer"
                ));
            }
        };
        return found.ok_or_else(|| {
            format!("profile `{name}`: credential_source `{cs}` gives no credentials")
        });
    }
    Err(format!(
        "profile `{name}` has role_arn but no source_profile, credential_source or web_identity_token_file to assume it with"
    ))
}
