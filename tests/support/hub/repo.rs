//! The emulator's pure parts: the repositories under its root (a folder
//! `ORG/NAME` each, its files the dataset's), the commits their
//! revisions name, the tree API's entries and pages, and the signatures
//! of the content host's URLs.

use std::hash::BuildHasher;
use std::path::Path;

use sha1::Digest;

/// The revisions every repository has: a branch, a tag, and the two
/// special refs whose names hold slashes.
pub const REVISIONS: &[&str] = &["main", "v1.0", "refs/convert/parquet", "refs/pr/1"];

/// The commit `revision` names in `repo`: a hash of both, so each
/// revision has its own (and a test can tell which one a read used).
pub fn commit_of(repo: &str, revision: &str) -> String {
    hex(&sha1::Sha1::digest(format!("{repo}@{revision}").as_bytes()))
}

/// The commit `rev` (a revision's name, or a commit) resolves to in `repo`.
pub fn resolve_revision(repo: &str, rev: &str) -> Option<String> {
    REVISIONS
        .iter()
        .map(|r| commit_of(repo, r))
        .find(|sha| sha == rev)
        .or_else(|| REVISIONS.contains(&rev).then(|| commit_of(repo, rev)))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One file or directory of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// From the repository's root.
    pub path: String,
    pub size: u64,
    pub dir: bool,
}

/// The entries under `dir` of the repository at `repo_dir` (directly, or
/// at every depth), sorted by path; `None` when `dir` is no directory.
pub fn list(repo_dir: &Path, dir: &str, recursive: bool) -> Option<Vec<Item>> {
    let base = if dir.is_empty() {
        repo_dir.to_path_buf()
    } else {
        repo_dir.join(dir)
    };
    if !base.is_dir() {
        return None;
    }
    let mut out = Vec::new();
    walk(&base, dir, recursive, &mut out);
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Some(out)
}

fn walk(at: &Path, rel: &str, recursive: bool, out: &mut Vec<Item>) {
    let Ok(rd) = std::fs::read_dir(at) else {
        return;
    };
    for e in rd.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            out.push(Item {
                path: path.clone(),
                size: 0,
                dir: true,
            });
            if recursive {
                walk(&e.path(), &path, recursive, out);
            }
        } else if m.is_file() {
            out.push(Item {
                path,
                size: m.len(),
                dir: false,
            });
        }
    }
}

/// An entry as the tree API gives it: `.tar` files as LFS files (their
/// `lfs` object with the size), others as plain git blobs.
pub fn entry_json(item: &Item) -> serde_json::Value {
    let oid = hex(&sha1::Sha1::digest(item.path.as_bytes()));
    if item.dir {
        return serde_json::json!({"type": "directory", "oid": oid, "size": 0, "path": item.path});
    }
    let mut v = serde_json::json!({
        "type": "file",
        "oid": oid,
        "size": item.size,
        "path": item.path,
    });
    if item.path.ends_with(".tar") {
        v["lfs"] = serde_json::json!({
            "oid": format!("{oid}{}", &oid[..24]),
            "size": item.size,
            "pointerSize": 134,
        });
    }
    v
}

/// The page of `items` from `cursor`, `page` entries long, and the next
/// page's cursor when there is one.
pub fn page(items: &[Item], cursor: usize, page: usize) -> (String, Option<usize>) {
    let end = (cursor + page).min(items.len());
    let entries: Vec<serde_json::Value> = items
        .get(cursor..end)
        .unwrap_or(&[])
        .iter()
        .map(entry_json)
        .collect();
    let next = (end < items.len()).then_some(end);
    (serde_json::Value::Array(entries).to_string(), next)
}

/// The signature of a content URL: a keyed hash (the emulator's random
/// key) of its path, expiry and generation.
pub fn signature(
    key: &std::collections::hash_map::RandomState,
    path: &str,
    expires: u64,
    generation: u64,
) -> String {
    format!("{:016x}", key.hash_one((path, expires, generation)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_trees_and_pages() {
        let sha = commit_of("o/n", "main");
        assert_eq!(sha.len(), 40);
        assert_eq!(resolve_revision("o/n", "main"), Some(sha.clone()));
        assert_eq!(resolve_revision("o/n", &sha), Some(sha.clone()));
        assert_ne!(resolve_revision("o/n", "refs/convert/parquet"), Some(sha));
        assert_eq!(resolve_revision("o/n", "nope"), None);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/x.tar"), b"12345").unwrap();
        std::fs::write(d.path().join("r.md"), b"1").unwrap();
        let all = list(d.path(), "", true).unwrap();
        let paths: Vec<&str> = all.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b", "a/b/x.tar", "r.md"]);
        assert_eq!(list(d.path(), "a", false).unwrap().len(), 1);
        assert_eq!(list(d.path(), "r.md", false), None);
        let (text, next) = page(&all, 0, 3);
        assert_eq!(next, Some(3));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[2]["lfs"]["size"], 5);
        assert_eq!(page(&all, 3, 3).1, None);
    }
}
