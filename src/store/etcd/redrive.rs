//! Redriving dead letters in etcd: the cursor `N r/redrive:<dlq>` (same codec as RocksDB's),
//! the letter marks `N r/letter:<dlq>:<seq>` (dead letters above the cursor settled on their
//! own, as RocksDB's `letter:` keys), the transaction that appends a batch of dead letters to
//! their target queues and moves the cursor, and the one that settles a single letter. Both are
//! compared with the cursor's revision and each target's tail.
//!
//! **Every write of either kind rewrites the cursor**, even a settle that only adds a mark (the
//! cursor then keeps its value): the cursor's `mod_revision` fences the marks too, so a redrive
//! or settle decided on marks another process changed meanwhile is refused, not applied over
//! them. Marks the cursor passes are deleted in the same transaction.

use std::collections::BTreeSet;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};

use super::{DeadLetterAppend, EtcdStore, corrupt, decode_tail};
use crate::error::StorageError;
use crate::store::{keys, records};

/// Marks read per request.
const PAGE: i64 = 1024;

/// One dead letter settled on its own ([`EtcdStore::settle_letter`]).
pub(crate) struct SettleLetter {
    /// Its sequence in the dead-letter queue.
    pub seq: u64,
    /// The cursor as it is (rewritten unchanged when the letter is only marked).
    pub cursor: u64,
    /// `Some`: the letter is the next one; the cursor moves here (over it and the marked
    /// letters right after it).
    pub cursor_to: Option<u64>,
    /// Its copy, for a redrive; `None` for a delete.
    pub copy: Option<DeadLetterAppend>,
    /// The flow step the copy queues again, if the letter is one's (`flows.rs`).
    pub flow: Option<super::flows::FlowChangeWrite>,
}

/// What became of [`EtcdStore::redrive`] and [`EtcdStore::settle_letter`].
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

    fn letter_key(&self, dlq: &str, seq: u64) -> Vec<u8> {
        self.key(b"r/", &keys::letter_key(dlq, seq))
    }

    /// Deletes the marks of `dlq` up to `through` (the cursor covers them now).
    fn delete_marks_through(&self, dlq: &str, through: u64) -> TxnOp {
        let end = match through.checked_add(1) {
            Some(next) => self.letter_key(dlq, next),
            // Through the last possible mark: to the end of this queue's marks.
            None => self.key(b"r/", &keys::letter_range(dlq).1),
        };
        TxnOp::delete(self.letter_key(dlq, 0), Some(DeleteOptions::new().with_range(end)))
    }

    /// The dead letters of `dlq` settled on their own (marked), whatever the cursor.
    pub async fn letter_marks(&self, dlq: &str) -> Result<BTreeSet<u64>, StorageError> {
        let (lo, hi) = keys::letter_range(dlq);
        let (lo, hi) = (self.key(b"r/", &lo), self.key(b"r/", &hi));
        let strip = self.key(b"r/", b"").len();
        let mut out = BTreeSet::new();
        let mut from = lo;
        loop {
            let opts = GetOptions::new().with_range(hi.clone()).with_keys_only().with_limit(PAGE);
            let got = self.kv().get(from.clone(), Some(opts)).await?;
            for kv in got.kvs() {
                let key = kv.key().get(strip..).unwrap_or_default();
                out.insert(keys::letter_seq(key).map_err(corrupt)?);
            }
            match got.kvs().last() {
                Some(last) if got.more() => from = [last.key(), &[0][..]].concat(),
                _ => return Ok(out),
            }
        }
    }

    /// Settles dead letter `settle.seq` of `dlq` on its own, if the cursor's `mod_revision` is
    /// still `cursor_rev`: appends its copy (a redrive) and either moves the cursor (the letter
    /// is the next one) or marks it, rewriting the cursor as it was.
    pub async fn settle_letter(
        &self,
        dlq: &str,
        cursor_rev: i64,
        settle: &SettleLetter,
    ) -> Result<RedriveOutcome, StorageError> {
        let cursor = self.cursor_key(dlq);
        let mut cmps = vec![Compare::mod_revision(cursor.clone(), CompareOp::Equal, cursor_rev)];
        let mut ops = Vec::new();
        let mut gets = vec![TxnOp::get(cursor.clone(), None)];
        if let Some(a) = &settle.copy {
            let tail = self.push_append(a, &mut cmps, &mut ops);
            gets.push(TxnOp::get(tail, None));
        }
        if let Some(change) = &settle.flow {
            self.push_flow_change(change, &mut ops);
        }
        match settle.cursor_to {
            Some(to) => {
                ops.push(TxnOp::put(cursor, records::encode_cursor(to).to_vec(), None));
                ops.push(self.delete_marks_through(dlq, to));
            }
            None => {
                ops.push(TxnOp::put(self.letter_key(dlq, settle.seq), Vec::new(), None));
                ops.push(TxnOp::put(cursor, records::encode_cursor(settle.cursor).to_vec(), None));
            }
        }
        self.cursor_txn(cmps, ops, gets, usize::from(settle.copy.is_some())).await
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
        flows: &[super::flows::FlowChangeWrite],
    ) -> Result<RedriveOutcome, StorageError> {
        let cursor = self.cursor_key(dlq);
        let mut cmps = vec![Compare::mod_revision(cursor.clone(), CompareOp::Equal, cursor_rev)];
        let mut ops = Vec::new();
        let mut gets = vec![TxnOp::get(cursor.clone(), None)];
        for a in appends {
            let tail = self.push_append(a, &mut cmps, &mut ops);
            gets.push(TxnOp::get(tail, None));
        }
        for change in flows {
            self.push_flow_change(change, &mut ops);
        }
        ops.push(TxnOp::put(cursor, records::encode_cursor(to).to_vec(), None));
        ops.push(self.delete_marks_through(dlq, to));
        self.cursor_txn(cmps, ops, gets, appends.len()).await
    }

    /// Runs a transaction compared with a cursor (and `targets` tails after it, whose current
    /// values `gets` reads if it is refused).
    async fn cursor_txn(
        &self,
        cmps: Vec<Compare>,
        ops: Vec<TxnOp>,
        gets: Vec<TxnOp>,
        targets: usize,
    ) -> Result<RedriveOutcome, StorageError> {
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
        let mut answers = super::answers(&resp);
        let cursor = match answers.next().flatten() {
            Some(kv) => (records::decode_cursor(kv.key(), kv.value()).map_err(corrupt)?, kv.mod_revision()),
            None => (0, 0),
        };
        let mut tails = Vec::with_capacity(targets);
        for _ in 0..targets {
            tails.push(match answers.next().flatten() {
                Some(t) => Some(decode_tail(t.key(), t.value())?),
                None => None,
            });
        }
        Ok(RedriveOutcome::Refused { cursor, tails })
    }
}
