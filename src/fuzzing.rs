//! The parsers of outside bytes, named for the fuzz targets (`fuzz/`) and
//! the test that replays their corpora (`tests/fuzz_corpus.rs`); not an
//! API. Most of them are public already; this module adds the few that are
//! private to their folder, so the fuzzers reach exactly what the engine
//! runs, and nothing else is opened up (see docs/decisions.md, "Fuzzing").

pub use crate::dataset::glob::{Glob, is_glob};
pub use crate::dataset::parse::{MAX_EXPANSION, expand_braces, expansion_count, parse_manifest};
pub use crate::tar::count::count_samples;
pub use crate::tar::sample::split_name;
pub use crate::tar::walk::{MemberSink, TarWalk, WalkCounts};
