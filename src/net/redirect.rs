//! HTTP redirects, pure: which answers are followed, where a `Location`
//! leads (resolved against the URL asked by the `url` crate, as RFC 3986
//! resolves a reference), and the checks a chain of them passes before
//! its next request. The readers (`crate::fetch`: the ranged GETs on
//! io_uring and on threads, `HEAD`) follow a chain request by request and
//! remember where a shard's chain ended (`HttpObject::remember`), so its
//! later ranges go there at once; the Hub's API client follows its own
//! (`super::hub`).
//!
//! The rules, for every chain:
//! - 301, 302, 303, 307 and 308 with a `Location` are followed, the same
//!   method asked again (GET with its `Range`, or `HEAD`: 303's "see
//!   other" is a GET already). A 3xx without one is an answer like any
//!   other error (S3's 301 `PermanentRedirect` names its endpoint in the
//!   body, not in a header).
//! - At most [`MAX_REDIRECTS`] hops; a URL asked before in the chain is a
//!   loop. Both are named errors ([`FailKind::Redirect`]), never retried.
//! - `https` to `http` is refused, as is any scheme but those two: the
//!   answer would travel unencrypted, and a signed URL with it.
//! - The user information of a `Location` (`user:pw@`) and its fragment
//!   are dropped: never sent.
//! - Credentials go to their own origin only ([`Hop::same_origin`]:
//!   scheme, host and port): the reader keeps the request's signer (SigV4,
//!   a bearer token) on a hop to the same origin and drops it on any
//!   other. A signed query the `Location` itself carries is the target's
//!   own, and goes with it.

use super::http::{FailKind, HttpFail};

/// The most redirects one request follows. The longest chain the Hub
/// gives is three (a renamed repository's 307 to its new name, the
/// `resolve/` URL's 302 to its content host, and, for some files, one more
/// hop between content hosts); ten is reqwest's default, so the data
/// plane and the control plane's clients give up at the same length, and
/// a loop with a changing query (which the URL check cannot see) costs ten
/// round trips before its error, not a hang.
pub const MAX_REDIRECTS: usize = 10;

/// Whether an answer of `status` is a redirect to follow (given a
/// `Location`).
pub fn followed(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Where a redirect leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The URL to ask next, absolute, without user information or
    /// fragment, its query (a signature) kept.
    pub url: String,
    /// The same scheme, host and port as the URL asked: the request's
    /// credentials may go there.
    pub same_origin: bool,
    /// The URL asked (as parsed): the chain's first when it is taken first.
    from: String,
}

/// The URLs one request's chain has asked, the first included: what makes
/// a loop, and how many hops were taken.
#[derive(Debug, Default, Clone)]
pub struct Chain {
    seen: Vec<String>,
}

impl Chain {
    /// The redirects followed so far.
    pub fn hops(&self) -> usize {
        self.seen.len().saturating_sub(1)
    }

    /// The answer to `from` (the URL asked, whole) was a `status` redirect
    /// to `location`: the next hop, or why there is none. The hop counts
    /// once it is [`taken`](Chain::take): a request whose next hop could
    /// not be made (its host not found) is asked again, and its answer's
    /// `Location` is then no loop.
    pub fn follow(&self, from: &str, status: u16, location: &str) -> Result<Hop, HttpFail> {
        let refuse = |why: String| HttpFail::new(FailKind::Redirect, why);
        let shown = crate::redact::url(location);
        let base = url::Url::parse(from)
            .map_err(|e| refuse(format!("HTTP {status}: the URL asked is not one ({e})")))?;
        let mut next = base.join(location).map_err(|e| {
            refuse(format!(
                "HTTP {status} to `{shown}`, which is not a URL ({e})"
            ))
        })?;
        match (base.scheme(), next.scheme()) {
            ("https", "http") => {
                return Err(refuse(format!(
                    "HTTP {status} from https to http (`{shown}`) refused: the answer would travel \
                     unencrypted"
                )));
            }
            (_, "http" | "https") => {}
            (_, other) => {
                return Err(refuse(format!(
                    "HTTP {status} to a `{other}:` URL (`{shown}`), which is not followed: \
                     http and https only"
                )));
            }
        }
        if next.host_str().is_none_or(str::is_empty) {
            return Err(refuse(format!(
                "HTTP {status} to `{shown}`, which has no host"
            )));
        }
        // Never sent: user information would be a credential for a host
        // the user did not name, and a fragment is not part of a request.
        let _ = next.set_username("");
        let _ = next.set_password(None);
        next.set_fragment(None);
        let url = next.as_str().to_string();
        if url == base.as_str() || self.seen.contains(&url) {
            return Err(refuse(format!(
                "redirect loop: HTTP {status} to `{}`, which this chain of {} redirect(s) asked \
                 before",
                crate::redact::url(&url),
                self.hops()
            )));
        }
        if self.hops() >= MAX_REDIRECTS {
            return Err(refuse(format!(
                "more than {MAX_REDIRECTS} redirects (the last, HTTP {status}, to `{}`)",
                crate::redact::url(&url)
            )));
        }
        Ok(Hop {
            same_origin: next.origin() == base.origin(),
            from: base.as_str().to_string(),
            url,
        })
    }

    /// The request goes to `hop`: counted, and its URL a loop from now on.
    pub fn take(&mut self, hop: &Hop) {
        if self.seen.is_empty() {
            self.seen.push(hop.from.clone());
        }
        self.seen.push(hop.url.clone());
    }
}

/// The control plane's redirect policy for reqwest clients that send no
/// credentials of their own (a mounted HTTP source's listing pages): the
/// same bound, loop check and refusal of `https` to `http` as the data
/// plane's chains. reqwest itself drops `Authorization` and cookies on a
/// hop to another origin; a client that signs its requests (S3's) follows
/// none at all.
pub fn reqwest_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let next = attempt.url().clone();
        let previous = attempt.previous();
        let downgrade = previous
            .last()
            .is_some_and(|p| p.scheme() == "https" && next.scheme() == "http");
        if downgrade {
            attempt.error("a redirect from https to http is refused")
        } else if !matches!(next.scheme(), "http" | "https") {
            attempt.error("a redirect to a URL not http or https is not followed")
        } else if previous.contains(&next) {
            attempt.error("redirect loop")
        } else if previous.len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// Whether two URLs have the same origin (scheme, host and port, default
/// ports filled in): what credentials are kept within. Unparsable URLs
/// have none in common.
pub fn same_origin(a: &str, b: &str) -> bool {
    match (url::Url::parse(a), url::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin().is_tuple() && a.origin() == b.origin(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(chain: &mut Chain, from: &str, location: &str) -> Result<Hop, HttpFail> {
        let hop = chain.follow(from, 302, location)?;
        chain.take(&hop);
        Ok(hop)
    }

    #[test]
    fn relative_and_absolute_locations_resolve_against_the_url_asked() {
        let from = "https://hub.example/datasets/o/n/resolve/main/a/b.tar?download=1";
        for (location, want, same) in [
            ("/x/y.tar", "https://hub.example/x/y.tar", true),
            (
                "c.tar",
                "https://hub.example/datasets/o/n/resolve/main/a/c.tar",
                true,
            ),
            (
                "../z.tar?s=1",
                "https://hub.example/datasets/o/n/resolve/main/z.tar?s=1",
                true,
            ),
            (
                "//cdn.example/k?sig=1",
                "https://cdn.example/k?sig=1",
                false,
            ),
            (
                "https://hub.example:8443/k",
                "https://hub.example:8443/k",
                false,
            ),
            (
                "https://HUB.example:443/k#frag",
                "https://hub.example/k",
                true,
            ),
            ("https://u:p@cdn.example/k", "https://cdn.example/k", false),
            ("http://hub.example/k", "", false),
        ] {
            let got = follow(&mut Chain::default(), from, location);
            if want.is_empty() {
                let f = got.unwrap_err();
                assert_eq!(f.kind, FailKind::Redirect);
                assert!(f.message.contains("https to http"), "{f}");
                continue;
            }
            let hop = got.unwrap_or_else(|f| panic!("{location}: {f}"));
            assert_eq!(
                (hop.url.as_str(), hop.same_origin),
                (want, same),
                "{location}"
            );
        }
        // http to https is an upgrade: followed, another origin.
        let hop = follow(&mut Chain::default(), "http://h/k", "https://h/k").unwrap();
        assert!(!hop.same_origin);
        assert!(followed(301) && followed(308) && !followed(300) && !followed(304));
    }

    #[test]
    fn loops_long_chains_and_other_schemes_are_named() {
        let mut c = Chain::default();
        follow(&mut c, "http://a/1", "/2").unwrap();
        let f = follow(&mut c, "http://a/2", "/1").unwrap_err();
        assert!(f.message.contains("redirect loop"), "{f}");
        assert!(!f.kind.retryable());
        let mut c = Chain::default();
        for i in 0..MAX_REDIRECTS {
            follow(&mut c, &format!("http://a/{i}"), &format!("/{}", i + 1)).unwrap();
        }
        assert_eq!(c.hops(), MAX_REDIRECTS);
        let f = follow(&mut c, "http://a/10", "/11").unwrap_err();
        assert!(f.message.contains("more than 10 redirects"), "{f}");
        // A hop not taken (its host not found, the request asked again)
        // is no loop when the same answer comes back.
        let c = Chain::default();
        c.follow("http://a/1", 302, "/2").unwrap();
        c.follow("http://a/1", 302, "/2").unwrap();
        assert_eq!(c.hops(), 0);
        let f = Chain::default()
            .follow("http://a/1", 302, "/1")
            .unwrap_err();
        assert!(f.message.contains("loop"), "{f}");
        for bad in [
            "file:///etc/passwd",
            "ftp://h/x",
            "data:,x",
            "http://",
            "http://[::1",
        ] {
            let f = follow(&mut Chain::default(), "http://a/1", bad).unwrap_err();
            assert_eq!(f.kind, FailKind::Redirect, "{bad}: {f}");
        }
    }

    /// A signed query in a `Location` is a credential of the target's:
    /// followed as it is, but never printed.
    #[test]
    fn errors_show_no_signature() {
        let mut c = Chain::default();
        follow(&mut c, "http://a/1", "http://b/k?X-Amz-Signature=s3cr3t").unwrap();
        let f = follow(&mut c, "http://b/k?X-Amz-Signature=s3cr3t", "http://a/1").unwrap_err();
        assert!(
            f.message.contains("loop") && !f.message.contains("s3cr3t"),
            "{f}"
        );
        let f = follow(
            &mut Chain::default(),
            "https://a/1",
            "http://b/k?signature=s3cr3t",
        )
        .unwrap_err();
        assert!(!f.message.contains("s3cr3t"), "{f}");
        let hop = follow(
            &mut Chain::default(),
            "http://a/1",
            "http://b/k?signature=s3cr3t",
        )
        .unwrap();
        assert_eq!(hop.url, "http://b/k?signature=s3cr3t");
    }

    #[test]
    fn origins() {
        assert!(same_origin("https://h/a", "https://h:443/b?x"));
        assert!(!same_origin("https://h/a", "http://h/a"));
        assert!(!same_origin("http://h:1/a", "http://h:2/a"));
        assert!(!same_origin("http://h/a", "not a url"));
    }
}
