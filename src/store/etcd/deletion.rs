//! Deleting groups and queues on etcd (`Broker::delete_group`, `Broker::delete_queue`), and
//! the watch that tells every process of a deleted group (a deleted queue travels with the
//! namespace watch: `retention.rs`).
//!
//! A group is its offset record `o/`, an ordered group's owner key `own/` and delivery marks
//! `k/`, a work group's claims `c/` (its reset mark among them), settings `g/`, kept outcomes
//! and progress reports `j/`: one transaction deletes them all. What a process that has not
//! heard of it yet writes next is refused by the compares every group write carries — a claim
//! or an offset move compares the offset record's value (which fails on a missing key), an
//! ordered commit its owner key — so nothing of the group comes back. Offset records are deleted
//! by nothing else, so a watch of their deletions alone (filtered on etcd's side: offset moves
//! do not travel) is how every process learns it.
//!
//! A queue is its record `q/<name>`, tail `t/`, purge mark `s/`, reservation `p/`, messages
//! `m/` with their priority index entries `sp/`, idempotency keys `d/` and delayed messages
//! `x/` (all under its id), its redrive cursor and letter marks `r/`, and every group on it:
//! one transaction deletes them all, compared with the queue record as read and with no group
//! made anywhere since (a group of the old
//! queue left behind would be taken up by a new queue of the name). What a process that has
//! not heard of it appends next is refused: every append compares the tail's value. The due
//! entries `sd/` of its delayed messages are left to the firing, which drops an entry whose
//! record is gone.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};

use super::delayed::Marked;
use super::{EtcdStore, WatchedKind, corrupt};
use crate::error::StorageError;
use crate::store::keys;

/// Groups deleted in a queue's own transaction; beyond them, the caller deletes groups first
/// (10 operations for the queue, 7 per group, within etcd's 128).
pub(crate) const QUEUE_DELETE_GROUPS: usize = 16;

/// A queue deletion as planned from one read ([`EtcdStore::delete_queue`]).
pub(crate) struct QueueDeletion<'a> {
    pub name: &'a str,
    pub qid: u32,
    /// The queue record's `mod_revision` as read.
    pub queue_rev: i64,
    /// The revision its groups were read at.
    pub read_at: i64,
    /// Its groups: each with an offset or a settings record.
    pub groups: &'a [String],
}

fn prefix() -> Option<DeleteOptions> {
    Some(DeleteOptions::new().with_prefix())
}

impl EtcdStore {
    /// Deletes group `group` on `queue` (either mode) with everything of it, in one transaction,
    /// which also puts the call's marker (if `marked`) if there was such a group. Returns
    /// whether there was (an offset or a settings record), and the deletion's revision.
    pub async fn delete_group(
        &self,
        group: &str,
        queue: &str,
        marked: Option<Marked>,
    ) -> Result<(bool, i64), StorageError> {
        // `If offset exists Then (deletes, marker) Else (If settings exist Then (deletes,
        // marker) Else deletes)`: a group exists once either record is written, and etcd has no
        // "or" of compares. The marker says, after a lost answer, whether this call found it.
        let exists = |key: Vec<u8>| Compare::version(key, CompareOp::Greater, 0);
        let found = || {
            let mut ops = self.group_deletes(group, queue);
            self.push_marker(marked, &mut ops);
            ops
        };
        let by_settings = Txn::new()
            .when([exists(self.settings_key(group, queue))])
            .and_then(found())
            .or_else(self.group_deletes(group, queue));
        let txn = Txn::new()
            .when([exists(self.offset_key(group, queue))])
            .and_then(found())
            .or_else([TxnOp::txn(by_settings)]);
        let resp = self.kv().txn(txn).await?;
        crate::faults::check("rockq-etcd-group-delete-answer")?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let existed = resp.succeeded()
            || resp.op_responses().into_iter().any(|r| matches!(r, TxnOpResponse::Txn(t) if t.succeeded()));
        Ok((existed, rev))
    }

    /// The deletions of everything of group `group` on `queue`.
    fn group_deletes(&self, group: &str, queue: &str) -> Vec<TxnOp> {
        vec![
            TxnOp::delete(self.offset_key(group, queue), None),
            TxnOp::delete(self.settings_key(group, queue), None),
            TxnOp::delete(self.owner_key(group, queue), None),
            TxnOp::delete(self.mark_prefix(group, queue), prefix()),
            TxnOp::delete(self.claims_prefix(group, queue), prefix()),
            TxnOp::delete(self.key(b"j/", &keys::outcome_prefix(group, queue)), prefix()),
            TxnOp::delete(self.key(b"j/", &keys::progress_prefix(group, queue)), prefix()),
        ]
    }

    /// Deletes queue `d.name` with everything of it, groups included, if its record is still
    /// the one read and no group was made since `d.read_at`: the deletion's revision; `None`:
    /// nothing written, read again. The caller keeps it within one transaction (`QUEUE_DELETE_GROUPS`).
    pub async fn delete_queue(&self, d: &QueueDeletion<'_>) -> Result<Option<i64>, StorageError> {
        let (name, qid) = (d.name, d.qid.to_be_bytes());
        let not_since = |kind: &[u8]| {
            Compare::create_revision(self.key(kind, b""), CompareOp::Less, d.read_at + 1).with_prefix()
        };
        let cmps = vec![
            Compare::mod_revision(self.queue_key(name), CompareOp::Equal, d.queue_rev),
            not_since(b"o/"),
            not_since(b"g/"),
        ];
        let mut ops = vec![
            TxnOp::delete(self.queue_key(name), None),
            TxnOp::delete(self.tail_key(d.qid), None),
            TxnOp::delete(self.purge_key(d.qid), None),
            TxnOp::delete(self.key(b"p/", &qid), None),
            TxnOp::delete(self.key(b"m/", &qid), prefix()),
            TxnOp::delete(self.key(b"sp/", &qid), prefix()),
            TxnOp::delete(self.key(b"d/", &qid), prefix()),
            TxnOp::delete(self.key(b"x/", &qid), prefix()),
            TxnOp::delete(self.key(b"r/", &keys::redrive_key(name)), None),
            TxnOp::delete(self.key(b"r/", &keys::letter_range(name).0), prefix()),
        ];
        for g in d.groups {
            ops.extend(self.group_deletes(g, name));
        }
        if ops.len() > super::MAX_TXN_OPS {
            return Err(StorageError::new(format!(
                "a queue deletion of {} operations exceeds etcd's {} per transaction",
                ops.len(),
                super::MAX_TXN_OPS
            )));
        }
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops)).await?;
        crate::faults::reached("rockq-etcd-queue-delete-landed");
        crate::faults::check("rockq-etcd-queue-delete-answer")?;
        Ok(resp.succeeded().then(|| resp.header().map_or(0, |h| h.revision())))
    }

    /// Follows the deletion of every group in the namespace from after `revision`: each
    /// batch names the groups deleted, `(group, queue, revision)`.
    pub async fn watch_group_deletions(
        &self,
        revision: i64,
    ) -> Result<
        impl futures::Stream<Item = Result<Vec<(String, String, i64)>, StorageError>> + use<>,
        StorageError,
    > {
        let prefix = self.key(b"o/", b"");
        let strip = prefix.len();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoPut]);
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Put => Ok(None),
            WatchedKind::Delete { .. } => {
                let key = kv.key().get(strip..).unwrap_or_default();
                let (group, queue) = keys::parse_offset_key(key).map_err(corrupt)?;
                Ok(Some((group.to_owned(), queue.to_owned(), kv.mod_revision())))
            }
        };
        self.watch_events(prefix, opts, decode).await
    }
}
