//! The S3 control plane: a client that turns `s3://` URLs into signed
//! [`HttpObject`]s for the data plane, and lists prefixes with
//! ListObjectsV2 (paginated by continuation token) over reqwest.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::creds::Provider;
use super::sign::SigV4Signer;
use super::{Addressing, Env, S3Config, S3Url, encode_query, explain_code};
use crate::error::{Error, Result};
use crate::net::http::{FailKind, HttpFail};
use crate::net::object::{HttpObject, RequestSigner};
use crate::net::retry::Jitter;
use crate::net::{NetOptions, with_retries};
use crate::sync::Locked;

/// One page of a ListObjectsV2 answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Keys and sizes, in the order listed.
    pub objects: Vec<(String, u64)>,
    /// Each object's ETag as listed (`None` where the answer gave none),
    /// in the order of `objects`.
    pub etags: Vec<Option<String>>,
    /// The common prefixes (a delimited listing's subdirectories), each
    /// ending with the delimiter.
    pub prefixes: Vec<String>,
    /// The token of the next page, when the listing is truncated.
    pub next: Option<String>,
}

/// Parses a ListObjectsV2 result.
pub fn parse_page(xml: &str) -> std::result::Result<Page, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct ListBucketResult {
        #[serde(default)]
        contents: Vec<Contents>,
        #[serde(default)]
        common_prefixes: Vec<CommonPrefix>,
        #[serde(default)]
        is_truncated: bool,
        next_continuation_token: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Contents {
        key: String,
        size: u64,
        #[serde(rename = "ETag")]
        etag: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct CommonPrefix {
        prefix: String,
    }
    let r: ListBucketResult = quick_xml::de::from_str(xml)
        .map_err(|e| format!("the ListObjectsV2 answer is not valid: {e}"))?;
    let next = match (r.is_truncated, r.next_continuation_token) {
        (true, Some(t)) if !t.is_empty() => Some(t),
        (true, _) => return Err("the listing is truncated but gives no continuation token".into()),
        (false, _) => None,
    };
    let (objects, etags) = r
        .contents
        .into_iter()
        .map(|c| ((c.key, c.size), c.etag))
        .unzip();
    Ok(Page {
        objects,
        etags,
        prefixes: r.common_prefixes.into_iter().map(|p| p.prefix).collect(),
        next,
    })
}

/// A directory's listing (one level, `/` as the delimiter): its objects
/// with size and ETag, and its subdirectories' prefixes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirListing {
    pub objects: Vec<(String, u64, Option<String>)>,
    pub prefixes: Vec<String>,
}

/// Listing pages asked for; S3's maximum (and default).
pub const LIST_PAGE: u32 = 1000;

/// Addressing and signing of one loader's S3 requests.
#[derive(Debug)]
pub struct S3Client {
    pub addressing: Addressing,
    pub(super) signer: Option<Arc<SigV4Signer>>,
    pub(super) http: reqwest::blocking::Client,
    /// Addresses by `host:port`: a listing of a million keys on one
    /// endpoint resolves it once, not once per object.
    dns: Mutex<HashMap<(String, u16), Vec<SocketAddr>>>,
}

impl S3Client {
    /// Resolves the endpoint and region, and runs the credential chain
    /// unless access is unsigned.
    pub fn new(cfg: &S3Config, env: &Env) -> Result<S3Client> {
        let addressing = Addressing::resolve(cfg, env).map_err(Error::Config)?;
        let signer = if cfg.unsigned {
            None
        } else {
            let p = Provider::new(cfg, env).map_err(Error::Credentials)?;
            Some(Arc::new(SigV4Signer::new(Arc::new(p), &addressing.region)))
        };
        let http = reqwest::blocking::Client::builder()
            // 10 s to connect, 60 s a page: a page of 1,000 keys is about
            // 300 KB and S3 answers it in well under a second; a listing
            // that stalls longer is failed (and retried) rather than hung.
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            // A request signed for one URL is never sent to another: its
            // signature and session token would go with it (reqwest drops
            // only `Authorization` across hosts). S3's redirects (301 or
            // 307 to a bucket's region) name the endpoint in their XML,
            // which the error then shows.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(S3Client {
            addressing,
            signer,
            http,
            dns: Mutex::new(HashMap::new()),
        })
    }

    /// The data-plane object of `bucket/key`, signed; named `s3://bucket/key`
    /// in messages.
    pub fn object(&self, url: &S3Url) -> Result<HttpObject> {
        let http_url = self.addressing.object_url(&url.bucket, &url.key);
        let p = crate::net::http::parse_url(&http_url).map_err(|reason| Error::Url {
            url: url.display(),
            reason,
        })?;
        let mut dns = self.dns.locked();
        let addrs = match dns.get(&(p.host.clone(), p.port)) {
            Some(a) => a.clone(),
            None => {
                let a: Vec<_> = (p.host.as_str(), p.port)
                    .to_socket_addrs()
                    .map_err(|e| Error::Http {
                        url: url.display(),
                        kind: FailKind::Dns,
                        message: format!("cannot resolve `{}`: {e}", p.host),
                        attempts: 1,
                    })?
                    .collect();
                dns.insert((p.host.clone(), p.port), a.clone());
                a
            }
        };
        drop(dns);
        let mut obj = HttpObject::new(&http_url, addrs).map_err(|reason| Error::Url {
            url: url.display(),
            reason,
        })?;
        obj.url = url.display();
        Ok(match &self.signer {
            Some(s) => obj.with_signer(Arc::clone(s) as Arc<dyn RequestSigner>),
            None => obj,
        })
    }

    /// Every key under `prefix` with its size, in key order, following
    /// continuation tokens; `page` keys per request. `recursive`: every key
    /// that starts with `prefix`, at any depth (no delimiter, as `aws s3 ls
    /// --recursive` lists); else only direct children (`/` as the
    /// delimiter, as a local directory lists its files).
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        recursive: bool,
        page: u32,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        self.pages(bucket, prefix, recursive, page, net, jitter, |p| {
            out.extend(p.objects)
        })?;
        Ok(out)
    }

    /// The objects directly under `prefix` (with their ETags) and its
    /// subdirectories (common prefixes): a directory as a file system
    /// shows it.
    pub fn list_dir(
        &self,
        bucket: &str,
        prefix: &str,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<DirListing> {
        let mut out = DirListing::default();
        self.pages(bucket, prefix, false, LIST_PAGE, net, jitter, |p| {
            out.objects.extend(
                p.objects
                    .into_iter()
                    .zip(p.etags)
                    .map(|((k, s), e)| (k, s, e)),
            );
            out.prefixes.extend(p.prefixes);
        })?;
        Ok(out)
    }

    /// Every page of a listing, in order, to `each`.
    #[allow(clippy::too_many_arguments)]
    fn pages(
        &self,
        bucket: &str,
        prefix: &str,
        recursive: bool,
        page: u32,
        net: &NetOptions,
        jitter: &mut Jitter,
        mut each: impl FnMut(Page),
    ) -> Result<()> {
        let mut token: Option<String> = None;
        let what = format!("s3://{bucket}/{prefix}");
        loop {
            let mut url = format!(
                "{}?list-type=2{}&max-keys={page}&prefix={}",
                self.addressing.bucket_url(bucket),
                if recursive { "" } else { "&delimiter=%2F" },
                encode_query(prefix)
            );
            if let Some(t) = &token {
                url.push_str(&format!("&continuation-token={}", encode_query(t)));
            }
            let mut code = None;
            let body = with_retries(net, jitter, &what, || {
                self.get(&url)
                    .inspect_err(|f: &HttpFail| code.clone_from(&f.code))
            })
            .map_err(|e| s3_error(e, bucket, prefix, code.take()))?;
            let p = parse_page(&body).map_err(|reason| Error::Url {
                url: what.clone(),
                reason,
            })?;
            let next = p.next.clone();
            each(p);
            match next {
                Some(t) if Some(&t) != token.as_ref() => token = Some(t),
                Some(_) => {
                    return Err(Error::Url {
                        url: what,
                        reason: "the listing repeats its continuation token".into(),
                    });
                }
                None => return Ok(()),
            }
        }
    }

    /// One signed GET of a small document (a listing page), once.
    fn get(&self, url: &str) -> std::result::Result<String, HttpFail> {
        let reply = self.send("GET", url, &[], Vec::new(), Duration::from_secs(60))?;
        String::from_utf8(reply.body)
            .map_err(|_| HttpFail::new(FailKind::Protocol, "the listing is not UTF-8"))
    }
}

/// An error that S3 answered with a code becomes [`Error::S3`] naming the
/// bucket and key; others pass through.
pub fn s3_error(e: Error, bucket: &str, key: &str, code: Option<String>) -> Error {
    match (e, code) {
        (Error::Http { kind, message, .. }, Some(code))
            if kind == FailKind::Client
                || kind == FailKind::Throttled
                || kind == FailKind::ServerError =>
        {
            // The last "HTTP " is ours (the URL, which may hold anything,
            // comes first in the message).
            let status = message
                .rsplit("HTTP ")
                .next()
                .and_then(|s| s.get(..3))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Error::S3 {
                bucket: bucket.to_string(),
                key: key.to_string(),
                status,
                explain: explain_code(&code),
                code,
            }
        }
        (e, _) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_parse_with_and_without_continuation() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>p/a.tar</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><Size>10</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>p/b &amp; c.tar</Key><Size>20</Size></Contents>
  <CommonPrefixes><Prefix>p/sub/</Prefix></CommonPrefixes>
  <NextContinuationToken>tok/1=</NextContinuationToken>
</ListBucketResult>"#;
        let p = parse_page(xml).unwrap();
        assert_eq!(
            p.objects,
            vec![("p/a.tar".to_string(), 10), ("p/b & c.tar".to_string(), 20)]
        );
        assert_eq!(p.next.as_deref(), Some("tok/1="));
        assert_eq!(p.prefixes, vec!["p/sub/".to_string()]);
        assert_eq!(p.etags, vec![None, None]);
        let tagged = r#"<ListBucketResult><Contents><Key>k</Key><ETag>&quot;abc&quot;</ETag><Size>3</Size></Contents></ListBucketResult>"#;
        assert_eq!(
            parse_page(tagged).unwrap().etags,
            vec![Some("\"abc\"".to_string())]
        );
        let last = "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>z</Key><Size>1</Size></Contents></ListBucketResult>";
        assert_eq!(parse_page(last).unwrap().next, None);
        let empty = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert!(parse_page(empty).unwrap().objects.is_empty());
    }

    #[test]
    fn bad_listings_are_clear_errors() {
        for (xml, want) in [
            (
                "<ListBucketResult><Contents><Key>a</Key><Size>x</Size></Contents></ListBucketResult>",
                "not valid",
            ),
            ("<ListBucketResult><Contents><Key>a</Key>", "not valid"),
            ("not xml at all", "not valid"),
            (
                "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                "no continuation token",
            ),
        ] {
            let e = parse_page(xml).unwrap_err();
            assert!(e.contains(want), "{xml}: {e}");
        }
    }

    #[test]
    fn answered_errors_name_bucket_key_and_code() {
        let e = Error::Http {
            url: "s3://b/k".into(),
            kind: FailKind::Client,
            message: "s3://b/HTTP 500.tar: HTTP 404 Not Found, S3 error code NoSuchKey".into(),
            attempts: 1,
        };
        let e = s3_error(e, "b", "k", Some("NoSuchKey".into()));
        let text = e.to_string();
        assert!(matches!(e, Error::S3 { status: 404, .. }), "{text}");
        assert!(
            text.contains("bucket `b`") && text.contains("key `k`") && text.contains("NoSuchKey"),
            "{text}"
        );
    }
}
