//! Instance metadata (IMDSv2): the last source of the chain, on EC2.

use super::Credentials;
use super::client;
use super::http::{get_text, json_credentials};
use crate::net::s3::Env;

/// IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT` (default
/// `http://169.254.169.254`): a session token by `PUT`, then the role name,
/// then its credentials. `Ok(None)` when `AWS_EC2_METADATA_DISABLED=true`.
pub fn from_imds(env: &Env) -> Result<Option<Credentials>, String> {
    if env.flag("AWS_EC2_METADATA_DISABLED") {
        return Ok(None);
    }
    let base = env
        .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or("http://169.254.169.254")
        .trim_end_matches('/')
        .to_string();
    let c = client(true)?;
    let what = format!("instance metadata at {base}");
    let token = get_text(
        c.put(format!("{base}/latest/api/token"))
            // Six hours, the longest IMDS allows; one token serves every
            // refresh of a typical job's credentials.
            .header("X-aws-ec2-metadata-token-ttl-seconds", "21600"),
        &what,
    )?;
    let token = token.trim();
    let list = format!("{base}/latest/meta-data/iam/security-credentials/");
    let roles = get_text(
        c.get(&list).header("X-aws-ec2-metadata-token", token),
        &what,
    )?;
    let role = roles
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| format!("{what}: the instance has no IAM role"))?;
    let text = get_text(
        c.get(format!("{list}{}", crate::net::s3::encode_query(role)))
            .header("X-aws-ec2-metadata-token", token),
        &what,
    )?;
    json_credentials(&text, "instance metadata").map(Some)
}
