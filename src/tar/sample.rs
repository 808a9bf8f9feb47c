//! WebDataset sample grouping: a member's path splits into the sample key
//! (the path up to the first dot of the basename) and the field name (the rest).
//! `a/b/000123.seg.png` → key `a/b/000123`, field `seg.png`. Consecutive
//! members with the same key form one sample.

/// Splits a member path into `(key, field)`; `None` when the basename has no
/// dot after its first character (WebDataset skips such files).
pub fn split_name(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let base_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    let dot = base.iter().position(|&b| b == b'.')?;
    if dot == 0 {
        return None;
    }
    let cut = base_start + dot;
    Some((&path[..cut], &path[cut + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_end_at_the_first_dot_of_the_basename() {
        let s = |p: &str| {
            split_name(p.as_bytes()).map(|(k, f)| {
                (
                    String::from_utf8(k.to_vec()).unwrap(),
                    String::from_utf8(f.to_vec()).unwrap(),
                )
            })
        };
        assert_eq!(
            s("a/b/000123.seg.png"),
            Some(("a/b/000123".into(), "seg.png".into()))
        );
        assert_eq!(s("x.y/k.jpg"), Some(("x.y/k".into(), "jpg".into())));
        assert_eq!(s("k."), Some(("k".into(), "".into())));
        assert_eq!(s("dir/noext"), None);
        assert_eq!(s("dir/.hidden"), None);
    }
}
