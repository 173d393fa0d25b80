//! Packed messages: one etcd key holding a run of an append's messages.
//!
//! etcd's cost is per key written (its index, its B-tree page, its share of the raft entry),
//! not per byte: 64 producers awaiting each send can only fill transactions of 64 messages,
//! about half of what a full transaction of 127 keys carries. An append packs its messages into
//! one value under the key of the run's **last** sequence (`N m/<qid><last>`), so the write
//! costs one key, whatever it carries.
//!
//! Keyed by the last sequence, the key that holds message `s` is the first key at or after
//! `m/<qid><s>` — a forward range read, as for single messages (etcd has no cheap "last key
//! before"). A run never spans more than [`MAX_SPAN`] sequences, so readers look no further.
//!
//! ```text
//! [0]      0xE5 (never an envelope's version byte: envelopes start with 1 or 2)
//! [1..3]   u16 BE count of messages (2..=MAX_SPAN; one message is stored as its envelope)
//! then per message: u32 BE length, envelope
//! ```
//!
//! A plain envelope is a run of one keyed by its own sequence: what every other writer (large
//! send calls, transactions, firings, dead-lettering, imports) and rockq before namespace
//! format 3 stored. Readers take both.

// Decoders read untrusted bytes: no indexing that could panic.
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use crate::error::CorruptionError;

/// The first byte of a packed run.
const TAG: u8 = 0xE5;
/// Sequences one run spans at most: how far past a sequence a reader looks for its key.
pub(crate) const MAX_SPAN: u64 = 128;
/// Envelope bytes one run holds at most: a reader bounded by bytes re-reads a run it stopped
/// inside, so runs stay small beside a read's budget. A message this large alone is stored
/// as its envelope.
pub(crate) const MAX_BYTES: usize = 64 << 10;

/// The namespace format whose appends pack their messages (format 2, rockq's before, stores
/// one key per message; both are read, and a namespace of format 2 is written as before).
pub(crate) const PACKED_FORMAT: u8 = 3;

/// The format record a namespace is created with (an import's too).
pub(crate) fn encode_format() -> Vec<u8> {
    let mut v = crate::store::records::encode_format();
    if let Some(last) = v.last_mut() {
        *last = PACKED_FORMAT;
    }
    v
}

/// Splits `envs` (consecutive sequences) into runs to store: `(start, end)` index ranges, each
/// at most [`MAX_SPAN`] messages and [`MAX_BYTES`] of envelopes, or a single envelope.
pub(crate) fn runs(envs: &[&[u8]]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, e) in envs.iter().enumerate() {
        let full = i - start >= MAX_SPAN as usize || (i > start && bytes + e.len() > MAX_BYTES);
        if full {
            out.push((start, i));
            start = i;
            bytes = 0;
        }
        bytes += e.len();
    }
    if start < envs.len() {
        out.push((start, envs.len()));
    }
    out
}

/// What an append of consecutive messages costs one transaction: its operations and value
/// bytes, tallied message by message in sequence order as [`runs`] and `push_packed` cut them
/// (a run of several messages is a put and the delete of leftovers beneath it, one message a
/// put; a prioritised message adds its index entry). Without packing (format 2), a put per
/// message.
///
/// Why: a round's sends to one queue are cut into transactions by this tally. Counting a
/// message per operation, as before packing, cut a packed append of 4,096 messages, which one
/// transaction holds (32 runs), into 33 transactions behind a reservation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    packs: bool,
    /// Operations so far.
    pub ops: usize,
    /// Value bytes so far (packed: as encoded).
    pub bytes: usize,
    /// Messages and envelope bytes in the current run (packed only).
    run: (usize, usize),
}

impl Tally {
    pub(crate) fn new(packs: bool) -> Self {
        Tally { packs, ..Tally::default() }
    }

    /// The tally of `envs` appended in order.
    pub(crate) fn of<'a>(packs: bool, envs: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut t = Tally::new(packs);
        envs.into_iter().for_each(|e| t.add(e));
        t
    }

    /// Adds the next message.
    pub(crate) fn add(&mut self, env: &[u8]) {
        if crate::store::envelope::priority(env) > 0 {
            self.ops += 1;
        }
        if !self.packs {
            self.ops += 1;
            self.bytes += env.len();
            return;
        }
        let (len, bytes) = self.run;
        // `runs`' condition, with `len` for `i - start`.
        if len == 0 || len >= MAX_SPAN as usize || bytes + env.len() > MAX_BYTES {
            self.ops += 1;
            self.bytes += env.len();
            self.run = (1, env.len());
            return;
        }
        if len == 1 {
            // A run of one was its envelope; of two, the delete beneath it and the packed
            // form's tag and count, and the first message's length.
            self.ops += 1;
            self.bytes += 3 + 4;
        }
        self.bytes += 4 + env.len();
        self.run = (len + 1, bytes + env.len());
    }
}

/// The stored value of a run: its envelope if it is one message, else the packed form.
pub(crate) fn encode(envs: &[&[u8]]) -> Vec<u8> {
    if let [one] = envs {
        return one.to_vec();
    }
    debug_assert!((2..=MAX_SPAN as usize).contains(&envs.len()));
    let mut out = Vec::with_capacity(3 + envs.iter().map(|e| 4 + e.len()).sum::<usize>());
    out.push(TAG);
    out.extend_from_slice(&(envs.len() as u16).to_be_bytes());
    for e in envs {
        out.extend_from_slice(&(e.len() as u32).to_be_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// The messages a stored value holds, `(seq, envelope)` in order, `last` being the sequence
/// its key names. `key` names the entry in errors.
pub(crate) fn decode<'a>(
    key: &[u8],
    last: u64,
    value: &'a [u8],
) -> Result<Vec<(u64, &'a [u8])>, CorruptionError> {
    let bad = |why: &str| CorruptionError::new("packed messages", key, why);
    let Some((&TAG, rest)) = value.split_first() else {
        return Ok(vec![(last, value)]);
    };
    let (count, mut rest) = rest.split_at_checked(2).ok_or_else(|| bad("shorter than its count"))?;
    let count = u64::from(u16::from_be_bytes(count.try_into().map_err(|_| bad("shorter than its count"))?));
    if !(2..=MAX_SPAN).contains(&count) || count - 1 > last {
        return Err(bad("count out of range"));
    }
    let first = last - (count - 1);
    let mut out = Vec::with_capacity(count as usize);
    for seq in first..=last {
        let (len, after) = rest.split_at_checked(4).ok_or_else(|| bad("a length cut short"))?;
        let len = u32::from_be_bytes(len.try_into().map_err(|_| bad("a length cut short"))?) as usize;
        let (env, after) = after.split_at_checked(len).ok_or_else(|| bad("an envelope cut short"))?;
        out.push((seq, env));
        rest = after;
    }
    if !rest.is_empty() {
        return Err(bad("bytes after its last envelope"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_round_trips_and_one_message_is_stored_as_its_envelope() {
        let envs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![2, 0, i, i]).collect();
        let refs: Vec<&[u8]> = envs.iter().map(Vec::as_slice).collect();
        let packed = encode(&refs);
        let got = decode(b"k", 14, &packed).unwrap();
        assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![10, 11, 12, 13, 14]);
        assert!(got.iter().zip(&refs).all(|((_, a), b)| a == b));
        assert_eq!(encode(&refs[..1]), envs[0]);
        assert_eq!(decode(b"k", 7, &envs[0]).unwrap(), vec![(7, &envs[0][..])]);
    }

    #[test]
    fn damaged_runs_are_corruption_not_panics() {
        let envs: Vec<&[u8]> = vec![b"\x02abc", b"\x02de"];
        let packed = encode(&envs);
        for cut in 1..packed.len() {
            assert!(decode(b"k", 9, &packed[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = packed.clone();
        longer.push(0);
        assert!(decode(b"k", 9, &longer).is_err());
        // A count that would start before sequence 0, or outside 2..=MAX_SPAN.
        assert!(decode(b"k", 0, &packed).is_err());
        assert!(decode(b"k", 500, &[TAG, 0, 1, 0, 0, 0, 0]).is_err());
        assert!(decode(b"k", 500, &[TAG, 0xff, 0xff]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn whatever_runs_hold_decodes_back(
            envs in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 1..=MAX_SPAN as usize),
            last in (MAX_SPAN..u64::MAX),
        ) {
            let refs: Vec<&[u8]> = envs.iter().map(Vec::as_slice).collect();
            let first = last - (envs.len() as u64 - 1);
            let stored = encode(&refs);
            // One message is stored as its envelope: read back as such only if it is not
            // taken for a run (an envelope starts with its version, never the run's tag).
            if envs.len() > 1 || envs[0].first() != Some(&TAG) {
                let got = decode(b"k", last, &stored).unwrap();
                proptest::prop_assert_eq!(got.len(), envs.len());
                for (i, (seq, env)) in got.into_iter().enumerate() {
                    proptest::prop_assert_eq!(seq, first + i as u64);
                    proptest::prop_assert_eq!(env, &envs[i][..]);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_after_the_tag_are_an_error_or_a_run_never_a_panic(
            rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            last in proptest::prelude::any::<u64>(),
        ) {
            let value: Vec<u8> = std::iter::once(TAG).chain(rest).collect();
            if let Ok(got) = decode(b"k", last, &value) {
                proptest::prop_assert!(got.len() >= 2 && got.last().map(|(s, _)| *s) == Some(last));
            }
        }
    }

    /// The tally of an append is what `push_packed` (or one put per message) really puts:
    /// the operations of the runs `runs` cuts, and their encoded bytes.
    fn tally_from_runs(packs: bool, envs: &[&[u8]]) -> (usize, usize) {
        let index = envs.iter().filter(|e| crate::store::envelope::priority(e) > 0).count();
        if !packs {
            return (envs.len() + index, envs.iter().map(|e| e.len()).sum());
        }
        let cut = runs(envs);
        let ops = cut.iter().map(|&(a, b)| if b - a > 1 { 2 } else { 1 }).sum::<usize>() + index;
        (ops, cut.iter().map(|&(a, b)| encode(&envs[a..b]).len()).sum())
    }

    #[test]
    fn a_tally_counts_runs_not_messages() {
        let small = [1u8; 100];
        let envs: Vec<&[u8]> = vec![&small; 4096];
        let t = Tally::of(true, envs.iter().copied());
        assert_eq!(t.ops, 64, "32 runs of 128: a put and a delete each");
        assert_eq!((t.ops, t.bytes), tally_from_runs(true, &envs));
        let plain = Tally::of(false, envs.iter().copied());
        assert_eq!((plain.ops, plain.bytes), (4096, 4096 * 100));
        assert_eq!(Tally::of(true, [&small[..]]).ops, 1, "one message: its envelope's put");
    }

    proptest::proptest! {
        #[test]
        fn a_tally_matches_what_the_runs_put(
            lens in proptest::collection::vec((0usize..3, proptest::prelude::any::<bool>()), 0..400),
            packs in proptest::prelude::any::<bool>(),
        ) {
            // Sizes around the run's byte bound and tiny ones; some prioritised (a v2 envelope
            // with the priority flag and a priority byte).
            let envs: Vec<Vec<u8>> = lens
                .iter()
                .map(|&(size, prioritised)| {
                    let len = [20, MAX_BYTES / 3, MAX_BYTES - 10][size];
                    prioritised_envelope(len, prioritised)
                })
                .collect();
            let refs: Vec<&[u8]> = envs.iter().map(Vec::as_slice).collect();
            let t = Tally::of(packs, refs.iter().copied());
            proptest::prop_assert_eq!((t.ops, t.bytes), tally_from_runs(packs, &refs));
        }
    }

    /// An envelope of about `len` bytes (its payload sized to it), with a priority or not.
    fn prioritised_envelope(len: usize, prioritised: bool) -> Vec<u8> {
        let mut m = crate::message::Message::new(vec![0u8; len.saturating_sub(32)]);
        if prioritised {
            m = m.priority(3);
        }
        crate::store::envelope::encode(&m, 1).unwrap()
    }

    #[test]
    fn runs_stop_at_the_span_and_at_the_byte_bound() {
        let small = [0u8; 10];
        let envs: Vec<&[u8]> = vec![&small; 300];
        assert_eq!(runs(&envs), vec![(0, 128), (128, 256), (256, 300)]);
        // Up to MAX_BYTES exactly; a message that would pass it starts the next run.
        let big = vec![0u8; MAX_BYTES - 20];
        let envs: Vec<&[u8]> = vec![&small, &big, &small, &big, &big];
        assert_eq!(runs(&envs), vec![(0, 3), (3, 4), (4, 5)]);
        assert!(runs(&[]).is_empty());
    }
}
