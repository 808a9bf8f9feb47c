//! The Hugging Face Hub: `hf://datasets/ORG/NAME[@REVISION]/PATH` URLs
//! ([`url`]), the settings and the token from the environment as
//! huggingface_hub reads them ([`token`]), and the API calls that resolve
//! a dataset (the revision's commit, the tree's files and sizes: [`api`]).
//!
//! A dataset's files are read like any HTTP object: each becomes an
//! [`HttpObject`] at `{endpoint}/datasets/{repo}/resolve/{commit}/{path}`,
//! pinned to the commit its revision named when it was resolved, so a
//! loader reads one version of the dataset however its branch moves. The
//! Hub answers that URL with a redirect to its content host (a signed URL
//! that expires), which the readers follow and remember per shard
//! (`crate::net::hop`); the token (`Authorization: Bearer`) goes with the
//! requests to the endpoint's origin only, never to the content host.

pub mod api;
pub mod token;
pub mod url;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::net::http::HttpFail;
use crate::net::object::{HttpObject, RequestSigner};
use crate::net::s3::{Env, SIGV4_ENCODE, encode_query};

pub use api::HubEntry;
pub use token::{Token, TokenSource};
pub use url::HubUrl;

/// A client of one Hub (the endpoint), with the token, if any.
pub struct HubClient {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub(crate) endpoint: String,
    pub(crate) token: Option<Token>,
    pub(crate) token_source: Option<TokenSource>,
    pub(crate) http: reqwest::blocking::Client,
    /// The endpoint's addresses, looked up once, for the data plane.
    addrs: Vec<SocketAddr>,
}

impl fmt::Debug for HubClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubClient")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token_source)
            .finish()
    }
}

impl HubClient {
    /// The client of the Hub the environment names. Offline mode is an
    /// error naming its variable: nothing is asked of the network.
    /// `what` is the URL being resolved, for that error.
    pub fn new(env: &Env, what: &str) -> Result<HubClient> {
        if let Some(var) = token::offline(env) {
            return Err(Error::Url {
                url: what.to_string(),
                reason: format!(
                    "{var} is set: the Hub is not asked, and ringfeed keeps no copy of a Hub \
                     dataset to read offline (copy its shards and give their paths, or unset \
                     {var})"
                ),
            });
        }
        let endpoint = token::endpoint(env)?;
        let (token, token_source) = match token::token(env)? {
            Some((t, s)) => (Some(t), Some(s)),
            None => (None, None),
        };
        let parsed = crate::net::http::parse_url(&format!("{endpoint}/")).map_err(|e| {
            Error::Config(format!(
                "HF_ENDPOINT `{}`: {e}",
                crate::redact::url(&endpoint)
            ))
        })?;
        let addrs =
            crate::net::hop::addresses(&parsed.host, parsed.port).map_err(|f| Error::Http {
                url: endpoint.clone(),
                kind: crate::net::http::FailKind::Dns,
                message: f.message,
                attempts: 1,
            })?;
        let http = reqwest::blocking::Client::builder()
            // 10 s to connect, 60 s an answer: a page of the tree is a few
            // hundred KB, answered in well under a second; one that
            // stalls longer is failed and retried rather than hung.
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            // Followed by `api`'s own loop, which sends the token to the
            // endpoint's origin only.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(HubClient {
            endpoint,
            token,
            token_source,
            http,
            addrs,
        })
    }

    /// The data-plane object of `path` in `repo` at commit `sha`, named
    /// `name` in messages: the Hub's `resolve/` URL, which redirects, with
    /// the token for the endpoint's origin.
    pub fn object(&self, repo: &str, sha: &str, path: &str, name: &str) -> Result<HttpObject> {
        let encoded: Vec<String> = path
            .split('/')
            .map(|s| percent_encoding::utf8_percent_encode(s, SIGV4_ENCODE).to_string())
            .collect();
        let url = format!(
            "{}/datasets/{repo}/resolve/{}/{}",
            self.endpoint,
            encode_query(sha),
            encoded.join("/")
        );
        let obj = HttpObject::new(&url, self.addrs.clone()).map_err(|reason| Error::Url {
            url: name.to_string(),
            reason,
        })?;
        let obj = obj.with_name(name).redirecting();
        Ok(match &self.token {
            Some(t) => obj.with_signer(Arc::new(Bearer(t.clone()))),
            None => obj,
        })
    }
}

/// The token as a request's `Authorization`. Kept to the endpoint's
/// origin by the redirect rules (`crate::net::hop`).
struct Bearer(Token);

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bearer(REDACTED)")
    }
}

impl RequestSigner for Bearer {
    fn sign(
        &self,
        _: &str,
        _: &HttpObject,
        _: Option<&str>,
    ) -> std::result::Result<String, HttpFail> {
        Ok(format!("Authorization: {}\r\n", self.0.bearer()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_the_resolve_urls_pinned_to_the_commit() {
        let env = Env::default()
            .set("HF_ENDPOINT", "http://127.0.0.1:9/hub/")
            .set("HF_TOKEN", "hf_secret_value");
        let c = HubClient::new(&env, "hf://datasets/o/n").unwrap();
        assert!(!format!("{c:?}").contains("hf_secret"), "{c:?}");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let o = c
            .object(
                "o/n",
                sha,
                "train dir/a#1.tar",
                "hf://datasets/o/n/train dir/a#1.tar",
            )
            .unwrap();
        assert_eq!(
            o.target,
            format!("/hub/datasets/o/n/resolve/{sha}/train%20dir/a%231.tar")
        );
        assert_eq!(o.url, "hf://datasets/o/n/train dir/a#1.tar");
        assert!(o.expects_redirect());
        let signed = o.range_request(0, 10, None).unwrap();
        let req = String::from_utf8(signed).unwrap();
        assert!(
            req.contains("\r\nAuthorization: Bearer hf_secret_value\r\n"),
            "{req}"
        );
        assert!(!format!("{o:?}").contains("hf_secret"));
        let e = HubClient::new(&env.clone().set("HF_HUB_OFFLINE", "1"), "hf://datasets/o/n")
            .unwrap_err();
        assert!(e.to_string().contains("HF_HUB_OFFLINE is set"), "{e}");
    }
}
