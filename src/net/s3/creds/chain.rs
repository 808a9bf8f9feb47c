//! The chain: which sources are asked, in which order, and the error that
//! lists what was tried when none gives credentials.

use super::{
    Credentials, config_path, credentials_path, from_config, from_container, from_env, from_imds,
    from_profile, from_web_identity, profile, profile_name,
};
use crate::net::s3::{Env, S3Config};

/// Which source gave the credentials; refreshes ask it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialSource {
    Config,
    Environment,
    Profile,
    WebIdentity,
    Container,
    InstanceMetadata,
}

pub(super) fn fetch(
    source: CredentialSource,
    cfg: &S3Config,
    env: &Env,
) -> Result<Option<Credentials>, String> {
    match source {
        CredentialSource::Config => from_config(cfg),
        CredentialSource::Environment => from_env(env),
        CredentialSource::Profile => {
            let name = profile_name(cfg, env);
            let named = cfg.profile.is_some() || env.get("AWS_PROFILE").is_some();
            if named && profile(env, &name).is_none() {
                // A profile asked for by name and missing is a typo, not a
                // reason to try the next identity.
                return Err(format!("profile `{name}` is not in {}", shared_files(env)));
            }
            from_profile(env, &name)
        }
        CredentialSource::WebIdentity => from_web_identity(env),
        CredentialSource::Container => from_container(env),
        CredentialSource::InstanceMetadata => from_imds(env),
    }
}

/// The shared files' paths, for messages.
fn shared_files(env: &Env) -> String {
    let files: Vec<_> = [credentials_path(env), config_path(env)]
        .iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
    if files.is_empty() {
        "no shared files (no home directory)".to_string()
    } else {
        files.join(" and ")
    }
}

/// Runs the chain: the first source that gives credentials, or an error
/// listing what was tried.
pub fn chain(cfg: &S3Config, env: &Env) -> Result<(CredentialSource, Credentials), String> {
    let profile = profile_name(cfg, env);
    let files = shared_files(env);
    let steps = [
        (
            CredentialSource::Config,
            "configuration keys aws_access_key_id/aws_secret_access_key".to_string(),
        ),
        (
            CredentialSource::Environment,
            "environment AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".to_string(),
        ),
        (
            CredentialSource::Profile,
            format!("profile `{profile}` in {files}"),
        ),
        (
            CredentialSource::WebIdentity,
            "web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN unset)".to_string(),
        ),
        (
            CredentialSource::Container,
            "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/_FULL_URI unset)"
                .to_string(),
        ),
        (
            CredentialSource::InstanceMetadata,
            "instance metadata".to_string(),
        ),
    ];
    let mut tried = Vec::new();
    for (source, what) in steps {
        match fetch(source, cfg, env) {
            Ok(Some(c)) => return Ok((source, c)),
            Ok(None) if source == CredentialSource::InstanceMetadata => {
                tried.push("instance metadata (disabled by AWS_EC2_METADATA_DISABLED)".to_string())
            }
            Ok(None) => tried.push(what),
            // Instance metadata is the last resort off EC2: not finding it
            // is "not configured", not a failure to report alone.
            Err(e) if source == CredentialSource::InstanceMetadata => tried.push(e),
            // A source that is configured but broken is an error: falling
            // through to another identity would be a surprise.
            Err(e) => return Err(e),
        }
    }
    Err(format!(
        "no AWS credentials found: tried {}; give credentials, or set `s3_unsigned: true` for a public bucket",
        tried.join(", ")
    ))
}
