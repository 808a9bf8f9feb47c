//! AWS credentials: the chain the AWS SDKs use, each source a small
//! function of an [`Env`](super::Env) (variables and home directory) so
//! tests give fake ones, and a [`Provider`] that keeps the chosen source's
//! credentials and fetches new ones before temporary credentials expire.
//!
//! Order: configuration keys, environment variables, the shared credentials
//! and config files (profiles: static keys, `credential_process`,
//! `role_arn` with `source_profile`, SSO), the web identity token file (EKS IRSA, STS
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
//! `profiles.rs` (which kind a profile is: a role, SSO, a process, keys),
//! `assume.rs` (a profile's `role_arn` through STS AssumeRole), `sso.rs`
//! (SSO's cached token and GetRoleCredentials), `process.rs`
//! (`credential_process`), `http.rs` (what the sources over HTTP share),
//! `sts.rs` (web identity), `secret.rs` (secrets in pages kept out of core
//! dumps),
//! `container.rs` (ECS, EKS Pod Identity), `imds.rs` (instance metadata),
//! `chain.rs` (the order of the sources) and `provider.rs` (keeping and
//! refreshing the chosen source's credentials).

mod assume;
mod chain;
mod container;
mod credentials;
mod http;
mod imds;
mod keys;
mod process;
mod profile;
mod profiles;
mod provider;
mod secret;
mod sso;
mod sts;
#[cfg(test)]
mod tests;

pub use assume::{assume_role, sign_sts, sts_endpoint};
pub use chain::{CredentialSource, chain};
pub use container::from_container;
pub use credentials::{Credentials, REFRESH_MARGIN, expired, needs_refresh};
pub use http::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, client, parse_time};
pub use imds::from_imds;
pub use keys::{from_config, from_env, static_keys};
pub use process::{
    PROCESS_TIMEOUT, ProcessError, from_process, from_process_within, parse_process_output,
};
pub use profile::{
    Ini, config_path, config_sections, credentials_path, parse_ini, profile, profile_name,
    profile_value,
};
pub use profiles::from_profile;
pub use provider::Provider;
pub use secret::SecretText;
pub use sso::{
    cache_file as sso_cache_file, parse_role_credentials, parse_token as parse_sso_token,
};
pub use sts::{from_web_identity, parse_sts, web_identity};
