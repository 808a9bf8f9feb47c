//! The mount's inodes: one per path, kept for the mount's life (a path
//! listed again gets its inode back, so the kernel's cached entries stay
//! right), and each directory's children as its last listing gave them,
//! with the time of that listing: a listing older than the time-to-live
//! is taken again on the next lookup or `readdir`. Files this mount is
//! writing, and directories made here, are kept across listings (the
//! store shows them only once a file in them is complete).

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime};

/// The root directory's inode, as FUSE numbers it.
pub const ROOT: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

/// What a listing says of one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub kind: Kind,
    pub size: u64,
    /// The object's ETag, where the listing gave one.
    pub etag: Option<String>,
    /// Its `Last-Modified` as the server sent it, where the listing read
    /// one (an HTTP server's `HEAD`): the validator left without an ETag.
    pub modified: Option<String>,
    pub mtime: Option<SystemTime>,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub parent: u64,
    /// The path from the mount's root, `/`-separated, no leading `/`
    /// (empty for the root).
    pub rel: String,
    pub kind: Kind,
    pub size: u64,
    pub etag: Option<String>,
    /// `Last-Modified`, as [`Listed::modified`].
    pub modified: Option<String>,
    /// The listing that last showed it (numbered from 1 for the mount's
    /// life): a file with no strong ETag listed again may be another
    /// version of the same size, so it is read anew.
    pub listing: u64,
    pub mtime: SystemTime,
    /// Made by this mount and not in the store yet (a file being
    /// written, a new directory): kept when a listing does not show it.
    pub local: bool,
}

#[derive(Debug, Default)]
struct Dir {
    children: BTreeMap<String, u64>,
    listed: Option<Instant>,
}

#[derive(Debug)]
pub struct Tree {
    nodes: HashMap<u64, Node>,
    dirs: HashMap<u64, Dir>,
    by_rel: HashMap<String, u64>,
    next: u64,
    /// Listings taken so far (the number of the last).
    listings: u64,
    pub started: SystemTime,
}

impl Tree {
    pub fn new() -> Tree {
        let started = SystemTime::now();
        let mut t = Tree {
            nodes: HashMap::new(),
            dirs: HashMap::new(),
            by_rel: HashMap::new(),
            next: ROOT + 1,
            listings: 0,
            started,
        };
        t.nodes.insert(
            ROOT,
            Node {
                parent: ROOT,
                rel: String::new(),
                kind: Kind::Dir,
                size: 0,
                etag: None,
                modified: None,
                listing: 0,
                mtime: started,
                local: false,
            },
        );
        t.by_rel.insert(String::new(), ROOT);
        t.dirs.insert(ROOT, Dir::default());
        t
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    /// When `dir` was last listed.
    pub fn listed(&self, dir: u64) -> Option<Instant> {
        self.dirs.get(&dir).and_then(|d| d.listed)
    }

    /// The child `name` of `dir`, as the last listing (or this mount) made it.
    pub fn child(&self, dir: u64, name: &str) -> Option<u64> {
        self.dirs.get(&dir)?.children.get(name).copied()
    }

    /// `dir`'s children in name order.
    pub fn children(&self, dir: u64) -> Vec<(String, u64)> {
        self.dirs.get(&dir).map_or_else(Vec::new, |d| {
            d.children.iter().map(|(n, i)| (n.clone(), *i)).collect()
        })
    }

    /// Up to `n` children of `dir` after `name` (`after`) or before it,
    /// nearest first, in name order.
    pub fn neighbours(&self, dir: u64, name: &str, n: usize, after: bool) -> Vec<(String, u64)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let Some(d) = self.dirs.get(&dir) else {
            return Vec::new();
        };
        let pick = |(k, v): (&String, &u64)| (k.clone(), *v);
        if after {
            d.children
                .range::<str, _>((Excluded(name), Unbounded))
                .take(n)
                .map(pick)
                .collect()
        } else {
            d.children
                .range::<str, _>((Unbounded, Excluded(name)))
                .rev()
                .take(n)
                .map(pick)
                .collect()
        }
    }

    fn rel_of(&self, dir: u64, name: &str) -> String {
        match self.nodes.get(&dir) {
            Some(d) if !d.rel.is_empty() => format!("{}/{name}", d.rel),
            _ => name.to_string(),
        }
    }

    /// The inode of `name` in `dir`, made (or changed to `l`'s kind) as
    /// needed, with `l`'s size and version.
    fn put(&mut self, dir: u64, l: &Listed, local: bool) -> u64 {
        let rel = self.rel_of(dir, &l.name);
        let mtime = l.mtime.unwrap_or(self.started);
        let ino = match self.by_rel.get(&rel) {
            Some(&i) => i,
            None => {
                let i = self.next;
                self.next += 1;
                self.by_rel.insert(rel.clone(), i);
                i
            }
        };
        let node = Node {
            parent: dir,
            rel,
            kind: l.kind,
            size: l.size,
            etag: l.etag.clone(),
            modified: l.modified.clone(),
            listing: self.listings,
            mtime,
            local,
        };
        self.nodes.insert(ino, node);
        if l.kind == Kind::Dir {
            self.dirs.entry(ino).or_default();
        }
        if let Some(d) = self.dirs.get_mut(&dir) {
            d.children.insert(l.name.clone(), ino);
        }
        ino
    }

    /// Takes `dir`'s listing: its children become what `listed` says, but
    /// for those this mount made and the store does not show yet.
    pub fn set_listing(&mut self, dir: u64, listed: &[Listed], at: Instant) {
        let keep: Vec<(String, u64)> = self
            .children(dir)
            .into_iter()
            .filter(|(_, i)| self.nodes.get(i).is_some_and(|n| n.local))
            .collect();
        if let Some(d) = self.dirs.get_mut(&dir) {
            d.children.clear();
            d.listed = Some(at);
        }
        self.listings += 1;
        for l in listed {
            // A file of the same name as a directory (S3 allows both `a`
            // and `a/...`): the directory wins, as Mountpoint shows it.
            let shadowed = l.kind == Kind::File
                && listed
                    .iter()
                    .any(|o| o.kind == Kind::Dir && o.name == l.name);
            if !shadowed {
                self.put(dir, l, false);
            }
        }
        for (name, ino) in keep {
            if let Some(d) = self.dirs.get_mut(&dir) {
                d.children.entry(name).or_insert(ino);
            }
        }
    }

    /// A file or directory this mount makes in `dir`.
    pub fn add_local(&mut self, dir: u64, name: &str, kind: Kind) -> u64 {
        let l = Listed {
            name: name.to_string(),
            kind,
            size: 0,
            etag: None,
            modified: None,
            mtime: Some(SystemTime::now()),
        };
        self.put(dir, &l, true)
    }

    /// Drops the inode `ino` (a file whose upload did not complete): its
    /// path gets a new inode if it is made again.
    pub fn forget(&mut self, ino: u64) {
        if let Some(n) = self.nodes.remove(&ino) {
            self.by_rel.remove(&n.rel);
        }
    }

    /// Takes `name` out of `dir` (an upload that did not complete).
    pub fn remove(&mut self, dir: u64, name: &str) {
        if let Some(d) = self.dirs.get_mut(&dir) {
            d.children.remove(name);
        }
    }
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> Listed {
        Listed {
            name: name.into(),
            kind: Kind::File,
            size,
            etag: Some(format!("\"{size}\"")),
            modified: None,
            mtime: None,
        }
    }

    fn dir(name: &str) -> Listed {
        Listed {
            name: name.into(),
            kind: Kind::Dir,
            size: 0,
            etag: None,
            modified: None,
            mtime: None,
        }
    }

    #[test]
    fn a_path_keeps_its_inode_across_listings() {
        let mut t = Tree::new();
        t.set_listing(ROOT, &[file("a", 1), dir("d")], Instant::now());
        let a = t.child(ROOT, "a").unwrap();
        let d = t.child(ROOT, "d").unwrap();
        t.set_listing(d, &[file("x", 5)], Instant::now());
        assert_eq!(t.get(t.child(d, "x").unwrap()).unwrap().rel, "d/x");
        t.set_listing(ROOT, &[file("a", 2)], Instant::now());
        assert_eq!(t.child(ROOT, "a"), Some(a));
        assert_eq!(t.get(a).unwrap().size, 2);
        assert_eq!(t.child(ROOT, "d"), None, "gone from the listing");
        t.set_listing(ROOT, &[file("a", 2), dir("d")], Instant::now());
        assert_eq!(t.child(ROOT, "d"), Some(d));
    }

    #[test]
    fn each_listing_has_its_number_on_what_it_showed() {
        let mut t = Tree::new();
        t.set_listing(ROOT, &[file("a", 1), file("b", 1)], Instant::now());
        let a = t.child(ROOT, "a").unwrap();
        let b = t.child(ROOT, "b").unwrap();
        assert_eq!(
            (t.get(a).unwrap().listing, t.get(b).unwrap().listing),
            (1, 1)
        );
        t.set_listing(ROOT, &[file("a", 1)], Instant::now());
        assert_eq!(t.get(a).unwrap().listing, 2);
        assert_eq!(t.get(b).unwrap().listing, 1, "not listed again");
    }

    #[test]
    fn neighbours_are_the_names_next_in_order() {
        let mut t = Tree::new();
        let l: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| file(n, 1))
            .collect();
        t.set_listing(ROOT, &l, Instant::now());
        let names = |v: Vec<(String, u64)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(names(t.neighbours(ROOT, "b", 2, true)), ["c", "d"]);
        assert_eq!(names(t.neighbours(ROOT, "d", 9, false)), ["c", "b", "a"]);
        assert_eq!(
            names(t.neighbours(ROOT, "e", 3, true)),
            Vec::<String>::new()
        );
        assert_eq!(names(t.neighbours(ROOT, "bb", 1, true)), ["c"]);
    }

    #[test]
    fn local_files_outlive_a_listing_and_a_directory_shadows_a_file() {
        let mut t = Tree::new();
        let w = t.add_local(ROOT, "new.bin", Kind::File);
        t.set_listing(
            ROOT,
            &[file("a", 1), file("s", 3), dir("s")],
            Instant::now(),
        );
        assert_eq!(t.child(ROOT, "new.bin"), Some(w));
        let s = t.child(ROOT, "s").unwrap();
        assert_eq!(t.get(s).unwrap().kind, Kind::Dir);
        t.remove(ROOT, "new.bin");
        assert_eq!(t.child(ROOT, "new.bin"), None);
        let names: Vec<_> = t.children(ROOT).into_iter().map(|c| c.0).collect();
        assert_eq!(names, ["a", "s"]);
    }
}
