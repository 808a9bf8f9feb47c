//! Container credentials: the ECS agent's or EKS Pod Identity's endpoint,
//! with its authorization token.

use super::Credentials;
use super::client;
use super::http::{get_text, json_credentials};
use crate::net::s3::Env;

/// The ECS/EKS container credentials endpoint, when
/// `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `_FULL_URI` is set; the
/// `Authorization` token from `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` or
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN`.
pub fn from_container(env: &Env) -> Result<Option<Credentials>, String> {
    let url = if let Some(rel) = env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        // The ECS agent's fixed address.
        format!("http://169.254.170.2{rel}")
    } else if let Some(full) = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
        full.to_string()
    } else {
        return Ok(None);
    };
    let token = match env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("container authorization token file `{f}`: {e}"))?
                .trim()
                .to_string(),
        ),
        None => env
            .get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
            .map(str::to_string),
    };
    let mut req = client(true)?.get(&url);
    if let Some(t) = token {
        req = req.header("Authorization", t);
    }
    let text = get_text(req, &format!("container credentials at {url}"))?;
    json_credentials(&text, "container credentials").map(Some)
}
