//! Keyspace values: an [`Entry`] as read, the [`Expect`] conditions a write can carry, and the
//! limits on keys and transactions.

use bytes::Bytes;

/// Longest key of a keyspace entry, in bytes.
pub const MAX_KV_KEY_LEN: usize = 4096;

/// Most operations (acks, sends, writes and conditions together) one transaction may hold:
/// it is applied as one write batch, which RocksDB holds in memory whole.
pub const MAX_TX_OPS: usize = 65_536;

/// Most bytes of keys, values and messages one transaction may hold (64 MiB), for the same
/// reason.
pub const MAX_TX_BYTES: usize = 64 << 20;

/// One entry of a [`Keyspace`](crate::Keyspace): its key, value and revision.
///
/// The revision is that of the write that stored it. Revisions come from one counter over every
/// keyspace of the broker and only grow, so a key that was deleted and written again never
/// shows an earlier revision: comparing revisions is a safe compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// The revision of the write that stored it.
    pub revision: u64,
}

/// A condition on a key, checked when a transaction (or a
/// [`compare_and_set`](crate::Keyspace::compare_and_set)) is applied: if it does not hold,
/// nothing of the transaction is applied and it fails with
/// [`Error::Conflict`](crate::Error::Conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expect {
    /// The key must not exist.
    Absent,
    /// The key must exist with exactly this revision (as read in an [`Entry`]).
    Revision(u64),
    /// The key must exist, whatever its revision.
    Present,
}

impl Expect {
    /// What a read found, as the condition that it is still so: [`Revision`](Expect::Revision)
    /// of the entry, or [`Absent`](Expect::Absent).
    pub fn from_read(entry: Option<&Entry>) -> Self {
        entry.map_or(Expect::Absent, |e| Expect::Revision(e.revision))
    }

    /// Whether a key whose stored revision is `found` (`None`: absent) satisfies this.
    pub fn holds(self, found: Option<u64>) -> bool {
        match self {
            Expect::Absent => found.is_none(),
            Expect::Revision(r) => found == Some(r),
            Expect::Present => found.is_some(),
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Absent => f.write_str("absent"),
            Expect::Revision(r) => write!(f, "revision {r}"),
            Expect::Present => f.write_str("present"),
        }
    }
}

/// Why `key` cannot be a keyspace key, if it cannot.
pub(crate) fn check_key(key: &[u8]) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("empty key");
    }
    if key.len() > MAX_KV_KEY_LEN {
        return Err("key longer than MAX_KV_KEY_LEN bytes");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_hold_exactly_when_they_should() {
        assert!(Expect::Absent.holds(None));
        assert!(!Expect::Absent.holds(Some(1)));
        assert!(Expect::Revision(3).holds(Some(3)));
        assert!(!Expect::Revision(3).holds(Some(4)));
        assert!(!Expect::Revision(3).holds(None));
        assert!(Expect::Present.holds(Some(9)));
        assert!(!Expect::Present.holds(None));
        assert!(check_key(b"").is_err());
        assert!(check_key(&vec![1; MAX_KV_KEY_LEN + 1]).is_err());
        assert!(check_key(b"a").is_ok());
    }
}
