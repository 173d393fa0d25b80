//! Arbitrary bytes into rockq's records decoding: errors are fine, panics are bugs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rockq::fuzzing::records(data));
