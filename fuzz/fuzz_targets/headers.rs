//! Fuzz target `headers`: see fuzz/props/headers.rs for the property, and
//! fuzz/README.md for how to run it.
#![no_main]

#[allow(dead_code)]
#[path = "../props/headers.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|input: props::Input| props::check_input(input));
