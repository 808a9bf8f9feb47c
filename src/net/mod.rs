//! The network protocols the readers and the dataset resolver speak: HTTP/1.1
//! ranged GETs ([`http`]), TLS set-up ([`tls`]), the retry policy
//! ([`retry`]) and S3 (signing, credentials, listing: [`s3`]).

pub mod http;
pub mod retry;
pub mod s3;
pub mod tls;
