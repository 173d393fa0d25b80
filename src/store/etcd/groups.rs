//! Deleting a group on etcd (`Broker::delete_group`), and the watch that tells every process.
//!
//! A group is its offset record `o/`, an ordered group's owner key `own/` and delivery marks
//! `k/`, a work group's claims `c/` (its reset mark among them), settings `g/`, kept outcomes
//! and progress reports `j/`: one transaction deletes them all. What a process that has not
//! heard of it yet writes next is refused by the compares every group write carries — a claim
//! or an offset move compares the offset record's value (which fails on a missing key), an
//! ordered commit its owner key — so nothing of the group comes back. Offset records are deleted
//! by nothing else, so a watch of their deletions alone (filtered on etcd's side: offset moves
//! do not travel) is how every process learns it.

use etcd_client::{DeleteOptions, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions};

use super::{EtcdStore, WatchedKind, corrupt};
use crate::error::StorageError;
use crate::store::keys;

impl EtcdStore {
    /// Deletes group `group` on `queue` (either mode) with everything of it, in one transaction.
    /// Returns whether there was such a group (an offset or a settings record).
    pub async fn delete_group(&self, group: &str, queue: &str) -> Result<bool, StorageError> {
        let prefix = || Some(DeleteOptions::new().with_prefix());
        let ops = vec![
            TxnOp::delete(self.offset_key(group, queue), None),
            TxnOp::delete(self.settings_key(group, queue), None),
            TxnOp::delete(self.owner_key(group, queue), None),
            TxnOp::delete(self.mark_prefix(group, queue), prefix()),
            TxnOp::delete(self.claims_prefix(group, queue), prefix()),
            TxnOp::delete(self.key(b"j/", &keys::outcome_prefix(group, queue)), prefix()),
            TxnOp::delete(self.key(b"j/", &keys::progress_prefix(group, queue)), prefix()),
        ];
        let resp = self.kv().txn(etcd_client::Txn::new().and_then(ops)).await?;
        let deleted: Vec<i64> = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Delete(d) => d.deleted(),
                _ => 0,
            })
            .collect();
        // The offset or the settings record: a group exists once either is written.
        Ok(deleted.iter().take(2).any(|&n| n > 0))
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
            WatchedKind::Delete => {
                let key = kv.key().get(strip..).unwrap_or_default();
                let (group, queue) = keys::parse_offset_key(key).map_err(corrupt)?;
                Ok(Some((group.to_owned(), queue.to_owned(), kv.mod_revision())))
            }
        };
        self.watch_events(prefix, opts, decode).await
    }
}
