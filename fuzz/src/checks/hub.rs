//! What the Hugging Face Hub and the redirects bring in from outside:
//! `hf://` URLs (`ringfeed::net::hub::url::parse`), a tree page's JSON
//! (`net::hub::api::page_entries`), a `Link` header (`api::next_link`) and
//! a redirect's `Location` (`net::redirect::Chain::follow`). The first
//! byte chooses which; the rest is the text.
//!
//! Asserts: an `hf://` URL accepted names a valid repository, and the
//! name of a file in it parses back to the same repository, revision and
//! path; a page accepted lists only clean paths under the directory asked
//! (directly, unless recursive); a next link is a part of its header; a
//! `Location` followed gives an http(s) URL without user information,
//! fragment, spaces or control characters, that the chain then counts as
//! a hop and refuses to ask again.

use ringfeed::net::hub::api::{next_link, page_entries};
use ringfeed::net::hub::url;
use ringfeed::net::redirect::Chain;

use super::Input;

pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let which = input.byte() % 4;
    let param = input.byte();
    let text = String::from_utf8_lossy(input.rest());
    match which {
        0 => hf_url(&text),
        1 => page(input_bytes(data), param),
        2 => link(&text),
        _ => location(&text, param),
    }
}

/// The bytes after the two parameter bytes.
fn input_bytes(data: &[u8]) -> &[u8] {
    data.get(2..).unwrap_or(&[])
}

fn hf_url(text: &str) {
    let Ok(u) = url::parse(text) else { return };
    let (org, name) = u.repo.split_once('/').expect("a repository is ORG/NAME");
    assert!(!org.is_empty() && !name.is_empty(), "{u:?}");
    assert!(!u.path.starts_with('/') && !u.path.ends_with('/'), "{u:?}");
    if u.path.is_empty() {
        return;
    }
    let again = url::parse(&u.name_of(&u.path)).expect("a name parses back");
    assert_eq!(
        (&again.repo, &again.revision, &again.path),
        (&u.repo, &u.revision, &u.path),
        "{text:?}"
    );
}

fn page(body: &[u8], param: u8) {
    let dirs = ["", "train", "a/b"];
    let dir = dirs[usize::from(param >> 1) % dirs.len()];
    let recursive = param & 1 != 0;
    let Ok(entries) = page_entries(body, dir, recursive) else {
        return;
    };
    for e in entries {
        let rel = if dir.is_empty() {
            e.path.as_str()
        } else {
            e.path
                .strip_prefix(dir)
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or_else(|| panic!("`{}` is not under `{dir}`", e.path))
        };
        assert!(!rel.is_empty(), "an entry that is its directory");
        for seg in rel.split('/') {
            assert!(!seg.is_empty() && seg != "." && seg != "..", "`{}`", e.path);
        }
        assert!(
            recursive || !rel.contains('/'),
            "`{}` deeper than asked",
            e.path
        );
        assert!(!e.path.chars().any(char::is_control), "{:?}", e.path);
        assert!(!e.dir || e.size == 0);
    }
}

fn link(text: &str) {
    if let Some(next) = next_link(text) {
        let at = next.as_ptr() as usize - text.as_ptr() as usize;
        assert!(
            at + next.len() <= text.len(),
            "the link is a part of its header"
        );
        assert!(!next.contains('>'), "{next:?}");
    }
}

fn location(text: &str, param: u8) {
    let froms = [
        "https://hub.example/datasets/o/n/resolve/0123/a.tar",
        "http://127.0.0.1:8080/x/y?sig=1",
        "https://[::1]:9/k",
    ];
    let from = froms[usize::from(param) % froms.len()];
    let mut chain = Chain::default();
    let Ok(hop) = chain.follow(from, 302, text) else {
        return;
    };
    let u = ::url::Url::parse(&hop.url).expect("a hop is a URL");
    assert!(matches!(u.scheme(), "http" | "https"), "{}", hop.url);
    assert!(
        !(from.starts_with("https:") && u.scheme() == "http"),
        "a downgrade"
    );
    assert!(
        u.username().is_empty() && u.password().is_none(),
        "{}",
        hop.url
    );
    assert!(u.fragment().is_none(), "{}", hop.url);
    assert!(
        !hop.url.bytes().any(|b| b <= b' ' || b == 0x7f),
        "{:?}",
        hop.url
    );
    chain.take(&hop);
    assert!(
        chain.follow(from, 302, &hop.url).is_err(),
        "asked twice: {}",
        hop.url
    );
}
