//! Small fixed-layout records in the meta and offsets column families.
//!
//! Each starts with a version byte so a later release can change the layout and still read old
//! databases.

use crate::error::CorruptionError;

/// Bumped when the on-disk layout changes incompatibly.
pub(crate) const FORMAT_VERSION: u8 = 1;
const FORMAT_MAGIC: &[u8] = b"rockq";

pub(crate) fn encode_format() -> Vec<u8> {
    [FORMAT_MAGIC, &[FORMAT_VERSION]].concat()
}

/// Returns the format version, or `None` if the value is not a rockq marker at all.
pub(crate) fn decode_format(value: &[u8]) -> Option<u8> {
    match value.strip_prefix(FORMAT_MAGIC) {
        Some([v]) => Some(*v),
        _ => None,
    }
}

/// `queue:<name>` → the queue's numeric id, first live sequence and retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueRecord {
    pub id: u32,
    /// Sequences below this have been deleted by retention (or never existed).
    pub first_seq: u64,
    pub retention: crate::Retention,
}

const QUEUE_RECORD_V1: u8 = 1;
/// Version 2 adds the retention policy; version 1 records read as the default policy.
const QUEUE_RECORD_V2: u8 = 2;

impl QueueRecord {
    pub fn encode(&self) -> [u8; 22] {
        let mut v = [0u8; 22];
        v[0] = QUEUE_RECORD_V2;
        v[1..5].copy_from_slice(&self.id.to_be_bytes());
        v[5..13].copy_from_slice(&self.first_seq.to_be_bytes());
        let (kind, value) = match self.retention {
            crate::Retention::UntilAcked => (0u8, 0u64),
            crate::Retention::MaxAge(d) => (1, d.as_micros().min(u64::MAX as u128) as u64),
            crate::Retention::MaxLen(n) => (2, n),
            crate::Retention::Forever => (3, 0),
        };
        v[13] = kind;
        v[14..].copy_from_slice(&value.to_be_bytes());
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("queue", key, r);
        let u64_at = |i: usize| {
            let mut s = [0u8; 8];
            s.copy_from_slice(&v[i..i + 8]);
            u64::from_be_bytes(s)
        };
        let retention = match (v.first(), v.len()) {
            (Some(&QUEUE_RECORD_V1), 13) => crate::Retention::default(),
            (Some(&QUEUE_RECORD_V2), 22) => match v[13] {
                0 => crate::Retention::UntilAcked,
                1 => crate::Retention::MaxAge(std::time::Duration::from_micros(u64_at(14))),
                2 => crate::Retention::MaxLen(u64_at(14)),
                3 => crate::Retention::Forever,
                _ => return Err(bad("unknown retention policy")),
            },
            (Some(&QUEUE_RECORD_V1 | &QUEUE_RECORD_V2), _) => {
                return Err(bad("wrong length for its version"));
            }
            _ => return Err(bad("unknown version")),
        };
        let id = u32::from_be_bytes([v[1], v[2], v[3], v[4]]);
        let first_seq = u64_at(5);
        if id == 0 || id == u32::MAX || first_seq == 0 {
            return Err(bad("id or first sequence out of range"));
        }
        Ok(QueueRecord { id, first_seq, retention })
    }
}

/// `consumer:<group>:<queue>` → the last committed sequence (0: nothing committed) and the
/// group's mode. Version 1 is an ordered group, version 2 a work-queue (shared) group; the two
/// modes keep different state, so a name cannot silently switch between them.
const OFFSET_RECORD_ORDERED: u8 = 1;
const OFFSET_RECORD_SHARED: u8 = 2;

/// A decoded offset record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetRecord {
    pub committed: u64,
    pub shared: bool,
}

pub(crate) fn encode_offset(committed: u64) -> [u8; 9] {
    encode_offset_mode(committed, false)
}

pub(crate) fn encode_shared_offset(committed: u64) -> [u8; 9] {
    encode_offset_mode(committed, true)
}

fn encode_offset_mode(committed: u64, shared: bool) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[0] = if shared { OFFSET_RECORD_SHARED } else { OFFSET_RECORD_ORDERED };
    v[1..].copy_from_slice(&committed.to_be_bytes());
    v
}

pub(crate) fn decode_offset(key: &[u8], v: &[u8]) -> Result<OffsetRecord, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("offset", key, r);
    let v: &[u8; 9] = v.try_into().map_err(|_| bad("length is not 9"))?;
    let shared = match v[0] {
        OFFSET_RECORD_ORDERED => false,
        OFFSET_RECORD_SHARED => true,
        _ => return Err(bad("unknown version")),
    };
    let mut s = [0u8; 8];
    s.copy_from_slice(&v[1..]);
    Ok(OffsetRecord { committed: u64::from_be_bytes(s), shared })
}

/// `redrive:<dlq>` → the last dead-letter sequence moved out. Same layout as an ordered offset.
pub(crate) fn encode_cursor(last: u64) -> [u8; 9] {
    encode_offset_mode(last, false)
}

pub(crate) fn decode_cursor(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    match decode_offset(key, v)? {
        OffsetRecord { committed, shared: false } => Ok(committed),
        _ => Err(CorruptionError::new("redrive cursor", key, "unknown version")),
    }
}

/// Where a claimed message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimState {
    /// Held by a consumer until the lease deadline.
    Leased = 1,
    /// Failed; deliverable again at `not_before`.
    Waiting = 2,
    /// Acknowledged or dead-lettered, above a sequence still in flight (the offset cannot move
    /// past it yet). Deleted when the offset passes it.
    Done = 3,
}

/// `claim:<group>:<queue>:<seq>` in `rockq.claims`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimRecord {
    pub state: ClaimState,
    /// Attempts started, counting the current one. Persisted before a handler runs.
    pub attempt: u32,
    /// Fencing token of the holder of the current attempt.
    pub token: u64,
    /// Lease deadline, wall-clock microseconds since the Unix epoch.
    pub deadline_micros: u64,
    /// Earliest redelivery, wall-clock microseconds (Waiting only).
    pub not_before_micros: u64,
    pub last_error: String,
}

const CLAIM_RECORD_V1: u8 = 1;
const CLAIM_HEADER: usize = 1 + 1 + 4 + 8 + 8 + 8 + 4;
/// Longest last-error text kept in a claim record.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl ClaimRecord {
    pub fn encode(&self) -> Vec<u8> {
        let err = truncate_utf8(&self.last_error, MAX_ERROR_BYTES).as_bytes();
        let mut v = Vec::with_capacity(CLAIM_HEADER + err.len());
        v.push(CLAIM_RECORD_V1);
        v.push(self.state as u8);
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.token.to_be_bytes());
        v.extend_from_slice(&self.deadline_micros.to_be_bytes());
        v.extend_from_slice(&self.not_before_micros.to_be_bytes());
        v.extend_from_slice(&(err.len() as u32).to_be_bytes());
        v.extend_from_slice(err);
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("claim", key, r);
        if v.len() < CLAIM_HEADER {
            return Err(bad("shorter than the fixed header"));
        }
        if v[0] != CLAIM_RECORD_V1 {
            return Err(bad("unknown version"));
        }
        let state = match v[1] {
            1 => ClaimState::Leased,
            2 => ClaimState::Waiting,
            3 => ClaimState::Done,
            _ => return Err(bad("unknown state")),
        };
        let u32_at = |i: usize| u32::from_be_bytes([v[i], v[i + 1], v[i + 2], v[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let err_len = u32_at(30) as usize;
        if v.len() != CLAIM_HEADER + err_len {
            return Err(bad("error text length does not match"));
        }
        let last_error =
            std::str::from_utf8(&v[CLAIM_HEADER..]).map_err(|_| bad("error text is not UTF-8"))?.to_owned();
        Ok(ClaimRecord {
            state,
            attempt: u32_at(2),
            token: u64_at(6),
            deadline_micros: u64_at(14),
            not_before_micros: u64_at(22),
            last_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_bad_bytes() {
        for retention in [
            crate::Retention::UntilAcked,
            crate::Retention::MaxAge(std::time::Duration::from_secs(90)),
            crate::Retention::MaxLen(1000),
            crate::Retention::Forever,
        ] {
            let q = QueueRecord { id: 7, first_seq: 42, retention };
            assert_eq!(QueueRecord::decode(b"k", &q.encode()).unwrap(), q);
            for cut in 0..22 {
                assert!(QueueRecord::decode(b"k", &q.encode()[..cut]).is_err());
            }
        }
        let q = QueueRecord { id: 7, first_seq: 42, retention: crate::Retention::Forever };
        let mut zero_id = q.encode();
        zero_id[1..5].fill(0);
        assert!(QueueRecord::decode(b"k", &zero_id).is_err());
        let mut bad_kind = q.encode();
        bad_kind[13] = 9;
        assert!(QueueRecord::decode(b"k", &bad_kind).is_err());
        // A version-1 record (before retention) reads with the default policy.
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&7u32.to_be_bytes());
        v1.extend_from_slice(&42u64.to_be_bytes());
        let d = QueueRecord::decode(b"k", &v1).unwrap();
        assert_eq!((d.id, d.first_seq, d.retention), (7, 42, crate::Retention::UntilAcked));

        assert_eq!(
            decode_offset(b"k", &encode_offset(99)).unwrap(),
            OffsetRecord { committed: 99, shared: false }
        );
        assert_eq!(
            decode_offset(b"k", &encode_shared_offset(7)).unwrap(),
            OffsetRecord { committed: 7, shared: true }
        );
        assert!(decode_offset(b"k", &[9; 9]).is_err());
        assert_eq!(decode_cursor(b"k", &encode_cursor(5)).unwrap(), 5);
        assert!(decode_cursor(b"k", &encode_shared_offset(5)).is_err());
        assert!(decode_offset(b"k", &[]).is_err());

        assert_eq!(decode_format(&encode_format()), Some(FORMAT_VERSION));
        assert_eq!(decode_format(b"rockq"), None);
        assert_eq!(decode_format(b"other1"), None);
    }

    #[test]
    fn claim_records_round_trip_and_reject_bad_bytes() {
        let c = ClaimRecord {
            state: ClaimState::Waiting,
            attempt: 3,
            token: 0xdead_beef,
            deadline_micros: 11,
            not_before_micros: 22,
            last_error: "boom é".into(),
        };
        let v = c.encode();
        assert_eq!(ClaimRecord::decode(b"k", &v).unwrap(), c);
        for cut in 0..v.len() {
            assert!(ClaimRecord::decode(b"k", &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_state = v.clone();
        bad_state[1] = 9;
        assert!(ClaimRecord::decode(b"k", &bad_state).is_err());
        let mut bad_utf8 = v.clone();
        let n = bad_utf8.len();
        bad_utf8[n - 1] = 0xff;
        assert!(ClaimRecord::decode(b"k", &bad_utf8).is_err());
        let long = ClaimRecord { last_error: "é".repeat(MAX_ERROR_BYTES), ..c };
        let decoded = ClaimRecord::decode(b"k", &long.encode()).unwrap();
        assert!(decoded.last_error.len() <= MAX_ERROR_BYTES);
    }
}
