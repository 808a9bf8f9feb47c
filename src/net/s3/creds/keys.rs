//! The static sources of the chain: long-lived keys from the configuration,
//! the environment, or a profile of the shared files (`profiles.rs` decides
//! which kind a profile is). Nothing is fetched.

use std::collections::BTreeMap;

use super::Credentials;
use crate::net::s3::{Env, S3Config};

/// The configuration keys `aws_access_key_id` and `aws_secret_access_key`.
pub fn from_config(cfg: &S3Config) -> Result<Option<Credentials>, String> {
    match (&cfg.access_key_id, &cfg.secret_access_key) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            cfg.session_token.as_deref(),
            None,
            "configuration",
        ))),
        (None, None) => Ok(None),
        _ => Err(
            "`aws_access_key_id` and `aws_secret_access_key` must be given together".to_string(),
        ),
    }
}

/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
pub fn from_env(env: &Env) -> Result<Option<Credentials>, String> {
    match (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            env.get("AWS_SESSION_TOKEN"),
            None,
            "environment",
        ))),
        (None, None) => Ok(None),
        _ => Err("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together".to_string()),
    }
}

/// The static keys of profile `name` (keys `p`), if it has any.
pub fn static_keys(
    name: &str,
    p: &BTreeMap<String, String>,
) -> Result<Option<Credentials>, String> {
    match (p.get("aws_access_key_id"), p.get("aws_secret_access_key")) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            p.get("aws_session_token").map(String::as_str),
            None,
            &format!("profile `{name}`"),
        ))),
        (None, None) => Ok(None),
        _ => Err(format!(
            "profile `{name}` has only one of aws_access_key_id and aws_secret_access_key"
        )),
    }
}
