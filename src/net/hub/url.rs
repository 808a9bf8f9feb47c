//! `hf://datasets/ORG/NAME[@REVISION][/PATH]` URLs, parsed as
//! huggingface_hub's `parse_hf_uri` parses them (pure): the repository
//! id, the revision after `@` (a branch, a tag or a commit; percent-
//! decoded, so `refs%2Fconvert%2Fparquet` is `refs/convert/parquet`; the
//! special refs `refs/convert/NAME` and `refs/pr/N` written with their
//! slashes are matched first), and the path in the repository (a file, a
//! directory, or a key pattern with `*`, `?`, `[...]`, `**`). Brace
//! expansion happens before (`crate::dataset`), as for any URL. Only
//! datasets are read: a model's or a space's URL is refused by name.

use percent_encoding::percent_decode_str;

/// The scheme.
pub const SCHEME: &str = "hf://";

/// The repository type read, as its URLs name it.
const DATASETS: &str = "datasets/";

/// A parsed `hf://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubUrl {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision, decoded; `None`: the default branch (`main`).
    pub revision: Option<String>,
    /// The revision as written in the URL (encoded or not): how shard
    /// names show it.
    pub raw_revision: Option<String>,
    /// The path in the repository, without leading or trailing `/`;
    /// empty: the whole repository.
    pub path: String,
}

/// The branch a URL without `@REVISION` reads, as the Hub's.
pub const DEFAULT_REVISION: &str = "main";

impl HubUrl {
    /// The revision asked for: the URL's, or `main`.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The URL of `path` (a file of this repository) at the revision as
    /// written: what names a shard in messages, stats and the cache.
    pub fn name_of(&self, path: &str) -> String {
        let at = self
            .raw_revision
            .as_ref()
            .map(|r| format!("@{r}"))
            .unwrap_or_default();
        format!("{SCHEME}{DATASETS}{}{at}/{path}", self.repo)
    }
}

/// Parses `url`; the error says what is wrong and how it should read.
pub fn parse(url: &str) -> Result<HubUrl, String> {
    const FORM: &str = "hf://datasets/ORG/NAME[@REVISION][/PATH]";
    let body = url
        .strip_prefix(SCHEME)
        .ok_or_else(|| format!("not an hf:// URL; expected {FORM}"))?;
    if body.bytes().any(|b| b < b' ' || b == 0x7f) {
        return Err("the URL holds control characters".into());
    }
    let Some(location) = body.strip_prefix(DATASETS) else {
        let kind = body.split('/').next().unwrap_or("");
        return Err(match kind {
            "models" | "spaces" | "kernels" | "buckets" => {
                format!("ringfeed reads Hub datasets only, not {kind}; expected {FORM}")
            }
            _ => format!(
                "a model's URL (no type given), which ringfeed does not read; expected {FORM}"
            ),
        });
    };
    let location = location.trim_end_matches('/');
    if location.is_empty() {
        return Err(format!("no repository id; expected {FORM}"));
    }
    // The `@` separates the revision only right after `ORG/NAME` (at most
    // one `/` before it); one deeper in the path is a file name's.
    let (repo, revision, raw_revision, path) = match location.find('@') {
        Some(at) if location[..at].matches('/').count() <= 1 => {
            let repo = &location[..at];
            let rest = &location[at + 1..];
            let (raw, path) = match special_ref(rest) {
                Some(n) => (
                    &rest[..n],
                    rest[n..].strip_prefix('/').unwrap_or(&rest[n..]),
                ),
                None => rest.split_once('/').unwrap_or((rest, "")),
            };
            if raw.is_empty() {
                return Err("an empty revision after `@`".into());
            }
            let decoded = percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| format!("the revision `{raw}` is not UTF-8 once decoded"))?;
            if decoded.is_empty() || decoded.chars().any(char::is_control) {
                return Err(format!(
                    "the revision `{raw}` is empty or holds control characters"
                ));
            }
            (
                repo.to_string(),
                Some(decoded.into_owned()),
                Some(raw.to_string()),
                path,
            )
        }
        _ => {
            let mut parts = location.splitn(3, '/');
            let (org, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            (
                format!("{org}/{name}"),
                None,
                None,
                parts.next().unwrap_or(""),
            )
        }
    };
    check_repo(&repo)
        .map_err(|why| format!("the repository id `{repo}` {why}; expected {FORM}"))?;
    check_path(path).map_err(|why| format!("the path `{path}` {why}"))?;
    Ok(HubUrl {
        repo,
        revision,
        raw_revision,
        path: path.to_string(),
    })
}

/// The length of a special ref at the start of `s`: `refs/convert/NAME`
/// (NAME of `[A-Za-z0-9_.-]`) or `refs/pr/N`, which keep their slashes
/// unencoded in a URL (huggingface_hub's `_SPECIAL_REFS_REVISION_REGEX`).
fn special_ref(s: &str) -> Option<usize> {
    let (prefix, ok): (&str, fn(char) -> bool) = if s.starts_with("refs/convert/") {
        ("refs/convert/", |c| {
            c.is_alphanumeric() || matches!(c, '_' | '.' | '-')
        })
    } else if s.starts_with("refs/pr/") {
        ("refs/pr/", |c| c.is_ascii_digit())
    } else {
        return None;
    };
    let name = s[prefix.len()..]
        .char_indices()
        .find(|&(_, c)| !ok(c))
        .map_or(s.len() - prefix.len(), |(i, _)| i);
    (name > 0).then_some(prefix.len() + name)
}

/// huggingface_hub's `validate_repo_id` for `ORG/NAME`: each part 1 to 96
/// of `A-Z a-z 0-9 _ . -`, starting and ending with a letter, digit or
/// `_`, without `--` or `..`.
fn check_repo(repo: &str) -> Result<(), &'static str> {
    let Some((org, name)) = repo
        .split_once('/')
        .filter(|(o, n)| !o.is_empty() && !n.is_empty())
    else {
        return Err("is not ORG/NAME");
    };
    for part in [org, name] {
        if part.is_empty() || part.len() > 96 {
            return Err("has a part empty or longer than 96 characters");
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err("holds characters other than letters, digits, `_`, `.` and `-`");
        }
        let edge = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        if !edge(part.as_bytes()[0]) || !edge(part.as_bytes()[part.len() - 1]) {
            return Err("has a part starting or ending with `.` or `-`");
        }
        if part.contains("--") || part.contains("..") {
            return Err("holds `--` or `..`");
        }
    }
    Ok(())
}

/// A path in a repository: no empty segment (`//`, a leading `/`) and no
/// `.` or `..` segment, which a URL would resolve away.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Ok(());
    }
    if path
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err("has an empty, `.` or `..` segment");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> (String, Option<String>, String) {
        let u = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        (u.repo, u.revision, u.path)
    }

    /// The forms huggingface_hub's own tests give `parse_hf_uri`.
    #[test]
    fn urls_parse_as_huggingface_hub_parses_them() {
        let s = |x: &str| x.to_string();
        for (url, repo, rev, path) in [
            ("hf://datasets/o/n", "o/n", None, ""),
            ("hf://datasets/o/n/", "o/n", None, ""),
            ("hf://datasets/o/n/train/a.tar", "o/n", None, "train/a.tar"),
            ("hf://datasets/o/n@main/a.tar", "o/n", Some("main"), "a.tar"),
            ("hf://datasets/o/n@v1.0", "o/n", Some("v1.0"), ""),
            (
                "hf://datasets/o/n@refs%2Fconvert%2Fparquet/default/train/0.parquet",
                "o/n",
                Some("refs/convert/parquet"),
                "default/train/0.parquet",
            ),
            (
                "hf://datasets/o/n@refs/convert/parquet/default/x",
                "o/n",
                Some("refs/convert/parquet"),
                "default/x",
            ),
            (
                "hf://datasets/o/n@refs/pr/10/a.tar",
                "o/n",
                Some("refs/pr/10"),
                "a.tar",
            ),
            (
                "hf://datasets/o/n@feature%2Fx/a.tar",
                "o/n",
                Some("feature/x"),
                "a.tar",
            ),
            (
                "hf://datasets/o/n/dir/file@1.tar",
                "o/n",
                None,
                "dir/file@1.tar",
            ),
            (
                "hf://datasets/o/n@0123abc/**/*.tar",
                "o/n",
                Some("0123abc"),
                "**/*.tar",
            ),
        ] {
            assert_eq!(ok(url), (s(repo), rev.map(s), s(path)), "{url}");
        }
        let u = parse("hf://datasets/o/n@refs%2Fconvert%2Fparquet/x.tar").unwrap();
        assert_eq!(u.revision(), "refs/convert/parquet");
        assert_eq!(
            u.name_of("x.tar"),
            "hf://datasets/o/n@refs%2Fconvert%2Fparquet/x.tar"
        );
        assert_eq!(parse("hf://datasets/o/n/x").unwrap().revision(), "main");
        assert_eq!(
            parse("hf://datasets/o/n/x").unwrap().name_of("x"),
            "hf://datasets/o/n/x"
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, want) in [
            ("s3://b/k", "not an hf:// URL"),
            ("hf://", "a model's URL"),
            ("hf://o/n/a.tar", "a model's URL"),
            ("hf://models/o/n", "datasets only, not models"),
            ("hf://spaces/o/n", "datasets only, not spaces"),
            ("hf://datasets/", "no repository id"),
            ("hf://datasets/o", "is not ORG/NAME"),
            ("hf://datasets/o/n@", "empty revision"),
            ("hf://datasets/o/n@/a.tar", "empty revision"),
            ("hf://datasets/o/n@%ff/a", "not UTF-8"),
            ("hf://datasets/o/n@%0a/a", "control characters"),
            ("hf://datasets/o/-n/a", "starting or ending"),
            ("hf://datasets/o/n--x/a", "`--`"),
            ("hf://datasets/o/n x/a", "characters other than"),
            ("hf://datasets/o/n//a", "empty, `.` or `..` segment"),
            ("hf://datasets/o/n/a/../../b", "empty, `.` or `..` segment"),
            ("hf://datasets/o/n/a\u{1}", "control characters"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(want), "{url}: {e}");
        }
    }
}
