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

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

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

/// How a keyspace transaction ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KvApplied {
    /// Applied at `revision` (`None`: it wrote nothing, its conditions held); `added` is how
    /// many keys each keyspace it wrote gained (negative: lost), `None` when an earlier try
    /// of this same call was applied (its answer lost: found by its marker).
    Applied { revision: Option<u64>, added: Option<Vec<(u32, i64)>> },
    /// The condition of op `index` did not hold: the key's revision then (`None`: absent).
    Conflict { index: usize, found: Option<u64> },
}

impl KvOp {
    /// The compare standing for `expect` on the key `key`.
    fn compare(key: Vec<u8>, expect: Expect) -> Compare {
        match expect {
            Expect::Absent => Compare::version(key, CompareOp::Equal, 0),
            Expect::Present => Compare::version(key, CompareOp::Greater, 0),
            // A revision etcd cannot have is one no key has (a missing key compares as 0).
            Expect::Revision(r) => {
                Compare::mod_revision(key, CompareOp::Equal, i64::try_from(r).unwrap_or(-1))
            }
        }
    }
}

/// A keyspace transaction's size as etcd counts it: (compares, writes, key and value bytes),
/// its marker's compare and put included.
pub(crate) fn txn_size(ops: &[KvOp]) -> (usize, usize, usize) {
    let compares = ops.iter().filter(|o| o.expect.is_some()).count();
    let mut written: Vec<(u32, &[u8])> =
        ops.iter().filter(|o| !o.condition_only).map(|o| (o.keyspace, o.key.as_slice())).collect();
    written.sort_unstable();
    written.dedup();
    let bytes = ops.iter().map(|o| o.key.len() + o.value.as_ref().map_or(0, Vec::len)).sum();
    (compares + 1, written.len() + 1, bytes)
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

    /// Applies `ops` as one etcd transaction: every condition compared, then the writes (the
    /// last write of a key wins, as when the embedded writer applies them in order). Within
    /// etcd's limits: the caller checks [`txn_size`].
    ///
    /// In doubt (no answer), call again with the same `nonce`: the transaction also puts the
    /// marker `y/<nonce>` under `marker_lease` and requires it absent, so a second try after
    /// a first that was applied is refused and reports the first as applied — never as a
    /// conflict with its own writes, never applied twice.
    pub async fn kv_txn(
        &self,
        ops: &[KvOp],
        nonce: u64,
        marker_lease: i64,
    ) -> Result<KvApplied, StorageError> {
        let marker = self.marker_key(nonce);
        let mut cmps = vec![Compare::version(marker.clone(), CompareOp::Equal, 0)];
        let mut checks = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Some(expect) = op.expect {
                let key = self.entry_key(op.keyspace, &op.key);
                cmps.push(KvOp::compare(key.clone(), expect));
                checks.push((i, key));
            }
        }
        // The last write of each key, in the order of first appearance.
        let mut last: Vec<&KvOp> = Vec::new();
        for op in ops.iter().filter(|o| !o.condition_only) {
            match last.iter_mut().find(|w| w.keyspace == op.keyspace && w.key == op.key) {
                Some(w) => *w = op,
                None => last.push(op),
            }
        }
        let mut writes: Vec<TxnOp> = last
            .iter()
            .map(|w| {
                let key = self.entry_key(w.keyspace, &w.key);
                match &w.value {
                    Some(v) => TxnOp::put(key, encode_entry(v), Some(PutOptions::new().with_prev_key())),
                    None => TxnOp::delete(key, Some(DeleteOptions::new().with_prev_key())),
                }
            })
            .collect();
        // On a failed compare, the compared keys as they were then: which condition failed.
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let mut reads: Vec<TxnOp> =
            checks.iter().map(|(_, key)| TxnOp::get(key.clone(), keys_only())).collect();
        reads.push(TxnOp::get(marker.clone(), keys_only()));
        let wrote = !writes.is_empty();
        writes.push(TxnOp::put(marker, Vec::new(), Some(PutOptions::new().with_lease(marker_lease))));
        crate::faults::check("rockq-etcd-kv-request")?;
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(writes).or_else(reads)).await?;
        crate::faults::check("rockq-etcd-kv-answer")?;
        if resp.succeeded() {
            let revision = wrote.then(|| resp.header().map_or(0, |h| h.revision()) as u64);
            let mut added: Vec<(u32, i64)> = Vec::new();
            for (w, r) in last.iter().zip(resp.op_responses()) {
                let delta = match r {
                    TxnOpResponse::Put(p) if p.prev_key().is_none() => 1,
                    TxnOpResponse::Delete(d) => -d.deleted(),
                    _ => 0,
                };
                match added.iter_mut().find(|(k, _)| *k == w.keyspace) {
                    Some((_, n)) => *n += delta,
                    None => added.push((w.keyspace, delta)),
                }
            }
            return Ok(KvApplied::Applied { revision, added: Some(added) });
        }
        let answers = resp.op_responses();
        if let Some(TxnOpResponse::Get(g)) = answers.last()
            && let Some(m) = g.kvs().first()
        {
            let revision = wrote.then_some(m.mod_revision() as u64);
            return Ok(KvApplied::Applied { revision, added: None });
        }
        for ((i, _), r) in checks.iter().zip(answers) {
            let TxnOpResponse::Get(g) = r else { continue };
            let found = g.kvs().first().map(|e| e.mod_revision() as u64);
            if let Some(expect) = ops[*i].expect
                && !expect.holds(found)
            {
                return Ok(KvApplied::Conflict { index: *i, found });
            }
        }
        Err(StorageError::new("etcd: a keyspace transaction's compare failed, yet every condition holds"))
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

    fn op(keyspace: u32, key: &str, write: bool, expect: Option<Expect>) -> KvOp {
        KvOp {
            keyspace,
            key: key.into(),
            value: write.then(|| b"v".to_vec()),
            expect,
            condition_only: !write,
        }
    }

    #[test]
    fn a_transaction_counts_each_written_key_once_and_every_condition() {
        let ops = [
            op(1, "a", true, None),
            op(1, "a", true, Some(Expect::Absent)),
            op(2, "a", true, None),
            op(1, "b", false, Some(Expect::Present)),
        ];
        assert_eq!(txn_size(&ops), (3, 3, 4 + 3));
    }

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
