//! The node engine's protocol (`ringfeed::node::proto`): the messages a
//! consumer or holder sends the engine, the records an engine writes into a
//! consumer's ring, and batch keys — all from processes the engine or the
//! consumer does not trust.
//!
//! Asserts: any bytes decode as a request, a reply or a key, or are refused
//! with an error (never a panic); what decodes encodes and decodes back to
//! the same value; a record decoded against a 4 KiB arena points only
//! inside it (every field's data and length), and a key's text parses only
//! with all four of its parts.

use ringfeed::node::proto::{self, Key, Reply, Request, record};

pub fn check(data: &[u8]) {
    if let Ok(req) = proto::decode::<Request>(data, "a request") {
        let back: Request = proto::decode(&proto::encode(&req), "again").expect("re-decodes");
        assert_eq!(back, req);
    }
    if let Ok(reply) = proto::decode::<Reply>(data, "a reply") {
        let back: Reply = proto::decode(&proto::encode(&reply), "again").expect("re-decodes");
        assert_eq!(back, reply);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(k) = Key::parse(text)
    {
        assert_eq!(Key::parse(&k.to_text()).expect("re-parses"), k);
    }
    let arena = [0u8; 4096];
    let base = arena.as_ptr();
    if let Ok(record::Record::Batch(d)) = record::decode(data, base, arena.len()) {
        for f in &d.fields {
            let at = f.data as usize - base as usize;
            assert!(
                f.len == 0 || (at <= arena.len() && f.len <= arena.len() - at),
                "a field of {} bytes at {at} outside the arena",
                f.len
            );
        }
        let total: usize = d.samples.iter().map(|s| s.field_count).sum();
        assert_eq!(total, d.fields.len());
    }
}
