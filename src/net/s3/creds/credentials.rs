//! The credentials themselves: a key pair, with a session token and expiry
//! for temporary ones, and when they must be fetched again. `Debug` redacts
//! the secrets, and they are kept in pages excluded from core dumps
//! (`SecretText`).

use std::fmt;
use std::time::{Duration, SystemTime};

use super::secret::SecretText;

/// A key pair, with a session token and expiry for temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    secret_access_key: SecretText,
    session_token: Option<SecretText>,
    /// `None`: long-lived keys that never need refreshing.
    pub expiry: Option<SystemTime>,
    /// Which source gave them, for messages (`"environment"`, ...).
    pub source: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key id is not a secret by AWS's rules, but it identifies an
        // account; show its first four characters only.
        let id: String = self.access_key_id.chars().take(4).collect();
        f.debug_struct("Credentials")
            .field("access_key_id", &format!("{id}…"))
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("expiry", &self.expiry)
            .field("source", &self.source)
            .finish()
    }
}

impl Credentials {
    /// The key pair as the SigV4 signer takes it (the S3 requests' signer
    /// and STS's).
    pub fn sigv4_identity(&self) -> aws_smithy_runtime_api::client::identity::Identity {
        aws_credential_types::Credentials::new(
            self.access_key_id.clone(),
            self.secret_access_key().to_string(),
            self.session_token().map(str::to_string),
            self.expiry,
            "ringfeed",
        )
        .into()
    }

    pub fn new(
        access_key_id: &str,
        secret_access_key: &str,
        session_token: Option<&str>,
        expiry: Option<SystemTime>,
        source: &str,
    ) -> Credentials {
        Credentials {
            access_key_id: access_key_id.to_string(),
            secret_access_key: SecretText::new(secret_access_key),
            session_token: session_token.map(SecretText::new),
            expiry,
            source: source.to_string(),
        }
    }

    pub fn secret_access_key(&self) -> &str {
        self.secret_access_key.as_str()
    }

    pub fn session_token(&self) -> Option<&str> {
        self.session_token.as_ref().map(SecretText::as_str)
    }

    /// The secret key's text, for the test that checks its pages stay out
    /// of core dumps.
    pub fn secret_storage(&self) -> &SecretText {
        &self.secret_access_key
    }
}

/// Temporary credentials are replaced this long before they expire: the
/// SDKs' 5-minute buffer, which also covers a request signed just before
/// the expiry and still in flight (a ranged GET of 8 MiB takes well under
/// a second; retries add seconds).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Whether credentials must be fetched again at `now`.
pub fn needs_refresh(c: &Credentials, now: SystemTime, margin: Duration) -> bool {
    match c.expiry {
        None => false,
        Some(e) => e <= now + margin,
    }
}

/// Whether credentials are past their expiry at `now` (unusable).
pub fn expired(c: &Credentials, now: SystemTime) -> bool {
    c.expiry.is_some_and(|e| e <= now)
}
