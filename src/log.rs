//! The library's log: one process-wide sink that the embedding program sets
//! (the C ABI's `ringfeed_set_log_callback`; Python's `logging` through it),
//! and the messages the engine gives it — each fallback (io_uring refused,
//! huge pages missing, memory not locked, a cache that stopped writing)
//! once, at the level it deserves, and network retries (the first of each
//! kind at `Warn`, the rest at `Debug`). Without a sink nothing is
//! formatted. Every message passes `crate::redact::text` on its way out.

use crate::sync::{Locked, ReadWriteLocked};
use std::collections::HashSet;
use std::sync::{Mutex, RwLock};

/// How much a message matters; the numbers are the C ABI's
/// `RINGFEED_LOG_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn from_i32(n: i32) -> Option<Level> {
        Some(match n {
            1 => Level::Error,
            2 => Level::Warn,
            3 => Level::Info,
            4 => Level::Debug,
            _ => return None,
        })
    }
}

/// Where messages go: called from any thread, at once from several.
pub type Sink = Box<dyn Fn(Level, &str) + Send + Sync>;

struct Logger {
    sink: Sink,
    max: Level,
}

static LOGGER: RwLock<Option<Logger>> = RwLock::new(None);
/// The keys of the messages given once, so far.
static ONCE: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Sets the sink and the most detailed level it gets; `None` stops logging.
pub fn set(sink: Option<Sink>, max: Level) {
    let mut l = LOGGER.write_locked();
    *l = sink.map(|sink| Logger { sink, max });
}

/// Whether a message at `level` would go anywhere.
pub fn enabled(level: Level) -> bool {
    LOGGER
        .read_locked()
        .as_ref()
        .is_some_and(|l| level <= l.max)
}

/// Gives the message `msg()` makes at `level`, when someone listens.
pub fn log(level: Level, msg: impl FnOnce() -> String) {
    let l = LOGGER.read_locked();
    if let Some(l) = l.as_ref().filter(|l| level <= l.max) {
        // The last guard: whatever a message was built from, no credential
        // of a presigned URL leaves through it.
        (l.sink)(level, &crate::redact::text(&msg()));
    }
}

/// As [`log`], the first time `key` is given in this process only (a
/// fallback says itself once, not once per loader or per shard). True when
/// the message went out now.
pub fn once(key: &str, level: Level, msg: impl FnOnce() -> String) -> bool {
    if !enabled(level) {
        return false;
    }
    let first = ONCE
        .locked()
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string());
    if first {
        log(level, msg);
    }
    first
}

/// The level of a setup note (`Stats::notes`): a lost path that costs
/// speed or safety is a warning (io_uring refused, memory not locked or
/// not registered, a cache that stopped writing, direct reads refused);
/// the rest (no CUDA, no reserved huge pages, placement) is information.
pub fn note_level(note: &str) -> Level {
    let warn = [
        "io_uring",
        "mlock",
        "not locked",
        "fixed buffers",
        "cache ",
        "direct_io",
        "read buffered",
    ];
    if warn.iter().any(|w| note.contains(w)) {
        Level::Warn
    } else {
        Level::Info
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// One test: the sink is process-wide.
    #[test]
    fn messages_reach_the_sink_at_their_level_and_once_when_asked() {
        let got: Arc<Mutex<Vec<(Level, String)>>> = Arc::default();
        let g = Arc::clone(&got);
        // Other tests of this binary log at once (a mount's leftovers, a
        // retry): the sink keeps what this test's thread gives.
        let me = std::thread::current().id();
        set(
            Some(Box::new(move |l, m| {
                if std::thread::current().id() == me {
                    g.locked().push((l, m.into()))
                }
            })),
            Level::Info,
        );
        log(Level::Warn, || "w".into());
        log(Level::Debug, || {
            panic!("a message above the level is not made")
        });
        assert!(once("k", Level::Info, || "first".into()));
        assert!(!once("k", Level::Info, || "second".into()));
        assert_eq!(
            *got.lock().unwrap(),
            vec![(Level::Warn, "w".into()), (Level::Info, "first".into())]
        );
        set(None, Level::Debug);
        log(Level::Error, || panic!("no sink, no message"));
        assert_eq!(
            note_level("io_uring unavailable (EPERM): thread backend"),
            Level::Warn
        );
        assert_eq!(
            note_level("MAP_HUGETLB failed: no huge pages reserved"),
            Level::Info
        );
        assert_eq!(Level::from_i32(5), None);
    }
}
