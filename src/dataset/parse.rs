//! The pure half of naming a dataset: local URLs to paths, WebDataset
//! brace expansion, and the lines of a manifest. Strings in, names out: no
//! filesystem, no network (`resolve.rs` does those with what this returns).

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Upper bound on what one URL may expand to; a typo such as
/// `{0..99999999}` must fail fast, not allocate gigabytes of names.
pub const MAX_EXPANSION: usize = 10_000_000;

/// Upper bound on the brace groups of one URL (nested ones included): real
/// patterns have one to three; the bound keeps the expansion's recursion,
/// one level per group, far inside a thread's stack.
pub const MAX_GROUPS: usize = 1024;

/// A manifest line: URL, size in bytes, samples.
pub type ManifestEntry = (String, Option<u64>, Option<u64>);

/// The lines of a manifest: `URL [size [samples]]`, blank lines and `#`
/// comments skipped; the error names the line.
pub fn parse_manifest(text: &str) -> std::result::Result<Vec<ManifestEntry>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split_once('#').map_or(raw, |(a, _)| a).trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let url = fields.next().unwrap_or_default().to_string();
        let size = match fields.next() {
            None => None,
            Some(f) => Some(
                f.parse::<u64>()
                    .map_err(|_| format!("line {}: the size `{f}` is not a byte count", i + 1))?,
            ),
        };
        let samples =
            match fields.next() {
                None => None,
                Some(f) => Some(f.parse::<u64>().map_err(|_| {
                    format!("line {}: the sample count `{f}` is not a number", i + 1)
                })?),
            };
        if fields.next().is_some() {
            return Err(format!(
                "line {}: expected `URL [size [samples]]`, got more fields",
                i + 1
            ));
        }
        out.push((url, size, samples));
    }
    Ok(out)
}

/// Maps a local URL to a path; refuses other schemes with the reason.
pub fn local_path(url: &str) -> Result<PathBuf> {
    let err = |reason: &str| Error::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(err(
                "a file:// URL needs an absolute path (file:///data/a.tar); hosts are not supported",
            ));
        }
        return Ok(PathBuf::from(rest));
    }
    if let Some((scheme, _)) = url.split_once("://") {
        return Err(match scheme {
            "s3" | "http" | "https" | "hf" => err("not a local path (resolved as a network URL)"),
            _ => err(&format!(
                "unsupported scheme `{scheme}`; use a local path or file://"
            )),
        });
    }
    if url.starts_with("pipe:") {
        return Err(err(
            "`pipe:` URLs run a shell command; ringfeed reads shards itself: give the path",
        ));
    }
    Ok(PathBuf::from(url))
}

/// WebDataset brace expansion: `{a,b}` alternatives, `{000..127}` numeric
/// ranges (zero-padded to the width of the first bound, optional `..step`),
/// nested and repeated groups. `\{` and `\}` are literal braces.
pub fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let err = |reason: String| Error::Url {
        url: pattern.to_string(),
        reason,
    };
    // Counted before anything is built, so a pattern over the limit fails
    // at once instead of after building MAX_EXPANSION names.
    let mut groups = 0;
    let n = count_names(pattern, &mut groups).map_err(err)?;
    if n > MAX_EXPANSION as u64 {
        return Err(err(format!("expands to more than {MAX_EXPANSION} names")));
    }
    let mut out = Vec::with_capacity(n as usize);
    expand_into(pattern, &mut String::new(), &mut out).map_err(err)?;
    Ok(out)
}

/// The names `pattern` expands to, counted without building them (past
/// `MAX_EXPANSION`: some number above it); the fuzz target checks it
/// against `expand_braces`.
pub fn expansion_count(pattern: &str) -> std::result::Result<u64, String> {
    count_names(pattern, &mut 0)
}

/// The names `rest` expands to, without building them (past
/// `MAX_EXPANSION`, some number above it). A pattern is its groups in
/// sequence, each multiplying the names of what follows it; a group's
/// names are the sum of its alternatives' (each a pattern itself).
fn count_names(mut rest: &str, groups: &mut usize) -> std::result::Result<u64, String> {
    const OVER: u64 = MAX_EXPANSION as u64 + 1;
    let mut n: u64 = 1;
    while let Some((open, close)) = find_group(rest)? {
        *groups += 1;
        if *groups > MAX_GROUPS {
            return Err(format!("holds more than {MAX_GROUPS} brace groups"));
        }
        let body = &rest[open + 1..close];
        let alternatives = match list_parts(body) {
            Some(parts) => {
                let mut sum: u64 = 0;
                for part in &parts {
                    sum = sum.saturating_add(count_names(part, groups)?).min(OVER);
                }
                sum
            }
            None => range_bounds(body)?.3,
        };
        n = n.saturating_mul(alternatives).min(OVER);
        rest = &rest[close + 1..];
    }
    Ok(n)
}

fn expand_into(
    rest: &str,
    prefix: &mut String,
    out: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let Some((open, close)) = find_group(rest)? else {
        out.push(format!("{prefix}{}", unescape(rest)));
        if out.len() > MAX_EXPANSION {
            return Err(format!("expands to more than {MAX_EXPANSION} names"));
        }
        return Ok(());
    };
    let head = unescape(&rest[..open]);
    let body = &rest[open + 1..close];
    let tail = &rest[close + 1..];
    let alternatives = group_alternatives(body)?;
    let keep = prefix.len();
    for alt in alternatives {
        prefix.push_str(&head);
        // An alternative may itself hold groups: expand it with the tail.
        let combined = format!("{alt}{tail}");
        expand_into(&combined, prefix, out)?;
        prefix.truncate(keep);
    }
    Ok(())
}

fn unescape(s: &str) -> String {
    s.replace("\\{", "{").replace("\\}", "}")
}

/// Finds the first top-level `{...}` group: byte offsets of its braces.
fn find_group(s: &str) -> std::result::Result<Option<(usize, usize)>, String> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    let mut open = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => {
                if depth == 0 {
                    open = Some(i);
                }
                depth += 1;
            }
            b'}' => {
                if depth == 0 {
                    return Err(format!("unmatched `}}` at byte {i}"));
                }
                depth -= 1;
                if depth == 0 {
                    return Ok(open.map(|o| (o, i)));
                }
            }
            _ => {}
        }
        i += 1;
    }
    match open {
        Some(o) => Err(format!("unmatched `{{` at byte {o}")),
        None => Ok(None),
    }
}

fn group_alternatives(body: &str) -> std::result::Result<Vec<String>, String> {
    match list_parts(body) {
        Some(parts) => Ok(parts),
        None => numeric_range(body),
    }
}

/// The alternatives of a list group `{a,b}`: top-level commas split them;
/// `None` for a group without one (a range).
fn list_parts(body: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(body[start..i].to_string());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if parts.is_empty() {
        return None;
    }
    parts.push(body[start..].to_string());
    Some(parts)
}

/// A range group's low and high bounds, step and count of names.
fn range_bounds(body: &str) -> std::result::Result<(u64, u64, u64, u64), String> {
    let fields: Vec<&str> = body.split("..").collect();
    let bad =
        || format!("`{{{body}}}` is neither a list `{{a,b}}` nor a numeric range `{{000..127}}`");
    if !(2..=3).contains(&fields.len()) || fields.iter().any(|f| f.is_empty()) {
        return Err(bad());
    }
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (lo, hi) = (num(fields[0])?, num(fields[1])?);
    let step = if fields.len() == 3 {
        num(fields[2])?
    } else {
        1
    };
    if step == 0 {
        return Err(format!("`{{{body}}}` has a step of 0"));
    }
    let count = lo.abs_diff(hi) / step + 1;
    if count > MAX_EXPANSION as u64 {
        return Err(format!(
            "`{{{body}}}` expands to more than {MAX_EXPANSION} names"
        ));
    }
    Ok((lo, hi, step, count))
}

fn numeric_range(body: &str) -> std::result::Result<Vec<String>, String> {
    let (lo, hi, step, count) = range_bounds(body)?;
    let fields: Vec<&str> = body.split("..").collect();
    let width = if fields[0].len() > 1 && fields[0].starts_with('0') {
        fields[0].len()
    } else {
        0
    };
    Ok((0..count)
        .map(|k| {
            let v = if lo <= hi {
                lo + k * step
            } else {
                lo - k * step
            };
            format!("{v:0width$}")
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webdataset_brace_forms() {
        assert_eq!(
            expand_braces("s-{000..003}.tar").unwrap(),
            ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
        );
        assert_eq!(
            expand_braces("{a,b}-{1..2}").unwrap(),
            ["a-1", "a-2", "b-1", "b-2"]
        );
        assert_eq!(expand_braces("x{0..6..3}").unwrap(), ["x0", "x3", "x6"]);
        assert_eq!(expand_braces("{3..1}").unwrap(), ["3", "2", "1"]);
        assert_eq!(expand_braces("{a,{b,c}d}").unwrap(), ["a", "bd", "cd"]);
        assert_eq!(expand_braces("plain.tar").unwrap(), ["plain.tar"]);
        assert_eq!(expand_braces("lit\\{x\\}").unwrap(), ["lit{x}"]);
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (p, want) in [
            ("a{0..3", "unmatched `{`"),
            ("a}b", "unmatched `}`"),
            ("{abc}", "neither a list"),
            ("{1..x}", "neither a list"),
            ("{0..9..0}", "step of 0"),
            ("{0..99999999999}", "more than"),
            ("{0..9999}{0..9999}", "more than"),
        ] {
            let e = expand_braces(p).unwrap_err().to_string();
            assert!(e.contains(want), "{p}: {e}");
        }
    }

    /// Found by fuzzing (`manifest`): a product of groups over the limit
    /// (`{0..9999}{0..9999}`) built 10 million names, 2.2 s and 550 MB,
    /// before it failed; and each group is a level of recursion, so a long
    /// run of them would overflow the stack. Both now fail before anything
    /// is built.
    #[test]
    fn patterns_over_the_limits_fail_before_expanding() {
        let t = std::time::Instant::now();
        for p in ["{0..9999}{0..9999}", "a{0..99999}{b,c}{0..99}"] {
            let e = expand_braces(p).unwrap_err().to_string();
            assert!(e.contains("more than 10000000 names"), "{p}: {e}");
        }
        let many = "{5..5}".repeat(MAX_GROUPS + 1);
        let e = expand_braces(&many).unwrap_err().to_string();
        assert!(e.contains("brace groups"), "{e}");
        // Generous: the product is refused by counting, in microseconds.
        assert!(
            t.elapsed() < std::time::Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(expansion_count("{a,{b,c}d}x{0..6..3}"), Ok(9));
    }

    #[test]
    fn schemes() {
        assert_eq!(
            local_path("file:///d/a.tar").unwrap(),
            PathBuf::from("/d/a.tar")
        );
        assert!(
            local_path("file://host/a.tar")
                .unwrap_err()
                .to_string()
                .contains("absolute")
        );
        assert!(
            local_path("s3://b/k")
                .unwrap_err()
                .to_string()
                .contains("not a local path")
        );
        assert!(
            local_path("gopher://x")
                .unwrap_err()
                .to_string()
                .contains("unsupported scheme `gopher`")
        );
        assert!(
            local_path("pipe:curl x")
                .unwrap_err()
                .to_string()
                .contains("pipe:")
        );
    }

    #[test]
    fn manifests_list_urls_with_optional_sizes() {
        let m = "# shards\n\ns3://b/a.tar 100\n  http://h/b.tar   # no size\n/d/c.tar\t7 3\n";
        assert_eq!(
            parse_manifest(m).unwrap(),
            vec![
                ("s3://b/a.tar".to_string(), Some(100), None),
                ("http://h/b.tar".to_string(), None, None),
                ("/d/c.tar".to_string(), Some(7), Some(3)),
            ]
        );
        assert!(
            parse_manifest("a.tar ten\n")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            parse_manifest("a.tar 10 some\n")
                .unwrap_err()
                .contains("the sample count `some` is not a number")
        );
        assert!(
            parse_manifest("\na.tar 1 2 3\n")
                .unwrap_err()
                .contains("line 2")
        );
    }
}
