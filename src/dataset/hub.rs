//! `hf://` URLs to shards: the resolver's part for Hugging Face Hub
//! datasets (the API calls are `crate::net::hub`'s).
//!
//! Each `(repository, revision)` is resolved once to its commit, which
//! every shard of it is read at (the `resolve/{commit}/` URL): a loader
//! reads one version of the dataset for its whole life, however the
//! branch moves. A URL names a file (found in its directory's listing,
//! which gives its size: no `HEAD`), a directory (its files at every
//! depth, in name order) or a key pattern (its literal directory listed
//! at every depth, every path matched: `crate::dataset::glob`); a brace
//! expansion of many files in one directory costs one listing, as each
//! listing is kept for the resolver's life.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::glob::{Glob, is_glob};
use super::{Shard, Source};
use crate::error::{Error, HubPlace, Result};
use crate::net::NetOptions;
use crate::net::hub::api::At;
use crate::net::hub::{HubClient, HubEntry, HubUrl, url};
use crate::net::retry::Jitter;
use crate::net::s3::Env;

/// A directory's listing: entries by path (so in name order).
type Listing = Arc<BTreeMap<String, HubEntry>>;

/// What the resolver keeps of the Hub between URLs.
#[derive(Default)]
pub(super) struct HubResolver {
    client: Option<HubClient>,
    /// `(repository, revision)` → commit.
    commits: HashMap<(String, String), String>,
    /// `(repository, commit, directory, recursive)` → its listing.
    listings: HashMap<(String, String, String, bool), Listing>,
}

impl HubResolver {
    /// The shards `one` (an `hf://` URL, braces expanded) names, in order;
    /// `keeps` says which listed files are shards (`.tar` ones, or every
    /// file for whole objects), `wanted` what they are called; `size`
    /// is a manifest's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn shards(
        &mut self,
        one: &str,
        size: Option<u64>,
        keeps: &dyn Fn(&str) -> bool,
        wanted: &str,
        env: &Env,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<Vec<Shard>> {
        let u = url::parse(one).map_err(|reason| Error::Url {
            url: one.to_string(),
            reason,
        })?;
        if self.client.is_none() {
            self.client = Some(HubClient::new(env, one)?);
        }
        let at = At {
            repo: &u.repo,
            revision: u.revision(),
            path: &u.path,
        };
        let sha = self.commit(&u, &at, net, jitter)?;
        let none = |reason: String| Error::Hub {
            at: Box::new(HubPlace {
                repo: u.repo.clone(),
                revision: u.revision().to_string(),
                path: u.path.clone(),
            }),
            status: 404,
            code: None,
            message: format!("{reason} at commit {sha}"),
        };
        let files: Vec<HubEntry> = if is_glob(&u.path) {
            let glob = Glob::parse(&u.path).map_err(|why| Error::Url {
                url: one.to_string(),
                reason: format!("bad path pattern: {why}"),
            })?;
            let dir = parent(glob.prefix());
            let listed = self.listing(&u, &at, &sha, dir, true, net, jitter)?;
            let matched: Vec<HubEntry> = listed
                .values()
                .filter(|e| !e.dir && glob.matches(&e.path))
                .cloned()
                .collect();
            let kept: Vec<HubEntry> = matched.iter().filter(|e| keeps(&e.path)).cloned().collect();
            if kept.is_empty() {
                let files = listed.values().filter(|e| !e.dir).count();
                return Err(none(match matched.len() {
                    0 => {
                        format!("no file matches the pattern ({files} files listed under `{dir}/`)")
                    }
                    n => format!("{n} file(s) match the pattern, but none is one of the {wanted}"),
                }));
            }
            kept
        } else if u.path.is_empty() {
            self.directory(&u, &at, &sha, "", keeps, net, jitter)?
                .ok_or_else(|| none(format!("the dataset holds no {wanted}")))?
        } else {
            let dir = parent(&u.path);
            let listed = self.listing(&u, &at, &sha, dir, false, net, jitter)?;
            match listed.get(&u.path) {
                Some(e) if !e.dir => vec![e.clone()],
                Some(_) => self
                    .directory(&u, &at, &sha, &u.path, keeps, net, jitter)?
                    .ok_or_else(|| none(format!("the directory holds no {wanted}")))?,
                None => return Err(none("no such file or directory".to_string())),
            }
        };
        let client = self.client.as_ref().expect("made above");
        let single = files.len() == 1;
        files
            .into_iter()
            .map(|e| {
                let name = u.name_of(&e.path);
                let obj = client.object(&u.repo, &sha, &e.path, &name)?;
                Ok(Shard {
                    name,
                    source: Source::Http(Arc::new(obj)),
                    // A manifest's size is for the one file it names.
                    size: Some(size.filter(|_| single).unwrap_or(e.size)),
                    samples: None,
                })
            })
            .collect()
    }

    /// The commit `u`'s revision names, asked once per resolver.
    fn commit(
        &mut self,
        u: &HubUrl,
        at: &At<'_>,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<String> {
        let key = (u.repo.clone(), u.revision().to_string());
        if let Some(sha) = self.commits.get(&key) {
            return Ok(sha.clone());
        }
        let client = self.client.as_ref().expect("made by the caller");
        let sha = client.commit(at, net, jitter)?;
        self.commits.insert(key, sha.clone());
        Ok(sha)
    }

    /// The files under `dir` at every depth that `keeps` takes, in name
    /// order; `None` when there are none.
    #[allow(clippy::too_many_arguments)]
    fn directory(
        &mut self,
        u: &HubUrl,
        at: &At<'_>,
        sha: &str,
        dir: &str,
        keeps: &dyn Fn(&str) -> bool,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<Option<Vec<HubEntry>>> {
        let listed = self.listing(u, at, sha, dir, true, net, jitter)?;
        let files: Vec<HubEntry> = listed
            .values()
            .filter(|e| !e.dir && keeps(&e.path))
            .cloned()
            .collect();
        Ok((!files.is_empty()).then_some(files))
    }

    /// `dir`'s listing at `sha`, asked once per resolver.
    #[allow(clippy::too_many_arguments)]
    fn listing(
        &mut self,
        u: &HubUrl,
        at: &At<'_>,
        sha: &str,
        dir: &str,
        recursive: bool,
        net: &NetOptions,
        jitter: &mut Jitter,
    ) -> Result<Listing> {
        let key = (u.repo.clone(), sha.to_string(), dir.to_string(), recursive);
        if let Some(l) = self.listings.get(&key) {
            return Ok(Arc::clone(l));
        }
        let client = self.client.as_ref().expect("made by the caller");
        let entries = client.tree(at, sha, dir, recursive, net, jitter)?;
        let listing: Listing = Arc::new(entries.into_iter().map(|e| (e.path.clone(), e)).collect());
        self.listings.insert(key, Arc::clone(&listing));
        Ok(listing)
    }
}

/// The directory of a path (empty at the root).
fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}
