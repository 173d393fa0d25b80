//! Property tests of every decoder that reads bytes from disk: arbitrary bytes give an error or
//! a value, never a panic, and what we encode decodes back. The same decoders are the cargo-fuzz
//! targets in `fuzz/`.

use proptest::prelude::*;

use super::{envelope, keys, records};

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decoders_never_panic(b in bytes()) {
        let _ = envelope::decode(b"k", &b);
        let _ = envelope::enqueued_micros(&b);
        let _ = records::decode_claim(b"k", &b);
        let _ = records::decode_queue(b"k", &b);
        let _ = records::decode_mark(b"k", &b);
        let _ = records::decode_settings(b"k", &b);
        let _ = records::decode_offset(b"k", &b);
        let _ = records::decode_cursor(b"k", &b);
        let _ = records::decode_format(&b);
        let _ = keys::decode_message_key(&b);
        let _ = keys::parse_offset_key(&b);
        let _ = keys::parse_claim_key(&b);
        let _ = keys::queue_name_from_key(&b);
        let _ = super::outcomes::decode_outcome(b"k", &b);
        let _ = super::outcomes::decode_progress(b"k", &b);
        let _ = keys::parse_outcome_key(&b);
        let _ = keys::parse_progress_key(&b);
    }

    #[test]
    fn corrupting_an_envelope_never_panics(payload in bytes(), flip in any::<(usize, u8)>()) {
        let msg = crate::message::Message::new(payload).header("h", "v");
        let mut enc = envelope::encode(&msg, 42).unwrap();
        let i = flip.0 % enc.len();
        enc[i] ^= flip.1 | 1;
        let _ = envelope::decode(b"k", &enc);
        for cut in 0..enc.len() {
            let _ = envelope::decode(b"k", &enc[..cut]);
        }
    }

    /// The read path decodes a batch's values as slices of one shared buffer: it must agree
    /// with the copying decoder on every input, corrupt ones included.
    #[test]
    fn the_shared_decoder_agrees_with_the_copying_one(b in bytes(), lead in 0usize..8) {
        let mut buf = vec![0xAB; lead];
        buf.extend_from_slice(&b);
        let shared = bytes::Bytes::from(buf).slice(lead..);
        match (envelope::decode(b"k", &b), envelope::decode_shared(b"k", &shared)) {
            (Ok(a), Ok(c)) => prop_assert_eq!(a, c),
            (Err(_), Err(_)) => {}
            (a, c) => prop_assert!(false, "copying {:?} but shared {:?}", a, c),
        }
        // And on valid envelopes with headers, sliced out of a larger buffer.
        let msg = crate::message::Message::new(b.clone()).header("h", b.clone()).header("", "");
        let enc = envelope::encode(&msg, 42).unwrap();
        let mut buf = vec![0xAB; lead];
        buf.extend_from_slice(&enc);
        let shared = bytes::Bytes::from(buf).slice(lead..);
        let decoded = envelope::decode_shared(b"k", &shared).unwrap();
        prop_assert_eq!(&decoded, &envelope::decode(b"k", &enc).unwrap());
        prop_assert_eq!(decoded.headers, msg.headers);
        prop_assert_eq!(decoded.payload, msg.payload);
    }

    #[test]
    fn claim_keys_round_trip(seq in any::<u64>(), g in "[A-Za-z0-9._-]{1,20}", q in "[A-Za-z0-9._-]{1,20}") {
        let k = keys::claim_key(&keys::claim_prefix(&g, &q), seq);
        prop_assert_eq!(keys::parse_claim_key(&k).unwrap(), (g.as_str(), q.as_str(), seq));
    }
}
