//! AWS credentials: the chain the AWS SDKs use, each source a small
//! function of an [`Env`] (variables and home directory) so tests give fake
//! ones, and a [`Provider`] that keeps the chosen source's credentials and
//! fetches new ones before temporary credentials expire.
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

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::{Env, S3Config};

/// A key pair, with a session token and expiry for temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
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
    pub fn new(
        access_key_id: &str,
        secret_access_key: &str,
        session_token: Option<&str>,
        expiry: Option<SystemTime>,
        source: &str,
    ) -> Credentials {
        Credentials {
            access_key_id: access_key_id.to_string(),
            secret_access_key: secret_access_key.to_string(),
            session_token: session_token.map(str::to_string),
            expiry,
            source: source.to_string(),
        }
    }

    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    pub fn session_token(&self) -> Option<&str> {
        self.session_token.as_deref()
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

// ---------------------------------------------------------------- profiles

/// Sections of an INI file (`[name]`, `key = value`, `#`/`;` comments).
pub type Ini = BTreeMap<String, BTreeMap<String, String>>;

/// Parses the AWS shared files' INI dialect. Keys are lower-cased; values
/// are trimmed; lines indented under a key (nested `s3 =` settings) are
/// skipped.
pub fn parse_ini(text: &str) -> Ini {
    let mut out = Ini::new();
    let mut section: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            section = Some(name);
            continue;
        }
        if raw.starts_with([' ', '\t']) {
            continue;
        }
        if let (Some(s), Some((k, v))) = (&section, line.split_once('=')) {
            out.entry(s.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`.
pub fn credentials_path(env: &Env) -> Option<PathBuf> {
    env.get("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/credentials")))
}

/// `AWS_CONFIG_FILE`, else `~/.aws/config`.
pub fn config_path(env: &Env) -> Option<PathBuf> {
    env.get("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| env.home.as_ref().map(|h| h.join(".aws/config")))
}

/// `aws_profile`, else `AWS_PROFILE`, else `default`.
pub fn profile_name(cfg: &S3Config, env: &Env) -> String {
    cfg.profile
        .clone()
        .or_else(|| env.get("AWS_PROFILE").map(str::to_string))
        .unwrap_or_else(|| "default".to_string())
}

fn read_ini(path: &Option<PathBuf>) -> Ini {
    path.as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_ini(&t))
        .unwrap_or_default()
}

/// A profile's keys: the config file's `[profile NAME]` (or `[default]`),
/// overridden by the credentials file's `[NAME]`.
pub fn profile(env: &Env, name: &str) -> Option<BTreeMap<String, String>> {
    let config = read_ini(&config_path(env));
    let creds = read_ini(&credentials_path(env));
    let mut found = None;
    let config_section = if name == "default" {
        config
            .get("default")
            .or_else(|| config.get("profile default"))
    } else {
        config.get(&format!("profile {name}"))
    };
    if let Some(s) = config_section {
        found = Some(s.clone());
    }
    if let Some(s) = creds.get(name) {
        found.get_or_insert_with(BTreeMap::new).extend(s.clone());
    }
    found
}

/// One value of a profile (e.g. `region`).
pub fn profile_value(env: &Env, name: &str, key: &str) -> Option<String> {
    profile(env, name)?
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
}

// ---------------------------------------------------------------- static sources

/// The configuration keys `aws_access_key_id` and `aws_secret_access_key`.
pub fn from_config(cfg: &S3Config) -> Result<Option<Credentials>, String> {
    match (&cfg.access_key_id, &cfg.secret_access_key) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            cfg.session_token.as_deref(),
            None,
            "configuration",
        ))),
        (None, None) => Ok(None),
        _ => Err(
            "`aws_access_key_id` and `aws_secret_access_key` must be given together".to_string(),
        ),
    }
}

/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
pub fn from_env(env: &Env) -> Result<Option<Credentials>, String> {
    match (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            env.get("AWS_SESSION_TOKEN"),
            None,
            "environment",
        ))),
        (None, None) => Ok(None),
        _ => Err("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together".to_string()),
    }
}

/// The keys of profile `name` in the shared files.
pub fn from_profile(env: &Env, name: &str) -> Result<Option<Credentials>, String> {
    let Some(p) = profile(env, name) else {
        return Ok(None);
    };
    match (p.get("aws_access_key_id"), p.get("aws_secret_access_key")) {
        (Some(id), Some(secret)) => Ok(Some(Credentials::new(
            id,
            secret,
            p.get("aws_session_token").map(String::as_str),
            None,
            &format!("profile `{name}`"),
        ))),
        (None, None) => Ok(None),
        _ => Err(format!(
            "profile `{name}` has only one of aws_access_key_id and aws_secret_access_key"
        )),
    }
}

// ---------------------------------------------------------------- HTTP sources

/// Time-outs of the credential fetches. Connecting to the instance metadata
/// address off EC2 hangs until the connect time-out (nothing answers), so it
/// is short: 1 s, as the SDKs use.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A whole credential request; STS answers in well under a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP client of the credential fetches. `direct`: no proxy (link-local
/// metadata addresses must never go through one).
pub fn client(direct: bool) -> Result<reqwest::blocking::Client, String> {
    let mut b = reqwest::blocking::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT);
    if direct {
        b = b.no_proxy();
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// An ISO 8601 time (`2026-11-30T09:00:00Z`) as a `SystemTime`.
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    use aws_smithy_types::date_time::{DateTime, Format};
    let t = DateTime::from_str(s.trim(), Format::DateTime)
        .map_err(|_| format!("bad expiration time `{s}`"))?;
    SystemTime::try_from(t).map_err(|_| format!("bad expiration time `{s}`"))
}

fn get_text(req: reqwest::blocking::RequestBuilder, what: &str) -> Result<String, String> {
    let resp = req
        .send()
        .map_err(|e| format!("{what}: {}", without_url(&e)))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("{what}: HTTP {status}"));
    }
    resp.text()
        .map_err(|e| format!("{what}: {}", without_url(&e)))
}

/// A reqwest error's text without the URL (which may hold a token in its
/// query, as STS's does).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_body() || e.is_decode() {
        "bad response body"
    } else {
        "request failed"
    };
    kind.to_string()
}

/// The JSON document of the container and instance metadata services.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct JsonCredentials {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<String>,
    code: Option<String>,
}

fn json_credentials(text: &str, source: &str) -> Result<Credentials, String> {
    let j: JsonCredentials = serde_json::from_str(text)
        .map_err(|_| format!("{source}: the response is not a credentials document"))?;
    if let Some(code) = j.code.as_deref().filter(|c| *c != "Success") {
        return Err(format!("{source}: the service says `{code}`"));
    }
    let expiry = j.expiration.as_deref().map(parse_time).transpose()?;
    Ok(Credentials::new(
        &j.access_key_id,
        &j.secret_access_key,
        j.token.as_deref(),
        expiry,
        source,
    ))
}

/// STS AssumeRoleWithWebIdentity, when `AWS_WEB_IDENTITY_TOKEN_FILE` and
/// `AWS_ROLE_ARN` are set. The STS endpoint is `AWS_ENDPOINT_URL_STS`, else
/// the regional one.
pub fn from_web_identity(env: &Env) -> Result<Option<Credentials>, String> {
    let (Some(token_file), Some(role)) = (
        env.get("AWS_WEB_IDENTITY_TOKEN_FILE"),
        env.get("AWS_ROLE_ARN"),
    ) else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(token_file)
        .map_err(|e| format!("web identity token file `{token_file}`: {e}"))?;
    let session = env
        .get("AWS_ROLE_SESSION_NAME")
        .unwrap_or("ringfeed-session");
    let region = env
        .get("AWS_REGION")
        .or_else(|| env.get("AWS_DEFAULT_REGION"))
        .unwrap_or(super::DEFAULT_REGION);
    let endpoint = env
        .get("AWS_ENDPOINT_URL_STS")
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
    let enc = super::encode_query;
    let url = format!(
        "{endpoint}/?Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={}&RoleSessionName={}&WebIdentityToken={}",
        enc(role),
        enc(session),
        enc(token.trim())
    );
    let what = format!("STS AssumeRoleWithWebIdentity at {endpoint}");
    let text = get_text(client(false)?.get(url), &what)?;
    parse_sts(&text)
        .map(Some)
        .map_err(|e| format!("{what}: {e}"))
}

/// The `Credentials` of an AssumeRoleWithWebIdentity response.
pub fn parse_sts(xml: &str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    struct Response {
        #[serde(rename = "AssumeRoleWithWebIdentityResult")]
        result: Result_,
    }
    #[derive(Deserialize)]
    struct Result_ {
        #[serde(rename = "Credentials")]
        credentials: Sts,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Sts {
        access_key_id: String,
        secret_access_key: String,
        session_token: String,
        expiration: String,
    }
    let r: Response = quick_xml::de::from_str(xml)
        .map_err(|_| "the response is not an AssumeRoleWithWebIdentity result".to_string())?;
    let c = r.result.credentials;
    Ok(Credentials::new(
        &c.access_key_id,
        &c.secret_access_key,
        Some(&c.session_token),
        Some(parse_time(&c.expiration)?),
        "web identity",
    ))
}

/// The ECS/EKS container credentials endpoint, when
/// `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `_FULL_URI` is set; the
/// `Authorization` token from `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` or
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN`.
pub fn from_container(env: &Env) -> Result<Option<Credentials>, String> {
    let url = if let Some(rel) = env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        // The ECS agent's fixed address.
        format!("http://169.254.170.2{rel}")
    } else if let Some(full) = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
        full.to_string()
    } else {
        return Ok(None);
    };
    let token = match env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("container authorization token file `{f}`: {e}"))?
                .trim()
                .to_string(),
        ),
        None => env
            .get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
            .map(str::to_string),
    };
    let mut req = client(true)?.get(&url);
    if let Some(t) = token {
        req = req.header("Authorization", t);
    }
    let text = get_text(req, &format!("container credentials at {url}"))?;
    json_credentials(&text, "container credentials").map(Some)
}

/// IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT` (default
/// `http://169.254.169.254`): a session token by `PUT`, then the role name,
/// then its credentials. `Ok(None)` when `AWS_EC2_METADATA_DISABLED=true`.
pub fn from_imds(env: &Env) -> Result<Option<Credentials>, String> {
    if env.flag("AWS_EC2_METADATA_DISABLED") {
        return Ok(None);
    }
    let base = env
        .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or("http://169.254.169.254")
        .trim_end_matches('/')
        .to_string();
    let c = client(true)?;
    let what = format!("instance metadata at {base}");
    let token = get_text(
        c.put(format!("{base}/latest/api/token"))
            // Six hours, the longest IMDS allows; one token serves every
            // refresh of a typical job's credentials.
            .header("X-aws-ec2-metadata-token-ttl-seconds", "21600"),
        &what,
    )?;
    let token = token.trim();
    let list = format!("{base}/latest/meta-data/iam/security-credentials/");
    let roles = get_text(
        c.get(&list).header("X-aws-ec2-metadata-token", token),
        &what,
    )?;
    let role = roles
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| format!("{what}: the instance has no IAM role"))?;
    let text = get_text(
        c.get(format!("{list}{}", super::encode_query(role)))
            .header("X-aws-ec2-metadata-token", token),
        &what,
    )?;
    json_credentials(&text, "instance metadata").map(Some)
}

// ---------------------------------------------------------------- the chain

/// Which source gave the credentials; refreshes ask it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Config,
    Environment,
    Profile,
    WebIdentity,
    Container,
    InstanceMetadata,
}

fn fetch(source: Source, cfg: &S3Config, env: &Env) -> Result<Option<Credentials>, String> {
    match source {
        Source::Config => from_config(cfg),
        Source::Environment => from_env(env),
        Source::Profile => {
            let name = profile_name(cfg, env);
            let named = cfg.profile.is_some() || env.get("AWS_PROFILE").is_some();
            if named && profile(env, &name).is_none() {
                // A profile asked for by name and missing is a typo, not a
                // reason to try the next identity.
                return Err(format!("profile `{name}` is not in {}", shared_files(env)));
            }
            from_profile(env, &name)
        }
        Source::WebIdentity => from_web_identity(env),
        Source::Container => from_container(env),
        Source::InstanceMetadata => from_imds(env),
    }
}

/// The shared files' paths, for messages.
fn shared_files(env: &Env) -> String {
    let files: Vec<_> = [credentials_path(env), config_path(env)]
        .iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
    if files.is_empty() {
        "no shared files (no home directory)".to_string()
    } else {
        files.join(" and ")
    }
}

/// Runs the chain: the first source that gives credentials, or an error
/// listing what was tried.
pub fn chain(cfg: &S3Config, env: &Env) -> Result<(Source, Credentials), String> {
    let profile = profile_name(cfg, env);
    let files = shared_files(env);
    let steps = [
        (
            Source::Config,
            "configuration keys aws_access_key_id/aws_secret_access_key".to_string(),
        ),
        (
            Source::Environment,
            "environment AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".to_string(),
        ),
        (Source::Profile, format!("profile `{profile}` in {files}")),
        (
            Source::WebIdentity,
            "web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN unset)".to_string(),
        ),
        (
            Source::Container,
            "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/_FULL_URI unset)"
                .to_string(),
        ),
        (Source::InstanceMetadata, "instance metadata".to_string()),
    ];
    let mut tried = Vec::new();
    for (source, what) in steps {
        match fetch(source, cfg, env) {
            Ok(Some(c)) => return Ok((source, c)),
            Ok(None) if source == Source::InstanceMetadata => {
                tried.push("instance metadata (disabled by AWS_EC2_METADATA_DISABLED)".to_string())
            }
            Ok(None) => tried.push(what),
            // Instance metadata is the last resort off EC2: not finding it
            // is "not configured", not a failure to report alone.
            Err(e) if source == Source::InstanceMetadata => tried.push(e),
            // A source that is configured but broken is an error: falling
            // through to another identity would be a surprise.
            Err(e) => return Err(e),
        }
    }
    Err(format!(
        "no AWS credentials found: tried {}; give credentials, or set `s3_unsigned: true` for a public bucket",
        tried.join(", ")
    ))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn home_with(credentials: &str, config: &str) -> (tempfile::TempDir, Env) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".aws")).unwrap();
        std::fs::write(d.path().join(".aws/credentials"), credentials).unwrap();
        std::fs::write(d.path().join(".aws/config"), config).unwrap();
        let env =
            Env::with_home(Some(d.path().to_path_buf())).set("AWS_EC2_METADATA_DISABLED", "true");
        (d, env)
    }

    const CREDS: &str = "\
# comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secretdefault

[work]
aws_access_key_id=AKIDWORK
aws_secret_access_key=secretwork
aws_session_token = tokwork
";
    const CONFIG: &str = "\
[default]
region = eu-north-1
[profile cfgonly]
aws_access_key_id = AKIDCFG
aws_secret_access_key = secretcfg
region = ap-south-1
s3 =
  addressing_style = path
[work]
aws_access_key_id = AKIDWRONG
aws_secret_access_key = wrong
";

    #[test]
    fn ini_sections_and_profiles() {
        let ini = parse_ini(CONFIG);
        assert_eq!(ini["profile cfgonly"]["region"], "ap-south-1");
        assert!(!ini["profile cfgonly"].contains_key("addressing_style"));
        let (_d, env) = home_with(CREDS, CONFIG);
        let c = from_profile(&env, "default").unwrap().unwrap();
        assert_eq!(c.access_key_id, "AKIDDEFAULT");
        assert_eq!(c.session_token(), None);
        let c = from_profile(&env, "work").unwrap().unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token()),
            ("AKIDWORK", Some("tokwork"))
        );
        // `[profile x]` in config, `[x]` in credentials; `[work]` in config is not a profile.
        let c = from_profile(&env, "cfgonly").unwrap().unwrap();
        assert_eq!(c.access_key_id, "AKIDCFG");
        assert_eq!(
            profile_value(&env, "cfgonly", "region").as_deref(),
            Some("ap-south-1")
        );
        assert_eq!(
            profile_value(&env, "default", "region").as_deref(),
            Some("eu-north-1")
        );
        assert!(from_profile(&env, "nope").unwrap().is_none());
        let env2 = env.clone().set("AWS_PROFILE", "cfgonly");
        assert_eq!(
            super::super::Addressing::resolve(&S3Config::default(), &env2)
                .unwrap()
                .region,
            "ap-south-1"
        );
    }

    #[test]
    fn files_from_the_environment_override_home() {
        let (d, env) = home_with(CREDS, CONFIG);
        let other = d.path().join("other-creds");
        std::fs::write(
            &other,
            "[default]\naws_access_key_id=AKIDOTHER\naws_secret_access_key=s\n",
        )
        .unwrap();
        let env = env
            .set("AWS_SHARED_CREDENTIALS_FILE", other.to_str().unwrap())
            .set("AWS_CONFIG_FILE", "/nonexistent/config");
        let c = from_profile(&env, "default").unwrap().unwrap();
        assert_eq!(c.access_key_id, "AKIDOTHER");
        assert!(from_profile(&env, "cfgonly").unwrap().is_none());
    }

    #[test]
    fn chain_precedence() {
        let (_d, env) = home_with(CREDS, CONFIG);
        let (s, c) = chain(&S3Config::default(), &env).unwrap();
        assert_eq!(
            (s, c.access_key_id.as_str()),
            (Source::Profile, "AKIDDEFAULT")
        );
        let cfg_profile = S3Config {
            profile: Some("work".into()),
            ..Default::default()
        };
        let env = env.set("AWS_PROFILE", "cfgonly");
        assert_eq!(
            chain(&S3Config::default(), &env).unwrap().1.access_key_id,
            "AKIDCFG"
        );
        assert_eq!(
            chain(&cfg_profile, &env).unwrap().1.access_key_id,
            "AKIDWORK"
        );
        let env = env
            .set("AWS_ACCESS_KEY_ID", "AKIDENV")
            .set("AWS_SECRET_ACCESS_KEY", "secretenv");
        let (s, c) = chain(&cfg_profile, &env).unwrap();
        assert_eq!(
            (s, c.access_key_id.as_str()),
            (Source::Environment, "AKIDENV")
        );
        let explicit = S3Config {
            access_key_id: Some("AKIDCONF".into()),
            secret_access_key: Some("secretconf".into()),
            ..Default::default()
        };
        let (s, c) = chain(&explicit, &env).unwrap();
        assert_eq!((s, c.access_key_id.as_str()), (Source::Config, "AKIDCONF"));
        let half = S3Config {
            access_key_id: Some("AKIDCONF".into()),
            ..Default::default()
        };
        assert!(chain(&half, &env).unwrap_err().contains("together"));
        let half_env = Env::default()
            .set("AWS_ACCESS_KEY_ID", "x")
            .set("AWS_EC2_METADATA_DISABLED", "true");
        assert!(
            chain(&S3Config::default(), &half_env)
                .unwrap_err()
                .contains("together")
        );
    }

    #[test]
    fn nothing_configured_is_a_clear_error_quickly() {
        let env = Env::with_home(None).set("AWS_EC2_METADATA_DISABLED", "true");
        let t = std::time::Instant::now();
        let e = chain(&S3Config::default(), &env).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2));
        for want in [
            "no AWS credentials found: tried",
            "AWS_ACCESS_KEY_ID",
            "profile `default`",
            "web identity",
            "container",
            "AWS_EC2_METADATA_DISABLED",
            "s3_unsigned",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn expiry_and_refresh() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let long = Credentials::new("A", "s", None, None, "t");
        assert!(!needs_refresh(&long, now, REFRESH_MARGIN));
        let soon = Credentials::new(
            "A",
            "s",
            Some("t"),
            Some(now + Duration::from_secs(200)),
            "t",
        );
        assert!(needs_refresh(&soon, now, REFRESH_MARGIN));
        assert!(!expired(&soon, now));
        let later = Credentials::new(
            "A",
            "s",
            Some("t"),
            Some(now + Duration::from_secs(3600)),
            "t",
        );
        assert!(!needs_refresh(&later, now, REFRESH_MARGIN));
        assert!(needs_refresh(
            &later,
            now + Duration::from_secs(3301),
            REFRESH_MARGIN
        ));
        assert!(expired(&later, now + Duration::from_secs(3600)));
        // A refresh from a source that now gives nothing keeps valid
        // credentials, and fails clearly once they have expired.
        let env = Env::default();
        let p = Provider::with(
            Source::Environment,
            soon.clone(),
            &S3Config::default(),
            &env,
        );
        assert_eq!(p.get(now).unwrap(), soon);
        let e = p.get(now + Duration::from_secs(300)).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        // A refresh that finds new credentials takes them.
        let env = env
            .set("AWS_ACCESS_KEY_ID", "NEW")
            .set("AWS_SECRET_ACCESS_KEY", "s2");
        let p = Provider::with(Source::Environment, soon, &S3Config::default(), &env);
        assert_eq!(p.get(now).unwrap().access_key_id, "NEW");
        assert_eq!(
            parse_time("2026-11-30T09:00:00Z").unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_029_200)
        );
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn sts_and_json_documents() {
        let xml = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>sub</SubjectFromWebIdentityToken>
    <Credentials>
      <SessionToken>TOKEN</SessionToken>
      <SecretAccessKey>SECRET</SecretAccessKey>
      <Expiration>2026-11-30T09:00:00Z</Expiration>
      <AccessKeyId>ASIAWEB</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
</AssumeRoleWithWebIdentityResponse>"#;
        let c = parse_sts(xml).unwrap();
        assert_eq!(
            (
                c.access_key_id.as_str(),
                c.secret_access_key(),
                c.session_token()
            ),
            ("ASIAWEB", "SECRET", Some("TOKEN"))
        );
        assert!(c.expiry.is_some());
        let e = parse_sts("<Error><Code>AccessDenied</Code></Error>").unwrap_err();
        assert!(e.contains("not an AssumeRoleWithWebIdentity"), "{e}");
        let j = r#"{"Code":"Success","AccessKeyId":"ASIAJ","SecretAccessKey":"SJ","Token":"TJ","Expiration":"2026-11-30T09:00:00Z"}"#;
        assert_eq!(json_credentials(j, "x").unwrap().access_key_id, "ASIAJ");
        let e = json_credentials(r#"{"AccessKeyId":"SECRETISH"}"#, "x").unwrap_err();
        assert!(!e.contains("SECRETISH"), "{e}");
    }

    #[test]
    fn debug_output_is_redacted() {
        let c = Credentials::new("AKIDLONGKEY", "topsecret", Some("sessiontok"), None, "t");
        let d = format!("{c:?}");
        assert!(
            !d.contains("topsecret") && !d.contains("sessiontok") && !d.contains("AKIDLONGKEY"),
            "{d}"
        );
        let cfg = S3Config {
            access_key_id: Some("AKIDLONGKEY".into()),
            secret_access_key: Some("topsecret".into()),
            session_token: Some("sessiontok".into()),
            ..Default::default()
        };
        let d = format!("{cfg:?}");
        assert!(
            !d.contains("topsecret") && !d.contains("sessiontok") && !d.contains("AKIDLONGKEY"),
            "{d}"
        );
        let env = Env::default().set("AWS_SECRET_ACCESS_KEY", "topsecret");
        assert!(!format!("{env:?}").contains("topsecret"));
    }
}
