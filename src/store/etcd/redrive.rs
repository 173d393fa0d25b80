//! Redriving dead letters in etcd: the cursor `N r/redrive:<dlq>` (same codec as RocksDB's) and
//! the transaction that appends a batch of dead letters to their target queues and moves the
//! cursor, compared with the cursor's revision and each target's tail.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{DeadLetterAppend, EtcdStore, corrupt, decode_tail};
use crate::error::StorageError;
use crate::store::{keys, records};

/// What became of [`EtcdStore::redrive`].
#[derive(Debug)]
pub(crate) enum RedriveOutcome {
    /// Appended, and the cursor moved, at revision `rev`.
    Done { rev: i64 },
    /// Nothing written: the cursor as it is now (value, revision) and each target's tail.
    Refused { cursor: (u64, i64), tails: Vec<Option<(u64, u64)>> },
}

impl EtcdStore {
    fn cursor_key(&self, dlq: &str) -> Vec<u8> {
        self.key(b"r/", &keys::redrive_key(dlq))
    }

    /// The redrive cursor of `dlq` and its `mod_revision` (`(0, 0)`: never redriven).
    pub async fn cursor(&self, dlq: &str) -> Result<(u64, i64), StorageError> {
        let got = self.kv().get(self.cursor_key(dlq), None).await?;
        match got.kvs().first() {
            Some(kv) => {
                Ok((records::decode_cursor(kv.key(), kv.value()).map_err(corrupt)?, kv.mod_revision()))
            }
            None => Ok((0, 0)),
        }
    }

    /// Appends each of `appends` (to its queue, compared with its tail as an append is) and
    /// sets `dlq`'s cursor to `to`, if the cursor's `mod_revision` is still `cursor_rev`.
    pub async fn redrive(
        &self,
        dlq: &str,
        cursor_rev: i64,
        to: u64,
        appends: &[DeadLetterAppend],
    ) -> Result<RedriveOutcome, StorageError> {
        let cursor = self.cursor_key(dlq);
        let mut cmps = vec![Compare::mod_revision(cursor.clone(), CompareOp::Equal, cursor_rev)];
        let mut ops = Vec::new();
        let mut gets = vec![TxnOp::get(cursor.clone(), None)];
        for a in appends {
            let tail = self.push_append(a, &mut cmps, &mut ops);
            gets.push(TxnOp::get(tail, None));
        }
        ops.push(TxnOp::put(cursor, records::encode_cursor(to).to_vec(), None));
        if ops.len() > super::MAX_TXN_OPS || cmps.len() > super::MAX_TXN_OPS {
            return Err(StorageError::new(format!(
                "a redrive batch of {} operations exceeds etcd's {} per transaction",
                ops.len(),
                super::MAX_TXN_OPS
            )));
        }
        let resp = self.kv().txn(Txn::new().when(cmps).and_then(ops).or_else(gets)).await?;
        if resp.succeeded() {
            return Ok(RedriveOutcome::Done { rev: resp.header().map_or(0, |h| h.revision()) });
        }
        let mut answers = resp.op_responses().into_iter().filter_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Some(g.kvs().first().cloned()),
            _ => None,
        });
        let cursor = match answers.next().flatten() {
            Some(kv) => (records::decode_cursor(kv.key(), kv.value()).map_err(corrupt)?, kv.mod_revision()),
            None => (0, 0),
        };
        let mut tails = Vec::with_capacity(appends.len());
        for _ in appends {
            tails.push(match answers.next().flatten() {
                Some(t) => Some(decode_tail(t.key(), t.value())?),
                None => None,
            });
        }
        Ok(RedriveOutcome::Refused { cursor, tails })
    }
}
