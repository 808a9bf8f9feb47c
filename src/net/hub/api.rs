//! The Hub's API, the calls a dataset's resolution makes (over reqwest,
//! blocking; `with_retries` for 429 and 5xx, `Retry-After` honoured by the
//! host's pacer):
//!
//! - `GET {endpoint}/api/datasets/{repo}/revision/{revision}?expand=sha`:
//!   the commit a branch, tag or commit names (`{"sha": ...}`);
//! - `GET {endpoint}/api/datasets/{repo}/tree/{sha}/{path}?recursive=...`:
//!   the files (`type`, `path`, `size`, `oid`, `lfs`) under a directory,
//!   in pages the `Link: <...>; rel="next"` header chains.
//!
//! Revision and path are encoded as huggingface_hub encodes them
//! (`quote(..., safe="")`). Redirects (a renamed repository's) are
//! followed by `crate::net::redirect`'s rules, the token sent only to the
//! endpoint's origin. Every answer is bounded ([`MAX_ANSWER`] bytes, and
//! [`MAX_ENTRIES`] entries in all) and checked
//! against the shape the API documents: anything else is a named
//! [`Error::Hub`], and so is a refusal (`X-Error-Code`: `RepoNotFound`,
//! `GatedRepo`, `RevisionNotFound`, `EntryNotFound`). The token never
//! appears in an error: a server's message that echoes it is scrubbed.

use std::io::Read;
use std::time::Duration;

use serde::Deserialize;

use super::HubClient;
use crate::error::{Error, HubPlace, Result};
use crate::net::http::{FailKind, HttpFail};
use crate::net::redirect::{Chain, followed, same_origin};
use crate::net::retry::Jitter;
use crate::net::s3::encode_query;
use crate::net::{NetOptions, with_retries};

/// The largest answer read from the API: a tree page of 1,000 entries
/// (the Hub's page) is about 300 KB, a revision's answer with `expand`
/// a few hundred bytes; 16 MiB is fifty times a page and bounds what a
/// misbehaving server makes the resolver hold.
pub const MAX_ANSWER: usize = 16 << 20;

/// The most entries a listing may hold: as many as a dataset URL may
/// expand to (ten million names), so a listing that never ends (a server
/// whose pages go on) is an error, not memory without bound.
pub const MAX_ENTRIES: usize = 10_000_000;

/// What one of a dataset's files or directories is, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEntry {
    /// In the repository, from its root.
    pub path: String,
    /// Bytes of the file (the LFS object's, for a file stored in LFS); 0
    /// for a directory.
    pub size: u64,
    pub dir: bool,
}

/// What names the place of a request in errors.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub repo: &'a str,
    /// As the user gave it.
    pub revision: &'a str,
    pub path: &'a str,
}

impl At<'_> {
    fn error(&self, status: u16, code: Option<String>, message: String) -> Error {
        Error::Hub {
            at: Box::new(HubPlace {
                repo: self.repo.to_string(),
                revision: self.revision.to_string(),
                path: self.path.to_string(),
            }),
            status,
            code,
            message,
        }
    }
}

/// An answer of the API, once its retries are over.
enum Answer {
    /// 200: the body (at most `MAX_ANSWER` bytes), and the next page's URL.
    Page(Vec<u8>, Option<String>),
    /// A refusal for good (4xx but 429), or a redirect not followed.
    Refused {
        status: u16,
        code: Option<String>,
        message: String,
    },
}

impl HubClient {
    /// The commit `revision` (a branch, a tag, a commit) names now: what
    /// every read of the dataset is pinned to.
    /// `at` names the URL being resolved, for errors.
    pub fn commit(&self, at: &At<'_>, net: &NetOptions, jitter: &mut Jitter) -> Result<String> {
        let url = format!(
            "{}/api/datasets/{}/revision/{}?expand=sha",
            self.endpoint,
            at.repo,
            encode_query(at.revision)
        );
        let (body, _) = self.get(&url, at, net, jitter)?;
        #[derive(Deserialize)]
        struct Info {
            sha: Option<String>,
        }
        let info: Info = shaped(&body, at, "revision")?;
        match info.sha {
            Some(sha) if is_commit(&sha) => Ok(sha),
            Some(sha) => Err(at.error(
                200,
                None,
                format!(
                    "the revision API answered the commit `{}`, which is not a commit id \
                     (40 or 64 hexadecimal digits)",
                    sha.chars().take(80).collect::<String>()
                ),
            )),
            None => Err(at.error(200, None, "the revision API's answer has no `sha`".into())),
        }
    }

    /// Every file and directory under `dir` (empty: the repository's
    /// root) at commit `sha`, at every depth when `recursive`, in the
    /// order listed; `revision` is the user's, for errors.
    pub fn tree(
        &self,
        at: &At<'_>,
        sha: &str,
        dir: &str,
        recursive: bool,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<Vec<HubEntry>> {
        let encoded = if dir.is_empty() {
            String::new()
        } else {
            format!("/{}", encode_query(dir))
        };
        let mut url = format!(
            "{}/api/datasets/{}/tree/{sha}{encoded}?recursive={recursive}",
            self.endpoint, at.repo
        );
        let mut pages = vec![url.clone()];
        let mut out = Vec::new();
        loop {
            let (body, next) = self.get(&url, at, net, jitter)?;
            let before = out.len();
            out.extend(
                page_entries(&body, dir, recursive).map_err(|why| at.error(200, None, why))?,
            );
            if out.len() > MAX_ENTRIES {
                return Err(at.error(
                    200,
                    None,
                    format!("the tree lists more than {MAX_ENTRIES} entries"),
                ));
            }
            let Some(next) = next else {
                return Ok(out);
            };
            let refuse = |why: &str| at.error(200, None, format!("the tree's pages {why}"));
            if out.len() == before {
                return Err(refuse("go on after an empty page"));
            }
            let next = url::Url::parse(&url)
                .and_then(|u| u.join(&next))
                .map_err(|_| refuse("name a next page that is not a URL"))?;
            if !matches!(next.scheme(), "http" | "https")
                || (url.starts_with("https:") && next.scheme() == "http")
            {
                return Err(refuse("name a next page that is not an https URL"));
            }
            if pages.iter().any(|p| p == next.as_str()) {
                return Err(refuse("name a page already read as the next"));
            }
            url = next.to_string();
            pages.push(url.clone());
        }
    }

    /// One GET of the API (its redirects followed) with its retries:
    /// the body and the next page's URL, or the named error.
    fn get(
        &self,
        url: &str,
        at: &At<'_>,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<(Vec<u8>, Option<String>)> {
        let shown = crate::redact::url(url).into_owned();
        match with_retries(net, jitter, &shown, || self.get_once(url)) {
            Ok(Answer::Page(body, next)) => Ok((body, next)),
            Ok(Answer::Refused {
                status,
                code,
                message,
            }) => Err(at.error(status, code, self.scrub(&message))),
            Err(Error::Http {
                url,
                kind,
                message,
                attempts,
            }) => Err(Error::Http {
                url,
                kind,
                message: self.scrub(&message),
                attempts,
            }),
            Err(e) => Err(e),
        }
    }

    /// `text` without the token, should a server have echoed it.
    fn scrub(&self, text: &str) -> String {
        match &self.token {
            Some(t) if t.is_in(text) => t.scrub(text),
            _ => text.to_string(),
        }
    }

    /// One attempt: the GET and the redirects it answers.
    fn get_once(&self, first: &str) -> std::result::Result<Answer, HttpFail> {
        let mut chain = Chain::default();
        let mut url = first.to_string();
        loop {
            let mut req = self
                .http
                .get(&url)
                .header("Accept", "application/json")
                .header(
                    "User-Agent",
                    concat!("ringfeed/", env!("CARGO_PKG_VERSION")),
                );
            // The token goes to the endpoint's origin only.
            if let Some(t) = &self.token
                && same_origin(&url, &self.endpoint)
            {
                req = req.header("Authorization", t.bearer());
            }
            let resp = req.send().map_err(transport)?;
            let status = resp.status().as_u16();
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            if let (true, Some(location)) = (followed(status), header("location")) {
                let hop = match chain.follow(&url, status, &location) {
                    Ok(h) => h,
                    Err(f) => {
                        return Ok(Answer::Refused {
                            status,
                            code: None,
                            message: f.message,
                        });
                    }
                };
                chain.take(&hop);
                url = hop.url;
                continue;
            }
            if status == 200 {
                let next = header("link")
                    .as_deref()
                    .and_then(next_link)
                    .map(str::to_string);
                let mut body = Vec::new();
                resp.take(MAX_ANSWER as u64 + 1)
                    .read_to_end(&mut body)
                    .map_err(|e| {
                        HttpFail::new(FailKind::Truncated, format!("the answer's body: {e}"))
                    })?;
                if body.len() > MAX_ANSWER {
                    return Ok(Answer::Refused {
                        status,
                        code: None,
                        message: format!("the answer is longer than {MAX_ANSWER} bytes"),
                    });
                }
                return Ok(Answer::Page(body, next));
            }
            let code = header("x-error-code").map(|c| printable(&c));
            let said = header("x-error-message").map(|m| printable(&m));
            let mut message = format!("HTTP {status}");
            if let Some(c) = &code {
                message.push_str(&format!(" {c}"));
            }
            if let Some(m) = said.filter(|m| !m.is_empty()) {
                message.push_str(&format!(": {m}"));
            }
            if status == 429 || status >= 500 {
                let mut f = HttpFail::new(FailKind::of_status(status), message);
                f.retry_after = header("retry-after")
                    .and_then(|v| v.trim().parse().ok())
                    .map(Duration::from_secs);
                return Err(f);
            }
            if matches!(status, 401 | 403) {
                message.push_str(&self.access_hint());
            }
            return Ok(Answer::Refused {
                status,
                code,
                message,
            });
        }
    }

    /// What to do about a 401 or 403: give a token, or one with access.
    fn access_hint(&self) -> String {
        match &self.token_source {
            None => "; no token was sent: a private or gated dataset needs one (set HF_TOKEN, or \
                     log in with `hf auth login`, which writes $HF_HOME/token)"
                .into(),
            Some(src) => format!(
                "; the token from {src} was sent: it is refused, or it has no access to this \
                 dataset (a gated one must be accepted on its page first)"
            ),
        }
    }
}

/// One entry of a tree page, as the API documents it.
#[derive(Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    size: u64,
}

impl Item {
    /// The entry, checked to be under `dir` (directly, unless
    /// `recursive`) with a usable path; what is wrong otherwise.
    fn entry(self, dir: &str, recursive: bool) -> std::result::Result<HubEntry, String> {
        let shown = || self.path.chars().take(200).collect::<String>();
        let rel = if dir.is_empty() {
            Some(self.path.as_str())
        } else {
            self.path
                .strip_prefix(dir)
                .and_then(|r| r.strip_prefix('/'))
        };
        let Some(rel) = rel else {
            return Err(format!("`{}`, which is not under `{dir}`", shown()));
        };
        let bad = rel.is_empty()
            || rel
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
            || rel.chars().any(char::is_control);
        if bad {
            return Err(format!("`{}`, which is no path in a repository", shown()));
        }
        if !recursive && rel.contains('/') {
            return Err(format!("`{}`, deeper than the directory asked", shown()));
        }
        match self.kind.as_str() {
            "file" => {
                let size = self
                    .lfs
                    .map(|l| l.size)
                    .or(self.size)
                    .ok_or_else(|| format!("the file `{}` without a size", shown()))?;
                Ok(HubEntry {
                    path: self.path,
                    size,
                    dir: false,
                })
            }
            "directory" => Ok(HubEntry {
                path: self.path,
                size: 0,
                dir: true,
            }),
            other => Err(format!(
                "`{}` as a `{}`, neither a file nor a directory",
                shown(),
                other.chars().take(40).collect::<String>()
            )),
        }
    }
}

/// The entries of one page of the tree API's answer for `dir` (pure: the
/// fuzz target `hub_answer` runs it); what is wrong with it otherwise.
pub fn page_entries(
    body: &[u8],
    dir: &str,
    recursive: bool,
) -> std::result::Result<Vec<HubEntry>, String> {
    let items: Vec<Item> = shaped_as(body, "tree")?;
    items
        .into_iter()
        .map(|item| {
            item.entry(dir, recursive)
                .map_err(|why| format!("the tree API listed {why}"))
        })
        .collect()
}

/// `body` read as `T`; the error says whether it was no JSON or another
/// shape, and of which call.
fn shaped_as<T: for<'de> Deserialize<'de>>(
    body: &[u8],
    call: &str,
) -> std::result::Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the {call} API's answer is not JSON ({e})"))?;
    serde_json::from_value(value)
        .map_err(|e| format!("the {call} API's answer is not the JSON it documents ({e})"))
}

/// [`shaped_as`], its error named at `at`.
fn shaped<T: for<'de> Deserialize<'de>>(body: &[u8], at: &At<'_>, call: &str) -> Result<T> {
    shaped_as(body, call).map_err(|why| at.error(200, None, why))
}

/// A git commit id: 40 (SHA-1) or 64 (SHA-256) hexadecimal digits.
fn is_commit(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A server's header made fit for a message: control characters dropped,
/// at most 300 characters (the Hub's messages are a sentence).
fn printable(v: &str) -> String {
    v.chars().filter(|c| !c.is_control()).take(300).collect()
}

/// A failure to reach the API: what the retry policy makes of it.
fn transport(e: reqwest::Error) -> HttpFail {
    let kind = if e.is_timeout() {
        FailKind::Stalled
    } else if e.is_connect() {
        FailKind::Refused
    } else {
        FailKind::Reset
    };
    // reqwest's message names the URL, which holds no credential.
    HttpFail::new(kind, format!("{e}"))
}

/// The URL of the `rel="next"` link of a `Link` header (RFC 8288), as
/// GitHub and the Hub paginate.
pub fn next_link(header: &str) -> Option<&str> {
    let mut rest = header;
    while let Some(open) = rest.find('<') {
        let close = open + rest[open..].find('>')?;
        let uri = &rest[open + 1..close];
        let after = &rest[close + 1..];
        let end = after.find('<').unwrap_or(after.len());
        let is_next = after[..end].split(';').any(|param| {
            param
                .trim()
                .trim_end_matches(',')
                .split_once('=')
                .is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("rel")
                        && v.trim()
                            .trim_matches('"')
                            .split_whitespace()
                            .any(|r| r.eq_ignore_ascii_case("next"))
                })
        });
        if is_next {
            return Some(uri);
        }
        rest = &after[end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_headers_name_the_next_page() {
        for (h, want) in [
            (
                r#"<https://h/api?cursor=a%3D>; rel="next""#,
                Some("https://h/api?cursor=a%3D"),
            ),
            (
                r#"<https://h/1>; rel="prev", <https://h/3>; rel="next""#,
                Some("https://h/3"),
            ),
            (r#"<https://h/3>; rel=next"#, Some("https://h/3")),
            (
                r#"<https://h/3>; title="x"; rel="last next""#,
                Some("https://h/3"),
            ),
            (r#"<https://h/1>; rel="prev""#, None),
            ("garbage", None),
            ("<unclosed; rel=next", None),
            ("", None),
        ] {
            assert_eq!(next_link(h), want, "{h}");
        }
    }

    #[test]
    fn tree_entries_are_checked() {
        let item = |kind: &str, path: &str, size: Option<u64>, lfs: Option<u64>| Item {
            kind: kind.into(),
            path: path.into(),
            size,
            lfs: lfs.map(|size| Lfs { size }),
        };
        let e = item("file", "d/a.tar", Some(134), Some(9_000))
            .entry("d", false)
            .unwrap();
        assert_eq!((e.size, e.dir), (9_000, false));
        let e = item("file", "a.tar", Some(7), None)
            .entry("", true)
            .unwrap();
        assert_eq!(e.size, 7);
        assert!(
            item("directory", "d/e", None, None)
                .entry("d", false)
                .unwrap()
                .dir
        );
        for (it, dir, recursive, want) in [
            (
                item("file", "x/a.tar", Some(1), None),
                "d",
                true,
                "not under",
            ),
            (
                item("file", "dd/a.tar", Some(1), None),
                "d",
                true,
                "not under",
            ),
            (item("file", "d/../a", Some(1), None), "d", true, "no path"),
            (item("file", "d//a", Some(1), None), "d", true, "no path"),
            (item("file", "d/", Some(1), None), "d", true, "no path"),
            (item("file", "d/e/a", Some(1), None), "d", false, "deeper"),
            (
                item("file", "d/a", None, None),
                "d",
                false,
                "without a size",
            ),
            (
                item("submodule", "d/a", Some(1), None),
                "d",
                false,
                "neither",
            ),
        ] {
            let why = it.entry(dir, recursive).unwrap_err();
            assert!(why.contains(want), "{why}");
        }
        assert!(is_commit(&"a".repeat(40)) && is_commit(&"0".repeat(64)));
        assert!(!is_commit("main") && !is_commit(&"g".repeat(40)));
    }
}
