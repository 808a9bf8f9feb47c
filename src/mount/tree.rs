//! The mount's inodes: one per path, kept while the kernel holds it (its
//! lookups not yet forgotten) or a listing still shows it (a path listed
//! again gets its inode back, so the kernel's cached entries stay right),
//! and each directory's children as its last listing gave them, with the
//! time of that listing: a listing older than the time-to-live is taken
//! again on the next lookup or `readdir`. Files this mount is writing, and
//! directories made here, are kept across listings (the store shows them
//! only once a file in them is complete).
//!
//! What is remembered is bounded: a path gone from its directory's
//! listing is dropped once the kernel forgets it (`forget`), and when the
//! inodes have doubled since the last sweep, the children of listings
//! older than the time-to-live that the kernel does not hold are dropped
//! too (such a listing is taken again when next used).

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime};

/// The root directory's inode, as FUSE numbers it.
pub const ROOT: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeKind {
    Dir,
    File,
}

/// What a listing says of one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub kind: TreeKind,
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
    pub kind: TreeKind,
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
    /// The kernel's lookups of it not yet forgotten (FUSE's `nlookup`).
    pub lookups: u64,
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
    /// Inodes after the last sweep: the next comes at twice as many.
    swept_at: usize,
    /// How long a listing is trusted: one older is swept.
    pub ttl: std::time::Duration,
    /// Inodes dropped since [`Tree::take_dropped`] last took them (what
    /// the file system keeps by inode goes with them).
    dropped: Vec<u64>,
    pub started: SystemTime,
}

/// Inodes below which no sweep is made: a few MiB of names.
const SWEEP_FLOOR: usize = 1 << 16;

impl Tree {
    pub fn new() -> Tree {
        let started = SystemTime::now();
        let mut t = Tree {
            nodes: HashMap::new(),
            dirs: HashMap::new(),
            by_rel: HashMap::new(),
            next: ROOT + 1,
            listings: 0,
            swept_at: 0,
            ttl: std::time::Duration::from_secs(60),
            dropped: Vec::new(),
            started,
        };
        t.nodes.insert(
            ROOT,
            Node {
                parent: ROOT,
                rel: String::new(),
                kind: TreeKind::Dir,
                size: 0,
                etag: None,
                modified: None,
                listing: 0,
                mtime: started,
                local: false,
                lookups: 0,
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
        let lookups = self.nodes.get(&ino).map_or(0, |n| n.lookups);
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
            lookups,
        };
        self.nodes.insert(ino, node);
        if l.kind == TreeKind::Dir {
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
        let before = self.children(dir);
        let keep: Vec<(String, u64)> = before
            .iter()
            .filter(|(_, i)| self.nodes.get(i).is_some_and(|n| n.local))
            .cloned()
            .collect();
        if let Some(d) = self.dirs.get_mut(&dir) {
            d.children.clear();
            d.listed = Some(at);
        }
        self.listings += 1;
        for l in listed {
            // A file of the same name as a directory (S3 allows both `a`
            // and `a/...`): the directory wins, as Mountpoint shows it.
            let shadowed = l.kind == TreeKind::File
                && listed
                    .iter()
                    .any(|o| o.kind == TreeKind::Dir && o.name == l.name);
            if !shadowed {
                self.put(dir, l, false);
            }
        }
        for (name, ino) in keep {
            if let Some(d) = self.dirs.get_mut(&dir) {
                d.children.entry(name).or_insert(ino);
            }
        }
        // Gone from the listing and not held by the kernel: forgotten.
        for (name, ino) in before {
            if self.child(dir, &name) != Some(ino) {
                self.drop_unheld(ino);
            }
        }
        if self.nodes.len() >= SWEEP_FLOOR.max(2 * self.swept_at) {
            self.sweep(dir, at);
        }
    }

    /// The kernel looked `ino` up once more (an entry it was answered).
    pub fn looked_up(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups += 1;
        }
    }

    /// The kernel forgot `n` lookups of `ino`; true when that dropped it
    /// (no lookup left, and no listing shows it).
    pub fn forgot(&mut self, ino: u64, n: u64) -> bool {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return false;
        };
        node.lookups = node.lookups.saturating_sub(n);
        let (parent, rel) = (node.parent, node.rel.clone());
        let name = rel.rsplit('/').next().unwrap_or(&rel);
        if self.child(parent, name) == Some(ino) {
            return false;
        }
        self.drop_unheld(ino)
    }

    /// Drops `ino` and what is below it, but for what the kernel holds
    /// or this mount made (kept, found by its inode); true when `ino` went.
    fn drop_unheld(&mut self, ino: u64) -> bool {
        let Some(n) = self.nodes.get(&ino) else {
            return false;
        };
        if ino == ROOT || n.lookups > 0 || n.local {
            return false;
        }
        let rel = n.rel.clone();
        self.nodes.remove(&ino);
        self.dropped.push(ino);
        if self.by_rel.get(&rel) == Some(&ino) {
            self.by_rel.remove(&rel);
        }
        if let Some(d) = self.dirs.remove(&ino) {
            for c in d.children.into_values() {
                self.drop_unheld(c);
            }
        }
        true
    }

    /// Drops the children of every listing older than the ttl at `now` that
    /// the kernel does not hold (but `skip`'s, just listed); such a
    /// listing is taken again when next used.
    fn sweep(&mut self, skip: u64, now: Instant) {
        let stale: Vec<u64> = self
            .dirs
            .iter()
            .filter(|(d, dir)| {
                **d != skip
                    && dir
                        .listed
                        .is_some_and(|at| now.saturating_duration_since(at) >= self.ttl)
            })
            .map(|(d, _)| *d)
            .collect();
        for d in stale {
            let Some(dir) = self.dirs.get_mut(&d) else {
                continue;
            };
            dir.listed = None;
            let children: Vec<(String, u64)> =
                dir.children.iter().map(|(n, i)| (n.clone(), *i)).collect();
            for (name, c) in children {
                let held = self.nodes.get(&c).is_some_and(|n| n.lookups > 0 || n.local);
                if !held {
                    self.drop_unheld(c);
                    if let Some(dir) = self.dirs.get_mut(&d) {
                        dir.children.remove(&name);
                    }
                }
            }
        }
        self.swept_at = self.nodes.len();
    }

    /// The inodes dropped since the last call.
    pub fn take_dropped(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dropped)
    }

    /// Inodes remembered now.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether only the root is remembered.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// A file or directory this mount makes in `dir`.
    pub fn add_local(&mut self, dir: u64, name: &str, kind: TreeKind) -> u64 {
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
            kind: TreeKind::File,
            size,
            etag: Some(format!("\"{size}\"")),
            modified: None,
            mtime: None,
        }
    }

    fn dir(name: &str) -> Listed {
        Listed {
            name: name.into(),
            kind: TreeKind::Dir,
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
        // The kernel holds `d`: it keeps its inode while gone from a
        // listing (one it does not hold is dropped, tested below).
        t.looked_up(d);
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
    fn a_path_gone_from_its_listing_goes_once_the_kernel_forgets_it() {
        let mut t = Tree::new();
        t.set_listing(
            ROOT,
            &[file("a", 1), file("b", 1), dir("d")],
            Instant::now(),
        );
        let (a, b, d) = (
            t.child(ROOT, "a").unwrap(),
            t.child(ROOT, "b").unwrap(),
            t.child(ROOT, "d").unwrap(),
        );
        t.set_listing(d, &[file("x", 1)], Instant::now());
        let x = t.child(d, "x").unwrap();
        t.looked_up(a);
        t.looked_up(a);
        assert_eq!(t.len(), 5);
        // Still listed: a forget keeps it (a lookup finds the same inode).
        assert!(!t.forgot(b, 1));
        assert!(t.get(b).is_some());
        // Gone from the listing: `b` and `d` (and `x` below it), which the
        // kernel does not hold, at once; `a`, held, once forgotten twice.
        t.take_dropped();
        t.set_listing(ROOT, &[], Instant::now());
        assert!(t.get(b).is_none() && t.get(d).is_none() && t.get(x).is_none());
        assert_eq!(t.len(), 2);
        let mut dropped = t.take_dropped();
        dropped.sort();
        assert_eq!(dropped, [b, d, x]);
        assert!(!t.forgot(a, 1));
        assert!(t.get(a).is_some(), "one lookup left");
        assert!(t.forgot(a, 1));
        assert_eq!(t.len(), 1);
        // Listed again: new inodes, the root's listing fine.
        t.set_listing(ROOT, &[file("a", 1)], Instant::now());
        assert_ne!(t.child(ROOT, "a"), Some(a));
        // Files this mount writes are never dropped.
        let w = t.add_local(ROOT, "w", TreeKind::File);
        t.set_listing(ROOT, &[], Instant::now());
        assert!(!t.forgot(w, 0));
        assert_eq!(t.child(ROOT, "w"), Some(w));
    }

    #[test]
    fn listings_older_than_the_ttl_are_swept_when_the_inodes_double() {
        let mut t = Tree::new();
        t.ttl = std::time::Duration::from_secs(60);
        let long_ago = Instant::now() - std::time::Duration::from_secs(120);
        let dirs: Vec<Listed> = (0..4).map(|i| dir(&format!("d{i}"))).collect();
        t.set_listing(ROOT, &dirs, Instant::now());
        let per = SWEEP_FLOOR / 4;
        let files: Vec<Listed> = (0..per).map(|i| file(&format!("f{i}"), 1)).collect();
        let d: Vec<u64> = (0..4)
            .map(|i| t.child(ROOT, &format!("d{i}")).unwrap())
            .collect();
        // d0..d2 listed long ago; one of d0's files held by the kernel.
        for &x in &d[..3] {
            t.set_listing(x, &files, long_ago);
        }
        let held = t.child(d[0], "f7").unwrap();
        t.looked_up(held);
        assert_eq!(t.len(), 1 + 4 + 3 * per);
        // The listing that passes the floor sweeps the old ones.
        t.set_listing(d[3], &files, Instant::now());
        assert_eq!(t.len(), 1 + 4 + per + 1);
        assert_eq!(t.listed(d[0]), None, "listed again when next used");
        assert!(t.get(held).is_some());
        assert_eq!(t.child(d[0], "f7"), Some(held));
        assert_eq!(t.child(d[0], "f8"), None);
        assert_eq!(t.children(d[3]).len(), per);
    }

    #[test]
    fn each_listing_has_its_number_on_what_it_showed() {
        let mut t = Tree::new();
        t.set_listing(ROOT, &[file("a", 1), file("b", 1)], Instant::now());
        let a = t.child(ROOT, "a").unwrap();
        let b = t.child(ROOT, "b").unwrap();
        t.looked_up(b);
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
        let w = t.add_local(ROOT, "new.bin", TreeKind::File);
        t.set_listing(
            ROOT,
            &[file("a", 1), file("s", 3), dir("s")],
            Instant::now(),
        );
        assert_eq!(t.child(ROOT, "new.bin"), Some(w));
        let s = t.child(ROOT, "s").unwrap();
        assert_eq!(t.get(s).unwrap().kind, TreeKind::Dir);
        t.remove(ROOT, "new.bin");
        assert_eq!(t.child(ROOT, "new.bin"), None);
        let names: Vec<_> = t.children(ROOT).into_iter().map(|c| c.0).collect();
        assert_eq!(names, ["a", "s"]);
    }
}
