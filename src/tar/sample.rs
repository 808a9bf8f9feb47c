//! WebDataset sample grouping: a member's path splits into the sample key
//! and the field name the way WebDataset's defaults do
//! (`webdataset.tariterators`: `tar_file_iterator`'s `__…__` skip,
//! `base_plus_ext`, and `group_by_keys` with `lcase=True`).
//! `a/b/000123.seg.PNG` → key `a/b/000123`, field `seg.png`. Consecutive
//! members with the same key form one sample. The rules and where they come
//! from are listed in docs/webdataset-compat.md.

/// Splits a member path into `(key, field)` as WebDataset's `base_plus_ext`
/// does; `None` for the members WebDataset passes over: metadata names
/// (`__…__`, see [`is_meta`]) and names its pattern does not match. The
/// field is as stored: lower-case it with [`lowercase_field`].
///
/// `base_plus_ext` is the pattern `^((?:.*/|)[^.]+)[.]([^/]*)$`: the key
/// always ends at the first dot of the basename, and the field is what
/// follows that dot. The pattern matches when, going back from that dot, a
/// `/` (before the first newline, which `.*` does not cross) or the start
/// of the path comes before any other dot and leaves a non-empty key part.
/// So `dir/.hidden.jpg` has key `dir/` and field `hidden.jpg`, while
/// `.hidden.jpg` and `a.b/.c` have none. Bytes, not characters: `.`, `/`
/// and newline are ASCII, so the UTF-8 the names are decoded from does not
/// change the answer.
pub fn split_name(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if is_meta(path) {
        return None;
    }
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = base_start + path[base_start..].iter().position(|&b| b == b'.')?;
    // The key part `[^.]+` starts after a `/` that `.*/` can reach, or at 0.
    let newline = path.iter().position(|&b| b == b'\n').unwrap_or(path.len());
    let mut k = dot;
    let matched = loop {
        if k == 0 {
            break dot > 0;
        }
        k -= 1;
        match path[k] {
            b'.' => break false,
            b'/' if k + 1 < dot && k < newline => break true,
            _ => {}
        }
    };
    matched.then(|| (&path[..dot], &path[dot + 1..]))
}

/// Names WebDataset's `tar_file_iterator` passes over as metadata: a name
/// without `/` that starts and ends with `__`, and a name whose first path
/// component does (its default `skip_meta`, `__[^/]*__($|/)`; its `$` also
/// matches before a final newline).
pub fn is_meta(path: &[u8]) -> bool {
    let first = path.split(|&b| b == b'/').next().unwrap_or(path);
    let whole = first.len() == path.len();
    let meta = |c: &[u8], min: usize| c.len() >= min && c.starts_with(b"__") && c.ends_with(b"__");
    (whole && meta(path, 2))
        || meta(first, 4)
        || (whole && path.ends_with(b"\n") && meta(&path[..path.len() - 1], 4))
}

/// The field name WebDataset gives: lower-cased (`str.lower()`), so
/// `000001.JSON` has the field `json`. ASCII names, the common case, are
/// lower-cased in `buf` without allocating, and returned as they are when
/// they have no upper-case letter; other UTF-8 is lower-cased by Unicode's
/// rules, as Python does; bytes that are not UTF-8 are kept as they are
/// (Python decodes them as lone surrogates, which have no case).
pub fn lowercase_field<'a>(field: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    if field.is_ascii() {
        if !field.iter().any(u8::is_ascii_uppercase) {
            return field;
        }
        buf.clear();
        buf.extend(field.iter().map(u8::to_ascii_lowercase));
        return buf;
    }
    buf.clear();
    for chunk in field.utf8_chunks() {
        buf.extend_from_slice(chunk.valid().to_lowercase().as_bytes());
        buf.extend_from_slice(chunk.invalid());
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(p: &str) -> Option<(String, String)> {
        split_name(p.as_bytes()).map(|(k, f)| {
            (
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(f.to_vec()).unwrap(),
            )
        })
    }

    fn some(k: &str, f: &str) -> Option<(String, String)> {
        Some((k.into(), f.into()))
    }

    #[test]
    fn keys_end_at_the_first_dot_of_the_basename() {
        assert_eq!(s("a/b/000123.seg.png"), some("a/b/000123", "seg.png"));
        assert_eq!(s("x.y/k.jpg"), some("x.y/k", "jpg"));
        assert_eq!(s("a.b.c.jpg"), some("a", "b.c.jpg"));
        assert_eq!(s("./000001.JSON"), some("./000001", "JSON"));
        assert_eq!(s("k."), some("k", ""));
        assert_eq!(s("dir/noext"), None);
        assert_eq!(s("noext"), None);
        assert_eq!(s("dir/"), None);
        assert_eq!(s(""), None);
    }

    /// A basename that starts with a dot: `base_plus_ext` backs up to the
    /// directory before it, when that directory's last component has no dot.
    #[test]
    fn a_leading_dot_makes_the_directory_the_key() {
        assert_eq!(s("dir/.hidden"), some("dir/", "hidden"));
        assert_eq!(s("a/dir/.hidden.jpg"), some("a/dir/", "hidden.jpg"));
        assert_eq!(s("/.x"), some("/", "x"));
        assert_eq!(s("a//.x"), some("a//", "x"));
        assert_eq!(s(".hidden.jpg"), None);
        assert_eq!(s("a.b/.c"), None);
        assert_eq!(s("./.c"), None);
        // `.*` stops at a newline, `[^.]+` does not.
        assert_eq!(s("a/b\nc/d.e"), some("a/b\nc/d", "e"));
        assert_eq!(s("a\n/.e"), some("a\n/", "e"));
        assert_eq!(s("a.x\n/.e"), None);
        assert_eq!(s("a\nb/c/.e"), some("a\nb/c/", "e"));
    }

    #[test]
    fn metadata_names_are_passed_over() {
        for meta in [
            "__",
            "___",
            "__meta__",
            "__a.b__",
            "__x__/y.jpg",
            "____/a.b",
            "__m__\n",
        ] {
            assert_eq!(s(meta), None, "{meta:?}");
        }
        assert_eq!(s("__key__.txt"), some("__key__", "txt"));
        assert_eq!(s("d/__meta__.json"), some("d/__meta__", "json"));
        assert_eq!(s("___/a.b"), some("___/a", "b"));
        assert_eq!(s("__x__y/a.b"), some("__x__y/a", "b"));
    }

    #[test]
    fn fields_are_lower_cased_as_python_does() {
        let low = |f: &[u8]| lowercase_field(f, &mut Vec::new()).to_vec();
        assert_eq!(low(b"JSON"), b"json");
        assert_eq!(low(b"Seg.PNG"), b"seg.png");
        assert_eq!(low(b"jpg"), b"jpg");
        assert_eq!(low("ÄBC.ΣΑΣ".as_bytes()), "äbc.σας".as_bytes());
        assert_eq!(low(b"A\xffB"), b"a\xffb");
        let mut buf = Vec::new();
        let field = b"already.lower";
        assert!(std::ptr::eq(
            lowercase_field(field, &mut buf),
            field.as_slice()
        ));
    }

    /// `base_plus_ext` run by brute force: every way the pattern can split
    /// the path, tried in the order Python's backtracking tries them.
    fn pattern(path: &[u8]) -> Option<(&[u8], &[u8])> {
        let newline = path.iter().position(|&b| b == b'\n').unwrap_or(path.len());
        // `(?:.*/|)`: longest first, then the empty alternative.
        let mut starts: Vec<usize> = (0..newline.min(path.len()))
            .rev()
            .filter(|&j| path[j] == b'/')
            .map(|j| j + 1)
            .collect();
        starts.push(0);
        starts.into_iter().find_map(|s| {
            let q = path[s..].iter().position(|&b| b == b'.')?;
            let dot = s + q;
            (q > 0 && !path[dot + 1..].contains(&b'/')).then(|| (&path[..dot], &path[dot + 1..]))
        })
    }

    proptest! {
        #[test]
        fn split_name_is_the_pattern(path in prop::collection::vec(
            prop::sample::select(b"ab./\n_".to_vec()), 0..12)) {
            let want = if is_meta(&path) { None } else { pattern(&path) };
            prop_assert_eq!(split_name(&path), want);
        }
    }
}
