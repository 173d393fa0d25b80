//! Arbitrary messages, records and keys, encoded then decoded: what comes back must be what
//! went in (the other targets go the other way, from arbitrary bytes).
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};

#[derive(Debug, Arbitrary)]
struct Input {
    payload: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    enqueued_at_micros: u64,
    claim: (u8, u32, u64, u64, u64, String, String),
    record: (u32, u64, u8, u64, bool, String),
    key: (String, String, u32, u64),
}

libfuzzer_sys::fuzz_target!(|i: Input| {
    use rockq::fuzzing as f;
    f::message_round_trip(&i.payload, &i.headers, i.enqueued_at_micros);
    let (state, attempt, token, deadline, not_before, error, holder) = i.claim;
    f::claim_round_trip(state, attempt, token, deadline, not_before, &error, &holder);
    let (id, first_seq, policy, value, paused, dlq) = i.record;
    f::records_round_trip(id, first_seq, policy, value, paused, &dlq);
    let (group, queue, queue_id, seq) = i.key;
    f::keys_round_trip(&group, &queue, queue_id, seq);
});
