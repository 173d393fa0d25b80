//! The reads behind stats and inspection: the registry as it is on disk, queue sizes, enqueue
//! times, offsets, cursors and claims. A live broker and a read-only inspector use the same
//! reads, so they compute every figure the same way. Blocking.

use rocksdb::{DB, Direction, IteratorMode};

use super::db::bounded;
use super::db::{Cfs, DbGuard, ReadError, scan, storage};
use super::open::{Loaded, last_sequence, load};
use super::{envelope, keys, records, scheduled};
use crate::error::{Error, StorageError};
use crate::model::{Claim, GroupOffset, QueueMeta, ScheduleRecord};

/// Messages read from a queue's head to estimate its size.
const SIZE_SAMPLE: u64 = 32;

/// A read view of the open database, valid while its guard is held.
pub(crate) struct Snapshot<'a> {
    pub(super) db: &'a DB,
    pub(super) cfs: Cfs<'a>,
    path: &'a std::path::Path,
}

impl DbGuard<'_> {
    /// A read view for inspection, or `None` once the database is closed.
    pub fn inspect<'a>(&'a self, path: &'a std::path::Path) -> Option<Snapshot<'a>> {
        let (db, cfs) = self.get()?;
        Some(Snapshot { db, cfs, path })
    }
}

impl Snapshot<'_> {
    /// Every queue, group, claim, mark and settings record.
    pub fn load(&self) -> Result<Loaded, Error> {
        load(self.db, self.path, false)
    }

    /// Approximate bytes of queue `queue_id`'s messages in SST files.
    pub fn queue_bytes(&self, queue_id: u32) -> u64 {
        let lo = keys::message_key(queue_id, 0);
        let hi = keys::queue_upper_bound(queue_id);
        let sizes = self.db.get_approximate_sizes_cf(self.cfs.messages, &[rocksdb::Range::new(&lo, &hi)]);
        sizes.first().copied().unwrap_or(0)
    }

    /// Approximate bytes of the `len` messages queue `queue_id` stores, recent writes still in
    /// memtables included: the SST estimate, or the mean stored size (key and value) of up to
    /// [`SIZE_SAMPLE`] messages from the head times `len`, whichever is larger. RocksDB's size
    /// estimate counts files only, so a queue that was never flushed measured 0 bytes (issue 31).
    pub fn queue_size(&self, queue_id: u32, first_seq: u64, len: u64) -> u64 {
        let files = self.queue_bytes(queue_id);
        if len == 0 {
            return files;
        }
        let lo = keys::message_key(queue_id, first_seq);
        let hi = keys::queue_upper_bound(queue_id);
        let mut it = self.db.raw_iterator_cf_opt(self.cfs.messages, bounded(lo.to_vec(), hi.to_vec()));
        it.seek(lo);
        let (mut n, mut bytes) = (0u64, 0u64);
        while it.valid() && n < SIZE_SAMPLE {
            bytes += (it.key().map_or(0, <[u8]>::len) + it.value().map_or(0, <[u8]>::len)) as u64;
            n += 1;
            it.next();
        }
        if n == 0 {
            return files;
        }
        files.max(bytes.saturating_mul(len) / n)
    }

    /// Bytes of the whole database: live SST files of every column family plus memtables.
    pub fn db_bytes(&self) -> u64 {
        super::db::db_bytes(self.db, &self.cfs)
    }

    /// When message `seq` of queue `queue_id` was enqueued (wall-clock µs), if it is stored.
    pub fn enqueued_at(&self, queue_id: u32, seq: u64) -> Result<Option<u64>, StorageError> {
        let v = self.db.get_cf(self.cfs.messages, keys::message_key(queue_id, seq)).map_err(storage)?;
        Ok(v.as_deref().and_then(envelope::enqueued_micros))
    }

    /// The dead letters of `dlq` settled on their own above its cursor.
    pub fn letter_marks(&self, dlq: &str) -> Result<std::collections::BTreeSet<u64>, ReadError> {
        super::read::letter_marks_in(self.db, self.cfs.meta, dlq)
    }

    /// How far dead-letter queue `dlq` has been redriven (`None`: never).
    pub fn cursor(&self, dlq: &str) -> Result<Option<u64>, ReadError> {
        let key = keys::redrive_key(dlq);
        match self.db.get_cf(self.cfs.meta, &key).map_err(storage)? {
            Some(v) => Ok(Some(records::decode_cursor(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The offset record of `group` on `queue`, if the group exists.
    pub fn offset(&self, group: &str, queue: &str) -> Result<Option<GroupOffset>, ReadError> {
        let key = keys::offset_key(group, queue);
        match self.db.get_cf(self.cfs.offsets, &key).map_err(storage)? {
            Some(v) => Ok(Some(records::decode_offset(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The claim record of `seq` in work-queue group `group` on `queue`, if there is one.
    pub fn claim(&self, group: &str, queue: &str, seq: u64) -> Result<Option<Claim>, ReadError> {
        let key = keys::claim_key(&keys::claim_prefix(group, queue), seq);
        match self.db.get_cf(self.cfs.claims, &key).map_err(storage)? {
            Some(v) => Ok(Some(records::decode_claim(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The outcome of job `seq` in work-queue group `group` on `queue`, if one is kept.
    pub fn outcome(
        &self,
        group: &str,
        queue: &str,
        seq: u64,
    ) -> Result<Option<crate::stats::JobOutcome>, ReadError> {
        let key = keys::claim_key(&keys::outcome_prefix(group, queue), seq);
        match self.db.get_pinned_cf(self.cfs.claims, &key).map_err(storage)? {
            Some(v) => Ok(Some(super::outcomes::decode_outcome(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The priority of message `seq` of queue `queue_id` (0: none).
    pub fn priority(&self, queue_id: u32, seq: u64) -> Result<u8, ReadError> {
        let key = keys::priority_key(queue_id, seq);
        match self.db.get_pinned_cf(self.cfs.scheduled, key).map_err(storage)? {
            Some(v) => match *v {
                [p] => Ok(p),
                _ => Err(crate::error::CorruptionError::new("priority", &key, "expected one byte").into()),
            },
            None => Ok(0),
        }
    }

    /// The last progress report on job `seq` in work-queue group `group` on `queue`, if any.
    pub fn progress(&self, group: &str, queue: &str, seq: u64) -> Result<Option<bytes::Bytes>, ReadError> {
        let key = keys::claim_key(&keys::progress_prefix(group, queue), seq);
        match self.db.get_pinned_cf(self.cfs.claims, &key).map_err(storage)? {
            Some(v) => Ok(Some(super::outcomes::decode_progress(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// The outcomes of work-queue group `group` on `queue` recorded at or before `before`
    /// (µs since the epoch), `(seq, finished at µs)` each, in sequence order from the lowest:
    /// at most `limit`, and the scan ends after `lookahead` outcomes in a row that have not
    /// expired (outcomes are recorded in roughly sequence order, so the expired ones are near
    /// the head; one slow job must not keep every later one, nor a pass read them all).
    ///
    /// The scan starts at sequence `from` (a pass goes on from where its last chunk ended). A
    /// record that does not decode is skipped (left for an operator: a lookup of its job
    /// reports the corruption), so one bad record does not stop every later expiry.
    pub fn expired_outcomes(
        &self,
        group: &str,
        queue: &str,
        from: u64,
        before: u64,
        limit: usize,
        lookahead: usize,
    ) -> Result<Vec<(u64, u64)>, ReadError> {
        let prefix = keys::outcome_prefix(group, queue);
        let lo = keys::claim_key(&prefix, from);
        let hi = keys::claim_key(&prefix, u64::MAX);
        let iter = self.db.iterator_cf_opt(
            self.cfs.claims,
            bounded(lo.clone(), hi),
            IteratorMode::From(&lo, Direction::Forward),
        );
        let (mut out, mut fresh) = (Vec::new(), 0);
        for item in iter {
            let (k, v) = item.map_err(storage)?;
            let seq = keys::claim_key_seq(&prefix, &k)?;
            let at = match super::outcomes::decode_outcome(&k, &v) {
                Ok(o) => super::outcomes::micros_of(o.finished_at),
                Err(e) => {
                    tracing::warn!(%group, %queue, seq, error = %e, "rockq: a job outcome does not decode; not expired");
                    continue;
                }
            };
            if at <= before {
                out.push((seq, at));
                fresh = 0;
                if out.len() >= limit {
                    break;
                }
            } else {
                fresh += 1;
                if fresh >= lookahead {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// The claims of work-queue group `group` on `queue` above sequence `after`, in order.
    pub fn claims_above(&self, group: &str, queue: &str, after: u64) -> Result<Vec<(u64, Claim)>, ReadError> {
        let prefix = keys::claim_prefix(group, queue);
        let lo = keys::claim_key(&prefix, after.saturating_add(1));
        let hi = keys::claim_key(&prefix, u64::MAX);
        let iter = self.db.iterator_cf_opt(
            self.cfs.claims,
            bounded(lo.clone(), hi),
            IteratorMode::From(&lo, Direction::Forward),
        );
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item.map_err(storage)?;
            let (_, _, seq) = keys::parse_claim_key(&k)?;
            out.push((seq, records::decode_claim(&k, &v)?));
        }
        Ok(out)
    }

    /// Queue `name`'s metadata and last sequence, if it exists.
    pub fn queue(&self, name: &str) -> Result<Option<(QueueMeta, u64)>, Error> {
        let key = keys::queue_key(name);
        let Some(v) = self.db.get_cf(self.cfs.meta, &key).map_err(storage)? else { return Ok(None) };
        let meta = records::decode_queue(&key, &v)?;
        let last = last_sequence(self.db, self.cfs.messages, &meta)?;
        Ok(Some((meta, last)))
    }
}

/// The schedule and dedup reads behind listings and expiry.
impl Snapshot<'_> {
    /// Idempotency keys that expired before `before`: `(expires, queue_id, key)`, oldest
    /// first, at most `limit`.
    pub fn expired_dedup(&self, before: u64, limit: usize) -> Result<Vec<(u64, u32, Vec<u8>)>, ReadError> {
        let (lo, hi) = keys::dedup_expired_range(before);
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.dedup, lo, hi) {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item.map_err(storage)?;
            let (expires, queue_id, key) = keys::parse_dedup_expiry_key(&k)?;
            out.push((expires, queue_id, key.to_vec()));
        }
        Ok(out)
    }

    /// Delayed messages of `queue_id` (or of every queue), in id order, at most `limit`:
    /// `(queue_id, id, due, envelope)`.
    pub fn list_scheduled(
        &self,
        queue_id: Option<u32>,
        limit: usize,
    ) -> Result<Vec<scheduled::ScheduledEntry>, ReadError> {
        let (lo, hi) = keys::scheduled_id_range(queue_id);
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.scheduled, lo, hi) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(storage)?;
            let (q, id) = keys::parse_scheduled_id_key(&k)?;
            let due = scheduled::decode_u64(&k, &v)?;
            // Written in the same batch as its id entry: a miss means it fired or was
            // cancelled between the two reads.
            if let Some(env) =
                self.db.get_cf(self.cfs.scheduled, keys::due_key(due, q, id)).map_err(storage)?
            {
                out.push((q, id, due, env));
            }
        }
        Ok(out)
    }

    /// The earliest due time of the delayed messages of each of `queue_ids`: a walk of the due
    /// index, which is in due order, from its head until every one was found.
    pub fn next_due(
        &self,
        queue_ids: &std::collections::HashSet<u32>,
    ) -> Result<std::collections::HashMap<u32, u64>, ReadError> {
        let mut out = std::collections::HashMap::with_capacity(queue_ids.len());
        if queue_ids.is_empty() {
            return Ok(out);
        }
        let (lo, hi) = keys::due_range();
        for item in scan(self.db, self.cfs.scheduled, lo, hi) {
            let (k, _) = item.map_err(storage)?;
            let (due, queue_id, _) = keys::parse_due_key(&k)?;
            if queue_ids.contains(&queue_id) {
                out.entry(queue_id).or_insert(due);
                if out.len() == queue_ids.len() {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every recurring schedule, by name.
    pub fn list_schedules(&self) -> Result<Vec<(String, ScheduleRecord)>, ReadError> {
        let (lo, hi) = keys::schedule_key_range();
        let mut out = Vec::new();
        for item in scan(self.db, self.cfs.scheduled, lo, hi) {
            let (k, v) = item.map_err(storage)?;
            let name = keys::schedule_name_from_key(&k)?.to_owned();
            out.push((name, scheduled::decode_schedule(&k, &v)?));
        }
        Ok(out)
    }
}
