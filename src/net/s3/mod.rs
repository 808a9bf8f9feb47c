//! S3: the control plane and the signing of the data plane.
//!
//! An `s3://bucket/key` URL becomes an [`HttpObject`](crate::net::object::HttpObject)
//! on the endpoint (path-style `http://endpoint/bucket/key` or virtual-hosted
//! `https://bucket.s3.REGION.amazonaws.com/key`), read with the same ranged
//! GETs as any HTTP shard; each request is signed by [`sign::SigV4Signer`]
//! (smithy-rs's `aws-sigv4`) with credentials from the chain in [`creds`].
//! `s3://bucket/prefix/` is listed with ListObjectsV2 ([`list`]), at every
//! depth, and so is the literal start of a key pattern
//! (`s3://bucket/train/**/shard-*.tar`, matched by `crate::dataset`); the
//! sizes come from the listing, so no HEAD is needed.
//!
//! Everything that reads the environment takes an [`Env`] value, so tests
//! give a fake one and the pure parts never read the process's variables.

pub mod creds;
pub mod list;
pub mod sign;
pub mod upload;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// SigV4's URI encoding: every byte but the unreserved `A-Z a-z 0-9 - _ . ~`
/// is percent-encoded (AWS's "UriEncode").
pub const SIGV4_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Encodes an object key for a URL path: SigV4 rules, `/` kept.
pub fn encode_key(key: &str) -> String {
    key.split('/')
        .map(|seg| utf8_percent_encode(seg, SIGV4_ENCODE).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// Encodes a query-string value: SigV4 rules, `/` encoded too.
pub fn encode_query(v: &str) -> String {
    utf8_percent_encode(v, SIGV4_ENCODE).to_string()
}

/// The environment the S3 settings and the credential chain read, and the
/// Hugging Face Hub's settings (`crate::net::hub`): variables and the home
/// directory. `Env::process()` takes the real one; tests build
/// their own. Its `Debug` shows the variable names only (values may be secrets).
#[derive(Clone, Default)]
pub struct Env {
    vars: BTreeMap<String, String>,
    pub home: Option<PathBuf>,
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .field("home", &self.home)
            .finish()
    }
}

impl Env {
    /// The process's `AWS_*` and `HF_*` variables (with the older
    /// `HUGGING_FACE_HUB_TOKEN` and `TRANSFORMERS_OFFLINE`, and
    /// `XDG_CACHE_HOME`, where the Hub's token file is found) and `$HOME`.
    pub fn process() -> Env {
        Env {
            vars: std::env::vars()
                .filter(|(k, _)| {
                    k.starts_with("AWS_")
                        || k.starts_with("HF_")
                        || matches!(
                            k.as_str(),
                            "HUGGING_FACE_HUB_TOKEN" | "TRANSFORMERS_OFFLINE" | "XDG_CACHE_HOME"
                        )
                })
                .collect(),
            home: std::env::var_os("HOME").map(PathBuf::from),
        }
    }

    /// An empty environment with `home` as the home directory.
    pub fn with_home(home: Option<PathBuf>) -> Env {
        Env {
            vars: BTreeMap::new(),
            home,
        }
    }

    /// The same environment with `key` set.
    pub fn set(mut self, key: &str, value: &str) -> Env {
        self.vars.insert(key.to_string(), value.to_string());
        self
    }

    /// A variable's value; empty counts as unset, like the AWS SDKs.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// `true`/`false` variables, case-insensitively.
    pub fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// The S3 keys of the configuration. Its `Debug` redacts the secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    /// `s3_endpoint`: `http(s)://host[:port]`; `None`: AWS itself.
    pub endpoint: Option<String>,
    /// `s3_region`.
    pub region: Option<String>,
    /// `s3_path_style`; `None`: path-style when an endpoint is given.
    pub path_style: Option<bool>,
    /// `s3_unsigned`: anonymous access, no signature.
    pub unsigned: bool,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// `aws_profile`.
    pub profile: Option<String>,
    /// `s3_suffix`: the ending a listed key must have to be taken; `None`:
    /// `.tar` for shards, any key for whole objects; `""`: any key.
    pub suffix: Option<String>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let given = |o: &Option<String>| if o.is_some() { "<redacted>" } else { "-" };
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("unsigned", &self.unsigned)
            .field("access_key_id", &given(&self.access_key_id))
            .field("secret_access_key", &given(&self.secret_access_key))
            .field("session_token", &given(&self.session_token))
            .field("profile", &self.profile)
            .field("suffix", &self.suffix)
            .finish()
    }
}

/// Region when nothing names one: the SDKs' global default.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Where and how objects are addressed, from the configuration over the
/// environment over the profile files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addressing {
    /// `None`: AWS (`https://s3.REGION.amazonaws.com`).
    pub endpoint: Option<String>,
    pub region: String,
    pub path_style: bool,
}

impl Addressing {
    /// Endpoint: `s3_endpoint`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`,
    /// the profile's `endpoint_url`.
    /// Region: `s3_region`, `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's
    /// `region`, then us-east-1. Path-style: `s3_path_style`, else true with
    /// an endpoint and false on AWS.
    pub fn resolve(cfg: &S3Config, env: &Env) -> Result<Addressing, String> {
        let endpoint = cfg
            .endpoint
            .clone()
            .or_else(|| env.get("AWS_ENDPOINT_URL_S3").map(str::to_string))
            .or_else(|| env.get("AWS_ENDPOINT_URL").map(str::to_string))
            .or_else(|| creds::profile_value(env, &creds::profile_name(cfg, env), "endpoint_url"))
            .map(|e| e.trim_end_matches('/').to_string());
        if let Some(e) = &endpoint {
            let p = crate::net::http::parse_url(e)
                .map_err(|why| format!("S3 endpoint `{e}`: {why}"))?;
            if p.target != "/" {
                return Err(format!(
                    "S3 endpoint `{e}`: give only scheme, host and port, no path"
                ));
            }
        }
        let region = match cfg
            .region
            .clone()
            .or_else(|| env.get("AWS_REGION").map(str::to_string))
            .or_else(|| env.get("AWS_DEFAULT_REGION").map(str::to_string))
        {
            Some(r) => r,
            None => {
                let profile = creds::profile_name(cfg, env);
                creds::profile_value(env, &profile, "region")
                    .unwrap_or_else(|| DEFAULT_REGION.to_string())
            }
        };
        let path_style = cfg.path_style.unwrap_or(endpoint.is_some());
        Ok(Addressing {
            endpoint,
            region,
            path_style,
        })
    }

    /// The endpoint's base URL with the bucket: path-style
    /// `http://endpoint/bucket`, virtual-hosted `https://bucket.endpoint`.
    pub fn bucket_url(&self, bucket: &str) -> String {
        let aws = format!("https://s3.{}.amazonaws.com", self.region);
        let ep = self.endpoint.as_deref().unwrap_or(&aws);
        if self.path_style {
            return format!("{ep}/{}", encode_key(bucket));
        }
        let (scheme, host) = ep.split_once("://").unwrap_or(("https", ep));
        format!("{scheme}://{bucket}.{host}")
    }

    /// The HTTP URL of an object.
    pub fn object_url(&self, bucket: &str, key: &str) -> String {
        format!("{}/{}", self.bucket_url(bucket), encode_key(key))
    }
}

/// An `s3://bucket/key` URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub key: String,
}

impl S3Url {
    /// Parses `s3://bucket/key`; the key may be empty (a whole bucket) or end
    /// with `/` (a prefix to list).
    pub fn parse(url: &str) -> Result<S3Url, String> {
        let rest = url.strip_prefix("s3://").ok_or("not an s3:// URL")?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err("the URL has no bucket (s3://bucket/key)".into());
        }
        // S3's bucket naming rules: 3-63 of a-z 0-9 . - (older buckets may
        // hold upper case and _; those are accepted for path-style).
        if bucket.len() > 255
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return Err(format!("`{bucket}` is not a valid bucket name"));
        }
        if key.bytes().any(|b| b < b' ' || b == 0x7f) {
            return Err("the key holds control characters".into());
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// Whether this names a prefix to list rather than one object.
    pub fn is_prefix(&self) -> bool {
        self.key.is_empty() || self.key.ends_with('/')
    }

    pub fn display(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }
}

/// The `<Code>` of an S3 XML error body, if it holds one.
pub fn error_code(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        #[serde(rename = "Code")]
        code: String,
    }
    let text = std::str::from_utf8(body).ok()?;
    quick_xml::de::from_str::<ErrorBody>(text)
        .ok()
        .map(|e| e.code)
        .filter(|c| !c.is_empty() && c.len() <= 128)
}

/// What an S3 error code means for the user, when it needs saying.
pub fn explain_code(code: &str) -> Option<&'static str> {
    Some(match code {
        "NoSuchKey" => "the object does not exist",
        "NoSuchBucket" => "the bucket does not exist",
        "AccessDenied" => "the credentials may not read this object",
        "SignatureDoesNotMatch" => {
            "the secret access key is wrong (or the request was altered on the way)"
        }
        "InvalidAccessKeyId" => "the access key id is not known to the server",
        "ExpiredToken" | "TokenRefreshRequired" => "the session token has expired",
        "RequestTimeTooSkewed" => "the system clock is too far off",
        "PermanentRedirect" | "AuthorizationHeaderMalformed" => {
            "the bucket lives in another region: set `s3_region`"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_per_sigv4() {
        assert_eq!(encode_key("a/b c/d+e.tar"), "a/b%20c/d%2Be.tar");
        assert_eq!(encode_key("x~y_z-1.tar"), "x~y_z-1.tar");
        assert_eq!(encode_key("ü/=&?#%"), "%C3%BC/%3D%26%3F%23%25");
        assert_eq!(encode_query("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn urls_split_into_bucket_and_key() {
        let u = S3Url::parse("s3://bkt/train/shard-1.tar").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.key.as_str()),
            ("bkt", "train/shard-1.tar")
        );
        assert!(!u.is_prefix());
        assert!(S3Url::parse("s3://bkt/train/").unwrap().is_prefix());
        assert!(S3Url::parse("s3://bkt").unwrap().is_prefix());
        for bad in ["s3:///k", "s3://b b/k", "s3://b/k\n", "http://b/k"] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn path_style_and_virtual_hosted_urls() {
        let env = Env::default();
        let mut cfg = S3Config {
            endpoint: Some("http://127.0.0.1:9000/".into()),
            ..Default::default()
        };
        let a = Addressing::resolve(&cfg, &env).unwrap();
        assert!(a.path_style);
        assert_eq!(
            a.object_url("b", "p/x y.tar"),
            "http://127.0.0.1:9000/b/p/x%20y.tar"
        );
        cfg.path_style = Some(false);
        let a = Addressing::resolve(&cfg, &env).unwrap();
        assert_eq!(a.object_url("b", "k"), "http://b.127.0.0.1:9000/k");
        let a = Addressing::resolve(
            &S3Config::default(),
            &env.clone().set("AWS_REGION", "eu-west-1"),
        )
        .unwrap();
        assert!(!a.path_style);
        assert_eq!(
            a.object_url("bkt", "k.tar"),
            "https://bkt.s3.eu-west-1.amazonaws.com/k.tar"
        );
        let bad = S3Config {
            endpoint: Some("ftp://x".into()),
            ..Default::default()
        };
        assert!(
            Addressing::resolve(&bad, &env)
                .unwrap_err()
                .contains("ftp://x")
        );
    }

    #[test]
    fn endpoint_and_region_precedence() {
        let env = Env::default()
            .set("AWS_ENDPOINT_URL", "http://general:1")
            .set("AWS_ENDPOINT_URL_S3", "http://s3only:2")
            .set("AWS_DEFAULT_REGION", "default-r")
            .set("AWS_REGION", "r");
        let a = Addressing::resolve(&S3Config::default(), &env).unwrap();
        assert_eq!(a.endpoint.as_deref(), Some("http://s3only:2"));
        assert_eq!(a.region, "r");
        let cfg = S3Config {
            endpoint: Some("http://cfg:3".into()),
            region: Some("cfg-r".into()),
            ..Default::default()
        };
        let a = Addressing::resolve(&cfg, &env).unwrap();
        assert_eq!(
            (a.endpoint.as_deref(), a.region.as_str()),
            (Some("http://cfg:3"), "cfg-r")
        );
        let env = Env::default()
            .set("AWS_ENDPOINT_URL", "http://general:1")
            .set("AWS_DEFAULT_REGION", "default-r");
        let a = Addressing::resolve(&S3Config::default(), &env).unwrap();
        assert_eq!(
            (a.endpoint.as_deref(), a.region.as_str()),
            (Some("http://general:1"), "default-r")
        );
        let a = Addressing::resolve(&S3Config::default(), &Env::default()).unwrap();
        assert_eq!((a.endpoint, a.region.as_str()), (None, DEFAULT_REGION));
    }

    #[test]
    fn error_codes_come_from_the_xml_body() {
        let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>a</Key></Error>";
        assert_eq!(error_code(body).as_deref(), Some("NoSuchKey"));
        assert_eq!(error_code(b"<html>oops</html>"), None);
        assert_eq!(error_code(b"<Error><Code>Sl"), None);
        assert_eq!(error_code(&[0xff, 0xfe]), None);
    }
}
