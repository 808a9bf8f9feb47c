//! STS AssumeRoleWithWebIdentity: the web identity token file of EKS IRSA
//! traded for temporary credentials; and the answer of STS's AssumeRole
//! calls (this one and `assume.rs`'s).

use serde::Deserialize;

use super::http::get_text;
use super::{Credentials, client, parse_time};
use crate::net::s3::Env;

/// STS AssumeRoleWithWebIdentity, when `AWS_WEB_IDENTITY_TOKEN_FILE` and
/// `AWS_ROLE_ARN` are set. The STS endpoint is `AWS_ENDPOINT_URL_STS`, else
/// `AWS_ENDPOINT_URL`, else the regional one.
pub fn from_web_identity(env: &Env) -> Result<Option<Credentials>, String> {
    let (Some(token_file), Some(role)) = (
        env.get("AWS_WEB_IDENTITY_TOKEN_FILE"),
        env.get("AWS_ROLE_ARN"),
    ) else {
        return Ok(None);
    };
    let session = env
        .get("AWS_ROLE_SESSION_NAME")
        .unwrap_or("ringfeed-session");
    let region = env
        .get("AWS_REGION")
        .or_else(|| env.get("AWS_DEFAULT_REGION"))
        .unwrap_or(crate::net::s3::DEFAULT_REGION);
    web_identity(env, token_file, role, session, region, "web identity").map(Some)
}

/// AssumeRoleWithWebIdentity of `role` with the token in `token_file`, at
/// the STS endpoint of `region`; `source` names the credentials.
pub fn web_identity(
    env: &Env,
    token_file: &str,
    role: &str,
    session: &str,
    region: &str,
    source: &str,
) -> Result<Credentials, String> {
    let token = std::fs::read_to_string(token_file)
        .map_err(|e| format!("web identity token file `{token_file}`: {e}"))?;
    let endpoint = super::assume::sts_endpoint(env, region);
    let enc = crate::net::s3::encode_query;
    let url = format!(
        "{endpoint}/?Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={}&RoleSessionName={}&WebIdentityToken={}",
        enc(role),
        enc(session),
        enc(token.trim())
    );
    let what = format!("STS AssumeRoleWithWebIdentity at {endpoint}");
    let text = get_text(client(false)?.get(url), &what)?;
    let mut c = parse_sts(&text).map_err(|e| format!("{what}: {e}"))?;
    c.source = source.to_string();
    Ok(c)
}

/// The `Credentials` of an AssumeRoleWithWebIdentity or AssumeRole response.
pub fn parse_sts(xml: &str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    struct Response {
        #[serde(rename = "AssumeRoleWithWebIdentityResult", alias = "AssumeRoleResult")]
        result: Result_,
    }
    #[derive(Deserialize)]
    struct Result_ {
        #[serde(rename = "Credentials")]
        credentials: Sts,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Sts {
        access_key_id: String,
        secret_access_key: String,
        session_token: String,
        expiration: String,
    }
    let r: Response = quick_xml::de::from_str(xml)
        .map_err(|_| "the response is not an AssumeRole(WithWebIdentity) result".to_string())?;
    let c = r.result.credentials;
    Ok(Credentials::new(
        &c.access_key_id,
        &c.secret_access_key,
        Some(&c.session_token),
        Some(parse_time(&c.expiration)?),
        "web identity",
    ))
}
