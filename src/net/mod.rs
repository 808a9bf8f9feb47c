//! The network protocols the readers and the dataset resolver speak: HTTP/1.1
//! ranged GETs ([`http`]), TLS set-up ([`tls`]), the retry policy
//! ([`retry`]) and the request rate under throttling ([`rate`]), which
//! ranges are late and may be hedged ([`tail`]), the redirects followed
//! ([`redirect`], each hop's next object in [`hop`]), one version per read
//! ([`version`]), S3 (signing, credentials, listing: [`s3`]), the Hugging
//! Face Hub (`hf://` URLs, the token, the API that lists a dataset:
//! [`hub`]), and the settings, counters and request rates every network
//! read shares ([`NetOptions`], [`Pacer`], [`with_retries`]).

pub mod hop;
pub mod http;
pub mod hub;
pub mod inflight;
pub mod object;
mod options;
pub mod rate;
pub mod redirect;
pub mod retry;
pub mod s3;
pub mod tail;
pub mod tls;
pub mod version;

pub(crate) use options::quick_ack;
pub use options::{
    NetOptions, NetStats, Pacer, gave_up, retry_wait, set_pacing, set_quick_ack, with_retries,
};
