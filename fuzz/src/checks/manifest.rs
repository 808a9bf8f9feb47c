//! Manifests (`URL [size [samples]]` per line, as `ringfeed index` writes
//! them) and the brace expansion the resolver applies to each URL.
//!
//! Asserts: an error names a line of the text; the entries of a manifest
//! accepted are URLs a line can hold (non-empty, no blank, no `#`), and
//! written back one a line as `ringfeed index` writes them they parse to
//! the same entries; each URL's expansion ends, within `MAX_EXPANSION`
//! names, or is a `Url` error; its count, made without expanding, is the
//! number of names, and a pattern over the limit fails by it.

use ringfeed::Error;
use ringfeed::fuzzing::{MAX_EXPANSION, expand_braces, expansion_count, parse_manifest};

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let entries = match parse_manifest(text) {
        Ok(e) => e,
        Err(msg) => {
            let line: usize = msg
                .strip_prefix("line ")
                .and_then(|m| m.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("the error names no line: {msg}"));
            assert!(line >= 1 && line <= text.lines().count(), "{msg}");
            return;
        }
    };
    let mut written = String::from("# written back\n");
    for (url, size, samples) in &entries {
        assert!(!url.is_empty() && !url.contains(char::is_whitespace) && !url.contains('#'));
        written.push_str(url);
        for n in [size, samples].into_iter().flatten() {
            written.push_str(&format!(" {n}"));
        }
        written.push('\n');
    }
    assert_eq!(parse_manifest(&written).as_ref(), Ok(&entries), "{written}");
    for (url, _, _) in &entries {
        // Expansions up to MAX_EXPANSION names are allowed and cost their
        // size; past 100,000 names only the count is compared, and a
        // pattern over the limit must fail without expanding.
        let count = expansion_count(url);
        if count
            .as_ref()
            .is_ok_and(|&n| n > 100_000 && n <= MAX_EXPANSION as u64)
        {
            continue;
        }
        match expand_braces(url) {
            Ok(names) => {
                assert!(!names.is_empty() && names.len() <= MAX_EXPANSION);
                assert_eq!(count, Ok(names.len() as u64), "`{url}` counted apart");
            }
            Err(Error::Url { .. }) => assert!(
                count.as_ref().map_or(true, |&n| n > MAX_EXPANSION as u64),
                "`{url}` counted {count:?} but failed to expand"
            ),
            Err(e) => panic!("`{url}`: an expansion error that is not Error::Url: {e:?}"),
        }
    }
}
