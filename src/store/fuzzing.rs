//! Entry points for the cargo-fuzz targets in `fuzz/` (compiled only under `cargo fuzz`,
//! re-exported as `rockq::fuzzing`).
//!
//! Each takes arbitrary bytes as a stored key or value. A decode error is fine; a panic, or a
//! value that decodes but does not survive re-encoding, is a bug. The round trips check the
//! other direction too: whatever decodes is a message or record the encoders can produce, so
//! `encode` then `decode` gives back everything the decoders accept.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::{envelope, keys, records};
use crate::model::{
    Claim, GroupMode, GroupOffset, GroupSettings, MAX_ERROR_BYTES, MAX_HOLDER_BYTES, QueueMeta, truncate_utf8,
};
use crate::retention::Retention;

/// A stored message envelope, through both decoders of the read path.
pub fn envelope(b: &[u8]) {
    let copied = envelope::decode(b"k", b);
    // The read path slices a batch's values out of one buffer: it must agree with the copy.
    let shared = envelope::decode_shared(b"k", &bytes::Bytes::copy_from_slice(b));
    let timestamp = envelope::enqueued_micros(b);
    let env = match (copied, shared) {
        (Ok(a), Ok(c)) => {
            assert_eq!(a, c, "shared and copying decoders disagree");
            a
        }
        (Err(_), Err(_)) => return,
        (a, c) => panic!("copying decoder gave {a:?}, shared one {c:?}"),
    };
    assert_eq!(timestamp, Some(env.enqueued_at_micros), "enqueued_micros disagrees with decode");
    let msg = env.clone().into_message();
    let enc = envelope::encode(&msg, env.enqueued_at_micros).expect("a decoded envelope re-encodes");
    assert_eq!(enc.len(), envelope::encoded_len(&msg));
    assert_eq!(envelope::decode(b"k", &enc).expect("a re-encoded envelope decodes"), env);
}

/// The records rockq reads at open and while claiming: each decoder on the same bytes.
pub fn records(b: &[u8]) {
    if let Ok(c) = records::ClaimRecord::decode(b"k", b) {
        // Encoding cuts the error text to its cap (an over-long one only comes from disk).
        let capped = truncate_utf8(&c.last_error, MAX_ERROR_BYTES).to_owned();
        let again = records::ClaimRecord::decode(b"k", &c.encode()).expect("a claim re-encodes");
        assert_eq!(again, records::ClaimRecord { last_error: capped, ..c });
    }
    if let Ok(c) = records::decode_claim(b"k", b) {
        let again = records::decode_claim(b"k", &records::encode_claim(&c)).expect("a claim re-encodes");
        let capped = match c {
            Claim::Waiting { attempt, token, not_before_micros, last_error } => Claim::Waiting {
                attempt,
                token,
                not_before_micros,
                last_error: truncate_utf8(&last_error, MAX_ERROR_BYTES).to_owned(),
            },
            other => other,
        };
        assert_eq!(again, capped);
    }
    if let Ok(q) = records::decode_queue(b"k", b) {
        let again =
            records::decode_queue(b"k", &records::encode_queue(&q)).expect("a queue record re-encodes");
        assert_eq!(again, q);
    }
    if let Ok(o) = records::decode_offset(b"k", b) {
        assert_eq!(records::encode_offset(&o).as_slice(), b, "an offset record has one encoding");
    }
    if let Ok(c) = records::decode_cursor(b"k", b) {
        assert_eq!(records::encode_cursor(c).as_slice(), b, "a redrive cursor has one encoding");
    }
    if let Ok(g) = records::decode_settings(b"k", b) {
        let enc = records::encode_settings(&g);
        // The current version has one encoding; an older one is rewritten in it.
        if b.first() == enc.first() {
            assert_eq!(enc, b, "group settings have one encoding");
        }
        assert_eq!(records::decode_settings(b"k", &enc).ok(), Some(g), "group settings re-encode");
    }
    if let Some(v) = records::decode_format(b) {
        // The marker is the magic then the version byte, whatever the version.
        let mut marker = records::encode_format();
        if let Some(last) = marker.last_mut() {
            *last = v;
        }
        assert_eq!(marker, b, "a format marker has one encoding");
    }
    if let Ok(d) = records::MarkRecord::decode(b"k", b) {
        assert_eq!(d.encode().as_slice(), b, "a mark record has one encoding");
    }
    if let Ok(m) = records::decode_mark(b"k", b) {
        let again = records::decode_mark(b"k", &records::encode_mark(&m)).expect("a mark re-encodes");
        assert_eq!(again, m);
    }
}

/// A message as a send stages it: validated, encoded into a shared arena behind other sends,
/// then stamped with its commit time. Decoding must give back exactly what was sent.
pub fn message_round_trip(payload: &[u8], headers: &[(String, Vec<u8>)], enqueued_at_micros: u64) {
    let mut msg = crate::message::Message::new(payload.to_vec());
    for (k, v) in headers {
        msg = msg.header(k.as_str(), v.clone());
    }
    if envelope::validate(&msg).is_err() {
        return;
    }
    let mut arena = vec![0xAB; 3];
    envelope::encode_into(&msg, 0, &mut arena);
    assert_eq!(arena.len(), 3 + envelope::encoded_len(&msg));
    envelope::stamp(&mut arena[3..], enqueued_at_micros);
    let env = envelope::decode(b"k", &arena[3..]).expect("an encoded message decodes");
    assert_eq!(env.enqueued_at_micros, enqueued_at_micros);
    assert_eq!(env.headers, msg.headers);
    assert_eq!(env.payload, msg.payload);
    assert_eq!(envelope::enqueued_micros(&arena[3..]), Some(enqueued_at_micros));
}

/// A claim record with arbitrary fields. Texts longer than their caps come back cut on a
/// character boundary.
pub fn claim_round_trip(
    state: u8,
    attempt: u32,
    token: u64,
    deadline: u64,
    not_before: u64,
    error: &str,
    holder: &str,
) {
    let state = match state % 3 {
        0 => records::ClaimState::Leased,
        1 => records::ClaimState::Waiting,
        _ => records::ClaimState::Done,
    };
    let c = records::ClaimRecord {
        state,
        attempt,
        token,
        deadline_micros: deadline,
        not_before_micros: not_before,
        last_error: error.to_owned(),
        holder: holder.into(),
    };
    let back = records::ClaimRecord::decode(b"k", &c.encode()).expect("an encoded claim decodes");
    let expected = records::ClaimRecord {
        last_error: truncate_utf8(error, MAX_ERROR_BYTES).to_owned(),
        holder: truncate_utf8(holder, MAX_HOLDER_BYTES).into(),
        ..c
    };
    assert_eq!(back, expected);
}

/// Queue records, group settings and offsets with arbitrary fields. Queue ids 0 and
/// `u32::MAX` and first sequence 0 are never written, and must not decode.
pub fn records_round_trip(id: u32, first_seq: u64, policy: u8, value: u64, paused: bool, dlq: &str) {
    let retention = match policy % 4 {
        0 => Retention::UntilAcked,
        1 => Retention::MaxAge(std::time::Duration::from_micros(value)),
        2 => Retention::MaxLen(value),
        _ => Retention::Forever,
    };
    let q = QueueMeta { id, first_seq, retention, dedup_window: std::time::Duration::from_micros(value) };
    let back = records::decode_queue(b"k", &records::encode_queue(&q));
    if id == 0 || id == u32::MAX || first_seq == 0 {
        assert!(back.is_err(), "an out-of-range queue record decoded: {back:?}");
    } else {
        assert_eq!(back.expect("an encoded queue record decodes"), q);
    }
    let g = GroupSettings { paused, dead_letter_queue: dlq.to_owned(), work: None };
    let back =
        records::decode_settings(b"k", &records::encode_settings(&g)).expect("encoded group settings decode");
    let dlq = truncate_utf8(dlq, 255);
    assert_eq!(back, GroupSettings { paused, dead_letter_queue: dlq.to_owned(), work: None });
    for mode in [GroupMode::Ordered, GroupMode::WorkQueue] {
        let o = GroupOffset { mode, committed: value };
        assert_eq!(records::decode_offset(b"k", &records::encode_offset(&o)).ok(), Some(o));
    }
    assert_eq!(records::decode_cursor(b"k", &records::encode_cursor(value)).ok(), Some(value));
}

/// Keys built from arbitrary names. Names rockq accepts (non-empty, no `:`) parse back;
/// others must not parse at all (as some other pair).
pub fn keys_round_trip(group: &str, queue: &str, queue_id: u32, seq: u64) {
    assert_eq!(keys::decode_message_key(&keys::message_key(queue_id, seq)).ok(), Some((queue_id, seq)));
    assert_eq!(keys::queue_name_from_key(&keys::queue_key(queue)).ok(), Some(queue));
    let valid = |n: &str| !n.is_empty() && !n.contains(':');
    let claim = keys::claim_key(&keys::claim_prefix(group, queue), seq);
    let (offset, settings) = (keys::offset_key(group, queue), keys::group_key(group, queue));
    if valid(group) && valid(queue) {
        assert_eq!(keys::parse_offset_key(&offset).ok(), Some((group, queue)));
        assert_eq!(keys::parse_group_key(&settings).ok(), Some((group, queue)));
        assert_eq!(keys::parse_claim_key(&claim).ok(), Some((group, queue, seq)));
    } else {
        assert!(keys::parse_offset_key(&offset).is_err());
        assert!(keys::parse_group_key(&settings).is_err());
        assert!(keys::parse_claim_key(&claim).is_err());
    }
}

/// Keys of every column family: whatever parses must be the key its builder makes.
pub fn keys(b: &[u8]) {
    if let Ok((q, s)) = keys::decode_message_key(b) {
        assert_eq!(keys::message_key(q, s).as_slice(), b);
    }
    if let Ok((g, q)) = keys::parse_offset_key(b) {
        assert_eq!(keys::offset_key(g, q), b);
    }
    if let Ok((g, q)) = keys::parse_group_key(b) {
        assert_eq!(keys::group_key(g, q), b);
    }
    if let Ok((g, q, s)) = keys::parse_claim_key(b) {
        assert_eq!(keys::claim_key(&keys::claim_prefix(g, q), s), b);
    }
    if let Ok(name) = keys::queue_name_from_key(b) {
        assert_eq!(keys::queue_key(name), b);
    }
    if let Ok((g, q, s)) = keys::parse_ordered_key(b) {
        assert_eq!(keys::claim_key(&keys::ordered_prefix(g, q), s), b);
    }
}
