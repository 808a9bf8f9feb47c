//! The Hub's settings from the environment, read as huggingface_hub reads
//! them: the endpoint (`HF_ENDPOINT`), the token (`HF_TOKEN`, the older
//! `HUGGING_FACE_HUB_TOKEN`, else the file `HF_TOKEN_PATH`, else
//! `$HF_HOME/token`, `HF_HOME` defaulting to `$XDG_CACHE_HOME/huggingface`
//! or `~/.cache/huggingface`; a leading `~` expanded), and offline mode
//! (`HF_HUB_OFFLINE`, or `TRANSFORMERS_OFFLINE`, true as `1`, `ON`, `YES`
//! or `TRUE`). The token is a [`Token`]: its value is only ever written
//! into an `Authorization` header, never shown.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::net::s3::Env;
use crate::net::s3::creds::SecretText;

/// The Hub's address when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A Hub token, in pages kept out of core dumps (as the S3 secrets are:
/// `SecretText`). `Debug` never shows it; the `Authorization` header a
/// request carries is a copy on the heap for that request only.
#[derive(Clone)]
pub struct Token(Arc<SecretText>);

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Token {
    fn new(text: &str) -> Token {
        Token(Arc::new(SecretText::new(text)))
    }

    /// The `Authorization` header's value.
    pub(crate) fn bearer(&self) -> String {
        format!("Bearer {}", self.0.as_str())
    }

    /// Whether `text` holds the token (a server's message echoing it).
    pub(crate) fn is_in(&self, text: &str) -> bool {
        text.contains(self.0.as_str())
    }

    /// `text` with the token, wherever it appears, replaced.
    pub(crate) fn scrub(&self, text: &str) -> String {
        text.replace(self.0.as_str(), crate::redact::REDACTED)
    }

    /// Whether the token is in pages excluded from core dumps.
    pub fn in_own_pages(&self) -> bool {
        self.0.in_own_pages()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(REDACTED)")
    }
}

/// Where the token came from, for messages (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    Env(&'static str),
    File(PathBuf),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Env(var) => write!(f, "${var}"),
            TokenSource::File(p) => write!(f, "the file `{}`", p.display()),
        }
    }
}

/// huggingface_hub's true values of a flag.
fn is_true(v: Option<&str>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// Whether the environment asks for offline mode: the variable that does.
pub fn offline(env: &Env) -> Option<&'static str> {
    ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
        .into_iter()
        .find(|v| is_true(env.get(v)))
}

/// The endpoint: `HF_ENDPOINT` without its trailing `/`, or the Hub's.
pub fn endpoint(env: &Env) -> Result<String> {
    let e = env
        .get("HF_ENDPOINT")
        .unwrap_or(DEFAULT_ENDPOINT)
        .trim()
        .trim_end_matches('/');
    let ok = url::Url::parse(e)
        .ok()
        .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    if !ok || e.contains(['?', '#']) {
        return Err(Error::Config(format!(
            "HF_ENDPOINT `{}` is not an http(s) URL of the Hub (such as {DEFAULT_ENDPOINT})",
            crate::redact::url(e)
        )));
    }
    Ok(e.to_string())
}

/// A path with a leading `~` made the home directory.
fn expand_home(p: &str, env: &Env) -> PathBuf {
    match (p.strip_prefix('~'), &env.home) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(p),
    }
}

/// The file the token is read from when no variable gives one.
pub fn token_path(env: &Env) -> PathBuf {
    if let Some(p) = env.get("HF_TOKEN_PATH") {
        return expand_home(p, env);
    }
    let hf_home = match env.get("HF_HOME") {
        Some(h) => expand_home(h, env),
        None => {
            let cache = match env.get("XDG_CACHE_HOME") {
                Some(c) => expand_home(c, env),
                None => env.home.clone().unwrap_or_default().join(".cache"),
            };
            cache.join("huggingface")
        }
    };
    hf_home.join("token")
}

/// The token, and where it came from; `None` when there is none (public
/// datasets need none). A token file that exists but cannot be read is an
/// error, as huggingface_hub's; a token a header cannot carry (a control
/// character inside) is refused without being shown.
pub fn token(env: &Env) -> Result<Option<(Token, TokenSource)>> {
    let (raw, source) = if let Some(var) = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
        .into_iter()
        .find(|v| env.get(v).is_some())
    {
        (
            env.get(var).unwrap_or_default().to_string(),
            TokenSource::Env(var),
        )
    } else {
        let path = token_path(env);
        match std::fs::read_to_string(&path) {
            Ok(t) => (t, TokenSource::File(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::Config(format!(
                    "the Hugging Face token file `{}` cannot be read: {e}",
                    path.display()
                )));
            }
        }
    };
    // huggingface_hub's `_clean_token`.
    let clean = raw.replace(['\r', '\n'], "");
    let clean = clean.trim();
    if clean.is_empty() {
        return Ok(None);
    }
    if clean.bytes().any(|b| b < b' ' || b == 0x7f || b >= 0x80) {
        return Err(Error::Config(format!(
            "the Hugging Face token from {source} holds characters an HTTP header cannot carry"
        )));
    }
    Ok(Some((Token::new(clean), source)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_where_huggingface_hub_finds_it() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().to_path_buf();
        let env = Env::with_home(Some(home.clone()));
        assert_eq!(token(&env).unwrap(), None);
        assert_eq!(token_path(&env), home.join(".cache/huggingface/token"));
        std::fs::create_dir_all(home.join(".cache/huggingface")).unwrap();
        std::fs::write(home.join(".cache/huggingface/token"), "hf_file\n").unwrap();
        let (t, src) = token(&env).unwrap().unwrap();
        assert_eq!(t.bearer(), "Bearer hf_file");
        assert_eq!(
            src,
            TokenSource::File(home.join(".cache/huggingface/token"))
        );
        let xdg = env.clone().set("XDG_CACHE_HOME", "/x");
        assert_eq!(token_path(&xdg), PathBuf::from("/x/huggingface/token"));
        let hf_home = xdg.clone().set("HF_HOME", "~/hf");
        assert_eq!(token_path(&hf_home), home.join("hf/token"));
        let path = hf_home.clone().set("HF_TOKEN_PATH", "/t/tok");
        assert_eq!(token_path(&path), PathBuf::from("/t/tok"));
        // The variables come first, HF_TOKEN before the older name.
        let var = env.clone().set("HUGGING_FACE_HUB_TOKEN", " hf_old ");
        assert_eq!(token(&var).unwrap().unwrap().0.bearer(), "Bearer hf_old");
        assert!(token(&var).unwrap().unwrap().0.in_own_pages());
        let var = var.set("HF_TOKEN", "hf_new\r\n");
        let (t, src) = token(&var).unwrap().unwrap();
        assert_eq!(
            (t.bearer().as_str(), src),
            ("Bearer hf_new", TokenSource::Env("HF_TOKEN"))
        );
        assert_eq!(format!("{t:?}"), "Token(REDACTED)");
        // Empty is none; a directory in the file's place is an error
        // naming the file, not the token.
        std::fs::write(home.join(".cache/huggingface/token"), " \n").unwrap();
        assert_eq!(token(&env).unwrap(), None);
        let dir = env
            .clone()
            .set("HF_TOKEN_PATH", &home.display().to_string());
        assert!(
            token(&dir)
                .unwrap_err()
                .to_string()
                .contains("cannot be read")
        );
        let bad = env.clone().set("HF_TOKEN", "hf_a\u{1}b");
        let e = token(&bad).unwrap_err().to_string();
        assert!(e.contains("$HF_TOKEN") && !e.contains("hf_a"), "{e}");
    }

    #[test]
    fn offline_and_endpoint() {
        let env = Env::default();
        assert_eq!(offline(&env), None);
        for v in ["1", "on", "YES", "true"] {
            assert_eq!(
                offline(&env.clone().set("HF_HUB_OFFLINE", v)),
                Some("HF_HUB_OFFLINE")
            );
        }
        assert_eq!(offline(&env.clone().set("HF_HUB_OFFLINE", "0")), None);
        assert_eq!(
            offline(&env.clone().set("TRANSFORMERS_OFFLINE", "1")),
            Some("TRANSFORMERS_OFFLINE")
        );
        assert_eq!(endpoint(&env).unwrap(), DEFAULT_ENDPOINT);
        let local = env.clone().set("HF_ENDPOINT", "http://127.0.0.1:9/hf/");
        assert_eq!(endpoint(&local).unwrap(), "http://127.0.0.1:9/hf");
        for bad in ["ftp://h", "huggingface.co", "http://h/?x=1"] {
            let e = endpoint(&env.clone().set("HF_ENDPOINT", bad)).unwrap_err();
            assert!(e.to_string().contains("HF_ENDPOINT"), "{bad}: {e}");
        }
    }
}
