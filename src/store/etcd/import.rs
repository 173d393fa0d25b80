//! Import of an export file into an empty etcd namespace.
//!
//! The namespace is taken first with an import mark (`N meta/importing`), written only if the
//! namespace holds nothing (no format record, no queue id); while the mark is there,
//! connecting to the namespace is refused. The lines, checked by `import_check.rs`, are
//! written in transactions of up to 127 puts and 1 MiB, each compared with the mark's
//! revision (an import whose namespace was cleared under it stops). At the end one transaction
//! writes the queue-id counter and the format record and deletes the mark: the namespace
//! appears whole. An import that fails deletes everything under the namespace (it was empty
//! before), so nothing is left; an import stopped by a crash leaves the mark, which the next
//! import clears (and `connect_etcd` names).
//!
//! A prioritised message's index entry is rebuilt from its envelope, as an embedded import
//! does. A rate limit's bucket is not in the file: it starts full.
//! Keyspace entries are written with etcd's own revisions (an etcd key's `mod_revision` is
//! the revision of the transaction that wrote it: the file's revisions cannot be kept); their
//! keys and values are kept.
//! Delayed messages and recurring schedules' pending firings are imported with both their
//! records, and the schedule-id counter is written past every id the file names.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};

use super::{EtcdStore, MAX_TXN_BYTES, MAX_TXN_OPS, encode_tail};
use crate::error::{Error, StorageError};
use crate::store::import_check::Write;
use crate::store::{keys, records};

/// What an import into etcd holds between batches.
pub(crate) struct EtcdImport {
    /// The import mark's `mod_revision`: every write compares it.
    mark_rev: i64,
    /// The next queue id to hand out (the counter written at the end).
    next_queue_id: u32,
    /// The next schedule id to hand out (the counter written at the end).
    next_scheduled_id: u64,
    /// The next keyspace id to hand out (the counter written at the end).
    next_keyspace_id: u32,
    /// Leases of idempotency records, by the whole minute they run out at.
    leases: HashMap<u64, i64>,
    now_micros: u64,
    ops: Vec<TxnOp>,
    bytes: usize,
}

impl EtcdStore {
    /// Whether an import into this namespace has not finished (its mark is there).
    async fn import_unfinished(&self) -> Result<bool, StorageError> {
        let got = self.kv().get(self.import_mark_key(), Some(GetOptions::new().with_count_only())).await?;
        Ok(got.count() > 0)
    }

    /// Takes the namespace for an import: it must hold nothing of rockq's (a stopped import's
    /// leftovers are cleared first).
    pub(crate) async fn begin_import(&self, now_micros: u64) -> Result<EtcdImport, Error> {
        let mark = self.import_mark_key();
        if self.import_unfinished().await? {
            self.clear_namespace().await?;
        }
        let all = self
            .kv()
            .get(self.key(b"", b""), Some(GetOptions::new().with_prefix().with_count_only()))
            .await?;
        if all.count() > 0 {
            return Err(Error::Invalid {
                reason: format!("{} is not empty: an import writes into an empty namespace", self.label),
            });
        }
        let txn = Txn::new()
            .when([
                Compare::version(self.format_key(), CompareOp::Equal, 0),
                Compare::version(self.next_id_key(), CompareOp::Equal, 0),
                Compare::version(mark.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(mark, b"rockq import".to_vec(), None)]);
        let resp = self.kv().txn(txn).await?;
        if !resp.succeeded() {
            return Err(Error::Invalid {
                reason: format!(
                    "{} was written meanwhile: an import writes into an empty namespace",
                    self.label
                ),
            });
        }
        let mark_rev = resp.header().map_or(0, |h| h.revision());
        Ok(EtcdImport {
            mark_rev,
            next_queue_id: 1,
            next_scheduled_id: 1,
            next_keyspace_id: 1,
            leases: HashMap::new(),
            now_micros,
            ops: Vec::new(),
            bytes: 0,
        })
    }

    /// Deletes everything under the namespace (an import that failed, or a stopped one's
    /// leftovers: the namespace was empty before it).
    pub(crate) async fn clear_namespace(&self) -> Result<(), StorageError> {
        let txn = Txn::new()
            .and_then([TxnOp::delete(self.key(b"", b""), Some(DeleteOptions::new().with_prefix()))]);
        self.kv().txn(txn).await.map(|_| ())
    }

    /// Adds one checked line to the import, writing a transaction when one is full.
    /// (`never_fires` first: what etcd could never fire is refused, not written.)
    pub(crate) async fn import_write(&self, imp: &mut EtcdImport, w: Write) -> Result<(), Error> {
        let (key, value, lease) = match w {
            Write::Queue { name, meta, last_seq } => {
                imp.next_queue_id = imp.next_queue_id.max(meta.id + 1);
                self.import_put(imp, self.tail_key(meta.id), encode_tail(last_seq, 0), None).await?;
                (self.queue_key(&name), records::encode_queue(&meta).to_vec(), None)
            }
            Write::Message { qid, seq, envelope } => {
                // Its index entry, rebuilt from the envelope as an embedded import does.
                let priority = crate::store::envelope::priority(&envelope);
                if priority > 0 {
                    self.import_put(imp, self.priority_key(qid, seq), vec![priority], None).await?;
                }
                (self.message_key(qid, seq), envelope, None)
            }
            Write::Group { group, queue, record } => {
                (self.key(b"g/", &keys::group_key(&group, &queue)), record, None)
            }
            Write::Offset { group, queue, record } => (self.offset_key(&group, &queue), record, None),
            Write::Claim { group, queue, seq, record } => {
                (self.key(b"c/", &keys::claim_key(&keys::claim_prefix(&group, &queue), seq)), record, None)
            }
            Write::Delivery { group, queue, seq, record } => {
                (self.mark_key(&group, &queue, seq), record, None)
            }
            Write::Redrive { dlq, record } => (self.key(b"r/", &keys::redrive_key(&dlq)), record, None),
            Write::Dedup { qid, key, record, expires_micros } => {
                // Expired: it counts as absent already.
                if expires_micros <= imp.now_micros {
                    return Ok(());
                }
                let lease = self.import_lease(imp, expires_micros).await?;
                (self.dedup_key(qid, &key), record, Some(lease))
            }
            Write::ScheduledId(next) => {
                imp.next_scheduled_id = imp.next_scheduled_id.max(next);
                return Ok(());
            }
            Write::Delayed { qid, id, due_micros, envelope } => {
                imp.next_scheduled_id = imp.next_scheduled_id.max(id + 1);
                self.import_put(imp, self.due_key(due_micros, qid, id), Vec::new(), None).await?;
                (self.delayed_key(qid, id), super::delayed::encode_record(due_micros, &envelope), None)
            }
            Write::Schedule { name, record } => (self.key(b"w/", name.as_bytes()), record, None),
            Write::ScheduleDue { name, id, due_micros } => {
                imp.next_scheduled_id = imp.next_scheduled_id.max(id + 1);
                let (qid, entry) =
                    (keys::RECURRING, super::delayed::encode_record(due_micros, name.as_bytes()));
                self.import_put(imp, self.due_key(due_micros, qid, id), Vec::new(), None).await?;
                (self.delayed_key(qid, id), entry, None)
            }
            // Entries get etcd's revisions (the file's cannot be given to etcd keys).
            Write::Keyspace { name, id } => {
                imp.next_keyspace_id = imp.next_keyspace_id.max(id + 1);
                (self.keyspace_key(&name), super::kv::encode_keyspace(id), None)
            }
            Write::Entry { keyspace, key, value, .. } => {
                (self.entry_key(keyspace, &key), super::kv::encode_entry(&value), None)
            }
            Write::Letter { dlq, seq } => (self.key(b"r/", &keys::letter_key(&dlq, seq)), Vec::new(), None),
            // Kept as they are: the retention pass expires them on the broker's clock.
            Write::Outcome { group, queue, seq, record } => {
                (self.outcome_key(&group, &queue, seq), record, None)
            }
            Write::Progress { group, queue, seq, record } => {
                (self.progress_key(&group, &queue, seq), record, None)
            }
        };
        self.import_put(imp, key, value, lease).await
    }

    /// A lease for an idempotency record expiring at `expires_micros`: one per minute of
    /// expiry, running out at the end of that minute.
    async fn import_lease(&self, imp: &mut EtcdImport, expires_micros: u64) -> Result<i64, Error> {
        let minute = expires_micros.div_ceil(60_000_000);
        if let Some(lease) = imp.leases.get(&minute) {
            return Ok(*lease);
        }
        let ttl = Duration::from_micros((minute * 60_000_000).saturating_sub(imp.now_micros))
            + Duration::from_secs(1);
        let lease = self.grant_expiring(ttl).await?;
        imp.leases.insert(minute, lease);
        Ok(lease)
    }

    async fn import_put(
        &self,
        imp: &mut EtcdImport,
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<i64>,
    ) -> Result<(), Error> {
        let size = key.len() + value.len();
        if !imp.ops.is_empty() && (imp.ops.len() + 1 >= MAX_TXN_OPS || imp.bytes + size > MAX_TXN_BYTES) {
            self.import_flush(imp).await?;
        }
        imp.bytes += size;
        imp.ops.push(TxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l))));
        Ok(())
    }

    /// Writes what is gathered, compared with the import mark.
    async fn import_flush(&self, imp: &mut EtcdImport) -> Result<(), Error> {
        if imp.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut imp.ops);
        imp.bytes = 0;
        let txn = Txn::new()
            .when([Compare::mod_revision(self.import_mark_key(), CompareOp::Equal, imp.mark_rev)])
            .and_then(ops);
        if !self.kv().txn(txn).await?.succeeded() {
            return Err(StorageError::new("etcd: the import's namespace was changed under it").into());
        }
        Ok(())
    }

    /// Ends the import: the queue-id counter and the format record written, the mark
    /// deleted, in one transaction after the last batch.
    pub(crate) async fn finish_import(&self, mut imp: EtcdImport) -> Result<(), Error> {
        self.import_flush(&mut imp).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(self.import_mark_key(), CompareOp::Equal, imp.mark_rev)])
            .and_then([
                TxnOp::put(self.next_id_key(), imp.next_queue_id.to_be_bytes().to_vec(), None),
                TxnOp::put(
                    self.key(b"meta/", keys::SCHEDULED_ID_KEY),
                    imp.next_scheduled_id.to_be_bytes().to_vec(),
                    None,
                ),
                TxnOp::put(self.next_keyspace_id_key(), imp.next_keyspace_id.to_be_bytes().to_vec(), None),
                TxnOp::put(self.format_key(), super::segment::encode_format(), None),
                TxnOp::delete(self.import_mark_key(), None),
            ]);
        if !self.kv().txn(txn).await?.succeeded() {
            return Err(StorageError::new("etcd: the import's namespace was changed under it").into());
        }
        Ok(())
    }
}

/// Whether `w` is what the etcd engine could never store or fire: a message or a delayed
/// message larger than one transaction, or a recurring schedule's message over a quarter of
/// one (a firing carries the schedule's record and up to two sends of it). The embedded engine
/// takes all three (messages up to 64 MiB); a send, a submit or an upsert on etcd refuses them
/// (`HugeMessage`), and so does an import, rather than fail on etcd's request limit.
pub(crate) fn never_fires(w: &Write) -> bool {
    match w {
        Write::Message { envelope, .. } => envelope.len() > super::MAX_TXN_BYTES,
        Write::Delayed { envelope, .. } => envelope.len() > super::MAX_TXN_BYTES,
        Write::Schedule { name, record } => crate::store::scheduled::decode_schedule(name.as_bytes(), record)
            .is_ok_and(|r| r.envelope.len() > super::MAX_TXN_BYTES / 4),
        _ => false,
    }
}
