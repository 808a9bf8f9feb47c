//! A redirect's next request: the object it asks, made from the hop
//! (`super::redirect`) and the object that answered with it. Within the
//! origin it keeps that object's addresses and signer; on another origin
//! it has no signer (no `Authorization`, no SigV4 signature: the rule of
//! `super::redirect`) and the new host's addresses, looked up here.
//!
//! The lookups are cached for the process ([`ADDR_TTL`]): a dataset's
//! shards all redirect to one or two content hosts, and a lookup is a
//! blocking `getaddrinfo` on the thread that follows the redirect (a
//! network thread's ring waits meanwhile), so each host costs one lookup
//! a minute, not one per shard.
//!
//! [`Route`] is one request's way to its object, the same for both
//! readers (`crate::fetch`): it starts where the object's last chain
//! ended (its remembered target: one redirect per shard, not per range),
//! follows each redirect answered, and when a remembered target answers
//! 403 (a content host's answer to an expired signed URL) starts again
//! from the object's own URL, once; the target its chain ends at becomes
//! the object's route.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::http::{FailKind, HttpFail, ResponseHead};
use super::object::HttpObject;
use super::redirect::{Hop, followed};
use super::version::VersionPin;
use crate::sync::Locked;

/// How long a host's looked-up addresses are used: a minute, the TTL
/// CDNs (CloudFront, the Hub's content hosts) give their names, so a
/// rotation of addresses is seen within one.
pub const ADDR_TTL: Duration = Duration::from_secs(60);

/// Hosts kept at most; past it the cache starts over. A loader meets a
/// handful of content hosts; the bound only stops a server that redirects
/// to a new host name every time from growing it without end.
const MAX_HOSTS: usize = 256;

type Cache = Mutex<HashMap<(String, u16), (Instant, Vec<SocketAddr>)>>;

fn cache() -> &'static Cache {
    static HOSTS: OnceLock<Cache> = OnceLock::new();
    HOSTS.get_or_init(Cache::default)
}

/// The addresses of `host`, from the cache when looked up less than
/// [`ADDR_TTL`] ago. A host without any is `FailKind::Dns` (retried: the
/// redirect is asked for again).
pub fn addresses(host: &str, port: u16) -> Result<Vec<SocketAddr>, HttpFail> {
    let key = (host.to_string(), port);
    if let Some((at, addrs)) = cache().locked().get(&key)
        && at.elapsed() < ADDR_TTL
    {
        return Ok(addrs.clone());
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| HttpFail::new(FailKind::Dns, format!("cannot resolve `{host}`: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(HttpFail::new(
            FailKind::Dns,
            format!("`{host}` has no address"),
        ));
    }
    let mut hosts = cache().locked();
    if hosts.len() >= MAX_HOSTS {
        hosts.clear();
    }
    hosts.insert(key, (Instant::now(), addrs.clone()));
    Ok(addrs)
}

/// The object the request to `from` goes to next, after its answer
/// redirected to `hop`: `from`'s addresses and signer within its origin,
/// none of its credentials elsewhere.
pub fn next_object(from: &HttpObject, hop: &Hop) -> Result<Arc<HttpObject>, HttpFail> {
    let bad = |why: String| HttpFail::new(FailKind::Redirect, why);
    let parsed = super::http::parse_url(&hop.url).map_err(|e| {
        bad(format!(
            "a redirect to `{}`, which cannot be asked: {e}",
            crate::redact::url(&hop.url)
        ))
    })?;
    let same = hop.same_origin
        && parsed.host == from.host
        && parsed.port == from.port
        && parsed.tls == from.tls;
    let addrs = if same {
        from.addrs.clone()
    } else {
        addresses(&parsed.host, parsed.port)?
    };
    let obj = HttpObject::new(&hop.url, addrs).map_err(bad)?;
    Ok(Arc::new(match (&from.signer, same) {
        (Some(s), true) => obj.with_signer(Arc::clone(s)),
        _ => obj,
    }))
}

/// What an answer means for the request's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The answer is the request's: read it (a success or an error).
    Final,
    /// The request goes again, to [`Route::at`] (a redirect followed, or
    /// an expired target forgotten). The answer's body is not wanted.
    Again,
}

/// One request's way to its object (see the module's doc).
#[derive(Debug, Default, Clone)]
pub struct Route {
    /// Where the request goes; `None`: the object itself.
    at: Option<Arc<HttpObject>>,
    /// `at` is the object's remembered target, not one this chain found:
    /// a 403 from it is taken for expiry.
    remembered: bool,
    /// The object's URL was asked again after its remembered target
    /// expired: a second expiry is an error.
    again: bool,
    chain: super::redirect::Chain,
}

impl Route {
    /// A request to `obj`: to its remembered target, if it has one.
    pub fn new(obj: &HttpObject) -> Route {
        let at = obj.route();
        Route {
            remembered: at.is_some(),
            at,
            again: false,
            chain: Default::default(),
        }
    }

    /// The object the request goes to.
    pub fn at<'a>(&'a self, obj: &'a HttpObject) -> &'a HttpObject {
        self.at.as_deref().unwrap_or(obj)
    }

    /// The same, as an `Arc`.
    pub fn target(&self, obj: &Arc<HttpObject>) -> Arc<HttpObject> {
        Arc::clone(self.at.as_ref().unwrap_or(obj))
    }

    /// Whether the request goes to the object itself, not to a target.
    pub fn at_object(&self) -> bool {
        self.at.is_none()
    }

    /// The `If-Match` the request carries: the pin's, except to an object
    /// that redirects (the validator is its target's).
    pub fn if_match<'p>(&self, obj: &HttpObject, pin: Option<&'p VersionPin>) -> Option<&'p str> {
        if self.at.is_none() && obj.expects_redirect() {
            return None;
        }
        pin.and_then(VersionPin::if_match)
    }

    /// The answer `h` to the request to [`Route::at`] of `obj`: whether it
    /// is the request's, or the request goes again; a redirect that is not
    /// followed, or a second expiry, is the error (its message naming
    /// `obj`).
    pub fn answered(&mut self, obj: &HttpObject, h: &ResponseHead) -> Result<Turn, HttpFail> {
        let named = |mut f: HttpFail| {
            f.message = format!("{}: {}", obj.url, f.message);
            f
        };
        if let Some(location) = h.location.as_deref().filter(|_| followed(h.status)) {
            obj.saw_redirect();
            let at = self.at(obj);
            let hop = self
                .chain
                .follow(&at.request_url(), h.status, location)
                .map_err(named)?;
            let next = next_object(at, &hop).map_err(named)?;
            self.chain.take(&hop);
            self.at = Some(next);
            self.remembered = false;
            return Ok(Turn::Again);
        }
        if h.status != 403 || self.at.is_none() {
            return Ok(Turn::Final);
        }
        if self.again || !self.remembered {
            return Err(named(HttpFail::new(
                FailKind::Client,
                format!(
                    "{} from the redirect's target{}",
                    h.status_text(),
                    if self.again {
                        ", after its expired target was resolved again once from this URL"
                    } else {
                        ""
                    }
                ),
            )));
        }
        // An expired signed URL: the object's own URL again (unless
        // another request found a new target meanwhile), once.
        if let Some(at) = self.at.take() {
            obj.forget(&at);
        }
        self.at = obj.route();
        self.remembered = self.at.is_some();
        self.again = true;
        self.chain = Default::default();
        Ok(Turn::Again)
    }

    /// The request's answer was taken: where its chain ended is where the
    /// object's next requests go.
    pub fn arrived(&self, obj: &HttpObject) {
        if let Some(at) = &self.at
            && !self.remembered
        {
            obj.remember(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::redirect::Chain;

    #[derive(Debug)]
    struct Marker;
    impl crate::net::object::RequestSigner for Marker {
        fn sign(&self, _: &str, _: &HttpObject, _: Option<&str>) -> Result<String, HttpFail> {
            Ok("Authorization: Bearer marker\r\n".into())
        }
    }

    /// The signer stays within the origin, and a host's addresses are the
    /// origin's or looked up.
    #[test]
    fn credentials_stay_within_their_origin() {
        let from = HttpObject::new(
            "http://127.0.0.1:9/a.tar",
            vec!["127.0.0.1:9".parse().unwrap()],
        )
        .unwrap()
        .with_signer(Arc::new(Marker));
        let chain = Chain::default();
        let same = chain
            .follow(&from.request_url(), 302, "/b.tar?x=1")
            .unwrap();
        let next = next_object(&from, &same).unwrap();
        assert!(next.signer.is_some());
        assert_eq!(
            (next.target.as_str(), next.addrs.clone()),
            ("/b.tar?x=1", from.addrs.clone())
        );
        for other in ["http://127.0.0.1:10/b.tar", "http://[::1]:9/b.tar"] {
            let hop = chain.follow(&from.request_url(), 307, other).unwrap();
            let next = next_object(&from, &hop).unwrap();
            assert!(next.signer.is_none(), "{other}");
            assert_eq!(next.addrs.len(), 1, "{other}");
        }
        let e = addresses("no-such-host.invalid", 80).unwrap_err();
        assert_eq!(e.kind, FailKind::Dns);
    }
}
