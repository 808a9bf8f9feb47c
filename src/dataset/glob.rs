//! Glob patterns on S3 keys, as users of s5cmd and shell globs write them
//! (`s3://bucket/train/**/shard-*.tar`): the literal part before the first
//! glob character is the prefix to list, and every listed key is matched
//! against the whole pattern. Pure: no I/O.
//!
//! - `*` any characters but `/` (within one path segment);
//! - `**` any characters, `/` included; `**/` also matches no directory at
//!   all, so `train/**/x.tar` matches `train/x.tar` (as in gitignore and
//!   the `globset` crate);
//! - `?` one character but `/`;
//! - `[abc]`, `[a-z]`, `[!a-z]` or `[^a-z]` one character of (or not of) a
//!   set, never `/`;
//! - `\` takes the next character literally (a key holding `*`, `?` or `[`).
//!
//! A small matcher of our own rather than the `globset` crate: its regex
//! engine is more than four operators need, and the listing prefix and the
//! error messages need the parse anyway. Matching is a table over
//! (pattern position, key position), so no pattern takes more than
//! pattern × key steps (a backtracking matcher can take exponential time
//! on `*a*a*a…`).

/// One element of a parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`
    One,
    /// `*`
    Star,
    /// `**` not followed by `/`.
    Deep,
    /// `**/`: zero or more whole directories.
    Dirs,
    /// `[...]`: ranges, negated or not.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A parsed key pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    tokens: Vec<Token>,
    /// The literal characters before the first glob operator.
    prefix: String,
}

/// Whether `key` holds a glob operator (an unescaped `*`, `?` or `[`), so
/// that it is a pattern rather than one object's key or a prefix.
pub fn is_glob(key: &str) -> bool {
    let mut escaped = false;
    for c in key.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

impl Glob {
    /// Parses a pattern; a bad one (an unclosed or empty `[`, a reversed
    /// range, `***`, a trailing `\`) is an error saying what and where
    /// (the character position, from 1).
    pub fn parse(pattern: &str) -> Result<Glob, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let at = i + 1;
            match chars[i] {
                '\\' => {
                    let c = chars
                        .get(i + 1)
                        .ok_or_else(|| format!("`\\` at position {at} escapes nothing"))?;
                    tokens.push(Token::Literal(*c));
                    i += 2;
                }
                '?' => {
                    tokens.push(Token::One);
                    i += 1;
                }
                '*' => {
                    let run = chars[i..].iter().take_while(|&&c| c == '*').count();
                    match run {
                        1 => tokens.push(Token::Star),
                        2 if chars.get(i + 2) == Some(&'/') => {
                            tokens.push(Token::Dirs);
                            i += 1;
                        }
                        2 => tokens.push(Token::Deep),
                        _ => {
                            return Err(format!(
                                "`{}` at position {at}: use `*` (within a directory) or `**` (across directories)",
                                "*".repeat(run)
                            ));
                        }
                    }
                    i += run.min(2);
                }
                '[' => {
                    let (class, next) = parse_class(&chars, i)?;
                    tokens.push(class);
                    i = next;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        let prefix = tokens
            .iter()
            .map_while(|t| match t {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect();
        Ok(Glob { tokens, prefix })
    }

    /// The literal start of the pattern: the prefix to list.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the whole of `key` matches.
    pub fn matches(&self, key: &str) -> bool {
        let key: Vec<char> = key.chars().collect();
        let (m, n) = (self.tokens.len(), key.len());
        // `next[j]`: tokens i+1.. match key[j..]; `row[j]` the same for
        // tokens i.., filled from the end of the key backwards.
        let mut next = vec![false; n + 1];
        next[n] = true;
        for i in (0..m).rev() {
            let mut row = vec![false; n + 1];
            // For `**/`: some `/` at or after j is followed by a match.
            let mut slash_then_match = false;
            for j in (0..=n).rev() {
                let c = key.get(j).copied();
                if c == Some('/') && next[j + 1] {
                    slash_then_match = true;
                }
                row[j] = match &self.tokens[i] {
                    Token::Literal(l) => c == Some(*l) && next[j + 1],
                    Token::One => c.is_some_and(|c| c != '/') && next[j + 1],
                    Token::Class { negated, ranges } => {
                        c.is_some_and(|c| {
                            c != '/' && ranges.iter().any(|&(a, b)| a <= c && c <= b) != *negated
                        }) && next[j + 1]
                    }
                    Token::Star => next[j] || (c.is_some_and(|c| c != '/') && row[j + 1]),
                    Token::Deep => next[j] || (c.is_some() && row[j + 1]),
                    Token::Dirs => next[j] || slash_then_match,
                };
            }
            next = row;
        }
        next[0]
    }
}

/// `[...]` starting at `chars[start]`: the class and the index after `]`.
/// A `]` right after `[` or `[!` is a member, as in shells.
fn parse_class(chars: &[char], start: usize) -> Result<(Token, usize), String> {
    let at = start + 1;
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let first = i;
    loop {
        let Some(&c) = chars.get(i) else {
            return Err(format!("`[` at position {at} is not closed by `]`"));
        };
        if c == ']' && i > first {
            break;
        }
        let c = if c == '\\' {
            i += 1;
            *chars
                .get(i)
                .ok_or_else(|| format!("`[` at position {at} is not closed by `]`"))?
        } else {
            c
        };
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
            let end = chars[i + 2];
            if end < c {
                return Err(format!(
                    "the range `{c}-{end}` at position {} is reversed",
                    i + 1
                ));
            }
            ranges.push((c, end));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
    Ok((Token::Class { negated, ranges }, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, key: &str) -> bool {
        Glob::parse(pattern).unwrap().matches(key)
    }

    #[test]
    fn star_stays_within_a_directory() {
        assert!(m("train/shard-*.tar", "train/shard-000.tar"));
        assert!(m("train/shard-*.tar", "train/shard-.tar"));
        assert!(!m("train/shard-*.tar", "train/a/shard-000.tar"));
        assert!(!m("train/shard-*.tar", "train/shard-000.tar.idx"));
        assert!(m("*/x", "a/x"));
        assert!(!m("*/x", "a/b/x"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "aXbY/c"));
    }

    #[test]
    fn double_star_crosses_directories() {
        let p = "train/**/shard-*.tar";
        for yes in [
            "train/shard-1.tar",
            "train/a/shard-1.tar",
            "train/a/b/c/shard-1.tar",
        ] {
            assert!(m(p, yes), "{yes}");
        }
        for no in [
            "train/a/shard-1.tar.gz",
            "val/a/shard-1.tar",
            "trainx/shard-1.tar",
            "train/a/xshard-1.tar",
        ] {
            assert!(!m(p, no), "{no}");
        }
        assert!(m("train/**", "train/a/b.tar"));
        assert!(m("train/**.tar", "train/a/b.tar"));
        assert!(!m("train/**.tar", "train/a/b.idx"));
        assert!(m("**", ""));
        assert!(m("**/x", "x"));
        assert!(m("**/x", "a/b/x"));
        assert!(!m("**/x", "ax"));
    }

    #[test]
    fn question_marks_classes_and_escapes() {
        assert!(m("s-??.tar", "s-01.tar"));
        assert!(!m("s-??.tar", "s-1.tar"));
        assert!(!m("a?b", "a/b"));
        assert!(m("s-[0-3].tar", "s-2.tar"));
        assert!(!m("s-[0-3].tar", "s-4.tar"));
        assert!(m("s-[!0-3].tar", "s-4.tar"));
        assert!(m("s-[^0-3].tar", "s-x.tar"));
        assert!(!m("s-[!0-3].tar", "s-/.tar"));
        assert!(m("[]]", "]"));
        assert!(m("[a-]", "-"));
        assert!(m("[ab]x", "bx"));
        assert!(m(r"a\*b", "a*b"));
        assert!(!m(r"a\*b", "axb"));
        assert!(m("ü*", "über"));
        assert!(!is_glob(r"a\*b\[c\?"));
        assert!(is_glob("a/b*"));
        assert!(is_glob("a[0]"));
        assert!(!is_glob("train/"));
    }

    #[test]
    fn the_prefix_is_the_literal_start() {
        assert_eq!(Glob::parse("train/**/s-*.tar").unwrap().prefix(), "train/");
        assert_eq!(Glob::parse("train/s-*.tar").unwrap().prefix(), "train/s-");
        assert_eq!(Glob::parse(r"a\*b/*").unwrap().prefix(), "a*b/");
        assert_eq!(Glob::parse("*").unwrap().prefix(), "");
    }

    #[test]
    fn bad_patterns_say_what_and_where() {
        for (p, want) in [
            ("a/[0-9", "`[` at position 3 is not closed"),
            ("a/[]", "`[` at position 3 is not closed"),
            ("a[9-0]", "range `9-0` at position 3 is reversed"),
            ("a/***.tar", "`***` at position 3"),
            (r"a\", "escapes nothing"),
        ] {
            let e = Glob::parse(p).unwrap_err();
            assert!(e.contains(want), "{p}: {e}");
        }
    }

    #[test]
    fn long_patterns_do_not_backtrack() {
        let key = "a".repeat(2000);
        let p = "*a".repeat(50) + "b";
        assert!(!m(&p, &key));
    }
}
