//! The credentials of a loader, kept and refreshed from the source the
//! chain chose, before temporary ones expire.
//!
//! One caller refreshes at a time, outside the lock: the others go on with
//! the credentials in hand while those are valid, and wait for the refresh
//! only once they have expired. A refresh that fails is not tried again at
//! every request: the next try waits a capped exponential backoff
//! ([`REFRESH_BACKOFF`]), never past the expiry.

use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::chain::fetch;
use super::{CredentialSource, Credentials, REFRESH_MARGIN, chain, expired};
use crate::net::retry::Backoff;
use crate::net::s3::{Env, S3Config};
use crate::sync::{Locked, Waits};

/// The wait after a failed refresh: 1 s (a source over HTTP answers in
/// milliseconds, so a second is a long pause for it), doubling, at most a
/// minute (so a refresh begun 5 minutes before the expiry is tried again
/// several times before it).
pub const REFRESH_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};

/// What the provider keeps, under its lock.
struct State {
    current: Credentials,
    /// When `current` was fetched, when known: its lifetime sets when it
    /// is due.
    fetched: Option<SystemTime>,
    /// A caller is fetching new credentials (outside the lock).
    refreshing: bool,
    /// Failed refreshes in a row, and the earliest time of the next try.
    failures: u32,
    next_try: Option<SystemTime>,
    last_error: Option<String>,
    /// Fetches begun (the first, by the chain, not counted).
    fetches: u64,
}

/// The credentials of a loader: the chain's choice, fetched again from the
/// same source before they expire.
pub struct Provider {
    source: CredentialSource,
    cfg: S3Config,
    env: Env,
    state: Mutex<State>,
    backoff: Backoff,
    /// Signalled when a refresh ends.
    refreshed: Condvar,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// When credentials fetched at `fetched` are due for a refresh: the
/// margin before their expiry ([`REFRESH_MARGIN`]), or half their lifetime
/// for credentials that live less than twice the margin (else every
/// request would fetch again). With no fetch time (or one past the
/// expiry), the margin.
pub fn refresh_due(c: &Credentials, fetched: Option<SystemTime>) -> Option<SystemTime> {
    let e = c.expiry?;
    let margin = match fetched.and_then(|f| e.duration_since(f).ok()) {
        Some(life) if !life.is_zero() => REFRESH_MARGIN.min(life / 2),
        _ => REFRESH_MARGIN,
    };
    Some(e.checked_sub(margin).unwrap_or(SystemTime::UNIX_EPOCH))
}

impl Provider {
    /// Runs the chain once.
    pub fn new(cfg: &S3Config, env: &Env) -> Result<Provider, String> {
        let (source, c) = chain(cfg, env)?;
        let p = Provider::with(source, c, cfg, env);
        p.lock().fetched = Some(SystemTime::now());
        Ok(p)
    }

    /// A provider that starts from `c`, fetched from `source` at a time
    /// not known (so due [`REFRESH_MARGIN`] before their expiry).
    pub fn with(source: CredentialSource, c: Credentials, cfg: &S3Config, env: &Env) -> Provider {
        Provider {
            source,
            cfg: cfg.clone(),
            env: env.clone(),
            state: Mutex::new(State {
                current: c,
                fetched: None,
                refreshing: false,
                failures: 0,
                next_try: None,
                last_error: None,
                fetches: 0,
            }),
            backoff: REFRESH_BACKOFF,
            refreshed: Condvar::new(),
        }
    }

    /// Waits between failed refreshes other than [`REFRESH_BACKOFF`].
    pub fn set_backoff(&mut self, backoff: Backoff) {
        self.backoff = backoff;
    }

    pub fn source(&self) -> CredentialSource {
        self.source
    }

    /// Refreshes begun since the chain's first fetch.
    pub fn fetches(&self) -> u64 {
        self.lock().fetches
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Credentials good for at least a while at `now`. A failed refresh
    /// keeps the old credentials while they are still valid, and is tried
    /// again only after its backoff; expired credentials whose refresh is
    /// backing off are an error naming the last failure.
    pub fn get(&self, now: SystemTime) -> Result<Credentials, String> {
        let mut st = self.lock();
        loop {
            let due = refresh_due(&st.current, st.fetched);
            if due.is_none_or(|d| now < d) {
                return Ok(st.current.clone());
            }
            let valid = !expired(&st.current, now);
            if st.refreshing {
                if valid {
                    return Ok(st.current.clone());
                }
                st = self.refreshed.wait_locked(st);
                continue;
            }
            if let Some(t) = st.next_try
                && now < t
            {
                if valid {
                    return Ok(st.current.clone());
                }
                return Err(format!(
                    "credentials from {} expired; {} refresh{} failed, the next in {:.1} s: {}",
                    st.current.source,
                    st.failures,
                    if st.failures == 1 { "" } else { "es" },
                    t.duration_since(now).unwrap_or_default().as_secs_f64(),
                    st.last_error.as_deref().unwrap_or("no new credentials")
                ));
            }
            st.refreshing = true;
            st.fetches += 1;
            drop(st);
            let got = fetch(self.source, &self.cfg, &self.env);
            st = self.lock();
            st.refreshing = false;
            self.refreshed.notify_all();
            match got {
                Ok(Some(c)) => {
                    st.current = c;
                    st.fetched = Some(now);
                    st.failures = 0;
                    st.next_try = None;
                    st.last_error = None;
                    return Ok(st.current.clone());
                }
                Ok(None) | Err(_) => {
                    st.failures += 1;
                    let mut next = now + self.backoff.after(st.failures);
                    // Never past the expiry: expired credentials are worth
                    // one more try at once.
                    if let Some(e) = st.current.expiry
                        && now < e
                    {
                        next = next.min(e);
                    }
                    st.next_try = Some(next);
                    st.last_error = got.err();
                    if !expired(&st.current, now) {
                        return Ok(st.current.clone());
                    }
                    return Err(match &st.last_error {
                        Some(e) => format!("credentials from {} expired: {e}", st.current.source),
                        None => format!(
                            "credentials from {} expired and the source gives no new ones",
                            st.current.source
                        ),
                    });
                }
            }
        }
    }
}
