//! Arbitrary bytes into rockq's keys decoding: errors are fine, panics are bugs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rockq::fuzzing::keys(data));
