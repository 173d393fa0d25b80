//! Keyspaces in etcd (`Broker::kv` on the etcd engine): named keyspaces of entries, each
//! entry one etcd key, its revision etcd's `mod_revision`.
//!
//! etcd already has what a keyspace promises: a revision per key that only grows over the
//! whole namespace (a key deleted and written again never shows an old revision), and
//! transactions whose compares are checked atomically with their writes. So an entry's
//! revision is the revision of the etcd transaction that wrote it, a condition is a compare
//! on the key's `mod_revision` or `version`, and a keyspace transaction is one etcd
//! transaction: every process's writes are fenced by the same compares.
//!
//! Layout (under the namespace prefix `N`):
//! - `N sk/<name>` → `version u8 (1), keyspace id u32 BE`: the keyspace. Between `q/` and
//!   `t0`, so the namespace watch brings a keyspace made by another process.
//! - `N v/<keyspace id u32 BE><key>` → `version u8 (1), value`: an entry.
//! - `N meta/keyspace-id` → the next keyspace id, `u32 BE`.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::{EtcdStore, corrupt};
use crate::entry::Expect;
use crate::error::{CorruptionError, StorageError};
use crate::store::RawEntry;

const KEYSPACE_V1: u8 = 1;
const ENTRY_V1: u8 = 1;

/// One write (or condition) of a keyspace transaction, as the store carries it out.
#[derive(Debug, Clone)]
pub(crate) struct KvOp {
    pub keyspace: u32,
    pub key: Vec<u8>,
    /// `None` deletes.
    pub value: Option<Vec<u8>>,
    pub expect: Option<Expect>,
    /// Checks `expect` and writes nothing.
    pub condition_only: bool,
}

impl EtcdStore {
    pub(super) fn keyspace_key(&self, name: &str) -> Vec<u8> {
        self.key(b"sk/", name.as_bytes())
    }

    pub(super) fn next_keyspace_id_key(&self) -> Vec<u8> {
        self.key(b"meta/", b"keyspace-id")
    }

    /// The prefix of keyspace `id`'s entries.
    fn entries_prefix(&self, id: u32) -> Vec<u8> {
        self.key(b"v/", &id.to_be_bytes())
    }

    pub(super) fn entry_key(&self, id: u32, key: &[u8]) -> Vec<u8> {
        let mut k = self.entries_prefix(id);
        k.extend_from_slice(key);
        k
    }

    /// The prefix of keyspace records (the namespace watch tells them by it).
    pub(super) fn keyspace_prefix(&self) -> Vec<u8> {
        self.key(b"sk/", b"")
    }

    /// The id of keyspace `name`, creating it unless it exists.
    pub async fn create_keyspace(&self, name: &str) -> Result<u32, StorageError> {
        let kv = self.kv();
        let key = self.keyspace_key(name);
        let idkey = self.next_keyspace_id_key();
        loop {
            if let Some(id) = self.keyspace(name).await? {
                return Ok(id);
            }
            let (id, id_cmp) = self.next_id(&idkey, "keyspace id").await?;
            let txn =
                Txn::new().when([Compare::version(key.clone(), CompareOp::Equal, 0), id_cmp]).and_then([
                    TxnOp::put(key.clone(), encode_keyspace(id), None),
                    TxnOp::put(idkey.clone(), (id + 1).to_be_bytes().to_vec(), None),
                ]);
            if kv.txn(txn).await?.succeeded() {
                return Ok(id);
            }
            // Another process made it, or took the id: look again.
        }
    }

    /// The id of keyspace `name`, if it exists.
    pub async fn keyspace(&self, name: &str) -> Result<Option<u32>, StorageError> {
        let got = self.kv().get(self.keyspace_key(name), None).await?;
        got.kvs().first().map(|k| decode_keyspace(k.key(), k.value())).transpose()
    }

    /// Every keyspace of the namespace: (name, id), by name.
    pub async fn keyspaces(&self) -> Result<Vec<(String, u32)>, StorageError> {
        let prefix = self.keyspace_prefix();
        let got = self.kv().get(prefix.clone(), Some(GetOptions::new().with_prefix())).await?;
        got.kvs().iter().map(|k| keyspace_record(&prefix, k.key(), k.value())).collect()
    }

    /// Entry `key` of keyspace `id`: (revision, value).
    pub async fn kv_get(&self, id: u32, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let got = self.kv().get(self.entry_key(id, key), None).await?;
        got.kvs().first().map(|e| decode_entry(e.key(), e.value(), e.mod_revision())).transpose()
    }

    /// Up to `limit` entries of keyspace `id` in `[from, to)` (`to: None`: to its end), in key
    /// order; fewer only at the range's end (a caller's "short page is the last"). Read in as
    /// many answers as their sizes need (one answer carries at most 4 MiB).
    pub async fn kv_scan(
        &self,
        id: u32,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<RawEntry>, StorageError> {
        let prefix = self.entries_prefix(id);
        let start = self.entry_key(id, from);
        let end = match to {
            Some(to) => self.entry_key(id, to),
            None => crate::store::prefix_end(&prefix).unwrap_or_else(|| vec![0]),
        };
        let mut start = start;
        let mut out = Vec::new();
        let mut n = limit.max(1);
        while start < end && out.len() < limit {
            let want = n.min(limit - out.len());
            let opts = GetOptions::new().with_range(end.clone()).with_limit(want as i64);
            let Some(got) = self.kv().get_bounded(start.clone(), Some(opts)).await? else {
                if n == 1 {
                    return Err(StorageError::new(
                        "etcd: a keyspace entry is larger than the client's 4 MiB answer limit",
                    ));
                }
                n = (n / 4).max(1);
                continue;
            };
            for e in got.kvs() {
                let (revision, value) = decode_entry(e.key(), e.value(), e.mod_revision())?;
                out.push((e.key()[prefix.len()..].to_vec(), revision, value));
            }
            match got.kvs().last() {
                Some(last) if got.more() => start = [last.key(), &[0]].concat(),
                _ => break,
            }
        }
        Ok(out)
    }

    /// How many keys keyspace `id` holds.
    pub async fn kv_count(&self, id: u32) -> Result<u64, StorageError> {
        let prefix = self.entries_prefix(id);
        let got = self.kv().get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await?;
        Ok(u64::try_from(got.count()).unwrap_or(0))
    }
}

/// A keyspace record as (name, id); `prefix` is the keyspace records' prefix
/// ([`EtcdStore::keyspace_prefix`]).
pub(super) fn keyspace_record(
    prefix: &[u8],
    key: &[u8],
    value: &[u8],
) -> Result<(String, u32), StorageError> {
    let name = key.get(prefix.len()..).unwrap_or_default();
    let name = std::str::from_utf8(name)
        .map_err(|_| corrupt(CorruptionError::new("keyspace", key, "name is not UTF-8")))?;
    Ok((name.to_owned(), decode_keyspace(key, value)?))
}

pub(super) fn encode_keyspace(id: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(5);
    v.push(KEYSPACE_V1);
    v.extend_from_slice(&id.to_be_bytes());
    v
}

pub(super) fn decode_keyspace(key: &[u8], v: &[u8]) -> Result<u32, StorageError> {
    match v {
        [KEYSPACE_V1, a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => Err(corrupt(CorruptionError::new("keyspace", key, "not a version-1 keyspace record"))),
    }
}

pub(super) fn encode_entry(value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + value.len());
    v.push(ENTRY_V1);
    v.extend_from_slice(value);
    v
}

pub(super) fn decode_entry(key: &[u8], v: &[u8], revision: i64) -> Result<(u64, Vec<u8>), StorageError> {
    match v.split_first() {
        Some((&ENTRY_V1, value)) => Ok((revision as u64, value.to_vec())),
        _ => Err(corrupt(CorruptionError::new("keyspace entry", key, "unknown version"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_what_they_encode_and_refuse_other_versions() {
        assert_eq!(decode_keyspace(b"k", &encode_keyspace(7)).unwrap(), 7);
        assert!(decode_keyspace(b"k", &[2, 0, 0, 0, 7]).is_err());
        assert!(decode_keyspace(b"k", &[1, 0, 0]).is_err());
        assert_eq!(decode_entry(b"k", &encode_entry(b"xy"), 9).unwrap(), (9, b"xy".to_vec()));
        assert!(decode_entry(b"k", &[], 9).is_err());
        assert!(decode_entry(b"k", &[2, 1], 9).is_err());
    }
}
