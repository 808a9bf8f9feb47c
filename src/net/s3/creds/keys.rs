//! The static sources of the chain: long-lived keys from the configuration,
//! the environment, or a profile of the shared files. Nothing is fetched.

use super::{Credentials, profile};
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

/// The keys of profile `name` in the shared files.
pub fn from_profile(env: &Env, name: &str) -> Result<Option<Credentials>, String> {
    let Some(p) = profile(env, name) else {
        return Ok(None);
    };
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
