//! STS AssumeRole: a profile's `role_arn` assumed with the credentials of
//! its `source_profile`, as the AWS CLI and SDKs do. The request is the
//! SDKs' (a form `POST`, SigV4-signed for service `sts`); the answer is
//! parsed by [`parse_sts`](super::parse_sts).

use std::collections::BTreeMap;
use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings};

use super::http::{get_text, service_endpoint};
use super::{Credentials, client, parse_sts};
use crate::net::s3::{DEFAULT_REGION, Env, encode_query};

/// The STS endpoint: `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`, else
/// the regional one of `region`.
pub fn sts_endpoint(env: &Env, region: &str) -> String {
    service_endpoint(env, "AWS_ENDPOINT_URL_STS")
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"))
}

/// The region STS is asked in: `AWS_REGION`, `AWS_DEFAULT_REGION`, the
/// profile's `region`, else us-east-1.
pub fn sts_region(env: &Env, p: &BTreeMap<String, String>) -> String {
    env.get("AWS_REGION")
        .or_else(|| env.get("AWS_DEFAULT_REGION"))
        .map(str::to_string)
        .or_else(|| p.get("region").filter(|r| !r.is_empty()).cloned())
        .unwrap_or_else(|| DEFAULT_REGION.to_string())
}

/// Assumes `p`'s `role_arn` (profile `name`) with `source`'s credentials.
/// `role_session_name`, `external_id` and `duration_seconds` are passed on;
/// `mfa_serial` needs a code typed in, which a loader cannot ask for.
pub fn assume_role(
    env: &Env,
    name: &str,
    p: &BTreeMap<String, String>,
    source: &Credentials,
) -> Result<Credentials, String> {
    let role = p.get("role_arn").map(String::as_str).unwrap_or("");
    if p.contains_key("mfa_serial") {
        return Err(format!(
            "profile `{name}` needs an MFA code (mfa_serial) to assume `{role}`; get temporary credentials first (`aws sts get-session-token`), or use a profile without MFA"
        ));
    }
    let session = p.get("role_session_name").cloned().unwrap_or_else(|| {
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("ringfeed-{secs}")
    });
    let mut form = format!(
        "Action=AssumeRole&Version=2011-06-15&RoleArn={}&RoleSessionName={}",
        encode_query(role),
        encode_query(&session)
    );
    if let Some(id) = p.get("external_id") {
        form.push_str(&format!("&ExternalId={}", encode_query(id)));
    }
    if let Some(d) = p.get("duration_seconds") {
        let d: u32 = d
            .parse()
            .map_err(|_| format!("profile `{name}`: duration_seconds `{d}` is not a number"))?;
        form.push_str(&format!("&DurationSeconds={d}"));
    }
    let region = sts_region(env, p);
    let endpoint = sts_endpoint(env, &region);
    let url = format!("{endpoint}/");
    let what = format!("STS AssumeRole of `{role}` for profile `{name}` at {endpoint}");
    let content_type = "application/x-www-form-urlencoded; charset=utf-8";
    let host = reqwest::Url::parse(&url)
        .ok()
        .and_then(|u| {
            let h = u.host_str()?.to_string();
            Some(match u.port() {
                Some(port) => format!("{h}:{port}"),
                None => h,
            })
        })
        .ok_or_else(|| format!("{what}: the endpoint is not a URL"))?;
    let signed = sign_sts(
        source,
        &region,
        &url,
        &[("host", &host), ("content-type", content_type)],
        form.as_bytes(),
        SystemTime::now(),
    )
    .map_err(|e| format!("{what}: {e}"))?;
    let mut req = client(false)?
        .post(&url)
        .header("content-type", content_type)
        .body(form);
    for (k, v) in signed {
        req = req.header(k, v);
    }
    let text = get_text(req, &what)?;
    let mut c = parse_sts(&text).map_err(|e| format!("{what}: {e}"))?;
    c.source = format!("profile `{name}` (role {role})");
    Ok(c)
}

/// SigV4 headers of a `POST` to STS carrying `body`, signed with `c`.
/// Errors never hold the key (the signer does not format it).
pub fn sign_sts(
    c: &Credentials,
    region: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    let identity = c.sigv4_identity();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("SigV4 parameters: {e}"))?
        .into();
    let req = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| format!("SigV4: {e}"))?;
    crate::net::s3::sign::signed_headers(req, &params)
}
