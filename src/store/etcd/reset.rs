//! Group resets in etcd: one transaction that moves a group's offset anywhere in the retained
//! range (backwards too) and forgets what the group's records said about the old position;
//! and a purge's move of an idle ordered group's offset.
//!
//! Offsets otherwise only move forward on etcd, and every process's writes lean on that (a work
//! group's offset move is `If offset < new`). A reset therefore also writes what the others
//! compare:
//!
//! - the **queue record**, put back unchanged: its `mod_revision` moves, so a trim planned
//!   from the old offset (every trim compares the queue record) writes nothing and plans again;
//! - for a work group, the **reset mark** `N c/claim:<group>:<queue>:<u64::MAX>` (the new
//!   offset), inside the claim prefix so that every process's claim watch sees it in the same
//!   revision as the deleted claims; every offset move and every claim of new leases compares
//!   its `mod_revision` with the one its process last learned, so a process that has not seen
//!   the reset yet can neither move the offset over messages the reset gave back nor claim
//!   them as if they were never claimed.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};

use super::delayed::Marked;
use super::{EtcdStore, corrupt, decode_envelope, first_get, two_gets};
use crate::error::StorageError;
use crate::model::{GroupMode, GroupOffset, QueueMeta};
use crate::store::{keys, records};

/// The sequence of a work group's reset mark: past any message a queue can hold.
pub(crate) const RESET_MARK_SEQ: u64 = u64::MAX;

/// Who may be holding an ordered group while it is reset.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OwnerCheck<'a> {
    /// Nobody: the group's owner key must not exist.
    Nobody,
    /// This process (`owner`), whose last subscription is being released.
    This(&'a [u8]),
}

/// What a reset found in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResetOutcome {
    /// Written at this revision.
    Done { rev: i64 },
    /// An ordered group is owned by a subscriber (the owner id found): nothing written.
    Owned(Vec<u8>),
    /// The queue record, or a work group's claim records, changed since they were read:
    /// nothing written; read again.
    Moved,
    /// The group's offset record is gone.
    NoGroup,
}

impl EtcdStore {
    /// The key of work group `group`'s reset mark on `queue`.
    pub(super) fn reset_mark_key(&self, group: &str, queue: &str) -> Vec<u8> {
        keys::claim_key(&self.claims_prefix(group, queue), RESET_MARK_SEQ)
    }

    /// Resets ordered group `group` on `queue` to `offset`: the offset is written and every
    /// mark deleted, with the call's marker, if the group is held by `owner` as given and the
    /// queue record is still at `queue_rev` (what the caller checked `offset` against).
    pub async fn reset_ordered(
        &self,
        group: &str,
        queue: &str,
        owner: OwnerCheck<'_>,
        (meta, queue_rev): (&QueueMeta, i64),
        offset: u64,
        marked: Marked,
    ) -> Result<ResetOutcome, StorageError> {
        let owner_key = self.owner_key(group, queue);
        let owner_cmp = match owner {
            OwnerCheck::Nobody => Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0),
            OwnerCheck::This(id) => Compare::value(owner_key.clone(), CompareOp::Equal, id.to_vec()),
        };
        let prefix = self.mark_prefix(group, queue);
        let mut ops = vec![
            TxnOp::put(self.offset_key(group, queue), offset_record(GroupMode::Ordered, offset), None),
            TxnOp::delete(prefix, Some(DeleteOptions::new().with_prefix())),
            TxnOp::put(self.queue_key(queue), records::encode_queue(meta).to_vec(), None),
        ];
        self.push_marker(Some(marked), &mut ops);
        let cmps = vec![
            owner_cmp,
            Compare::mod_revision(self.queue_key(queue), CompareOp::Equal, queue_rev),
            Compare::version(self.offset_key(group, queue), CompareOp::Greater, 0),
        ];
        let txn = Txn::new()
            .when(cmps)
            .and_then(ops)
            .or_else([TxnOp::get(self.offset_key(group, queue), None), TxnOp::get(owner_key, None)]);
        let resp = self.kv().txn(txn).await?;
        crate::faults::reached("rockq-etcd-reset-landed");
        crate::faults::check("rockq-etcd-reset-answer")?;
        if resp.succeeded() {
            return Ok(ResetOutcome::Done { rev: revision(&resp) });
        }
        let (offset_rec, owner_rec) = two_gets(&resp);
        Ok(match (offset_rec, owner_rec, owner) {
            (None, ..) => ResetOutcome::NoGroup,
            (Some(_), Some(o), OwnerCheck::Nobody) => ResetOutcome::Owned(o.value().to_vec()),
            (Some(_), Some(o), OwnerCheck::This(id)) if o.value() != id => {
                ResetOutcome::Owned(o.value().to_vec())
            }
            // The queue record moved, or this process's release ended meanwhile.
            _ => ResetOutcome::Moved,
        })
    }

    /// Resets work group `group` on `queue` to `offset`: every claim record goes, the offset is
    /// written and the reset mark put, with the call's marker, if no claim record changed since
    /// revision `read_at` (the caller found no live lease among them) and the queue record is
    /// still at `queue_rev`.
    pub async fn reset_work(
        &self,
        group: &str,
        queue: &str,
        read_at: i64,
        (meta, queue_rev): (&QueueMeta, i64),
        offset: u64,
        marked: Marked,
    ) -> Result<ResetOutcome, StorageError> {
        let prefix = self.claims_prefix(group, queue);
        let mark = self.reset_mark_key(group, queue);
        let cmps = vec![
            // Every key of the prefix, the reset mark included: a claim written since the
            // caller looked (a lease it did not see), or another reset.
            Compare::mod_revision(prefix.clone(), CompareOp::Less, read_at + 1).with_prefix(),
            Compare::mod_revision(self.queue_key(queue), CompareOp::Equal, queue_rev),
            Compare::version(self.offset_key(group, queue), CompareOp::Greater, 0),
        ];
        let mut ops = vec![
            TxnOp::delete(keys::claim_key(&prefix, 0), Some(DeleteOptions::new().with_range(mark.clone()))),
            TxnOp::put(self.offset_key(group, queue), offset_record(GroupMode::WorkQueue, offset), None),
            TxnOp::put(mark, offset_record(GroupMode::WorkQueue, offset), None),
            TxnOp::put(self.queue_key(queue), records::encode_queue(meta).to_vec(), None),
            // Kept outcomes of the jobs that run again go (an old outcome must not make a
            // queued job read as finished); those at or below the new offset stay.
            self.delete_outcomes_after(group, queue, offset),
            // Progress goes with the claims (a reset forgets attempts).
            self.delete_progress_between(group, queue, 0, u64::MAX),
        ];
        self.push_marker(Some(marked), &mut ops);
        let txn =
            Txn::new().when(cmps).and_then(ops).or_else([TxnOp::get(self.offset_key(group, queue), None)]);
        let resp = self.kv().txn(txn).await?;
        crate::faults::reached("rockq-etcd-reset-landed");
        crate::faults::check("rockq-etcd-reset-answer")?;
        if resp.succeeded() {
            return Ok(ResetOutcome::Done { rev: revision(&resp) });
        }
        Ok(match first_get(&resp) {
            None => ResetOutcome::NoGroup,
            Some(_) => ResetOutcome::Moved,
        })
    }

    /// Moves ordered group `group`'s offset on `queue` forward to `to` if nobody owns the group
    /// (an owner moves its own offset: a purge's range is skipped by its subscription). Returns
    /// whether it moved.
    pub async fn move_idle_ordered(&self, group: &str, queue: &str, to: u64) -> Result<bool, StorageError> {
        let key = self.offset_key(group, queue);
        let rec = offset_record(GroupMode::Ordered, to);
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.owner_key(group, queue), CompareOp::Equal, 0),
                Compare::value(key.clone(), CompareOp::Less, rec.clone()),
            ])
            .and_then([TxnOp::put(key, rec, None)]);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// When message `seq` of queue `qid` was enqueued (micros since the epoch), if it is stored.
    pub async fn enqueued_at(&self, qid: u32, seq: u64) -> Result<Option<u64>, StorageError> {
        self.message_at(qid, seq)
            .await?
            .map(|(env, _)| decode_envelope(qid, seq, &env).map(|e| e.enqueued_at_micros).map_err(corrupt))
            .transpose()
    }
}

/// The new offset (and a work group's reset mark, which holds the same record).
fn offset_record(mode: GroupMode, committed: u64) -> Vec<u8> {
    records::encode_offset(&GroupOffset { mode, committed }).to_vec()
}

/// The revision a transaction was applied at.
fn revision(resp: &etcd_client::TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}
