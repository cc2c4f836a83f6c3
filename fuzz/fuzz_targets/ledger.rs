//! Fuzz target `ledger`: see fuzz/props/ledger.rs for the property, and
//! fuzz/README.md for how to run it.
#![no_main]

#[allow(dead_code)]
#[path = "../props/ledger.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::check(data));
