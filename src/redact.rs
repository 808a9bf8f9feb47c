//! Secrets carried in URLs, taken out of everything the library prints or
//! stores.
//!
//! A presigned S3 URL carries its signature, its access key id and (for
//! temporary credentials) its session token in the query string; an Azure
//! SAS URL its `sig`; a Google signed URL its `X-Goog-Signature`. Such a URL
//! is a bearer credential until it expires, so none of those values may reach
//! an error message, a log line, a stat, a metric or a cache entry's header.
//! The names stay (a reader still sees the URL was presigned); each value
//! becomes `REDACTED`. A user name and password before the host go the same
//! way, and so do tokens: a bearer token after `Bearer ` (an
//! `Authorization` header a server echoed) and a Hugging Face token
//! (`hf_...`) wherever it stands.
//!
//! Two entry points: [`url`] for a string that is one URL, and [`text`] for
//! a message that may hold URLs anywhere (the log sink and the stats' notes
//! pass every line through it, as the last guard). Both are pure and cheap
//! when there is nothing to take out (no `=`, `@` or token: the text is
//! borrowed).

use std::borrow::Cow;

/// What a secret's value becomes.
pub const REDACTED: &str = "REDACTED";

/// Query parameters whose values are credentials, lowercased: AWS SigV4 and
/// SigV2 presigning, Azure SAS, Google signed URLs, and the usual bearer
/// names of HTTP APIs.
const SECRET_PARAMS: &[&str] = &[
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "signature",
    "awsaccesskeyid",
    "sig",
    "x-goog-signature",
    "x-goog-credential",
    "googleaccessid",
    "token",
    "access_token",
    "api_key",
    "apikey",
    "key",
    "password",
    "secret",
];

/// Whether `name` (a query parameter's name, percent-encoded or not) is one
/// whose value is a credential.
pub fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_PARAMS.contains(&lower.as_str())
}

/// The least a Hugging Face token holds after its `hf_`: its real ones
/// have 34; a name such as `hf_dataset` is no token.
const HF_TOKEN_MIN: usize = 20;

/// A byte of a bearer token (RFC 6750's `b64token`).
fn in_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

/// Whether `bytes` may hold a token that [`token_cuts`] takes out.
fn has_token(bytes: &[u8]) -> bool {
    bytes
        .windows(3)
        .any(|w| w == b"hf_" || w.eq_ignore_ascii_case(b"er "))
}

/// The tokens of a text, as values to cut: what follows `Bearer ` (an
/// `Authorization` header a server echoed), and a Hugging Face token
/// (`hf_` and at least [`HF_TOKEN_MIN`] letters and digits) wherever it
/// stands. The last guard: the Hub's client never puts its token in a
/// message, but a server may.
fn token_cuts(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut cuts = Vec::new();
    let run = |from: usize, ok: fn(u8) -> bool| {
        let mut k = from;
        while k < b.len() && ok(b[k]) {
            k += 1;
        }
        k
    };
    let mut i = 0;
    while i < b.len() {
        if b.len() - i >= 7 && b[i..i + 7].eq_ignore_ascii_case(b"bearer ") {
            let start = i + 7;
            let end = run(start, in_token);
            if end > start {
                cuts.push((start, end));
            }
            i = end.max(i + 1);
            continue;
        }
        if b[i..].starts_with(b"hf_")
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let start = i + 3;
            let end = run(start, |c| c.is_ascii_alphanumeric());
            if end - start >= HF_TOKEN_MIN {
                cuts.push((start, end));
            }
            i = end.max(i + 1);
            continue;
        }
        i += 1;
    }
    cuts
}

/// `u`, one URL, with every credential in it replaced by `REDACTED`.
pub fn url(u: &str) -> Cow<'_, str> {
    text(u)
}

/// A byte that ends a query value inside a message: the next parameter,
/// a fragment, or the text around the URL (spaces, quotes, brackets).
fn ends_value(b: u8) -> bool {
    matches!(
        b,
        b'&' | b'#' | b';' | b'`' | b'\'' | b'"' | b'<' | b'>' | b'(' | b')' | b'[' | b']'
    ) || b.is_ascii_whitespace()
}

/// A byte that can be part of a query parameter's name.
fn in_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'%')
}

/// `s` with the value of every secret query parameter (a `name=value` right
/// after `?` or `&`) and every `user:password@` after `://` replaced.
pub fn text(s: &str) -> Cow<'_, str> {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| b == b'=' || b == b'@') && !has_token(bytes) {
        return Cow::Borrowed(s);
    }
    // (start, end) of each value to replace, in order, never overlapping.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'?' | b'&' => {
                let name_start = i + 1;
                let mut j = name_start;
                while j < bytes.len() && in_name(bytes[j]) {
                    j += 1;
                }
                if j < bytes.len() && bytes[j] == b'=' && j > name_start {
                    let name = &s[name_start..j];
                    let value_start = j + 1;
                    let mut k = value_start;
                    while k < bytes.len() && !ends_value(bytes[k]) {
                        k += 1;
                    }
                    if is_secret_param(name) && k > value_start {
                        cuts.push((value_start, k));
                    }
                    i = k;
                    continue;
                }
                i = j.max(i + 1);
            }
            b':' if bytes[i..].starts_with(b"://") => {
                // An authority with user information: `scheme://user:pw@host`.
                let start = i + 3;
                let mut k = start;
                while k < bytes.len() && !matches!(bytes[k], b'/' | b'?' | b'#' | b'@') {
                    if ends_value(bytes[k]) {
                        break;
                    }
                    k += 1;
                }
                if k < bytes.len() && bytes[k] == b'@' && k > start {
                    cuts.push((start, k));
                }
                i = k.max(start);
            }
            _ => i += 1,
        }
    }
    cuts.extend(token_cuts(s));
    if cuts.is_empty() {
        return Cow::Borrowed(s);
    }
    // The tokens' cuts may fall inside a parameter's: merged, in order.
    cuts.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(cuts.len());
    for (a, b) in cuts {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let cuts = merged;
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for (a, b) in cuts {
        out.push_str(&s[at..a]);
        out.push_str(REDACTED);
        at = b;
    }
    out.push_str(&s[at..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn presigned_s3_urls_keep_their_names_and_lose_their_values() {
        let u = "https://b.s3.amazonaws.com/k/shard-0.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256\
                 &X-Amz-Credential=AKIAEXAMPLE%2F20261201%2Fus-east-1%2Fs3%2Faws4_request\
                 &X-Amz-Date=20261201T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host\
                 &X-Amz-Security-Token=FwoGZXIvYXdzEXAMPLETOKEN&X-Amz-Signature=abcdef0123";
        let r = url(u);
        for secret in ["AKIAEXAMPLE", "FwoGZXIvYXdzEXAMPLETOKEN", "abcdef0123"] {
            assert!(!r.contains(secret), "{secret} in {r}");
        }
        assert!(r.contains("X-Amz-Signature=REDACTED"), "{r}");
        assert!(r.contains("X-Amz-Expires=3600"), "{r}");
        assert!(
            r.starts_with("https://b.s3.amazonaws.com/k/shard-0.tar?"),
            "{r}"
        );
    }

    #[test]
    fn sas_and_signed_urls_inside_messages() {
        let m = "retrying `https://acct.blob.core.windows.net/c/x.tar?sv=2022-11-02&sig=SeCrEt%3D&se=2026` \
                 (503): and GET 'http://h/x?X-Goog-Signature=GSIG' failed";
        let r = text(m);
        assert!(!r.contains("SeCrEt") && !r.contains("GSIG"), "{r}");
        assert!(r.contains("sig=REDACTED&se=2026` (503)"), "{r}");
        assert!(r.contains("X-Goog-Signature=REDACTED'"), "{r}");
    }

    #[test]
    fn user_information_is_taken_out() {
        let r = text("dataset URL `https://alice:hunter2@h:8080/x.tar`: bad");
        assert_eq!(r, "dataset URL `https://REDACTED@h:8080/x.tar`: bad");
    }

    /// A bearer token a server echoed, and a Hugging Face token anywhere.
    #[test]
    fn tokens_are_taken_out() {
        let t = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567";
        for (m, want) in [
            (
                format!("HTTP 401: Invalid credentials (got `Bearer {t}`)"),
                "HTTP 401: Invalid credentials (got `Bearer REDACTED`)".to_string(),
            ),
            (
                "authorization: bearer abc.DEF-123".to_string(),
                "authorization: bearer REDACTED".to_string(),
            ),
            (
                format!("token {t} leaked"),
                "token hf_REDACTED leaked".to_string(),
            ),
            (
                format!("http://h/x?token=1&v={t}"),
                "http://h/x?token=REDACTED&v=hf_REDACTED".to_string(),
            ),
        ] {
            assert_eq!(text(&m), want, "{m}");
        }
        // Names that only look like one stay.
        for s in [
            "hf_dataset_v2.tar",
            "my_hf_AbCdEfGhIjKlMnOpQrStUvWxYz",
            "a bearer",
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn text_without_secrets_is_borrowed_unchanged() {
        for s in [
            "shard `s3://b/train/shard-000001.tar` at byte 512",
            "http://h/x.tar?part=3&size=10",
            "a=b in prose, email bob@example.com",
        ] {
            assert!(matches!(text(s), Cow::Borrowed(_)), "{s}");
            assert_eq!(text(s), s);
        }
    }

    proptest! {
        /// Whatever surrounds it, a secret parameter's value never survives,
        /// and redacting twice changes nothing more.
        #[test]
        fn no_secret_value_survives(
            before in "[ -~]{0,40}",
            name in prop::sample::select(SECRET_PARAMS.to_vec()),
            upper in any::<bool>(),
            value in "[A-Za-z0-9%/+]{1,40}",
            after in "([&#` ][ -~]{0,40})?",
        ) {
            let name = if upper { name.to_ascii_uppercase() } else { name.to_string() };
            let secret = format!("ZZ{value}ZZ");
            let s = format!("{before}http://h/p?a=1&{name}={secret}{after}");
            let r = text(&s);
            prop_assert!(!r.contains(&secret), "{} -> {}", s, r);
            prop_assert_eq!(text(&r).into_owned(), r.clone().into_owned());
        }
    }
}
