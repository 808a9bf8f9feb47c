//! The API host's routes: the revision and tree APIs, `resolve/` and its
//! redirect to the content host, and what stands before them (a renamed
//! repository's 307, a 429 and its `Retry-After`, the access a token gives).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{Garbage, Reply, State, decode, query, refusal, repo, set, text, unix_now};

/// The 429 of a throttled request, and the hold it starts; a request
/// inside a running hold is `early`.
fn throttled(st: &State, counter: &AtomicU64) -> Option<Response<Reply>> {
    let mut hold = st.hold.lock().unwrap();
    let now = Instant::now();
    let running = hold.is_some_and(|until| now < until);
    if running {
        st.stats.early.fetch_add(1, Ordering::SeqCst);
    }
    let take = counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !running && !take {
        return None;
    }
    if !running {
        *hold = Some(now + Duration::from_secs(st.opts.retry_after));
    }
    st.stats.throttled.fetch_add(1, Ordering::SeqCst);
    let left = hold.map_or(0, |until| {
        until.saturating_duration_since(now).as_secs_f64().ceil() as u64
    });
    let mut r = refusal(
        StatusCode::TOO_MANY_REQUESTS,
        "RateLimited",
        "You have been rate-limited; retry later",
    );
    set(&mut r, "retry-after", &left.max(1).to_string());
    Some(r)
}

/// The refusal of a request with `auth` for `repo`, if it may not read it.
fn refused(st: &State, repo: &str, auth: Option<&str>) -> Option<Response<Reply>> {
    let good = st
        .opts
        .token
        .as_ref()
        .is_some_and(|t| auth == Some(format!("Bearer {t}").as_str()));
    let echo = |msg: &str| match (st.controls.echo_token.load(Ordering::SeqCst), auth) {
        (true, Some(a)) => format!("{msg} (got `{a}`)"),
        _ => msg.to_string(),
    };
    if st.opts.gated.iter().any(|g| g == repo) {
        return Some(if good {
            refusal(
                StatusCode::FORBIDDEN,
                "GatedRepo",
                &format!(
                    "Access to dataset {repo} is restricted and you are not in the authorized list."
                ),
            )
        } else {
            refusal(
                StatusCode::UNAUTHORIZED,
                "GatedRepo",
                &echo(&format!(
                    "Access to dataset {repo} is restricted. You must be authenticated to access it."
                )),
            )
        });
    }
    let exists = st.root.join(repo).is_dir();
    if exists && !st.opts.private.iter().any(|p| p == repo) {
        return None;
    }
    if exists && good {
        return None;
    }
    Some(match (auth.is_some() && !good, exists || !good) {
        (true, _) => refusal(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            &echo("Invalid credentials in Authorization header"),
        ),
        (false, true) => refusal(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            &echo("Repository not found"),
        ),
        (false, false) => refusal(
            StatusCode::NOT_FOUND,
            "RepoNotFound",
            "Repository not found",
        ),
    })
}

/// The API host's routes.
pub(super) fn api(
    st: &State,
    req: &Request<Incoming>,
    path: &str,
    auth: Option<&str>,
) -> Response<Reply> {
    let (api, rest) = match (
        path.strip_prefix("/api/datasets/"),
        path.strip_prefix("/datasets/"),
    ) {
        (Some(r), _) => (true, r),
        (None, Some(r)) => (false, r),
        _ => return text(StatusCode::NOT_FOUND, "not a route of this Hub\n"),
    };
    let mut parts = rest.splitn(4, '/');
    let (org, name, call, tail) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let repo = format!("{org}/{name}");
    if let Some((_, new)) = st.opts.renamed.iter().find(|(old, _)| *old == repo) {
        // Relative, as the Hub's: the same path under the new name.
        let moved = path.replacen(&repo, new, 1);
        let q = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let mut r = text(StatusCode::TEMPORARY_REDIRECT, "moved\n");
        set(&mut r, "location", &format!("{moved}{q}"));
        return r;
    }
    let throttle = if api {
        &st.controls.throttle_api
    } else {
        &st.controls.throttle_resolves
    };
    if let Some(r) = throttled(st, throttle) {
        return r;
    }
    if let Some(r) = refused(st, &repo, auth) {
        return r;
    }
    let garbage = *st.controls.garbage.lock().unwrap();
    let repo_dir = st.root.join(&repo);
    match (api, call) {
        (true, "revision") => {
            st.stats.revisions.fetch_add(1, Ordering::SeqCst);
            let rev = decode(tail);
            let Some(sha) = repo::resolve_revision(&repo, &rev) else {
                return refusal(
                    StatusCode::NOT_FOUND,
                    "RevisionNotFound",
                    &format!("Invalid rev id: {rev}"),
                );
            };
            let body = match garbage {
                Some(Garbage::NotJson) => "<html><body>Bad gateway</body></html>".to_string(),
                Some(Garbage::WrongShape) => "{\"sha\": 40}".to_string(),
                Some(Garbage::BadSha) => serde_json::json!({"id": repo, "sha": "main"}).to_string(),
                _ => serde_json::json!({"_id": "x", "id": repo, "sha": sha, "private": false})
                    .to_string(),
            };
            text(StatusCode::OK, body)
        }
        (true, "tree") => {
            st.stats.trees.fetch_add(1, Ordering::SeqCst);
            let (rev, dir) = tail.split_once('/').unwrap_or((tail, ""));
            let (rev, dir) = (decode(rev), decode(dir));
            if repo::resolve_revision(&repo, &rev).is_none() {
                return refusal(
                    StatusCode::NOT_FOUND,
                    "RevisionNotFound",
                    &format!("Invalid rev id: {rev}"),
                );
            }
            let q = query(req.uri().query().unwrap_or(""));
            let recursive = q
                .get("recursive")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let cursor: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
            let Some(items) = repo::list(&repo_dir, &dir, recursive) else {
                return refusal(
                    StatusCode::NOT_FOUND,
                    "EntryNotFound",
                    &format!("{dir} does not exist on \"{rev}\""),
                );
            };
            let link = |cursor: usize| {
                format!(
                    "<http://{}{path}?recursive={recursive}&cursor={cursor}>; rel=\"next\"",
                    st.api
                )
            };
            let (body, next) = match garbage {
                Some(Garbage::TreeNotJson) => ("<html>oops</html>".to_string(), None),
                Some(Garbage::TreeWrongShape) => ("{\"entries\": []}".to_string(), None),
                Some(Garbage::Huge) => {
                    let mut b = String::with_capacity(17 << 20);
                    b.push('[');
                    b.push_str(&" ".repeat(17 << 20));
                    b.push(']');
                    (b, None)
                }
                Some(Garbage::PageLoop) => {
                    let (b, _) = repo::page(&items, 0, st.opts.page);
                    (b, Some(0))
                }
                Some(Garbage::EmptyPages) => ("[]".to_string(), Some(cursor + 1)),
                Some(Garbage::OutsidePath) => {
                    let escape = format!("{dir}/../../../etc/passwd");
                    let v = serde_json::json!([{"type": "file", "oid": "0", "size": 1, "path": escape}]);
                    (v.to_string(), None)
                }
                _ => repo::page(&items, cursor, st.opts.page),
            };
            let mut r = text(StatusCode::OK, body);
            if let Some(n) = next {
                set(&mut r, "link", &link(n));
            }
            r
        }
        (false, "resolve") => {
            st.stats.resolves.fetch_add(1, Ordering::SeqCst);
            let (rev, file) = tail.split_once('/').unwrap_or((tail, ""));
            let (rev, file) = (decode(rev), decode(file));
            st.stats
                .resolved_revisions
                .lock()
                .unwrap()
                .push(rev.clone());
            let Some(sha) = repo::resolve_revision(&repo, &rev) else {
                return refusal(
                    StatusCode::NOT_FOUND,
                    "RevisionNotFound",
                    &format!("Invalid rev id: {rev}"),
                );
            };
            let Some((data, etag)) = st.file(&repo_dir.join(&file)) else {
                return refusal(StatusCode::NOT_FOUND, "EntryNotFound", "Entry not found");
            };
            let expires = unix_now() + st.opts.url_ttl.as_secs();
            let generation = st.generation.load(Ordering::SeqCst);
            let rel = format!("/{repo}/{file}");
            let sig = repo::signature(&st.key, &rel, expires, generation);
            let encoded: String = rel
                .split('/')
                .map(|s| {
                    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
                        .to_string()
                })
                .collect::<Vec<_>>()
                .join("/");
            let host = if st.opts.same_host {
                format!("http://{}/_content", st.api)
            } else {
                format!("http://{}", st.content)
            };
            let location = format!(
                "{host}{encoded}?Expires={expires}&Gen={generation}&Key-Pair-Id=EMULATOR&Signature={sig}"
            );
            let mut r = text(StatusCode::FOUND, "Found. Redirecting\n");
            set(&mut r, "location", &location);
            set(&mut r, "x-repo-commit", &sha);
            set(&mut r, "x-linked-etag", &etag);
            set(&mut r, "x-linked-size", &data.len().to_string());
            set(&mut r, "etag", &etag);
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not a route of this Hub\n"),
    }
}
