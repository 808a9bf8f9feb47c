//! Manifests (`URL [size [samples]]` per line, as `ringfeed index` writes
//! them) and the brace expansion the resolver applies to each URL.
//!
//! Asserts: an error names a line of the text; the entries of a manifest
//! accepted are URLs a line can hold (non-empty, no blank, no `#`), and
//! written back one a line as `ringfeed index` writes them they parse to
//! the same entries; each URL's expansion ends, within `MAX_EXPANSION`
//! names, or is a `Url` error.

use ringfeed::Error;
use ringfeed::fuzzing::{MAX_EXPANSION, expand_braces, parse_manifest};

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
        match expand_braces(url) {
            Ok(names) => assert!(!names.is_empty() && names.len() <= MAX_EXPANSION),
            Err(Error::Url { .. }) => {}
            Err(e) => panic!("`{url}`: an expansion error that is not Error::Url: {e:?}"),
        }
    }
}
