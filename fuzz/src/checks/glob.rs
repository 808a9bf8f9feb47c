//! Key patterns of `s3://` URLs (`dataset::glob`). The input is
//! `PATTERN NUL KEY`.
//!
//! Asserts: parsing and matching never panic; a key that matches starts
//! with the pattern's listing prefix; a pattern without glob characters or
//! escapes matches exactly itself; every character escaped, a key is a
//! pattern that matches exactly it, with the whole key as its prefix; `**`
//! matches every key and `*` every key without `/`.

use ringfeed::fuzzing::{Glob, is_glob};

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, key) = text.split_once('\0').unwrap_or((text, ""));
    if let Ok(g) = Glob::parse(pattern) {
        if g.matches(key) {
            assert!(key.starts_with(g.prefix()), "{pattern:?} matched {key:?}");
        }
        if !is_glob(pattern) && !pattern.contains('\\') {
            assert_eq!(g.matches(key), pattern == key, "{pattern:?} vs {key:?}");
            assert_eq!(g.prefix(), pattern);
        }
    } else {
        assert!(
            is_glob(pattern) || pattern.contains('\\'),
            "{pattern:?}: plain text refused"
        );
    }
    let escaped: String = key.chars().flat_map(|c| ['\\', c]).collect();
    let g = Glob::parse(&escaped).expect("an escaped key is a pattern");
    assert!(g.matches(key) && g.prefix() == key, "{key:?}");
    assert!(!is_glob(&escaped));
    assert!(Glob::parse("**").unwrap().matches(key));
    assert_eq!(Glob::parse("*").unwrap().matches(key), !key.contains('/'));
}
