//! Fuzz target `duration`: see fuzz/props/duration.rs for the property, and
//! fuzz/README.md for how to run it.
#![no_main]

#[allow(dead_code)]
#[path = "../props/duration.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::check(data));
