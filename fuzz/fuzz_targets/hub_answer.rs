#![no_main]
//! See `ringfeed_fuzz::checks::hub` for what this target asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::checks::hub::check(data));
