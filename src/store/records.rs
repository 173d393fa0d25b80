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

/// `queue:<name>` → the queue's numeric id and first live sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueRecord {
    pub id: u32,
    /// Sequences below this have been deleted by retention (or never existed).
    pub first_seq: u64,
}

const QUEUE_RECORD_V1: u8 = 1;

impl QueueRecord {
    pub fn encode(&self) -> [u8; 13] {
        let mut v = [0u8; 13];
        v[0] = QUEUE_RECORD_V1;
        v[1..5].copy_from_slice(&self.id.to_be_bytes());
        v[5..].copy_from_slice(&self.first_seq.to_be_bytes());
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Self, CorruptionError> {
        let bad = |r: &str| CorruptionError::new("queue", key, r);
        let v: &[u8; 13] = v.try_into().map_err(|_| bad("length is not 13"))?;
        if v[0] != QUEUE_RECORD_V1 {
            return Err(bad("unknown version"));
        }
        let id = u32::from_be_bytes([v[1], v[2], v[3], v[4]]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&v[5..]);
        let first_seq = u64::from_be_bytes(s);
        if id == 0 || id == u32::MAX || first_seq == 0 {
            return Err(bad("id or first sequence out of range"));
        }
        Ok(QueueRecord { id, first_seq })
    }
}

/// `consumer:<group>:<queue>` → the last committed sequence (0: nothing committed).
const OFFSET_RECORD_V1: u8 = 1;

pub(crate) fn encode_offset(committed: u64) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[0] = OFFSET_RECORD_V1;
    v[1..].copy_from_slice(&committed.to_be_bytes());
    v
}

pub(crate) fn decode_offset(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    let bad = |r: &str| CorruptionError::new("offset", key, r);
    let v: &[u8; 9] = v.try_into().map_err(|_| bad("length is not 9"))?;
    if v[0] != OFFSET_RECORD_V1 {
        return Err(bad("unknown version"));
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&v[1..]);
    Ok(u64::from_be_bytes(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_bad_bytes() {
        let q = QueueRecord { id: 7, first_seq: 42 };
        assert_eq!(QueueRecord::decode(b"k", &q.encode()).unwrap(), q);
        assert!(QueueRecord::decode(b"k", &q.encode()[..12]).is_err());
        let mut zero_id = q.encode();
        zero_id[1..5].fill(0);
        assert!(QueueRecord::decode(b"k", &zero_id).is_err());

        assert_eq!(decode_offset(b"k", &encode_offset(99)).unwrap(), 99);
        assert!(decode_offset(b"k", &[2; 9]).is_err());
        assert!(decode_offset(b"k", &[]).is_err());

        assert_eq!(decode_format(&encode_format()), Some(FORMAT_VERSION));
        assert_eq!(decode_format(b"rockq"), None);
        assert_eq!(decode_format(b"other1"), None);
    }
}
