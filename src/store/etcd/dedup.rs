//! Idempotency keys in etcd: `N d/<qid u32><key>` holds a key's dedup record (the RocksDB
//! codec: the original's sequence and when the key expires). The record is written in the
//! append transaction of its message, compared with the `mod_revision` the writer read it at
//! (0: none). Two processes appending the same key at once are already ordered by the append's
//! compare on the queue's tail; the record's own compare keeps "exactly one" true should a
//! record ever be written without moving the tail (a delayed message's). The loser reads the
//! record again and reports a duplicate.
//!
//! Expiry: a record whose `expires_micros` passed counts as absent (a new message with its key
//! overwrites it, compared likewise). Records are attached to an etcd lease that outlives
//! every record written under it (the window plus the lease's bucket), so etcd deletes them
//! after they expired: no pass has to find them.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{DedupWrite, EtcdStore, corrupt};
use crate::error::StorageError;
use crate::model::DedupRecord;
use crate::sent::Original;
use crate::store::scheduled::{decode_dedup, encode_dedup};

/// A key's record as read: the record and its `mod_revision`.
pub(crate) type DedupFound = Option<(DedupRecord, i64)>;

impl EtcdStore {
    pub(super) fn dedup_key(&self, qid: u32, key: &str) -> Vec<u8> {
        let mut rest = qid.to_be_bytes().to_vec();
        rest.extend_from_slice(key.as_bytes());
        self.key(b"d/", &rest)
    }

    /// The records of `keys` of queue `qid`, in order (at most one transaction's worth).
    pub async fn dedup_records(&self, qid: u32, keys: &[&str]) -> Result<Vec<DedupFound>, StorageError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(super::MAX_TXN_OPS) {
            let gets: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(self.dedup_key(qid, k), None)).collect();
            let resp = self.kv().txn(Txn::new().and_then(gets)).await?;
            for r in resp.op_responses() {
                let found = match r {
                    etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                        decode_dedup(kv.key(), kv.value()).map(|d| (d, kv.mod_revision())).map_err(corrupt)
                    }),
                    _ => None,
                };
                out.push(found.transpose()?);
            }
        }
        Ok(out)
    }

    /// A lease that runs out after `ttl` (never kept alive): the dedup records written under it
    /// go with it.
    pub async fn grant_expiring(&self, ttl: Duration) -> Result<i64, StorageError> {
        let secs = ttl.as_secs().max(1) as i64;
        Ok(self.members.run(false, |c| async move { c.lease_client().grant(secs, None).await }).await?.id())
    }

    /// Adds the dedup records of an append at `first` to its transaction.
    pub(super) fn push_dedup(
        &self,
        qid: u32,
        first: u64,
        dedup: &[DedupWrite],
        lease: i64,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) {
        for d in dedup {
            let key = self.dedup_key(qid, &d.key);
            cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, d.expected));
            let record = DedupRecord {
                original: d.scheduled.map_or(Original::Appended(first + d.index as u64), Original::Scheduled),
                expires_micros: d.expires_micros,
            };
            ops.push(TxnOp::put(
                key,
                encode_dedup(&record).to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            ));
        }
    }
}
