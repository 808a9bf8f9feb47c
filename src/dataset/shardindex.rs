//! WebDataset's shard index (`shardindex.json`, the format its `wids`
//! readers use and `widsindex create` writes): the shards with their
//! sample counts, so a dataset split among consumers needs no pass over
//! the data. Pure: text in, entries out; the resolver fetches the file and
//! looks for one beside the shards (`resolve.rs`).
//!
//! The format read: `{"wids_version": 1, "shardlist": [{"url": ...,
//! "nsamples": N, "filesize": B}, ...], "base": ...}`; a shard's `url` is
//! taken as it is when absolute, else joined to `base` when the index has
//! one, else to the index's own folder. `datasets` lists of further inline
//! shardlists are read too; a `source_url` reference to another index is
//! refused by name (one level is read, not a chain of fetches).

use serde::Deserialize;

/// The most entries an index may list: a bound on what a hostile file
/// makes the resolver allocate (ten times the largest public WebDataset
/// sets' shard counts).
const MAX_ENTRIES: usize = 10_000_000;

/// One shard of an index: its URL (resolved), sample count, and size in
/// bytes when the index gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub url: String,
    pub samples: u64,
    pub size: Option<u64>,
}

#[derive(Deserialize)]
struct Raw {
    wids_version: Option<serde_json::Value>,
    #[serde(default)]
    shardlist: Vec<RawShard>,
    base: Option<String>,
    #[serde(default)]
    datasets: Vec<RawDataset>,
}

#[derive(Deserialize)]
struct RawDataset {
    #[serde(default)]
    shardlist: Vec<RawShard>,
    base: Option<String>,
    source_url: Option<String>,
}

#[derive(Deserialize)]
struct RawShard {
    url: String,
    nsamples: u64,
    filesize: Option<u64>,
}

/// The entries of the index at `location` (its URL or path, which
/// relative shard URLs are joined to). Errors say what is wrong with the
/// text, without echoing it.
pub fn parse_shardindex(text: &str, location: &str) -> Result<Vec<IndexEntry>, String> {
    let raw: Raw = serde_json::from_str(text).map_err(|e| {
        format!(
            "not a shard index (`{{\"wids_version\": 1, \"shardlist\": [{{\"url\": ..., \
             \"nsamples\": ...}}]}}`): {e}"
        )
    })?;
    match raw.wids_version {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(v) => return Err(format!("`wids_version` is {v}; version 1 is read")),
        None => return Err("no `wids_version`: not a WebDataset shard index".into()),
    }
    let folder = folder_of(location);
    let mut out = Vec::new();
    let mut take = |list: Vec<RawShard>, base: Option<&str>| -> Result<(), String> {
        for s in list {
            if out.len() >= MAX_ENTRIES {
                return Err(format!("more than {MAX_ENTRIES} shards"));
            }
            if s.url.is_empty() {
                return Err("a shard with an empty `url`".into());
            }
            out.push(IndexEntry {
                url: join(base.unwrap_or(&folder), &s.url),
                samples: s.nsamples,
                size: s.filesize,
            });
        }
        Ok(())
    };
    take(raw.shardlist, raw.base.as_deref())?;
    for d in raw.datasets {
        if let Some(u) = d.source_url {
            return Err(format!(
                "a dataset refers to another index (`source_url`: {}): list its shards in this one",
                crate::redact::url(&u)
            ));
        }
        take(d.shardlist, d.base.as_deref().or(raw.base.as_deref()))?;
    }
    if out.is_empty() {
        return Err("the index lists no shards".into());
    }
    Ok(out)
}

/// The folder of a URL or path, without its last `/`-separated name.
pub(crate) fn folder_of(location: &str) -> String {
    match location.rfind('/') {
        Some(i) => location[..i].to_string(),
        None => String::new(),
    }
}

/// `name` against `base` as WebDataset merges them: an absolute URL or
/// path stays; a relative one is joined (`./` and `x/../` folded).
pub(crate) fn join(base: &str, name: &str) -> String {
    if name.contains("://") || name.starts_with('/') || base.is_empty() {
        return name.to_string();
    }
    let mut parts: Vec<&str> = base.trim_end_matches('/').split('/').collect();
    // Keep `scheme://host` (its empty part after `:`) intact.
    let fixed = if base.contains("://") { 3 } else { 0 };
    for p in name.split('/') {
        match p {
            "" | "." => {}
            ".." if parts.len() > fixed => {
                parts.pop();
            }
            ".." => {}
            p => parts.push(p),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_joined_to_the_index_folder_or_its_base() {
        let text = r#"{"__kind__": "wids-shard-index-v1", "wids_version": 1,
            "shardlist": [{"url": "a-0.tar", "nsamples": 10, "filesize": 100},
                          {"url": "sub/../b-1.tar", "nsamples": 3},
                          {"url": "https://h/x.tar", "nsamples": 1}]}"#;
        let e = parse_shardindex(text, "s3://bucket/data/shardindex.json").unwrap();
        let urls: Vec<&str> = e.iter().map(|e| e.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "s3://bucket/data/a-0.tar",
                "s3://bucket/data/b-1.tar",
                "https://h/x.tar"
            ]
        );
        assert_eq!((e[0].samples, e[0].size), (10, Some(100)));
        assert_eq!(e[1].size, None);
        let based = r#"{"wids_version": 1, "base": "http://h:8/d/",
            "shardlist": [{"url": "a.tar", "nsamples": 1}],
            "datasets": [{"shardlist": [{"url": "c.tar", "nsamples": 2}]}]}"#;
        let e = parse_shardindex(based, "/local/shardindex.json").unwrap();
        assert_eq!(e[0].url, "http://h:8/d/a.tar");
        assert_eq!(e[1].url, "http://h:8/d/c.tar");
        let local = r#"{"wids_version": 1, "shardlist": [{"url": "a.tar", "nsamples": 1}]}"#;
        assert_eq!(
            parse_shardindex(local, "/data/set/shardindex.json").unwrap()[0].url,
            "/data/set/a.tar"
        );
        // `..` never climbs above the host.
        assert_eq!(join("http://h/d", "../../x.tar"), "http://h/x.tar");
    }

    #[test]
    fn garbage_is_named_not_echoed() {
        for (text, want) in [
            ("", "not a shard index"),
            ("[1, 2]", "not a shard index"),
            ("{\"shardlist\": []}", "no `wids_version`"),
            (
                "{\"wids_version\": 2, \"shardlist\": []}",
                "version 1 is read",
            ),
            ("{\"wids_version\": 1}", "lists no shards"),
            (
                "{\"wids_version\": 1, \"shardlist\": [{\"url\": \"a\"}]}",
                "not a shard index",
            ),
            (
                "{\"wids_version\": 1, \"shardlist\": [{\"url\": \"a\", \"nsamples\": -1}]}",
                "not a shard index",
            ),
            (
                "{\"wids_version\": 1, \"shardlist\": [{\"url\": \"\", \"nsamples\": 1}]}",
                "empty `url`",
            ),
            (
                "{\"wids_version\": 1, \"datasets\": [{\"source_url\": \"https://u:secret@h/i.json\"}]}",
                "refers to another index",
            ),
        ] {
            let e = parse_shardindex(text, "x/shardindex.json").unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }
}
