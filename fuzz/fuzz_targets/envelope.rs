//! Arbitrary bytes into rockq's envelope decoding: errors are fine, panics are bugs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rockq::fuzzing::envelope(data));
