//! The credentials of a loader, kept and refreshed from the source the
//! chain chose, before temporary ones expire.

use std::fmt;
use std::sync::Mutex;
use std::time::SystemTime;

use super::chain::fetch;
use super::{Credentials, REFRESH_MARGIN, Source, chain, expired, needs_refresh};
use crate::net::s3::{Env, S3Config};

/// The credentials of a loader: the chain's choice, fetched again from the
/// same source [`REFRESH_MARGIN`] before they expire.
pub struct Provider {
    source: Source,
    cfg: S3Config,
    env: Env,
    current: Mutex<Credentials>,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// Runs the chain once.
    pub fn new(cfg: &S3Config, env: &Env) -> Result<Provider, String> {
        let (source, c) = chain(cfg, env)?;
        Ok(Provider::with(source, c, cfg, env))
    }

    /// A provider that starts from `c`, fetched from `source`.
    pub fn with(source: Source, c: Credentials, cfg: &S3Config, env: &Env) -> Provider {
        Provider {
            source,
            cfg: cfg.clone(),
            env: env.clone(),
            current: Mutex::new(c),
        }
    }

    pub fn source(&self) -> Source {
        self.source
    }

    /// Credentials good for at least a while at `now`. A failed refresh
    /// keeps the old credentials while they are still valid.
    pub fn get(&self, now: SystemTime) -> Result<Credentials, String> {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if !needs_refresh(&cur, now, REFRESH_MARGIN) {
            return Ok(cur.clone());
        }
        match fetch(self.source, &self.cfg, &self.env) {
            Ok(Some(c)) => {
                *cur = c;
                Ok(cur.clone())
            }
            Ok(None) | Err(_) if !expired(&cur, now) => Ok(cur.clone()),
            Ok(None) => Err(format!(
                "credentials from {} expired and the source gives no new ones",
                cur.source
            )),
            Err(e) => Err(format!("credentials from {} expired: {e}", cur.source)),
        }
    }
}
