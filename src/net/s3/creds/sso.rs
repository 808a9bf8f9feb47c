//! IAM Identity Center (SSO) profiles: the token `aws sso login` cached in
//! `~/.aws/sso/cache/<sha1>.json` traded for a role's credentials with the
//! portal's GetRoleCredentials, as the AWS CLI and SDKs do. The token is
//! never refreshed here (that needs the OIDC client `aws sso login`
//! registered); an expired one is an error that says to log in again.
//!
//! A profile names its session with `sso_session` (a `[sso-session NAME]`
//! section of the config file holding `sso_start_url` and `sso_region`; the
//! cache file is the SHA-1 of the session name), or holds `sso_start_url`
//! and `sso_region` itself (the older form; the cache file is the SHA-1 of
//! the start URL). Both need `sso_account_id` and `sso_role_name`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use sha1::{Digest, Sha1};

use super::http::{service_endpoint, without_url};
use super::{Credentials, client, parse_time};
use crate::net::s3::Env;

/// Whether profile `p` is an SSO profile.
pub fn is_sso(p: &BTreeMap<String, String>) -> bool {
    p.contains_key("sso_session") || p.contains_key("sso_start_url")
}

/// The role credentials of SSO profile `name` (keys `p`); `sections`: the
/// config file's sections, for `[sso-session NAME]`.
pub fn from_sso(
    env: &Env,
    name: &str,
    p: &BTreeMap<String, String>,
    sections: &super::Ini,
) -> Result<Credentials, String> {
    let login = format!("run `aws sso login --profile {name}`");
    let need = |m: &BTreeMap<String, String>, key: &str, whose: &str| {
        m.get(key)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| format!("{whose} has no `{key}`"))
    };
    let profile = format!("SSO profile `{name}`");
    let (cache_key, region) = match p.get("sso_session") {
        Some(session) => {
            let s = sections
                .get(&format!("sso-session {session}"))
                .ok_or_else(|| {
                    format!("{profile} names sso_session `{session}`, which has no [sso-session {session}] section in the config file")
                })?;
            let whose = format!("[sso-session {session}]");
            need(s, "sso_start_url", &whose)?;
            (session.clone(), need(s, "sso_region", &whose)?)
        }
        None => (
            need(p, "sso_start_url", &profile)?,
            need(p, "sso_region", &profile)?,
        ),
    };
    let account = need(p, "sso_account_id", &profile)?;
    let role = need(p, "sso_role_name", &profile)?;
    let path = cache_file(env, &cache_key)
        .ok_or_else(|| format!("{profile}: no home directory to find ~/.aws/sso/cache in"))?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{profile}: no SSO token cached at {} ({e}); {login}",
            path.display()
        )
    })?;
    let token = parse_token(&text, SystemTime::now()).map_err(|e| {
        format!(
            "{profile}: the SSO token in {} {e}; {login}",
            path.display()
        )
    })?;

    let endpoint = service_endpoint(env, "AWS_ENDPOINT_URL_SSO")
        .unwrap_or_else(|| format!("https://portal.sso.{region}.amazonaws.com"));
    let enc = crate::net::s3::encode_query;
    let url = format!(
        "{endpoint}/federation/credentials?account_id={}&role_name={}",
        enc(&account),
        enc(&role)
    );
    let what = format!("SSO GetRoleCredentials for profile `{name}` at {endpoint}");
    let resp = client(false)?
        .get(url)
        .header("x-amz-sso_bearer_token", token)
        .send()
        .map_err(|e| format!("{what}: {}", without_url(&e)))?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return Err(format!(
            "{what}: HTTP {status}: the token is no longer valid or the role `{role}` in account {account} is not assigned to you; {login}"
        ));
    }
    if !status.is_success() {
        return Err(format!("{what}: HTTP {status}"));
    }
    let text = resp
        .text()
        .map_err(|e| format!("{what}: {}", without_url(&e)))?;
    parse_role_credentials(&text, &format!("profile `{name}` (SSO)"))
        .map_err(|e| format!("{what}: {e}"))
}

/// `~/.aws/sso/cache/<hex SHA-1 of key>.json`.
pub fn cache_file(env: &Env, key: &str) -> Option<PathBuf> {
    let digest = Sha1::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Some(
        env.home
            .as_ref()?
            .join(format!(".aws/sso/cache/{hex}.json")),
    )
}

/// The access token of a cached token document, unless it has expired at
/// `now`. Errors complete "the SSO token in FILE ...".
pub fn parse_token(text: &str, now: SystemTime) -> Result<String, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Token {
        access_token: Option<String>,
        expires_at: Option<String>,
    }
    let t: Token = serde_json::from_str(text).map_err(|_| "is not a token document".to_string())?;
    let token = t
        .access_token
        .filter(|s| !s.is_empty())
        .ok_or("has no accessToken")?;
    let at = t.expires_at.ok_or("has no expiresAt")?;
    // The AWS CLI v1 wrote `...UTC` for `...Z`.
    let at = match at.strip_suffix("UTC") {
        Some(t) => format!("{t}Z"),
        None => at,
    };
    if parse_time(&at)? <= now {
        return Err(format!("expired at {at}"));
    }
    Ok(token)
}

/// The `roleCredentials` of a GetRoleCredentials answer (expiry in
/// milliseconds since the epoch).
pub fn parse_role_credentials(text: &str, source: &str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        role_credentials: Role,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Role {
        access_key_id: String,
        secret_access_key: String,
        session_token: Option<String>,
        expiration: u64,
    }
    let a: Answer = serde_json::from_str(text)
        .map_err(|_| "the response is not a GetRoleCredentials result".to_string())?;
    let r = a.role_credentials;
    Ok(Credentials::new(
        &r.access_key_id,
        &r.secret_access_key,
        r.session_token.as_deref(),
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(r.expiration)),
        source,
    ))
}
