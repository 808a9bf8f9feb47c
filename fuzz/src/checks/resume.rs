//! Resume states (`ringfeed::plan::resume`): the bytes `State::decode`
//! reads and the hex text of the `resume` key.
//!
//! Asserts: a state decoded encodes to the same bytes, and its hex to the
//! same text (lower-cased); the hex of any bytes decodes as the bytes do;
//! errors are `Error::State`; a decoded state, given at open to a small
//! dataset, starts (or is refused with `Error::State`) without panicking,
//! and what it says was delivered is computed within bounds.

use ringfeed::Error;
use ringfeed::plan::resume::{State, start_from};
use ringfeed::plan::{PlanOptions, Remainder};

pub fn check(data: &[u8]) {
    let decoded = State::decode(data);
    let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        format!("{:?}", State::from_hex(&hex)),
        format!("{decoded:?}"),
        "hex and bytes decode apart"
    );
    match decoded {
        Ok(s) => {
            assert_eq!(s.encode(), data, "a decoded state encodes to other bytes");
            assert_eq!(s.to_hex(), hex);
            start(&s);
        }
        Err(e) => assert!(matches!(e, Error::State(_)), "{e:?}"),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        match State::from_hex(text) {
            Ok(s) => assert_eq!(s.to_hex(), text.to_ascii_lowercase()),
            Err(e) => assert!(matches!(e, Error::State(_)), "{e:?}"),
        }
    }
}

/// The state given to a loader of 4 small shards, on its own layout and on
/// one consumer of one stream (an elastic resume).
fn start(s: &State) {
    let counts = [5u64, 0, 3, 9];
    for (consumers, consumer, streams) in [(s.consumers, s.consumer, s.streams as usize), (1, 0, 1)]
    {
        let opts = PlanOptions {
            seed: 7,
            shuffle: true,
            shuffle_buffer: 4,
            shuffle_initial: 2,
            remainder: Remainder::Pad,
            batch_size: 2,
            consumers,
            consumer,
            streams,
            ..PlanOptions::default()
        };
        match start_from(std::slice::from_ref(s), s.fingerprint, &opts) {
            Ok(st) => match st.delivered(&opts, &counts) {
                Ok(_) | Err(Error::State(_)) => {}
                Err(e) => panic!("delivered: {e:?}"),
            },
            Err(Error::State(_)) => {}
            Err(e) => panic!("start_from: {e:?}"),
        }
    }
}
