#![no_main]
//! See `ringfeed_fuzz::checks::node` for what this target asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::checks::node::check(data));
