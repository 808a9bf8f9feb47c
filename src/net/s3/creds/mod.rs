//! AWS credentials: the chain the AWS SDKs use, each source a small
//! function of an [`Env`](super::Env) (variables and home directory) so
//! tests give fake ones, and a [`Provider`] that keeps the chosen source's
//! credentials and fetches new ones before temporary credentials expire.
//!
//! Order: configuration keys, environment variables, the shared credentials
//! and config files (profiles), the web identity token file (EKS IRSA, STS
//! AssumeRoleWithWebIdentity), container credentials (ECS, EKS Pod
//! Identity), instance metadata (IMDSv2). The first source that is
//! configured wins; the sources over HTTP are only asked when their
//! variables are set, except instance metadata, which is asked last unless
//! `AWS_EC2_METADATA_DISABLED=true`.
//!
//! Secrets never reach a message: `Debug` is written by hand and redacts
//! them, and errors name the source and the file or URL, never a response
//! body.
//!
//! One file per part: `credentials.rs` (the key pair, its expiry),
//! `profile.rs` (the shared config and credentials files), `keys.rs` (the
//! static sources: configuration keys, environment, a profile's keys),
//! `http.rs` (what the sources over HTTP share), `sts.rs` (web identity),
//! `container.rs` (ECS, EKS Pod Identity), `imds.rs` (instance metadata),
//! `chain.rs` (the order of the sources) and `provider.rs` (keeping and
//! refreshing the chosen source's credentials).

mod chain;
mod container;
mod credentials;
mod http;
mod imds;
mod keys;
mod profile;
mod provider;
mod sts;
#[cfg(test)]
mod tests;

pub use chain::{Source, chain};
pub use container::from_container;
pub use credentials::{Credentials, REFRESH_MARGIN, expired, needs_refresh};
pub use http::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, client, parse_time};
pub use imds::from_imds;
pub use keys::{from_config, from_env, from_profile};
pub use profile::{
    Ini, config_path, credentials_path, parse_ini, profile, profile_name, profile_value,
};
pub use provider::Provider;
pub use sts::{from_web_identity, parse_sts};
