//! What the sources over HTTP share: the client and its time-outs, the
//! endpoint overrides, a request whose errors never show the URL (it may
//! hold a token) nor the body (only an AWS error code), the credentials
//! document of the container and instance metadata services, and ISO 8601
//! expiry times.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::Credentials;
use crate::net::s3::Env;

/// Time-outs of the credential fetches. Connecting to the instance metadata
/// address off EC2 hangs until the connect time-out (nothing answers), so it
/// is short: 1 s, as the SDKs use.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A whole credential request; STS answers in well under a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP client of the credential fetches. `direct`: no proxy (link-local
/// metadata addresses must never go through one).
pub fn client(direct: bool) -> Result<reqwest::blocking::Client, String> {
    let mut b = reqwest::blocking::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT);
    if direct {
        b = b.no_proxy();
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// An ISO 8601 time (`2026-11-30T09:00:00Z`) as a `SystemTime`.
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    use aws_smithy_types::date_time::{DateTime, Format};
    let t = DateTime::from_str(s.trim(), Format::DateTime)
        .map_err(|_| format!("bad expiration time `{s}`"))?;
    SystemTime::try_from(t).map_err(|_| format!("bad expiration time `{s}`"))
}

pub(super) fn get_text(
    req: reqwest::blocking::RequestBuilder,
    what: &str,
) -> Result<String, String> {
    let resp = req
        .send()
        .map_err(|e| format!("{what}: {}", without_url(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        // STS says why in an XML error (`<Code>AccessDenied</Code>`); the
        // code is shown, the rest of the body is not.
        let code = resp.text().ok().and_then(|b| error_code(&b));
        return Err(match code {
            Some(c) => format!("{what}: HTTP {status}, error code {c}"),
            None => format!("{what}: HTTP {status}"),
        });
    }
    resp.text()
        .map_err(|e| format!("{what}: {}", without_url(&e)))
}

/// The `<Code>` of an AWS XML error body, when it is a plain word.
fn error_code(body: &str) -> Option<String> {
    let start = body.find("<Code>")? + "<Code>".len();
    let len = body[start..].find("</Code>")?;
    let code = &body[start..start + len];
    (!code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
    .then(|| code.to_string())
}

/// A service's endpoint override, as the SDKs read it: its own variable
/// (`AWS_ENDPOINT_URL_STS`), else `AWS_ENDPOINT_URL`; without a trailing `/`.
pub(super) fn service_endpoint(env: &Env, var: &str) -> Option<String> {
    env.get(var)
        .or_else(|| env.get("AWS_ENDPOINT_URL"))
        .map(|e| e.trim_end_matches('/').to_string())
}

/// A reqwest error's text without the URL (which may hold a token in its
/// query, as STS's does).
pub(super) fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "bad response body"
    } else {
        "request failed"
    };
    kind.to_string()
}

/// The JSON document of the container and instance metadata services.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct JsonCredentials {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<String>,
    code: Option<String>,
}

pub(super) fn json_credentials(text: &str, source: &str) -> Result<Credentials, String> {
    let j: JsonCredentials = serde_json::from_str(text)
        .map_err(|_| format!("{source}: the response is not a credentials document"))?;
    if let Some(code) = j.code.as_deref().filter(|c| *c != "Success") {
        return Err(format!("{source}: the service says `{code}`"));
    }
    let expiry = j.expiration.as_deref().map(parse_time).transpose()?;
    Ok(Credentials::new(
        &j.access_key_id,
        &j.secret_access_key,
        j.token.as_deref(),
        expiry,
        source,
    ))
}
