//! The codecs of job outcome records (`outcome:<group>:<queue>:<seq u64 BE>` in the claims
//! column family, written by a group that keeps outcomes in the write that finishes the job)
//! and of progress reports (`progress:<group>:<queue>:<seq u64 BE>`, a running job's last).
//!
//! Layout (version 1): `version u8, kind u8 (1 acked, 2 deleted, 3 dead-lettered), finished at
//! µs since the epoch u64, attempt u32, result flag u8 (0 none, 1 present), [result length u32,
//! result bytes]`, then for a dead letter `dead-letter seq u64, dead-letter queue length u8, its
//! UTF-8, reason length u32, its UTF-8`. Every integer is big-endian.

// Decoders read untrusted bytes: no indexing that could panic (decode_props.rs checks it).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::error::CorruptionError;
use crate::model::truncate_utf8;
use crate::stats::{JobOutcome, OutcomeKind};

const OUTCOME_V1: u8 = 1;
const ACKED: u8 = 1;
const DELETED: u8 = 2;
const DEAD_LETTERED: u8 = 3;

/// A dead letter's reason is kept up to this many bytes (the dead letter itself has it whole).
pub(crate) const MAX_OUTCOME_REASON: usize = 4096;

/// Microseconds since the epoch of `t` (0 before it).
pub(crate) fn micros_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64)
}

pub(crate) fn encode_outcome(o: &JobOutcome) -> Vec<u8> {
    let result_len = o.result.as_ref().map_or(0, |r| 4 + r.len());
    let mut v = Vec::with_capacity(1 + 1 + 8 + 4 + 1 + result_len + 64);
    v.push(OUTCOME_V1);
    v.push(match o.kind {
        OutcomeKind::Acked => ACKED,
        OutcomeKind::Deleted => DELETED,
        OutcomeKind::DeadLettered { .. } => DEAD_LETTERED,
    });
    v.extend_from_slice(&micros_of(o.finished_at).to_be_bytes());
    v.extend_from_slice(&o.attempt.to_be_bytes());
    match &o.result {
        None => v.push(0),
        Some(r) => {
            v.push(1);
            // Results are checked against `MAX_RESULT_BYTES` (far below 4 GiB) when set.
            v.extend_from_slice(&(r.len() as u32).to_be_bytes());
            v.extend_from_slice(r);
        }
    }
    if let OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } = &o.kind {
        let dlq = truncate_utf8(dead_letter_queue, 255).as_bytes();
        let reason = truncate_utf8(reason, MAX_OUTCOME_REASON).as_bytes();
        v.extend_from_slice(&dead_letter_seq.to_be_bytes());
        v.push(dlq.len() as u8);
        v.extend_from_slice(dlq);
        v.extend_from_slice(&(reason.len() as u32).to_be_bytes());
        v.extend_from_slice(reason);
    }
    v
}

/// Reads a record byte by byte, never past its end.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_be_bytes)
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_be_bytes)
    }
    pub(super) fn text(&mut self, len: usize) -> Option<String> {
        std::str::from_utf8(self.take(len)?).ok().map(str::to_owned)
    }
}

pub(crate) fn decode_outcome(key: &[u8], v: &[u8]) -> Result<JobOutcome, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("job outcome", key, r);
    let mut r = Reader(v);
    if r.u8() != Some(OUTCOME_V1) {
        return Err(bad("unknown version"));
    }
    let kind = r.u8().ok_or_else(|| bad("no kind"))?;
    let micros = r.u64().ok_or_else(|| bad("no finish time"))?;
    let attempt = r.u32().ok_or_else(|| bad("no attempt"))?;
    let result = match r.u8() {
        Some(0) => None,
        Some(1) => {
            let len = r.u32().ok_or_else(|| bad("no result length"))? as usize;
            Some(Bytes::copy_from_slice(r.take(len).ok_or_else(|| bad("result cut short"))?))
        }
        _ => return Err(bad("result flag is not 0 or 1")),
    };
    let kind = match kind {
        ACKED => OutcomeKind::Acked,
        DELETED => OutcomeKind::Deleted,
        DEAD_LETTERED => {
            let dead_letter_seq = r.u64().ok_or_else(|| bad("no dead-letter sequence"))?;
            let len = usize::from(r.u8().ok_or_else(|| bad("no dead-letter queue"))?);
            let dead_letter_queue =
                r.text(len).ok_or_else(|| bad("dead-letter queue cut short or not UTF-8"))?;
            let len = r.u32().ok_or_else(|| bad("no reason length"))? as usize;
            let reason = r.text(len).ok_or_else(|| bad("reason cut short or not UTF-8"))?;
            OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq }
        }
        _ => return Err(bad("unknown kind")),
    };
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    let finished_at = UNIX_EPOCH + Duration::from_micros(micros);
    Ok(JobOutcome { kind, finished_at, attempt, result })
}

/// `progress:<group>:<queue>:<seq>`: `version u8 (1)`, then the report's bytes.
const PROGRESS_V1: u8 = 1;

pub(crate) fn encode_progress(value: &[u8]) -> Vec<u8> {
    [&[PROGRESS_V1][..], value].concat()
}

pub(crate) fn decode_progress(key: &[u8], v: &[u8]) -> Result<Bytes, CorruptionError> {
    match v.split_first() {
        Some((&PROGRESS_V1, value)) => Ok(Bytes::copy_from_slice(value)),
        _ => Err(CorruptionError::new("progress report", key, "unknown version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<JobOutcome> {
        let at = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        vec![
            JobOutcome { kind: OutcomeKind::Acked, finished_at: at, attempt: 1, result: None },
            JobOutcome {
                kind: OutcomeKind::Acked,
                finished_at: at,
                attempt: 2,
                result: Some(Bytes::from("42")),
            },
            JobOutcome { kind: OutcomeKind::Acked, finished_at: at, attempt: 2, result: Some(Bytes::new()) },
            JobOutcome { kind: OutcomeKind::Deleted, finished_at: at, attempt: 0, result: None },
            JobOutcome {
                kind: OutcomeKind::DeadLettered {
                    reason: "bounced: é".into(),
                    dead_letter_queue: "mail.dlq".into(),
                    dead_letter_seq: 7,
                },
                finished_at: at,
                attempt: 5,
                result: None,
            },
        ]
    }

    #[test]
    fn outcomes_round_trip_and_every_cut_is_corrupt() {
        for o in samples() {
            let v = encode_outcome(&o);
            assert_eq!(decode_outcome(b"k", &v).unwrap(), o);
            for cut in 0..v.len() {
                assert!(decode_outcome(b"k", &v[..cut]).is_err(), "{o:?} cut at {cut}");
            }
            let longer = [&v[..], &[0]].concat();
            assert!(decode_outcome(b"k", &longer).is_err(), "trailing byte");
            for (at, byte) in [(0, 9), (1, 9), (14, 2)] {
                let mut bad = v.clone();
                bad[at] = byte;
                assert!(decode_outcome(b"k", &bad).is_err(), "byte {at} = {byte}");
            }
        }
    }

    #[test]
    fn progress_reports_round_trip_and_an_unknown_version_is_corrupt() {
        for v in [&b""[..], b"40%", &[0, 255, 1]] {
            assert_eq!(decode_progress(b"k", &encode_progress(v)).unwrap(), v);
        }
        assert_eq!(encode_progress(b"x"), [1, b'x']);
        assert!(decode_progress(b"k", &[]).is_err());
        assert!(decode_progress(b"k", &[2, b'x']).is_err());
    }

    /// The version-1 layout, byte for byte: a change here is a format change.
    #[test]
    fn outcome_layout_is_pinned() {
        let o = JobOutcome {
            kind: OutcomeKind::DeadLettered {
                reason: "r".into(),
                dead_letter_queue: "d".into(),
                dead_letter_seq: 3,
            },
            finished_at: UNIX_EPOCH + Duration::from_micros(5),
            attempt: 2,
            result: Some(Bytes::from("x")),
        };
        let mut want = vec![1, 3];
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(&[1, 0, 0, 0, 1, b'x']);
        want.extend_from_slice(&3u64.to_be_bytes());
        want.extend_from_slice(&[1, b'd', 0, 0, 0, 1, b'r']);
        assert_eq!(encode_outcome(&o), want);
    }
}
