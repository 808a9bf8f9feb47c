#![no_main]
//! See `ringfeed_fuzz::checks::image` for what this target asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::checks::image::check(data));
