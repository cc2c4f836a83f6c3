//! Fuzz target `frame`: see fuzz/props/frame.rs for the property, and
//! fuzz/README.md for how to run it.
#![no_main]

#[allow(dead_code)]
#[path = "../props/frame.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::check(data));
