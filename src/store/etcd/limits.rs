//! A work group's limit record in etcd: what makes a rate or concurrency limit hold across
//! processes.
//!
//! | key | value |
//! | --- | --- |
//! | `N c/claim:<group>:<queue>:<u64::MAX>l` | the rate bucket's `tat`, wall-clock micros (u64, big-endian; 0: none) |
//!
//! Every claim of a group with a rate or concurrency limit rewrites the record in its
//! transaction and compares its `mod_revision` with the one the claiming process decided on.
//! The record is thereby the order of the group's limited claims: a process that decided on a
//! view missing another process's claim (a lease it did not count, a token it did not see
//! taken) writes nothing. The key sits inside the claim prefix, so every process's claim watch
//! delivers it in the same revision as the claims written with it, and after the reset mark,
//! so neither a reset's deletion nor an offset move's (both ranges end below the mark) takes
//! it: a reset does not refill the bucket, as embedded. A group's deletion takes the prefix,
//! this record with it.

use etcd_client::{Compare, CompareOp, TxnOp};

use super::{EtcdStore, corrupt};
use crate::error::{CorruptionError, StorageError};

/// What follows the reset mark's key in the limit record's key.
pub(crate) const LIMIT_SUFFIX: u8 = b'l';

/// The limit record a claim transaction writes ([`EtcdStore::write_claims`]): `tat_micros`,
/// if the record's `mod_revision` is still `expected` (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitWrite {
    pub expected: i64,
    pub tat_micros: u64,
}

/// The limit record as read: the bucket's `tat` (wall micros, 0: none) and its `mod_revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitRecord {
    pub tat_micros: u64,
    pub rev: i64,
}

impl EtcdStore {
    /// The key of work group `group`'s limit record on `queue`.
    pub(super) fn limit_key(&self, group: &str, queue: &str) -> Vec<u8> {
        let mut key = self.reset_mark_key(group, queue);
        key.push(LIMIT_SUFFIX);
        key
    }

    /// Adds `w`'s compare, put and (for a refusal's answer) get to a claim transaction.
    pub(super) fn push_limit(
        &self,
        group: &str,
        queue: &str,
        w: LimitWrite,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
        gets: &mut Vec<TxnOp>,
    ) {
        let key = self.limit_key(group, queue);
        cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, w.expected));
        ops.push(TxnOp::put(key.clone(), w.tat_micros.to_be_bytes().to_vec(), None));
        gets.push(TxnOp::get(key, None));
    }

    /// Decodes a limit record read from etcd.
    pub(super) fn limit_record(kv: &etcd_client::KeyValue) -> Result<LimitRecord, StorageError> {
        let tat = <[u8; 8]>::try_from(kv.value())
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt(CorruptionError::new("limit", kv.key(), "not an 8-byte time")))?;
        Ok(LimitRecord { tat_micros: tat, rev: kv.mod_revision() })
    }
}

/// Whether `key` (a claim key without the namespace, as an export reads them) is a limit
/// record's: the reset mark's sequence and the suffix. No claim key ends so — the byte before
/// a claim's sequence is the `:` of its prefix, not `0xff`.
pub(crate) fn is_limit_key(key: &[u8]) -> bool {
    key.len() >= 9 && key.ends_with(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, LIMIT_SUFFIX])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_key_is_told_from_every_claim_key() {
        let prefix = crate::store::keys::claim_prefix("w", "q");
        let mut limit = crate::store::keys::claim_key(&prefix, u64::MAX);
        limit.push(LIMIT_SUFFIX);
        assert!(is_limit_key(&limit));
        for seq in [0, 1, u64::MAX, u64::MAX - 1, u64::from_be_bytes(*b"\xff\xff\xff\xff\xff\xff\xffl")] {
            assert!(!is_limit_key(&crate::store::keys::claim_key(&prefix, seq)), "{seq}");
        }
    }
}
