//! Fuzz target `config`: see fuzz/props/config.rs for the property, and
//! fuzz/README.md for how to run it.
#![no_main]

#[allow(dead_code)]
#[path = "../props/config.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::check(data));
