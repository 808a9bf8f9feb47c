//! Cache entries (`ringfeed::cache::entry`): whatever a cache directory
//! holds is read back as outside bytes (a torn write, another version of
//! the format, a disk that flips bits).
//!
//! Asserts: opening the bytes as an entry never panics; an entry that opens
//! and whose data passes every block's checksum, stored again with the
//! identity, data and count it gave, is the same bytes (the format has one
//! way to write each entry, so nothing in a file that opens is left
//! unchecked); the header alone parses to what the opened entry says.

use ringfeed::cache::entry::{Entry, Identity, parse_header, store};

pub fn check(data: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("fuzzed.rfc");
    std::fs::write(&path, data).expect("write the input");
    let entry = match Entry::open(&path) {
        Ok(Ok(e)) => e,
        Ok(Err(_)) => return,
        Err(e) => panic!("reading a plain file failed: {e}"),
    };
    assert_eq!(parse_header(data).as_ref(), Ok(&entry.header));
    let Ok(bytes) = entry.read_all().expect("read the data") else {
        return;
    };
    let Some(id) = Identity::parse(&entry.header.identity) else {
        // An identity that is not five fields never matches a lookup.
        return;
    };
    if id.len != bytes.len() as u64 {
        // Never looked up: the lookup's identity carries the length.
        return;
    }
    let again = tempfile::tempdir().expect("a temporary directory");
    let stored = store(again.path(), &id, &bytes, entry.header.samples).expect("store");
    let written = std::fs::read(stored).expect("read back");
    assert!(
        written == data,
        "an entry that opens was not written as the format writes it"
    );
}
