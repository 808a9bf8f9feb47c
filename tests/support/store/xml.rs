//! S3's XML, as much of it as the emulator answers: the error body and
//! ListObjectsV2's result (with `prefix`, `delimiter`, `max-keys`,
//! `start-after` and continuation tokens). Pure functions over a listing
//! the caller made; the continuation token is the last key or common prefix
//! of the page, opaque to clients.

use quick_xml::escape::escape;

use super::model::iso8601;

/// `<Error>` with its code and message, as S3 sends with a 4xx or 5xx.
pub fn error(code: &str, message: &str, resource: &str, request_id: u64) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message>\
         <Resource>{}</Resource><RequestId>{request_id:016X}</RequestId></Error>",
        escape(code),
        escape(message),
        escape(resource)
    )
}

/// One object of a bucket, its key relative to the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub size: u64,
    pub mtime_s: i64,
    pub etag: String,
}

/// What a ListObjectsV2 request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub max_keys: usize,
    /// The continuation token, else `start-after`: keys after it.
    pub after: Option<String>,
    /// Echoed back as S3 does.
    pub continuation_token: Option<String>,
    pub start_after: Option<String>,
    /// A ListObjects (V1) request (no `list-type=2`): a truncated page
    /// also names its `NextMarker` (the last key or common prefix), which
    /// V1 clients page by when a delimiter is given.
    pub v1: bool,
}

/// S3's largest page (and default `max-keys`).
pub const MAX_KEYS: usize = 1000;

/// The page of `entries` (sorted by key) that `q` asks for, as the XML of
/// a ListBucketResult.
pub fn list_objects_v2(bucket: &str, entries: &[Entry], q: &ListQuery) -> String {
    let max = q.max_keys.min(MAX_KEYS);
    let mut contents: Vec<&Entry> = Vec::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut last: Option<String> = None;
    let mut truncated = false;
    for e in entries.iter().filter(|e| e.key.starts_with(&q.prefix)) {
        if let Some(after) = &q.after {
            // A token that is a common prefix skips every key under it.
            let under = q
                .delimiter
                .as_ref()
                .is_some_and(|d| after.ends_with(d.as_str()))
                && e.key.starts_with(after.as_str());
            if e.key.as_str() <= after.as_str() || under {
                continue;
            }
        }
        let common = q
            .delimiter
            .as_ref()
            .filter(|d| !d.is_empty())
            .and_then(|d| {
                let rest = &e.key[q.prefix.len()..];
                rest.find(d.as_str())
                    .map(|i| format!("{}{}", q.prefix, &rest[..i + d.len()]))
            });
        if common.as_ref().is_some_and(|c| prefixes.last() == Some(c)) {
            continue;
        }
        if contents.len() + prefixes.len() == max {
            truncated = true;
            break;
        }
        match common {
            Some(c) => {
                last = Some(c.clone());
                prefixes.push(c);
            }
            None => {
                last = Some(e.key.clone());
                contents.push(e);
            }
        }
    }
    let mut x = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
    );
    x += &format!(
        "<Name>{}</Name><Prefix>{}</Prefix>",
        escape(bucket),
        escape(&q.prefix)
    );
    if let Some(d) = &q.delimiter {
        x += &format!("<Delimiter>{}</Delimiter>", escape(d));
    }
    if let Some(t) = &q.continuation_token {
        x += &format!("<ContinuationToken>{}</ContinuationToken>", escape(t));
    }
    if let Some(s) = &q.start_after {
        x += &format!("<StartAfter>{}</StartAfter>", escape(s));
    }
    x += &format!(
        "<KeyCount>{}</KeyCount><MaxKeys>{max}</MaxKeys><IsTruncated>{truncated}</IsTruncated>",
        contents.len() + prefixes.len()
    );
    if truncated {
        if let Some(l) = &last {
            x += &format!(
                "<NextContinuationToken>{}</NextContinuationToken>",
                escape(l)
            );
            if q.v1 {
                x += &format!("<NextMarker>{}</NextMarker>", escape(l));
            }
        }
    }
    for e in contents {
        x += &format!(
            "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag>\
             <Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
            escape(&e.key),
            iso8601(e.mtime_s),
            escape(&e.etag),
            e.size
        );
    }
    for p in prefixes {
        x += &format!(
            "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
            escape(&p)
        );
    }
    x += "</ListBucketResult>";
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(keys: &[&str]) -> Vec<Entry> {
        keys.iter()
            .map(|k| Entry {
                key: k.to_string(),
                size: 1,
                mtime_s: 0,
                etag: "\"e\"".into(),
            })
            .collect()
    }

    fn keys_of(x: &str) -> Vec<String> {
        x.split("<Key>")
            .skip(1)
            .map(|s| s.split("</Key>").next().unwrap().to_string())
            .collect()
    }

    fn tag<'a>(x: &'a str, t: &str) -> Option<&'a str> {
        let open = format!("<{t}>");
        let s = x.split_once(open.as_str())?.1;
        Some(s.split_once(&format!("</{t}>"))?.0)
    }

    #[test]
    fn pages_follow_the_continuation_token_to_the_end() {
        let es = entries(&["a/1", "a/2", "a/3", "b/1"]);
        let mut q = ListQuery {
            prefix: "a/".into(),
            max_keys: 2,
            ..ListQuery::default()
        };
        let p1 = list_objects_v2("bk", &es, &q);
        assert_eq!(keys_of(&p1), ["a/1", "a/2"]);
        assert_eq!(tag(&p1, "IsTruncated"), Some("true"));
        let token = tag(&p1, "NextContinuationToken").unwrap().to_string();
        q.after = Some(token.clone());
        q.continuation_token = Some(token);
        let p2 = list_objects_v2("bk", &es, &q);
        assert_eq!(keys_of(&p2), ["a/3"]);
        assert_eq!(tag(&p2, "IsTruncated"), Some("false"));
        assert_eq!(tag(&p2, "NextContinuationToken"), None);
        assert_eq!(tag(&p2, "KeyCount"), Some("1"));
    }

    #[test]
    fn a_delimiter_folds_deeper_keys_into_common_prefixes() {
        let es = entries(&["a/x/1", "a/x/2", "a/y", "b"]);
        let q = ListQuery {
            delimiter: Some("/".into()),
            max_keys: 1000,
            ..ListQuery::default()
        };
        let x = list_objects_v2("bk", &es, &q);
        assert_eq!(keys_of(&x), ["b"]);
        assert!(
            x.contains("<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>"),
            "{x}"
        );
        // Resuming after the common prefix skips what is under it.
        let q = ListQuery {
            after: Some("a/".into()),
            ..q
        };
        assert_eq!(keys_of(&list_objects_v2("bk", &es, &q)), ["b"]);
    }

    #[test]
    fn names_are_escaped() {
        let es = entries(&["a&b<c"]);
        let q = ListQuery {
            max_keys: 10,
            ..ListQuery::default()
        };
        let x = list_objects_v2("bk", &es, &q);
        assert!(x.contains("<Key>a&amp;b&lt;c</Key>"), "{x}");
        let e = error("SlowDown", "Please reduce your request rate.", "/b/k&", 1);
        assert!(
            e.contains("<Code>SlowDown</Code>") && e.contains("/b/k&amp;"),
            "{e}"
        );
    }
}
