#![no_main]
//! See `ringfeed_fuzz::checks::cache` for what this target asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::checks::cache::check(data));
