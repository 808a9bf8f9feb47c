//! What a reader needs for network reads, whatever its backend: the stall
//! time-out, the retry policy, the TLS set-up, the counters and the request
//! rates shared by a loader's readers ([`NetOptions`], [`NetStats`],
//! [`Pacer`]); [`with_retries`], the retry loop of blocking requests (HTTP
//! reads on threads, `HEAD` at open, S3 listing and writes); and
//! [`gave_up`], the error of a request the policy ends. The
//! configuration's defaults are applied by `NetOptions::for_config` in
//! `crate::fetch`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::net::http::{FailKind, HttpFail};
use crate::net::rate::{Admit, RateLimiter};
use crate::net::retry::{GiveUp, Jitter, RetryPolicy, Tries, authority};
use crate::net::tls::TlsSetup;
use crate::sync::Locked;

/// Network counters shared by a loader's readers. Relaxed: statistics.
#[derive(Debug, Default)]
pub struct NetStats {
    pub requests: AtomicU64,
    /// Retries, indexed by `FailKind::index`.
    pub retries: [AtomicU64; FailKind::ALL.len()],
    /// Hedges sent (a late range re-requested on a fresh connection), and
    /// the ranges a hedge finished (its answer came first).
    pub hedges_sent: AtomicU64,
    pub hedges_won: AtomicU64,
}

impl NetStats {
    /// Counts a retry of `url` after `f`, and logs it: the first of each
    /// kind in the process as a warning, the rest at debug level.
    pub fn retried(&self, url: &str, f: &HttpFail) {
        self.retries[f.kind.index()].fetch_add(1, Ordering::Relaxed);
        let msg = || format!("retrying `{url}` ({}): {}", f.kind.name(), f.message);
        if !crate::log::once(f.kind.name(), crate::log::Level::Warn, msg) {
            crate::log::log(crate::log::Level::Debug, msg);
        }
    }

    pub fn retries_by_kind(&self) -> Vec<(&'static str, u64)> {
        FailKind::ALL
            .iter()
            .map(|k| (k.name(), self.retries[k.index()].load(Ordering::Relaxed)))
            .collect()
    }
}

/// Whether pacers adapt request rates at all. Relaxed: a flag set once
/// before the reads it governs start.
static PACING: AtomicBool = AtomicBool::new(true);

/// Turns the adaptation of request rates off for every loader in the
/// process: requests go at once, throttled ones retried after their
/// backoff alone. Only for the test that shows what the adaptation saves;
/// never in a program.
#[doc(hidden)]
pub fn set_pacing(on: bool) {
    PACING.store(on, Ordering::Relaxed);
}

/// Whether HTTP reads ask for quick ACKs ([`quick_ack`]). Relaxed, as
/// `PACING`.
static QUICK_ACK: AtomicBool = AtomicBool::new(true);

/// Turns quick ACKs on or off for every loader in the process (on by
/// default). Only for the
/// test that shows what they save (tests/delayed_ack.rs); never in a
/// program.
#[doc(hidden)]
pub fn set_quick_ack(on: bool) {
    QUICK_ACK.store(on, Ordering::Relaxed);
}

/// Asks the socket `fd` to acknowledge what arrives at once, not on the
/// delayed-ACK timer (up to 40 ms on Linux): a server that writes a
/// response's head and its body apart without `TCP_NODELAY` (Python's
/// `http.server`, many small ones) holds the body's last short segment
/// until the head is acknowledged, and a request-response connection's
/// ACKs wait to ride on the next request. The kernel leaves quick-ACK mode
/// on its own, so it is asked for again after each request and at each
/// piece of the response head (Nagle holds back only the one short
/// segment after the head: the body needs no syscall of its own). A
/// failure only costs that wait.
pub(crate) fn quick_ack(fd: std::os::fd::RawFd) {
    if !QUICK_ACK.load(Ordering::Relaxed) {
        return;
    }
    let one: libc::c_int = 1;
    // SAFETY: `fd` is the caller's open socket; the option's value is a
    // c_int of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&raw const one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The request rates of a loader's hosts, shared by all its readers and
/// requests: one [`RateLimiter`] per host (a URL's authority), and the
/// clock they read.
///
/// One mutex for the loader: two locks per request (admit, answer) and a
/// scan of a handful of hosts, against a request's tens of microseconds of
/// system calls on loopback (and milliseconds on S3).
#[derive(Debug)]
pub struct Pacer {
    origin: Instant,
    /// A handful of hosts per loader: a list is quicker than a map.
    hosts: Mutex<Vec<(String, RateLimiter)>>,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer {
            origin: Instant::now(),
            hosts: Mutex::new(Vec::new()),
        }
    }
}

impl Pacer {
    fn with<R>(&self, url: &str, f: impl FnOnce(&mut RateLimiter, f64) -> R) -> R {
        let host = authority(url);
        let mut hosts = self.hosts.locked();
        // Read under the lock: a limiter's times must not go backwards.
        let now = self.origin.elapsed().as_secs_f64();
        let i = match hosts.iter().position(|(h, _)| h == host) {
            Some(i) => i,
            None => {
                hosts.push((host.to_string(), RateLimiter::new()));
                hosts.len() - 1
            }
        };
        f(&mut hosts[i].1, now)
    }

    /// A request to `url` is about to go: whether it has its token (and
    /// how long to wait for it) or must ask again later, and the time it
    /// will be sent at with its token (for [`Pacer::answered`]).
    pub fn admit(&self, url: &str) -> (f64, Admit) {
        if !PACING.load(Ordering::Relaxed) {
            return (
                self.origin.elapsed().as_secs_f64(),
                Admit::Go(Duration::ZERO),
            );
        }
        self.with(url, |r, now| {
            let a = r.admit(now);
            let wait = match a {
                Admit::Go(w) | Admit::Later(w) => w.as_secs_f64(),
            };
            (now + wait, a)
        })
    }

    /// The request sent at `sent` was answered: taken, or throttled (with
    /// the `Retry-After` the answer gave, if any).
    pub fn answered(&self, url: &str, sent: f64, throttled: Option<Option<Duration>>) {
        if !PACING.load(Ordering::Relaxed) {
            return;
        }
        self.with(url, |r, now| match throttled {
            Some(after) => r.throttled(sent, now, after.map(|d| d.as_secs_f64())),
            None => r.succeeded(now),
        })
    }

    /// The rate `url`'s host is held to, requests per second (0: none).
    pub fn rate(&self, url: &str) -> f64 {
        self.with(url, |r, _| r.rate())
    }

    /// Whether `url`'s host is paced now: a throttled request to it is
    /// retried when the bucket gives it a token, without a backoff of its
    /// own (the bucket is the backoff, by rate rather than by attempts).
    pub fn paced(&self, url: &str) -> bool {
        PACING.load(Ordering::Relaxed) && self.with(url, |r, _| r.enabled())
    }

    /// The hosts whose rate is held, with that rate and the rate they took
    /// without throttling (requests per second), for the stats' notes.
    pub fn rates(&self) -> Vec<(String, f64, f64)> {
        let hosts = self.hosts.locked();
        hosts
            .iter()
            .filter(|(_, r)| r.enabled())
            .map(|(h, r)| (h.clone(), r.rate(), r.good_rate()))
            .collect()
    }

    /// A note for the stats per paced host: its rate now.
    pub fn notes(&self) -> Vec<String> {
        self.rates()
            .into_iter()
            .map(|(h, rate, good)| {
                format!(
                    "{h}: throttled; requests paced at {rate:.1}/s (taken {good:.1}/s without throttling)"
                )
            })
            .collect()
    }
}

/// What a reader needs for network reads.
#[derive(Debug, Clone)]
pub struct NetOptions {
    pub stall: Duration,
    pub retry: RetryPolicy,
    pub stats: Arc<NetStats>,
    pub tls: Arc<TlsSetup>,
    pub pace: Arc<Pacer>,
}

/// Runs `op` until it succeeds, fails with an error retrying cannot fix, or
/// the policy ends it (attempts, deadline); waits for the host's rate
/// before each attempt, sleeps the policy's backoff between attempts and
/// counts each retry by kind.
pub fn with_retries<T>(
    net: &NetOptions,
    jitter: &mut Jitter,
    url: &str,
    mut op: impl FnMut() -> Result<T, HttpFail>,
) -> Result<T, Error> {
    let mut tries = Tries::default();
    let mut first_failure = None;
    loop {
        let sent = loop {
            match net.pace.admit(url) {
                (sent, Admit::Go(wait)) => {
                    if !wait.is_zero() {
                        std::thread::sleep(wait);
                    }
                    break sent;
                }
                (_, Admit::Later(wait)) => std::thread::sleep(wait),
            }
        };
        net.stats.requests.fetch_add(1, Ordering::Relaxed);
        match op() {
            Ok(v) => {
                net.pace.answered(url, sent, None);
                return Ok(v);
            }
            Err(f) => {
                if f.kind == FailKind::Throttled {
                    net.pace.answered(url, sent, Some(f.retry_after));
                }
                tries.record(f.kind);
                let failing_for = first_failure.get_or_insert_with(Instant::now).elapsed();
                match net.retry.decide(&tries, f.kind, failing_for, jitter.draw()) {
                    Ok(d) => {
                        net.stats.retried(url, &f);
                        std::thread::sleep(retry_wait(net, url, &f, d));
                    }
                    Err(why) => return Err(gave_up(url, f, &tries, failing_for, why, &net.retry)),
                }
            }
        }
    }
}

/// The wait before retrying a request to `url` that failed with `f`, the
/// policy having said `d`: a throttled request to a paced host goes as
/// soon as its token allows (the pacer's wait, taken at the next admit,
/// is its backoff), so that under a rate limit the rate rides the limit
/// instead of idling through exponential backoffs; anything else waits
/// `d`.
pub fn retry_wait(net: &NetOptions, url: &str, f: &HttpFail, d: Duration) -> Duration {
    if f.kind == FailKind::Throttled && net.pace.paced(url) {
        Duration::ZERO
    } else {
        d
    }
}

/// The error of a request to `url` that the policy ended after `f`:
/// throttled up to the deadline is [`Error::Throttled`]; anything else an
/// [`Error::Http`] (saying so when it was the deadline that ended it).
pub fn gave_up(
    url: &str,
    f: HttpFail,
    tries: &Tries,
    failing_for: Duration,
    why: GiveUp,
    policy: &RetryPolicy,
) -> Error {
    let attempts = tries.failures.max(1);
    match why {
        GiveUp::Deadline if f.kind == FailKind::Throttled => Error::Throttled {
            url: url.to_string(),
            attempts,
            waited_ms: failing_for.as_millis() as u64,
            deadline_ms: policy.deadline.as_millis() as u64,
            message: f.message,
        },
        GiveUp::Deadline => Error::Http {
            url: url.to_string(),
            kind: f.kind,
            message: format!(
                "{}; failing for {:.1} s, past `retry_deadline_s` ({} s)",
                f.message,
                failing_for.as_secs_f64(),
                policy.deadline.as_secs()
            ),
            attempts,
        },
        // A changed object is its own error (`Error::Changed`).
        GiveUp::Final | GiveUp::Attempts => f.into_error(url, attempts),
    }
}
