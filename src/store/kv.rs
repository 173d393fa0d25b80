//! Application state beside the queues: named keyspaces of versioned entries in the
//! `rockq.kv` column family, written by the writer in the same batches as messages, claims and
//! offsets (so one batch can ack a message, update state and send another).
//!
//! Layout:
//! - `rockq.kv`: `<keyspace_id u32 BE><user key>` → `version u8 (1), revision u64 BE, value`.
//!   The revision is the one of the write that stored the entry: a counter over every keyspace
//!   that only grows (etcd's `mod_revision`), so a key deleted and written again never shows
//!   an old revision to a compare-and-set.
//! - `rockq.meta` `kv:<name>` → `version u8 (1), keyspace_id u32 BE, keys u64 BE`: the
//!   keyspace and how many keys it holds (rewritten in each batch that changes the count, so
//!   stats never scan).
//! - `rockq.meta` `kv-revision` → `u64 BE`: the last revision handed out.

use rocksdb::{DB, Direction, IteratorMode};

use super::batch::Batch;
use super::db::{ReadError, Store, bounded, storage};
use crate::error::{CorruptionError, StorageError};

pub(super) const KEYSPACE_PREFIX: &[u8] = b"kv:";
/// The last revision handed out.
pub(super) const REVISION_KEY: &[u8] = b"kv-revision";
const ENTRY_V1: u8 = 1;
const KEYSPACE_V1: u8 = 1;

/// A keyspace as found at open.
#[derive(Debug, Clone)]
pub(crate) struct LoadedKeyspace {
    pub name: String,
    pub id: u32,
    pub keys: u64,
}

/// One stored entry: its key within the keyspace, revision and value.
pub(crate) type RawEntry = (Vec<u8>, u64, Vec<u8>);

pub(super) fn entry_key(keyspace: u32, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&keyspace.to_be_bytes());
    k.extend_from_slice(key);
    k
}

fn keyspace_key(name: &str) -> Vec<u8> {
    [KEYSPACE_PREFIX, name.as_bytes()].concat()
}

pub(super) fn encode_entry(revision: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + value.len());
    v.push(ENTRY_V1);
    v.extend_from_slice(&revision.to_be_bytes());
    v.extend_from_slice(value);
    v
}

pub(super) fn decode_entry(key: &[u8], v: &[u8]) -> Result<(u64, Vec<u8>), CorruptionError> {
    let bad = |r: &str| CorruptionError::new("keyspace entry", key, r);
    if v.len() < 9 {
        return Err(bad("shorter than its header"));
    }
    if v[0] != ENTRY_V1 {
        return Err(bad("unknown version"));
    }
    let mut rev = [0u8; 8];
    rev.copy_from_slice(&v[1..9]);
    Ok((u64::from_be_bytes(rev), v[9..].to_vec()))
}

fn decode_revision_only(key: &[u8], v: &[u8]) -> Result<u64, CorruptionError> {
    if v.len() < 9 || v[0] != ENTRY_V1 {
        return Err(CorruptionError::new("keyspace entry", key, "bad header"));
    }
    let mut rev = [0u8; 8];
    rev.copy_from_slice(&v[1..9]);
    Ok(u64::from_be_bytes(rev))
}

pub(super) fn encode_keyspace(id: u32, keys: u64) -> [u8; 13] {
    let mut v = [0u8; 13];
    v[0] = KEYSPACE_V1;
    v[1..5].copy_from_slice(&id.to_be_bytes());
    v[5..].copy_from_slice(&keys.to_be_bytes());
    v
}

pub(super) fn decode_keyspace(key: &[u8], v: &[u8]) -> Result<(u32, u64), CorruptionError> {
    let bad = |r: &str| CorruptionError::new("keyspace", key, r);
    let v: &[u8; 13] = v.try_into().map_err(|_| bad("wrong length"))?;
    if v[0] != KEYSPACE_V1 {
        return Err(bad("unknown version"));
    }
    let mut keys = [0u8; 8];
    keys.copy_from_slice(&v[5..]);
    Ok((u32::from_be_bytes([v[1], v[2], v[3], v[4]]), u64::from_be_bytes(keys)))
}

/// The exclusive upper bound of keys starting with `prefix` (`None`: no bound, the prefix is
/// all `0xff`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl Batch<'_> {
    /// Writes `key` of keyspace `keyspace` with `value`, stored under `revision`.
    pub fn put_kv(&mut self, keyspace: u32, key: &[u8], revision: u64, value: &[u8]) {
        if let Some(cf) = self.cfs.kv {
            self.wb.put_cf(cf, entry_key(keyspace, key), encode_entry(revision, value));
        }
    }

    /// Deletes `key` of keyspace `keyspace`.
    pub fn delete_kv(&mut self, keyspace: u32, key: &[u8]) {
        if let Some(cf) = self.cfs.kv {
            self.wb.delete_cf(cf, entry_key(keyspace, key));
        }
    }

    /// Writes keyspace `name`'s record: its id and how many keys it holds.
    pub fn put_keyspace(&mut self, name: &str, id: u32, keys: u64) {
        self.wb.put_cf(self.cfs.meta, keyspace_key(name), encode_keyspace(id, keys));
    }

    /// Persists the last revision handed out.
    pub fn put_kv_revision(&mut self, revision: u64) {
        self.wb.put_cf(self.cfs.meta, REVISION_KEY, revision.to_be_bytes());
    }

    /// The stored revision of `key` in keyspace `keyspace` (`None`: absent), as last written
    /// (not this batch's own entries).
    pub fn kv_revision(&self, keyspace: u32, key: &[u8]) -> Result<Option<u64>, ReadError> {
        let Some(cf) = self.cfs.kv else { return Ok(None) };
        let k = entry_key(keyspace, key);
        match self.db.get_pinned_cf(cf, &k).map_err(storage)? {
            Some(v) => Ok(Some(decode_revision_only(&k, &v)?)),
            None => Ok(None),
        }
    }
}

/// `key` of keyspace `keyspace`: its revision and value, if present. Blocking.
pub(crate) fn kv_get(store: &Store, keyspace: u32, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, ReadError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(StorageError::new("the database is closed").into());
    };
    let Some(cf) = cfs.kv else { return Ok(None) };
    let k = entry_key(keyspace, key);
    match db.get_pinned_cf(cf, &k).map_err(storage)? {
        Some(v) => Ok(Some(decode_entry(&k, &v)?)),
        None => Ok(None),
    }
}

/// Up to `limit` entries of keyspace `keyspace` with keys in `[from, to)` (`to: None`: to the
/// keyspace's end), in key order, through one bounded iterator. Blocking.
pub(crate) fn kv_scan(
    store: &Store,
    keyspace: u32,
    from: &[u8],
    to: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<RawEntry>, ReadError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else {
        return Err(StorageError::new("the database is closed").into());
    };
    let Some(cf) = cfs.kv else { return Ok(Vec::new()) };
    let lo = entry_key(keyspace, from);
    // Keyspace ids below `u32::MAX`: `<id + 1>` always bounds the keyspace.
    let hi = match to {
        Some(to) => entry_key(keyspace, to),
        None => (keyspace + 1).to_be_bytes().to_vec(),
    };
    if lo >= hi {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in db.iterator_cf_opt(cf, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward)) {
        if out.len() >= limit {
            break;
        }
        let (k, v) = item.map_err(storage)?;
        let (revision, value) = decode_entry(&k, &v)?;
        out.push((k[4..].to_vec(), revision, value));
    }
    Ok(out)
}

/// Every keyspace and the last revision handed out (0 on a database without any).
pub(super) fn load(db: &DB, meta: &rocksdb::ColumnFamily) -> Result<(Vec<LoadedKeyspace>, u64), ReadError> {
    let mut keyspaces = Vec::new();
    let lo = KEYSPACE_PREFIX.to_vec();
    let hi = prefix_end(KEYSPACE_PREFIX).unwrap_or_default();
    for item in db.iterator_cf_opt(meta, bounded(lo.clone(), hi), IteratorMode::From(&lo, Direction::Forward))
    {
        let (k, v) = item.map_err(storage)?;
        let name = std::str::from_utf8(&k[KEYSPACE_PREFIX.len()..])
            .map_err(|_| CorruptionError::new("keyspace", &k, "name is not UTF-8"))?
            .to_owned();
        let (id, keys) = decode_keyspace(&k, &v)?;
        keyspaces.push(LoadedKeyspace { name, id, keys });
    }
    let revision = match db.get_cf(meta, REVISION_KEY).map_err(storage)? {
        Some(v) => super::scheduled::decode_u64(REVISION_KEY, &v)?,
        None => 0,
    };
    Ok((keyspaces, revision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let v = encode_entry(42, b"hello");
        assert_eq!(decode_entry(b"k", &v).unwrap(), (42, b"hello".to_vec()));
        assert_eq!(decode_revision_only(b"k", &v).unwrap(), 42);
        assert!(decode_entry(b"k", &v[..5]).is_err());
        let mut bad = v.clone();
        bad[0] = 9;
        assert!(decode_entry(b"k", &bad).is_err());
        assert_eq!(decode_keyspace(b"kv:a", &encode_keyspace(7, 1 << 40)).unwrap(), (7, 1 << 40));
        assert!(decode_keyspace(b"kv:a", &[1, 2, 3]).is_err());
    }

    #[test]
    fn prefix_end_bounds_exactly_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
