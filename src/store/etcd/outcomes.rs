//! Job records in etcd beside the claims: kept job outcomes (`WorkGroup::keep_outcomes`,
//! `N j/outcome:<group>:<queue>:<seq>`) and progress reports (`Task::progress`,
//! `N j/progress:<group>:<queue>:<seq>`), with the embedded records' keys and codecs
//! (`store/outcomes.rs`).
//!
//! A progress report is put only while the reporting holder's claim record is the one it
//! wrote (compared by revision: a holder whose lease another process took writes nothing);
//! the write that finishes the job deletes it, as does every offset move over it and a reset.
//!
//! Outcomes: An outcome is put in
//! the claim transaction that finishes its job (`work.rs`, `ClaimWrite::outcome`), so a job is
//! never finished without it; a work group's reset deletes those of the jobs that run again
//! (`reset.rs`); the retention pass deletes those past the group's retention, each compared
//! with the revision it was read at (a job finished again since keeps its new one).

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};

use super::EtcdStore;
use crate::error::{CorruptionError, StorageError};
use crate::store::{keys, outcomes};

/// Outcomes read per request by the expiry scan (fewer when their results are large).
const PAGE: i64 = 512;

/// A kept outcome as the expiry scan read it.
pub(crate) struct ScannedOutcome {
    /// Its group and queue.
    pub group: String,
    pub queue: String,
    /// When it was recorded (µs since the epoch); `None`: the record does not decode (left
    /// for an operator: the job's lookup reports it).
    pub finished_micros: Option<u64>,
    /// Its key (whole) and `mod_revision`: the deletion compares it.
    pub key: Vec<u8>,
    pub rev: i64,
}

impl EtcdStore {
    /// The key of work group `group`'s outcome of job `seq` on `queue`.
    pub(super) fn outcome_key(&self, group: &str, queue: &str, seq: u64) -> Vec<u8> {
        self.key(b"j/", &keys::claim_key(&keys::outcome_prefix(group, queue), seq))
    }

    /// The key of work group `group`'s progress report on job `seq` of `queue`.
    pub(super) fn progress_key(&self, group: &str, queue: &str, seq: u64) -> Vec<u8> {
        self.key(b"j/", &keys::claim_key(&keys::progress_prefix(group, queue), seq))
    }

    /// Deletes `group`'s progress reports on jobs `from..=through`.
    pub(super) fn delete_progress_between(&self, group: &str, queue: &str, from: u64, through: u64) -> TxnOp {
        let end = match through.checked_add(1) {
            Some(next) => self.progress_key(group, queue, next),
            None => {
                let mut end = self.key(b"j/", &keys::progress_prefix(group, queue));
                // The prefix ends in ':': the next byte value bounds every key under it.
                if let Some(last) = end.last_mut() {
                    *last += 1;
                }
                end
            }
        };
        TxnOp::delete(self.progress_key(group, queue, from), Some(DeleteOptions::new().with_range(end)))
    }

    /// Puts `report` as the progress of job `seq`, if its claim record's `mod_revision` is
    /// still `claim_rev` (the reporting holder's; held in the range record ending at `run`, if
    /// given, and no record of its own since). Returns whether it was put.
    pub async fn put_progress(
        &self,
        group: &str,
        queue: &str,
        (seq, run): (u64, Option<u64>),
        claim_rev: i64,
        report: &[u8],
    ) -> Result<bool, StorageError> {
        let prefix = self.claims_prefix(group, queue);
        let claim = keys::claim_key(&prefix, seq);
        let fence = match run {
            None => vec![Compare::mod_revision(claim, CompareOp::Equal, claim_rev)],
            Some(last) => vec![
                Compare::mod_revision(
                    super::claim_ranges::range_key(&prefix, last),
                    CompareOp::Equal,
                    claim_rev,
                ),
                Compare::create_revision(claim, CompareOp::Equal, 0),
                // And the offset below it: a trim past the job leaves a range record that
                // holds later jobs too.
                Compare::value(
                    self.offset_key(group, queue),
                    CompareOp::Less,
                    crate::store::records::encode_offset(&crate::model::GroupOffset {
                        mode: crate::model::GroupMode::WorkQueue,
                        committed: seq,
                    })
                    .to_vec(),
                ),
            ],
        };
        let txn = Txn::new().when(fence).and_then([TxnOp::put(
            self.progress_key(group, queue, seq),
            outcomes::encode_progress(report),
            None,
        )]);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// Job `seq`'s last progress report (`None`: none stored).
    pub async fn progress(
        &self,
        group: &str,
        queue: &str,
        seq: u64,
    ) -> Result<Option<Result<bytes::Bytes, CorruptionError>>, StorageError> {
        let got = self.kv().get(self.progress_key(group, queue, seq), None).await?;
        Ok(got.kvs().first().map(|kv| outcomes::decode_progress(kv.key(), kv.value())))
    }

    /// Deletes `group`'s outcomes of the jobs after `offset` (they run again after a reset).
    pub(super) fn delete_outcomes_after(&self, group: &str, queue: &str, offset: u64) -> TxnOp {
        let mut end = self.key(b"j/", &keys::outcome_prefix(group, queue));
        // The prefix ends in ':': the next byte value bounds every key under it.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let from = self.outcome_key(group, queue, offset.saturating_add(1));
        TxnOp::delete(from, Some(DeleteOptions::new().with_range(end)))
    }

    /// The kept outcome of job `seq` (`None`: none kept, or it expired).
    pub async fn outcome(
        &self,
        group: &str,
        queue: &str,
        seq: u64,
    ) -> Result<Option<Result<crate::stats::JobOutcome, CorruptionError>>, StorageError> {
        let got = self.kv().get(self.outcome_key(group, queue, seq), None).await?;
        Ok(got.kvs().first().map(|kv| outcomes::decode_outcome(kv.key(), kv.value())))
    }

    /// Whether job `seq`'s stored outcome is `expected`, byte for byte: after a claim write
    /// whose answer was lost, a `Done` found alone may be another process's (an operator's
    /// delete), whose outcome differs.
    pub async fn outcome_is(
        &self,
        group: &str,
        queue: &str,
        seq: u64,
        expected: &crate::stats::JobOutcome,
    ) -> Result<bool, StorageError> {
        let got = self.kv().get(self.outcome_key(group, queue, seq), None).await?;
        Ok(got.kvs().first().is_some_and(|kv| kv.value() == outcomes::encode_outcome(expected).as_slice()))
    }

    /// Up to a page of kept outcomes from `from` (a key under `N j/`; empty: the first), with
    /// the key to go on from (`None`: that was the last page).
    pub async fn scan_outcomes(
        &self,
        from: &[u8],
    ) -> Result<(Vec<ScannedOutcome>, Option<Vec<u8>>), StorageError> {
        let (lo, hi) = keys::outcome_key_range();
        let (lo, hi) = (self.key(b"j/", &lo), self.key(b"j/", &hi));
        let start = if from.is_empty() { lo } else { from.to_vec() };
        // Results make outcomes up to 1 MiB each: a page whose answer outgrew the client's
        // limit is asked again for a quarter as many, down to one.
        let mut limit = PAGE;
        let got = loop {
            let opts = GetOptions::new().with_range(hi.clone()).with_limit(limit);
            match self.kv().get_bounded(start.clone(), Some(opts)).await? {
                Some(got) => break got,
                None if limit > 1 => limit = (limit / 4).max(1),
                None => {
                    return Err(StorageError::new(
                        "etcd: one outcome is larger than the client's answer limit",
                    ));
                }
            }
        };
        let strip = self.key(b"j/", b"").len();
        let mut out = Vec::with_capacity(got.kvs().len());
        for kv in got.kvs() {
            let rest = kv.key().get(strip..).unwrap_or_default();
            // A key that does not parse is not an outcome of any group: skipped, as the
            // embedded scan skips what is not under a group's prefix.
            let Ok((group, queue, _)) = keys::parse_outcome_key(rest) else { continue };
            let finished_micros =
                outcomes::decode_outcome(rest, kv.value()).ok().map(|o| outcomes::micros_of(o.finished_at));
            out.push(ScannedOutcome {
                group: group.to_owned(),
                queue: queue.to_owned(),
                finished_micros,
                key: kv.key().to_vec(),
                rev: kv.mod_revision(),
            });
        }
        let next = match got.kvs().last() {
            Some(last) if got.more() => Some([last.key(), &[0][..]].concat()),
            _ => None,
        };
        Ok((out, next))
    }

    /// Deletes the outcomes `expired` (key, revision), each only if its revision is still the
    /// one read, in transactions of at most etcd's operations; returns how many went.
    pub async fn delete_outcomes(&self, expired: &[(Vec<u8>, i64)]) -> Result<u64, StorageError> {
        let mut deleted = 0;
        for chunk in expired.chunks(super::MAX_TXN_OPS) {
            let cmps: Vec<Compare> = chunk
                .iter()
                .map(|(k, rev)| Compare::mod_revision(k.clone(), CompareOp::Equal, *rev))
                .collect();
            let ops: Vec<TxnOp> = chunk.iter().map(|(k, _)| TxnOp::delete(k.clone(), None)).collect();
            if self.kv().txn(Txn::new().when(cmps).and_then(ops)).await?.succeeded() {
                deleted += chunk.len() as u64;
                continue;
            }
            // One changed meanwhile (finished again after a reset): each alone, so the rest go.
            for (k, rev) in chunk {
                let txn = Txn::new()
                    .when([Compare::mod_revision(k.clone(), CompareOp::Equal, *rev)])
                    .and_then([TxnOp::delete(k.clone(), None)]);
                if self.kv().txn(txn).await?.succeeded() {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}
