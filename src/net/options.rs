//! What a reader needs for network reads, whatever its backend: the stall
//! time-out, the retry policy, the TLS set-up and the counters shared by a
//! loader's readers ([`NetOptions`], [`NetStats`]); and [`with_retries`],
//! the retry loop of blocking requests (HTTP reads on threads, `HEAD` at
//! open, S3 listing). The configuration's defaults are applied by
//! `NetOptions::for_config` in `crate::fetch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Error;
use crate::net::http::{Fail, FailKind};
use crate::net::retry::{Jitter, RetryPolicy};
use crate::net::tls::TlsSetup;

/// Network counters shared by a loader's readers. Relaxed: statistics.
#[derive(Debug, Default)]
pub struct NetStats {
    pub requests: AtomicU64,
    /// Retries, indexed by `FailKind::index`.
    pub retries: [AtomicU64; FailKind::ALL.len()],
}

impl NetStats {
    /// Counts a retry of `url` after `f`, and logs it: the first of each
    /// kind in the process as a warning, the rest at debug level.
    pub fn retried(&self, url: &str, f: &Fail) {
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

/// What a reader needs for network reads.
#[derive(Debug, Clone)]
pub struct NetOptions {
    pub stall: Duration,
    pub retry: RetryPolicy,
    pub stats: Arc<NetStats>,
    pub tls: Arc<TlsSetup>,
}

/// Runs `op` until it succeeds, fails with an error retrying cannot fix, or
/// runs out of attempts; sleeps the policy's backoff between attempts and
/// counts each retry by kind.
pub fn with_retries<T>(
    net: &NetOptions,
    jitter: &mut Jitter,
    url: &str,
    mut op: impl FnMut() -> Result<T, Fail>,
) -> Result<T, Error> {
    let mut attempt = 0;
    loop {
        net.stats.requests.fetch_add(1, Ordering::Relaxed);
        match op() {
            Ok(v) => return Ok(v),
            Err(f) => match net.retry.next_delay(attempt, f.kind, jitter.draw()) {
                Some(d) => {
                    net.stats.retried(url, &f);
                    std::thread::sleep(d);
                    attempt += 1;
                }
                None => return Err(f.into_error(url, attempt + 1)),
            },
        }
    }
}
