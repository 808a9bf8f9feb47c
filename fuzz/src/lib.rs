//! The fuzz targets' shared code: the properties each asserts (`checks`),
//! also replayed over the committed corpora by `tests/fuzz_corpus.rs`.

pub mod checks;
