//! The write side of the store: one [`Batch`] per writer round, whose methods are the domain
//! operations the writer performs (append a message, record a claim, commit an offset, trim a
//! queue's head…). Keys, record layouts, column families and RocksDB's `WriteBatch` stay in
//! here; the writer deals in queues, groups, sequences and domain values.
//!
//! Everything in a batch is applied atomically by [`Batch::write`]: one WAL append (and, with
//! `sync`, one fsync).

use rocksdb::{DB, WriteBatch, WriteOptions};

use super::db::{Cfs, DbGuard, ReadError, storage};
use super::{keys, records};
use crate::error::StorageError;
use crate::model::{Claim, GroupOffset, GroupSettings, OrderedMark, QueueMeta};

/// The keys of one group, built once when the group is created or loaded: its offset record
/// and the prefix of its per-message records (claims of a work-queue group, marks of an ordered
/// group). The offset key doubles as the group's identity in the engine's registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupKeys {
    offset: Vec<u8>,
    records: Vec<u8>,
    /// The prefixes of a work group's job outcomes and progress reports; empty for an
    /// ordered group.
    outcomes: Vec<u8>,
    progress: Vec<u8>,
}

impl GroupKeys {
    /// An ordered group: its per-message records are `ordered:` marks.
    pub fn ordered(group: &str, queue: &str) -> Self {
        GroupKeys {
            offset: keys::offset_key(group, queue),
            records: keys::ordered_prefix(group, queue),
            outcomes: Vec::new(),
            progress: Vec::new(),
        }
    }

    /// A work-queue group: its per-message records are `claim:` records.
    pub fn work(group: &str, queue: &str) -> Self {
        GroupKeys {
            offset: keys::offset_key(group, queue),
            records: keys::claim_prefix(group, queue),
            outcomes: keys::outcome_prefix(group, queue),
            progress: keys::progress_prefix(group, queue),
        }
    }

    /// The group's identity: equal for the same (group, queue) whatever the mode.
    pub fn id(&self) -> &[u8] {
        &self.offset
    }

    /// The key of the group's claim or mark on `seq` (for error reports).
    pub fn record(&self, seq: u64) -> Vec<u8> {
        keys::claim_key(&self.records, seq)
    }

    /// The key of a work group's outcome of job `seq`.
    pub fn outcome(&self, seq: u64) -> Vec<u8> {
        keys::claim_key(&self.outcomes, seq)
    }

    /// The key of a work group's progress report on job `seq`.
    pub fn progress(&self, seq: u64) -> Vec<u8> {
        keys::claim_key(&self.progress, seq)
    }
}

/// The identity of (group, queue) in the engine's registry, without building a group's keys.
pub(crate) fn group_id(group: &str, queue: &str) -> Vec<u8> {
    keys::offset_key(group, queue)
}

impl DbGuard<'_> {
    /// A batch for one writer round, or `None` once the database is closed.
    pub fn batch(&self, capacity_bytes: usize) -> Option<Batch<'_>> {
        let (db, cfs) = self.get()?;
        Some(Batch::new(db, cfs, capacity_bytes))
    }
}

/// One round's writes, applied atomically by [`write`](Batch::write). Reads through it see the
/// database as last written (not the batch's own entries).
pub(crate) struct Batch<'a> {
    pub(super) db: &'a DB,
    pub(super) cfs: Cfs<'a>,
    pub(super) wb: WriteBatch,
}

impl<'a> Batch<'a> {
    fn new(db: &'a DB, cfs: Cfs<'a>, capacity_bytes: usize) -> Self {
        Batch { db, cfs, wb: WriteBatch::with_capacity_bytes(capacity_bytes) }
    }

    /// Appends message `seq` of queue `queue_id` (an encoded, stamped envelope).
    #[inline]
    pub fn put_message(&mut self, queue_id: u32, seq: u64, envelope: &[u8]) {
        self.wb.put_cf(self.cfs.messages, keys::message_key(queue_id, seq), envelope);
    }

    /// Indexes prioritised message `seq` of a queue (see `keys.rs`; the registry's
    /// `priority.rs` is its memory).
    pub fn put_priority(&mut self, queue_id: u32, seq: u64, priority: u8) {
        self.wb.put_cf(self.cfs.scheduled, keys::priority_key(queue_id, seq), [priority]);
    }

    /// Deletes the priority entries of messages `from..=through` of a queue (one range
    /// tombstone, with the messages' own).
    pub fn trim_priorities(&mut self, queue_id: u32, from: u64, through: u64) {
        self.wb.delete_range_cf(
            self.cfs.scheduled,
            keys::priority_key(queue_id, from).to_vec(),
            match through.checked_add(1) {
                Some(next) => keys::priority_key(queue_id, next).to_vec(),
                None => keys::priority_range(Some(queue_id)).1,
            },
        );
    }

    /// Deletes messages `from..=through` of a queue with one range tombstone.
    pub fn trim_messages(&mut self, queue_id: u32, from: u64, through: u64) {
        self.wb.delete_range_cf(
            self.cfs.messages,
            keys::message_key(queue_id, from),
            keys::message_key(queue_id, through.saturating_add(1)),
        );
    }

    /// Writes queue `name`'s metadata (creation, a new first sequence, a new policy).
    pub fn put_queue(&mut self, name: &str, meta: &QueueMeta) {
        self.wb.put_cf(self.cfs.meta, keys::queue_key(name), records::encode_queue(meta));
    }

    /// Writes a group's offset record (creation, a commit, a reset).
    pub fn put_offset(&mut self, group: &GroupKeys, offset: GroupOffset) {
        self.wb.put_cf(self.cfs.offsets, &group.offset, records::encode_offset(&offset));
    }

    /// Writes a work-queue group's claim on message `seq`.
    pub fn put_claim(&mut self, group: &GroupKeys, seq: u64, claim: &Claim) {
        self.wb.put_cf(self.cfs.claims, group.record(seq), records::encode_claim(claim));
    }

    /// Writes an ordered group's mark on message `seq`.
    pub fn put_mark(&mut self, group: &GroupKeys, seq: u64, mark: &OrderedMark) {
        self.wb.put_cf(self.cfs.claims, group.record(seq), records::encode_mark(mark));
    }

    /// Deletes a group's claim or mark on message `seq`.
    pub fn delete_record(&mut self, group: &GroupKeys, seq: u64) {
        self.wb.delete_cf(self.cfs.claims, group.record(seq));
    }

    /// Deletes a group's claims or marks on the messages `from..=through`, with one range
    /// tombstone.
    pub fn delete_records_between(&mut self, group: &GroupKeys, from: u64, through: u64) {
        self.wb.delete_range_cf(self.cfs.claims, group.record(from), group.record(through.saturating_add(1)));
    }

    /// Deletes a group's claims or marks on every message up to `through`, with one range
    /// tombstone.
    pub fn delete_records_through(&mut self, group: &GroupKeys, through: u64) {
        self.wb.delete_range_cf(self.cfs.claims, group.record(0), group.record(through.saturating_add(1)));
    }

    /// Deletes every claim or mark of a group (a range tombstone, plus the one key a range's
    /// exclusive end cannot cover).
    pub fn delete_all_records(&mut self, group: &GroupKeys) {
        self.wb.delete_range_cf(self.cfs.claims, group.record(0), group.record(u64::MAX));
        self.wb.delete_cf(self.cfs.claims, group.record(u64::MAX));
    }

    /// Deletes every job outcome and progress report of a work group (it is deleted).
    pub fn delete_job_records(&mut self, group: &GroupKeys) {
        for prefix in [&group.outcomes, &group.progress] {
            if !prefix.is_empty() {
                let key = |seq: u64| keys::claim_key(prefix, seq);
                self.wb.delete_range_cf(self.cfs.claims, key(0), key(u64::MAX));
                self.wb.delete_cf(self.cfs.claims, key(u64::MAX));
            }
        }
    }

    /// Deletes a work group's kept outcomes of jobs `from..=through` (one range tombstone).
    pub fn delete_outcomes_between(&mut self, group: &GroupKeys, from: u64, through: u64) {
        self.wb.delete_range_cf(
            self.cfs.claims,
            group.outcome(from),
            group.outcome(through.saturating_add(1)),
        );
    }

    /// Deletes a work group's progress reports on jobs `from..=through` (one range tombstone).
    pub fn delete_progress_between(&mut self, group: &GroupKeys, from: u64, through: u64) {
        self.wb.delete_range_cf(
            self.cfs.claims,
            group.progress(from),
            group.progress(through.saturating_add(1)),
        );
    }

    /// Writes a work group's latest progress report on job `seq`.
    pub fn put_progress(&mut self, group: &GroupKeys, seq: u64, value: &[u8]) {
        self.wb.put_cf(self.cfs.claims, group.progress(seq), super::outcomes::encode_progress(value));
    }

    /// Deletes a work group's progress report on job `seq`.
    pub fn delete_progress(&mut self, group: &GroupKeys, seq: u64) {
        self.wb.delete_cf(self.cfs.claims, group.progress(seq));
    }

    /// Writes a work group's outcome of job `seq`.
    pub fn put_outcome(&mut self, group: &GroupKeys, seq: u64, outcome: &crate::stats::JobOutcome) {
        self.wb.put_cf(self.cfs.claims, group.outcome(seq), super::outcomes::encode_outcome(outcome));
    }

    /// Deletes a work group's outcome of job `seq`.
    pub fn delete_outcome(&mut self, group: &GroupKeys, seq: u64) {
        self.wb.delete_cf(self.cfs.claims, group.outcome(seq));
    }

    /// The outcome of job `seq` as last written (not this batch's own entries).
    pub fn outcome(
        &self,
        group: &GroupKeys,
        seq: u64,
    ) -> Result<Option<crate::stats::JobOutcome>, ReadError> {
        let key = group.outcome(seq);
        match self.db.get_pinned_cf(self.cfs.claims, &key).map_err(storage)? {
            None => Ok(None),
            Some(v) => Ok(Some(super::outcomes::decode_outcome(&key, &v)?)),
        }
    }

    /// Writes a rate-limited work group's bucket (with the claims it admitted).
    pub fn put_rate(&mut self, group: &str, queue: &str, tat_micros: u64) {
        self.wb.put_cf(self.cfs.claims, keys::rate_key(group, queue), records::encode_rate(tat_micros));
    }

    /// Deletes a work group's rate bucket (its rate limit was removed).
    pub fn delete_rate(&mut self, group: &str, queue: &str) {
        self.wb.delete_cf(self.cfs.claims, keys::rate_key(group, queue));
    }

    /// Writes the settings of `group` on `queue`.
    pub fn put_settings(&mut self, group: &str, queue: &str, settings: &GroupSettings) {
        self.wb.put_cf(self.cfs.meta, keys::group_key(group, queue), records::encode_settings(settings));
    }

    /// Writes how far dead-letter queue `dlq` has been redriven.
    pub fn put_cursor(&mut self, dlq: &str, last: u64) {
        self.wb.put_cf(self.cfs.meta, keys::redrive_key(dlq), records::encode_cursor(last));
    }

    /// Marks dead letter `seq` of `dlq` as settled on its own (see `keys::letter_key`).
    pub fn put_letter_mark(&mut self, dlq: &str, seq: u64) {
        self.wb.put_cf(self.cfs.meta, keys::letter_key(dlq, seq), []);
    }

    /// Deletes the letter marks of `dlq` up to `through`: the cursor passed them.
    pub fn delete_letter_marks_through(&mut self, dlq: &str, through: u64) {
        let (lo, _) = keys::letter_range(dlq);
        self.wb.delete_range_cf(self.cfs.meta, lo, keys::letter_key(dlq, through.saturating_add(1)));
        if through == u64::MAX {
            self.wb.delete_cf(self.cfs.meta, keys::letter_key(dlq, u64::MAX));
        }
    }

    /// The letter marks of `dlq` as stored.
    pub fn letter_marks(&self, dlq: &str) -> Result<std::collections::BTreeSet<u64>, ReadError> {
        super::read::letter_marks_in(self.db, self.cfs.meta, dlq)
    }

    /// The stored envelope of message `seq` of queue `queue_id`, if present.
    pub fn message(&self, queue_id: u32, seq: u64) -> Result<Option<Vec<u8>>, StorageError> {
        self.db.get_cf(self.cfs.messages, keys::message_key(queue_id, seq)).map_err(storage)
    }

    /// The settings record of `group` on `queue`, if any.
    pub fn settings(&self, group: &str, queue: &str) -> Result<Option<GroupSettings>, ReadError> {
        let key = keys::group_key(group, queue);
        match self.db.get_cf(self.cfs.meta, &key).map_err(storage)? {
            Some(v) => Ok(Some(records::decode_settings(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// How far dead-letter queue `dlq` has been redriven (`None`: never).
    pub fn cursor(&self, dlq: &str) -> Result<Option<u64>, ReadError> {
        let key = keys::redrive_key(dlq);
        match self.db.get_cf(self.cfs.meta, &key).map_err(storage)? {
            Some(v) => Ok(Some(records::decode_cursor(&key, &v)?)),
            None => Ok(None),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.wb.is_empty()
    }

    /// Bytes the batch holds (sizes the next round's batch).
    pub fn size_in_bytes(&self) -> usize {
        self.wb.size_in_bytes()
    }

    /// Applies the batch atomically: one WAL append (fsynced first under a syncing `mode`).
    pub fn write(self, mode: &WriteMode) -> Result<(), StorageError> {
        crate::faults::check("rockq-writer-write")?;
        self.db.write_opt(self.wb, &mode.0).map_err(storage)
    }
}

/// Whether a batch's write fsyncs the WAL itself. Made once by the writer, not per round.
pub(crate) struct WriteMode(WriteOptions);

impl WriteMode {
    pub fn new(sync: bool) -> Self {
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
        WriteMode(opts)
    }
}
