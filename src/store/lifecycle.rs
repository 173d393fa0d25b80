//! The store's half of deleting queues and groups: the domain operations that remove every
//! record of one queue or one group from a writer round's batch, and the reads that find the
//! records whose keys are not contiguous (delayed messages' due entries, idempotency keys'
//! expiry entries, group settings). The reads see the database as last written; the writer
//! adds what its own round wrote.

use rocksdb::DB;

use super::batch::{Batch, GroupKeys};
use super::db::{ReadError, Store, scan, storage};
use super::keys;
use super::scheduled::{decode_dedup, decode_u64};
use crate::error::StorageError;

impl Batch<'_> {
    /// Deletes queue `name` (id `queue_id`): its record, every message (one range tombstone),
    /// its delayed messages' id index, its priority index and its idempotency keys (a range
    /// tombstone each), and
    /// its redrive cursor. The due entries and expiry entries are not contiguous per queue:
    /// the caller deletes them one by one ([`Batch::delete_due`], [`Batch::delete_dedup_expiry`]).
    pub fn delete_queue(&mut self, name: &str, queue_id: u32) {
        self.wb.delete_cf(self.cfs.meta, keys::queue_key(name));
        self.wb.delete_range_cf(
            self.cfs.messages,
            keys::message_key(queue_id, 0).to_vec(),
            keys::queue_upper_bound(queue_id).to_vec(),
        );
        let (lo, hi) = keys::scheduled_id_range(Some(queue_id));
        self.wb.delete_range_cf(self.cfs.scheduled, lo, hi);
        let (lo, hi) = keys::priority_range(Some(queue_id));
        self.wb.delete_range_cf(self.cfs.scheduled, lo, hi);
        let (lo, hi) = dedup_range(queue_id);
        self.wb.delete_range_cf(self.cfs.dedup, lo, hi);
        self.wb.delete_cf(self.cfs.meta, keys::redrive_key(name));
        let (lo, hi) = keys::letter_range(name);
        self.wb.delete_range_cf(self.cfs.meta, lo, hi);
    }

    /// Deletes group `group` on `queue`, whichever its mode: its offset record, every claim or
    /// delivery record (ordered and work-queue prefixes both: a record of either kind has no
    /// meaning once the group is gone), its rate bucket and its settings record.
    pub fn delete_group(&mut self, group: &str, queue: &str) {
        self.wb.delete_cf(self.cfs.offsets, keys::offset_key(group, queue));
        for records in [GroupKeys::ordered(group, queue), GroupKeys::work(group, queue)] {
            self.delete_all_records(&records);
        }
        self.delete_job_records(&GroupKeys::work(group, queue));
        self.wb.delete_cf(self.cfs.claims, keys::rate_key(group, queue));
        self.wb.delete_cf(self.cfs.meta, keys::group_key(group, queue));
    }

    /// Removes one idempotency key's expiry entry.
    pub fn delete_dedup_expiry(&mut self, expires: u64, queue_id: u32, key: &[u8]) {
        self.wb.delete_cf(self.cfs.dedup, keys::dedup_expiry_key(expires, queue_id, key));
    }

    /// Persists the lowest queue id never handed out.
    pub fn put_next_queue_id(&mut self, next: u32) {
        self.wb.put_cf(self.cfs.meta, keys::NEXT_QUEUE_ID_KEY, next.to_be_bytes());
    }

    /// The delayed messages of `queue_id` as stored: `(id, due)` each.
    pub fn scheduled_of(&self, queue_id: u32) -> Result<Vec<(u64, u64)>, StorageError> {
        let (lo, hi) = keys::scheduled_id_range(Some(queue_id));
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.scheduled, lo, hi) {
            let (k, v) = item.map_err(storage)?;
            match keys::parse_scheduled_id_key(&k).and_then(|(_, id)| Ok((id, decode_u64(&k, &v)?))) {
                Ok(entry) => out.push(entry),
                // Its id entry goes with the range; a due entry left behind names no queue, and
                // firing drops it.
                Err(e) => {
                    tracing::warn!(error = %e, "rockq: a deleted queue's delayed message does not decode")
                }
            }
        }
        Ok(out)
    }

    /// The idempotency keys of `queue_id` as stored, with their expiry: `(key, expires)` each.
    pub fn dedup_of(&self, queue_id: u32) -> Result<Vec<(Vec<u8>, u64)>, StorageError> {
        let (lo, hi) = dedup_range(queue_id);
        let prefix = lo.len();
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.dedup, lo, hi) {
            let (k, v) = item.map_err(storage)?;
            match decode_dedup(&k, &v) {
                Ok(record) => out.push((k.get(prefix..).unwrap_or_default().to_vec(), record.expires_micros)),
                // The record goes with the range; an expiry entry left behind finds no record
                // when it expires, and goes then.
                Err(e) => {
                    tracing::warn!(error = %e, "rockq: a deleted queue's idempotency key does not decode")
                }
            }
        }
        Ok(out)
    }

    /// The groups with a settings record on `queue` (a record may outlive its group's offset
    /// record in a database written by hand; every one goes with its queue).
    pub fn settings_groups_of(&self, queue: &str) -> Result<Vec<String>, StorageError> {
        let (lo, hi) = keys::group_key_range();
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.meta, lo, hi) {
            let (k, _) = item.map_err(storage)?;
            if let Ok((group, q)) = keys::parse_group_key(&k)
                && q == queue
            {
                out.push(group.to_owned());
            }
        }
        Ok(out)
    }
}

/// Every idempotency key of one queue: `[k<id>, k<id + 1>)`.
fn dedup_range(queue_id: u32) -> (Vec<u8>, Vec<u8>) {
    (keys::dedup_key(queue_id, b""), keys::dedup_key(queue_id.saturating_add(1), b""))
}

/// The lowest queue id never handed out, as persisted by the last queue deletion (0 if no
/// queue was ever deleted). Read once by the writer as it starts.
pub(crate) fn next_queue_id(store: &Store) -> Result<u32, ReadError> {
    let guard = store.lock();
    let Some((db, cfs)) = guard.get() else { return Ok(0) };
    read_next_queue_id(db, cfs.meta)
}

fn read_next_queue_id(db: &DB, meta: &rocksdb::ColumnFamily) -> Result<u32, ReadError> {
    match db.get_cf(meta, keys::NEXT_QUEUE_ID_KEY).map_err(storage)? {
        Some(v) => {
            let bytes: [u8; 4] = v.as_slice().try_into().map_err(|_| {
                crate::error::CorruptionError::new(
                    "next queue id",
                    keys::NEXT_QUEUE_ID_KEY,
                    "expected 4 bytes",
                )
            })?;
            Ok(u32::from_be_bytes(bytes))
        }
        None => Ok(0),
    }
}
