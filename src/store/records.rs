//! Small fixed-layout records in the meta and offsets column families.
//!
//! Each starts with a version byte so a later release can change the layout and still read old
//! databases.

// Decoders read untrusted bytes: no indexing that could panic (the fuzz targets check it too).
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

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
        let u64_at = |i: usize| be_u64(v, i).ok_or_else(|| bad("truncated"));
        let retention = match (v.first(), v.len()) {
            (Some(&QUEUE_RECORD_V1), 13) => crate::Retention::default(),
            (Some(&QUEUE_RECORD_V2), 22) => match v.get(13) {
                Some(0) => crate::Retention::UntilAcked,
                Some(1) => crate::Retention::MaxAge(std::time::Duration::from_micros(u64_at(14)?)),
                Some(2) => crate::Retention::MaxLen(u64_at(14)?),
                Some(3) => crate::Retention::Forever,
                _ => return Err(bad("unknown retention policy")),
            },
            (Some(&QUEUE_RECORD_V1 | &QUEUE_RECORD_V2), _) => {
                return Err(bad("wrong length for its version"));
            }
            _ => return Err(bad("unknown version")),
        };
        let id = be_u32(v, 1).ok_or_else(|| bad("truncated"))?;
        let first_seq = u64_at(5)?;
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
    /// Who holds the current attempt (the subscription's consumer name; empty for records
    /// written before version 2 or when nobody holds it).
    /// Shared with the subscription's configuration: claiming does not allocate a copy.
    pub holder: std::sync::Arc<str>,
}

const CLAIM_RECORD_V1: u8 = 1;
/// Version 2 appends the holder: `<len u8><utf-8>`.
const CLAIM_RECORD_V2: u8 = 2;
/// Longest holder name kept in a claim record.
pub(crate) const MAX_HOLDER_BYTES: usize = 255;
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
        let holder = truncate_utf8(&self.holder, MAX_HOLDER_BYTES).as_bytes();
        let mut v = Vec::with_capacity(CLAIM_HEADER + err.len() + 1 + holder.len());
        v.push(CLAIM_RECORD_V2);
        v.push(self.state as u8);
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.token.to_be_bytes());
        v.extend_from_slice(&self.deadline_micros.to_be_bytes());
        v.extend_from_slice(&self.not_before_micros.to_be_bytes());
        v.extend_from_slice(&(err.len() as u32).to_be_bytes());
        v.extend_from_slice(err);
        v.push(holder.len() as u8);
        v.extend_from_slice(holder);
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("claim", key, r);
        if v.len() < CLAIM_HEADER {
            return Err(bad("shorter than the fixed header"));
        }
        let version = v.first().copied();
        if version != Some(CLAIM_RECORD_V1) && version != Some(CLAIM_RECORD_V2) {
            return Err(bad("unknown version"));
        }
        let state = match v.get(1) {
            Some(1) => ClaimState::Leased,
            Some(2) => ClaimState::Waiting,
            Some(3) => ClaimState::Done,
            _ => return Err(bad("unknown state")),
        };
        let u32_at = |i: usize| be_u32(v, i).ok_or_else(|| bad("truncated"));
        let u64_at = |i: usize| be_u64(v, i).ok_or_else(|| bad("truncated"));
        let err_len = u32_at(30)? as usize;
        let err_end = CLAIM_HEADER.checked_add(err_len).filter(|&e| e <= v.len());
        let Some(err_end) = err_end else { return Err(bad("error text length does not match")) };
        let holder = if version == Some(CLAIM_RECORD_V1) {
            if v.len() != err_end {
                return Err(bad("error text length does not match"));
            }
            std::sync::Arc::from("")
        } else {
            let Some(&len) = v.get(err_end) else { return Err(bad("holder length missing")) };
            if v.len() != err_end + 1 + len as usize {
                return Err(bad("holder length does not match"));
            }
            let holder = v.get(err_end + 1..).unwrap_or_default();
            std::str::from_utf8(holder).map_err(|_| bad("holder is not UTF-8"))?.into()
        };
        let last_error = v.get(CLAIM_HEADER..err_end).ok_or_else(|| bad("truncated"))?;
        let last_error =
            std::str::from_utf8(last_error).map_err(|_| bad("error text is not UTF-8"))?.to_owned();
        Ok(ClaimRecord {
            state,
            attempt: u32_at(2)?,
            token: u64_at(6)?,
            deadline_micros: u64_at(14)?,
            not_before_micros: u64_at(22)?,
            last_error,
            holder,
        })
    }
}

/// `ordered:<group>:<queue>:<seq>` in the claims CF: what an ordered group knows about one
/// message above its offset. Written only when a delivery comes back without an ack, or when
/// the message is dead-lettered; deleted once the offset passes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeliveryRecord {
    /// Deliveries that came back without an ack (nacked or dropped).
    pub deliveries: u32,
    /// Not to be delivered again before this wall-clock time (µs; 0: at once).
    pub not_before_micros: u64,
    /// Moved to the dead-letter queue: done for this group, never delivered again.
    pub dead_lettered: bool,
}

const DELIVERY_RECORD_V1: u8 = 1;
const DELIVERY_RECORD_LEN: usize = 14;

impl DeliveryRecord {
    pub fn encode(&self) -> [u8; DELIVERY_RECORD_LEN] {
        let mut v = [0u8; DELIVERY_RECORD_LEN];
        v[0] = DELIVERY_RECORD_V1;
        v[1] = if self.dead_lettered { 2 } else { 1 };
        v[2..6].copy_from_slice(&self.deliveries.to_be_bytes());
        v[6..].copy_from_slice(&self.not_before_micros.to_be_bytes());
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("delivery", key, r);
        let v: &[u8; DELIVERY_RECORD_LEN] = v.try_into().map_err(|_| bad("wrong length"))?;
        if v[0] != DELIVERY_RECORD_V1 {
            return Err(bad("unknown version"));
        }
        let dead_lettered = match v[1] {
            1 => false,
            2 => true,
            _ => return Err(bad("unknown state")),
        };
        let mut nb = [0u8; 8];
        nb.copy_from_slice(&v[6..]);
        Ok(DeliveryRecord {
            deliveries: u32::from_be_bytes([v[2], v[3], v[4], v[5]]),
            not_before_micros: u64::from_be_bytes(nb),
            dead_lettered,
        })
    }
}

/// `group:<group>:<queue>` in the meta CF: settings of a group that outlive its handles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GroupSettings {
    /// A paused group hands out nothing until resumed.
    pub paused: bool,
    /// The dead-letter queue a work-queue group last subscribed with (empty: not recorded).
    pub dead_letter_queue: String,
}

const GROUP_SETTINGS_V1: u8 = 1;

impl GroupSettings {
    pub fn encode(&self) -> Vec<u8> {
        let dlq = truncate_utf8(&self.dead_letter_queue, 255).as_bytes();
        let mut v = Vec::with_capacity(3 + dlq.len());
        v.push(GROUP_SETTINGS_V1);
        v.push(u8::from(self.paused));
        v.push(dlq.len() as u8);
        v.extend_from_slice(dlq);
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("group settings", key, r);
        let [version, paused, len, rest @ ..] = v else { return Err(bad("shorter than the header")) };
        if *version != GROUP_SETTINGS_V1 {
            return Err(bad("unknown version"));
        }
        let paused = match paused {
            0 => false,
            1 => true,
            _ => return Err(bad("paused flag is not 0 or 1")),
        };
        if rest.len() != *len as usize {
            return Err(bad("dead-letter queue length does not match"));
        }
        let dlq = std::str::from_utf8(rest).map_err(|_| bad("dead-letter queue is not UTF-8"))?;
        Ok(GroupSettings { paused, dead_letter_queue: dlq.to_owned() })
    }
}

/// The big-endian `u32` at `i`, if the record is long enough (decoders never index: a short
/// record is a corruption, not a panic).
fn be_u32(v: &[u8], i: usize) -> Option<u32> {
    v.get(i..i.checked_add(4)?)?.try_into().ok().map(u32::from_be_bytes)
}

/// The big-endian `u64` at `i`, if the record is long enough.
fn be_u64(v: &[u8], i: usize) -> Option<u64> {
    v.get(i..i.checked_add(8)?)?.try_into().ok().map(u64::from_be_bytes)
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
            holder: "worker-1".into(),
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
        let long = ClaimRecord {
            last_error: "é".repeat(MAX_ERROR_BYTES),
            holder: "h".repeat(300).into(),
            ..c.clone()
        };
        let decoded = ClaimRecord::decode(b"k", &long.encode()).unwrap();
        assert!(decoded.last_error.len() <= MAX_ERROR_BYTES);
        assert_eq!(decoded.holder.len(), MAX_HOLDER_BYTES);
        // A version-1 record (before holders) still reads, with no holder.
        let mut v1 = c.encode();
        v1.truncate(v1.len() - 1 - c.holder.len());
        v1[0] = 1;
        assert_eq!(ClaimRecord::decode(b"k", &v1).unwrap(), ClaimRecord { holder: "".into(), ..c });
    }

    #[test]
    fn delivery_records_round_trip_and_reject_bad_bytes() {
        for r in [
            DeliveryRecord { deliveries: 3, not_before_micros: 0, dead_lettered: false },
            DeliveryRecord { deliveries: u32::MAX, not_before_micros: u64::MAX, dead_lettered: true },
        ] {
            let v = r.encode();
            assert_eq!(DeliveryRecord::decode(b"k", &v).unwrap(), r);
            for cut in 0..v.len() {
                assert!(DeliveryRecord::decode(b"k", &v[..cut]).is_err());
            }
            let mut bad = v;
            bad[1] = 9;
            assert!(DeliveryRecord::decode(b"k", &bad).is_err());
            let mut bad = v;
            bad[0] = 9;
            assert!(DeliveryRecord::decode(b"k", &bad).is_err());
        }
    }

    #[test]
    fn group_settings_round_trip_and_reject_bad_bytes() {
        let s = GroupSettings { paused: true, dead_letter_queue: "orders.dlq".into() };
        let v = s.encode();
        assert_eq!(GroupSettings::decode(b"k", &v).unwrap(), s);
        for cut in 0..v.len() {
            assert!(GroupSettings::decode(b"k", &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_flag = v.clone();
        bad_flag[1] = 2;
        assert!(GroupSettings::decode(b"k", &bad_flag).is_err());
        let mut bad_version = v;
        bad_version[0] = 9;
        assert!(GroupSettings::decode(b"k", &bad_version).is_err());
        assert_eq!(
            GroupSettings::decode(b"k", &GroupSettings::default().encode()).unwrap(),
            GroupSettings::default()
        );
    }
}
