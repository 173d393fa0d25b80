//! Work-queue groups in etcd: claim records fenced by their `mod_revision`, the group's offset,
//! its stored settings, and a watch on its claims.
//!
//! | key | value |
//! | --- | --- |
//! | `N c/claim:<group>:<queue>:<seq u64>` | a claim record (same codec as RocksDB's) |
//! | `N g/group:<group>:<queue>` | the group's settings record (same codec) |
//!
//! Every write of claim records is one transaction that compares, for each record, the
//! `mod_revision` the writer last saw (0: no record), and the group's offset below the
//! smallest sequence written: a process that decided on a stale view writes nothing, and
//! learns the records as they are from the transaction's answer. The `mod_revision` a claim
//! was written at is its holder's fencing token.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};

use super::limits::{LimitRecord, LimitWrite};
use super::{DeadLetterAppend, EtcdStore, WatchedKind, corrupt, decode_tail};
use crate::error::{CorruptionError, StorageError};
use crate::model::{Claim, GroupMode, GroupOffset, GroupSettings};
use crate::store::{keys, records};

/// The group's offset record was made at or before `seen`, the revision this process read the
/// group at: a group deleted and made anew since (a process that has not heard of the deletion)
/// is another group, which this process's writes must not reach.
fn same_group(offset_key: &[u8], seen: i64) -> Compare {
    Compare::create_revision(offset_key.to_vec(), CompareOp::Less, seen.saturating_add(1))
}

/// What became of [`EtcdStore::put_work_settings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettingsPut {
    /// Written at this revision.
    Written(i64),
    /// The record changed since it was read: read it again.
    Changed,
    /// The group was deleted (and perhaps made anew) since this process read it.
    GroupGone,
}

/// A claim record as read: its sequence, record and `mod_revision`.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRecord {
    pub seq: u64,
    pub claim: Claim,
    pub rev: i64,
}

/// A change to a group's claim records, seen by a watch.
#[derive(Debug, Clone)]
pub(crate) enum ClaimEvent {
    /// Written at `rev`.
    Put(ClaimRecord),
    /// Deleted at `rev`: the offset passed it (or a reset at `rev` deleted every record).
    Gone { seq: u64, rev: i64 },
    /// The group was reset to `offset` at `rev` (`reset.rs`): every record went in the same
    /// revision.
    Reset { offset: u64, rev: i64 },
    /// The group's limit record was written (`limits.rs`): by a claim of a limited group, in
    /// the revision of the claims it admitted.
    Limit(LimitRecord),
}

/// A work group's claim records as read at one revision.
#[derive(Debug, Clone)]
pub(crate) struct LoadedClaims {
    /// The stored offset.
    pub offset: u64,
    /// The records above it.
    pub records: Vec<ClaimRecord>,
    /// The revision they were read at (a watch starts after it).
    pub rev: i64,
    /// The `mod_revision` of the group's last reset (0: never reset), which offset moves and
    /// claims of new leases compare.
    pub reset_rev: i64,
    /// The group's limit record (`limits.rs`), if a limited claim wrote one.
    pub limit: Option<LimitRecord>,
}

/// One write of [`EtcdStore::write_claims`]: `record` at `seq`, if its `mod_revision` is still
/// `expected` (0: no record).
#[derive(Debug, Clone)]
pub(crate) struct ClaimWrite {
    pub seq: u64,
    pub expected: i64,
    pub record: Claim,
    /// The job's outcome record (`outcomes.rs`), for a group that keeps outcomes: put in the
    /// same transaction as the `Done` that finishes it.
    pub outcome: Option<crate::stats::JobOutcome>,
    /// The change its flow's step takes, if the job is a flow step (`flows.rs`): put in the
    /// same transaction.
    pub flow: Option<super::flows::FlowChangeWrite>,
    /// Whether the job's progress report goes (it is finished, and a report was known).
    pub delete_progress: bool,
    /// Whether the job's progress report is read in the same transaction (a claim of a later
    /// attempt reads back what an earlier one reported, without a round trip of its own).
    pub read_progress: bool,
}

impl ClaimWrite {
    /// `record` at `seq`, expected at revision `expected`, with no outcome record.
    pub fn new(seq: u64, expected: i64, record: Claim) -> Self {
        ClaimWrite {
            seq,
            expected,
            record,
            outcome: None,
            flow: None,
            delete_progress: false,
            read_progress: false,
        }
    }
}

/// An offset move made in the same transaction as a write of `Done` records
/// ([`EtcdStore::write_claims`]): the group's offset to `to`, every claim record and progress
/// report at or below it deleted, if the group's last reset is still `reset_rev` (0: none).
/// A `Done` at or below `to` is not put: the move deletes its record in the same revision,
/// which is what a `Done` passed by the offset becomes anyway (the other processes' watches
/// read a deletion as the offset passing it). One transaction per round of acks instead of
/// two, the claims' compares fencing the move too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetMove {
    pub to: u64,
    pub reset_rev: i64,
}

/// What became of [`EtcdStore::write_claims`].
#[derive(Debug)]
pub(crate) enum ClaimsOutcome {
    /// Every record written at revision `rev`, with the progress reports read back.
    Written { rev: i64, progress: Vec<(u64, bytes::Bytes)> },
    /// Nothing written: the offset and the records as they are now (`None`: no record), the
    /// dead-letter queue's tail if one was compared, and the fences if they were.
    Refused {
        offset: u64,
        found: Vec<(u64, Option<ClaimRecord>)>,
        tail: Option<(u64, u64)>,
        fences: Option<FencesFound>,
    },
}

/// What a claim of new leases compares besides its records ([`EtcdStore::write_claims`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimFences {
    /// The `mod_revision` of the group's reset mark the claim was decided after (0: never
    /// reset). A reset makes finished jobs unfinished again, so a process that has not learned
    /// it would claim, as never claimed, a message the reset replays later than its key's
    /// earlier one, which another process may be running by then.
    pub reset_rev: i64,
    /// The limit record (`limits.rs`), for a group with a rate or concurrency limit.
    pub limit: Option<LimitWrite>,
}

/// What a refused claim of new leases found of its fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FencesFound {
    /// The group's last reset as it is now: the offset it reset to and the mark's
    /// `mod_revision` (`None`: never reset).
    pub reset: Option<(u64, i64)>,
    /// The limit record as it is now, if one was compared (rev 0: none).
    pub limit: Option<LimitRecord>,
}

/// What a refused claim write found: the group's offset, and each record written as it is now
/// (`None`: no record).
pub(crate) type FoundClaims = (u64, Vec<(u64, Option<ClaimRecord>)>);

/// The claim records of one work group that a transaction writes, as
/// [`EtcdStore::write_claims`] compares and writes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimsTxn<'a> {
    pub group: &'a str,
    pub queue: &'a str,
    /// The revision this process read the group at (`same_group`).
    pub seen: i64,
    pub writes: &'a [ClaimWrite],
}

impl EtcdStore {
    /// Adds `c`'s compares (the group's offset below every sequence written, the group the
    /// one read at `seen`, each record's `mod_revision`), writes, and the gets a refusal
    /// answers with (the offset, then each record: [`refused_claims`](Self::refused_claims)).
    pub(super) fn push_claims(
        &self,
        c: ClaimsTxn<'_>,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
        gets: &mut Vec<TxnOp>,
    ) {
        self.push_claims_passed(c, 0, cmps, ops, gets);
    }

    /// [`push_claims`](Self::push_claims), but the `Done` records at or below `passed` are
    /// not put (an offset move to `passed` in the same transaction deletes them).
    fn push_claims_passed(
        &self,
        c: ClaimsTxn<'_>,
        passed: u64,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
        gets: &mut Vec<TxnOp>,
    ) {
        let ClaimsTxn { group, queue, seen, writes } = c;
        let prefix = self.claims_prefix(group, queue);
        let offset_key = self.offset_key(group, queue);
        let floor = writes.iter().map(|w| w.seq).min().unwrap_or(u64::MAX);
        let below = GroupOffset { mode: GroupMode::WorkQueue, committed: floor };
        cmps.push(Compare::value(
            offset_key.clone(),
            CompareOp::Less,
            records::encode_offset(&below).to_vec(),
        ));
        cmps.push(same_group(&offset_key, seen));
        gets.push(TxnOp::get(offset_key, None));
        for w in writes {
            let key = keys::claim_key(&prefix, w.seq);
            cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, w.expected));
            if w.seq > passed || w.record != Claim::Done {
                ops.push(TxnOp::put(key.clone(), records::encode_claim(&w.record), None));
            }
            gets.push(TxnOp::get(key, None));
            if let Some(outcome) = &w.outcome {
                let value = crate::store::outcomes::encode_outcome(outcome);
                ops.push(TxnOp::put(self.outcome_key(group, queue, w.seq), value, None));
            }
            if let Some(change) = &w.flow {
                self.push_flow_change(change, ops);
            }
            if w.delete_progress {
                ops.push(TxnOp::delete(self.progress_key(group, queue, w.seq), None));
            }
            if w.read_progress {
                ops.push(TxnOp::get(self.progress_key(group, queue, w.seq), None));
            }
        }
    }

    /// What a refused transaction's gets of [`push_claims`](Self::push_claims) found, taken
    /// from `answers`: the group's offset, and each record as it is now (`None`: none).
    /// `None`: the group has no offset record (deleted).
    pub(super) fn refused_claims(
        &self,
        c: &ClaimsTxn<'_>,
        answers: &mut impl Iterator<Item = Option<etcd_client::KeyValue>>,
    ) -> Result<Option<FoundClaims>, StorageError> {
        let prefix = self.claims_prefix(c.group, c.queue);
        let offset = match answers.next().flatten() {
            Some(o) => records::decode_offset(o.key(), o.value()).map_err(corrupt)?.committed,
            None => {
                // (Its records' answers are skipped with it.)
                answers.take(c.writes.len()).for_each(drop);
                return Ok(None);
            }
        };
        let mut found = Vec::with_capacity(c.writes.len());
        for w in c.writes {
            let rec = match answers.next().flatten() {
                Some(kv) => Some(self.claim_record(&prefix, &kv)?),
                None => None,
            };
            found.push((w.seq, rec));
        }
        Ok(Some((offset, found)))
    }

    pub(super) fn claims_prefix(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"c/", &keys::claim_prefix(group, queue))
    }
    pub(super) fn settings_key(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"g/", &keys::group_key(group, queue))
    }

    fn claim_record(&self, prefix: &[u8], kv: &etcd_client::KeyValue) -> Result<ClaimRecord, StorageError> {
        let seq = kv
            .key()
            .get(prefix.len()..)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| corrupt(CorruptionError::new("claim", kv.key(), "bad sequence")))?;
        let claim = records::decode_claim(kv.key(), kv.value()).map_err(corrupt)?;
        Ok(ClaimRecord { seq, claim, rev: kv.mod_revision() })
    }

    /// A work group's offset and its claim records above it, read at one revision (returned:
    /// a watch starts after it).
    /// `None`: the group has no offset record (deleted by any process since it was found).
    pub async fn load_claims(&self, group: &str, queue: &str) -> Result<Option<LoadedClaims>, StorageError> {
        let kv = self.kv();
        let prefix = self.claims_prefix(group, queue);
        // In pages at one revision: a group with many records above its offset (a slow head
        // while everything after it finished) must not outgrow the client's answer limit.
        const PAGE: i64 = 4096;
        // Through the limit record, the last key of the prefix (`limits.rs`).
        let end = self.limit_key(group, queue).into_iter().chain([0]).collect::<Vec<u8>>();
        let got = kv
            .get_long(prefix.clone(), Some(GetOptions::new().with_range(end.clone()).with_limit(PAGE)))
            .await?;
        let rev = got.header().map_or(0, |h| h.revision());
        let mut pages = vec![got];
        while let Some(last) = pages.last().filter(|p| p.more()).and_then(|p| p.kvs().last()) {
            let from: Vec<u8> = last.key().iter().copied().chain([0]).collect();
            let opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE).with_revision(rev);
            pages.push(kv.get_long(from, Some(opts)).await?);
        }
        let offset =
            kv.get(self.offset_key(group, queue), Some(GetOptions::new().with_revision(rev))).await?;
        let offset = match offset.kvs().first() {
            Some(o) => records::decode_offset(o.key(), o.value()).map_err(corrupt)?.committed,
            None => return Ok(None),
        };
        let mark = self.reset_mark_key(group, queue);
        let limit_key = self.limit_key(group, queue);
        let mut records = Vec::new();
        let mut reset_rev = 0;
        let mut limit = None;
        for kv in pages.iter().flat_map(|p| p.kvs()) {
            if kv.key() == mark.as_slice() {
                reset_rev = kv.mod_revision();
                continue;
            }
            if kv.key() == limit_key.as_slice() {
                limit = Some(Self::limit_record(kv)?);
                continue;
            }
            let r = self.claim_record(&prefix, kv)?;
            if r.seq > offset {
                records.push(r);
            }
        }
        Ok(Some(LoadedClaims { offset, records, rev, reset_rev, limit }))
    }

    /// Writes claim records (claims, outcomes) in one transaction, if every record's
    /// `mod_revision` is the one expected and the group's offset is below every sequence
    /// written; and dead-letter copies with the same tail compare as an append, and, for new
    /// leases, the `fences` (the reset mark compared, the limit record written and compared),
    /// if given.
    #[allow(clippy::too_many_arguments)] // one transaction's parts, each optional
    pub async fn write_claims(
        &self,
        group: &str,
        queue: &str,
        seen: i64,
        writes: &[ClaimWrite],
        dead_letters: Option<&DeadLetterAppend>,
        moving: Option<OffsetMove>,
        fences: Option<ClaimFences>,
    ) -> Result<ClaimsOutcome, StorageError> {
        let (mut cmps, mut ops, mut gets) = (Vec::new(), Vec::new(), Vec::new());
        let passed = moving.map_or(0, |m| m.to);
        let c = ClaimsTxn { group, queue, seen, writes };
        self.push_claims_passed(c, passed, &mut cmps, &mut ops, &mut gets);
        if let Some(m) = moving {
            self.push_move(group, queue, m, &mut cmps, &mut ops);
        }
        let tail_key = dead_letters.map(|dl| self.push_append(dl, &mut cmps, &mut ops));
        if let Some(tail) = &tail_key {
            gets.push(TxnOp::get(tail.clone(), None));
        }
        if let Some(f) = fences {
            let mark = self.reset_mark_key(group, queue);
            cmps.push(Compare::mod_revision(mark.clone(), CompareOp::Equal, f.reset_rev));
            gets.push(TxnOp::get(mark, None));
            if let Some(l) = f.limit {
                self.push_limit(group, queue, l, &mut cmps, &mut ops, &mut gets);
            }
        }
        if ops.len() > super::MAX_TXN_OPS || cmps.len() > super::MAX_TXN_OPS {
            return Err(StorageError::new(format!(
                "a claim write of {} operations exceeds etcd's {} per transaction",
                ops.len(),
                super::MAX_TXN_OPS
            )));
        }
        let txn = Txn::new().when(cmps).and_then(ops).or_else(gets);
        // Tests lose a claim write before it is sent (etcd unreachable, as far as it matters).
        crate::faults::check("rockq-etcd-claim-request")?;
        let resp = self.kv().txn(txn).await?;
        // Tests lose the answer of an applied write: the caller must find out it landed.
        crate::faults::check("rockq-etcd-claim-answer")?;
        if resp.succeeded() {
            let rev = resp.header().map_or(0, |h| h.revision());
            // The reports read back (only the gets answer with values).
            let progress_prefix = self.key(b"j/", &keys::progress_prefix(group, queue));
            let mut progress = Vec::new();
            for r in resp.op_responses() {
                let etcd_client::TxnOpResponse::Get(g) = r else { continue };
                for kv in g.kvs() {
                    let seq = kv
                        .key()
                        .get(progress_prefix.len()..)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(u64::from_be_bytes);
                    match (seq, crate::store::outcomes::decode_progress(kv.key(), kv.value())) {
                        (Some(seq), Ok(report)) => progress.push((seq, report)),
                        _ => {
                            tracing::warn!(%group, %queue, "rockq: a progress report does not decode; the attempt starts without it")
                        }
                    }
                }
            }
            return Ok(ClaimsOutcome::Written { rev, progress });
        }
        // The answers to the gets, in order: the offset, each record, the tail, the reset
        // mark, the limit.
        let mut answers = super::answers(&resp);
        let c = ClaimsTxn { group, queue, seen, writes };
        let Some((offset, found)) = self.refused_claims(&c, &mut answers)? else {
            return Err(StorageError::new(format!("work group {group} on {queue} has no offset record")));
        };
        // (An answer is taken only for a get that was sent: the fences' follow.)
        let tail = match tail_key.map(|_| answers.next().flatten()) {
            Some(Some(t)) => Some(decode_tail(t.key(), t.value())?),
            _ => None,
        };
        let fences = match fences {
            Some(f) => {
                let reset = match answers.next().flatten() {
                    Some(kv) => Some((
                        records::decode_offset(kv.key(), kv.value()).map_err(corrupt)?.committed,
                        kv.mod_revision(),
                    )),
                    None => None,
                };
                let limit = match f.limit.map(|_| answers.next().flatten()) {
                    Some(Some(kv)) => Some(Self::limit_record(&kv)?),
                    // Compared and missing: as a record never written.
                    Some(None) => Some(LimitRecord { tat_micros: 0, rev: 0 }),
                    None => None,
                };
                Some(FencesFound { reset, limit })
            }
            None => None,
        };
        Ok(ClaimsOutcome::Refused { offset, found, tail, fences })
    }

    /// Adds `m` to a transaction of [`push_claims`](Self::push_claims): its compares (the
    /// offset below `to`, the group's reset mark), the offset's put and the deletions. The
    /// `Done` records at or below `to` must have been left out (etcd refuses a put inside a
    /// range the same transaction deletes; the deletion is what they become).
    fn push_move(
        &self,
        group: &str,
        queue: &str,
        m: OffsetMove,
        cmps: &mut Vec<Compare>,
        ops: &mut Vec<TxnOp>,
    ) {
        let prefix = self.claims_prefix(group, queue);
        let offset_key = self.offset_key(group, queue);
        let passed = keys::claim_key(&prefix, m.to.saturating_add(1));
        let rec =
            records::encode_offset(&GroupOffset { mode: GroupMode::WorkQueue, committed: m.to }).to_vec();
        cmps.push(Compare::value(offset_key.clone(), CompareOp::Less, rec.clone()));
        cmps.push(Compare::mod_revision(self.reset_mark_key(group, queue), CompareOp::Equal, m.reset_rev));
        ops.push(TxnOp::put(offset_key, rec, None));
        ops.push(TxnOp::delete(
            keys::claim_key(&prefix, 0),
            Some(etcd_client::DeleteOptions::new().with_range(passed)),
        ));
        ops.push(self.delete_progress_between(group, queue, 0, m.to));
    }

    /// Moves a work group's offset to `to` unless it is there already, deleting every claim
    /// record at or below it (all `Done`: the caller saw them finished), if the group's last
    /// reset is the one the caller knows (`reset_rev`, 0: none; `reset.rs`). Returns whether
    /// this call moved it.
    pub async fn move_work_offset(
        &self,
        group: &str,
        queue: &str,
        seen: i64,
        to: u64,
        reset_rev: i64,
    ) -> Result<bool, StorageError> {
        let prefix = self.claims_prefix(group, queue);
        let offset_key = self.offset_key(group, queue);
        let rec = records::encode_offset(&GroupOffset { mode: GroupMode::WorkQueue, committed: to }).to_vec();
        let cmps = [
            Compare::value(offset_key.clone(), CompareOp::Less, rec.clone()),
            Compare::mod_revision(self.reset_mark_key(group, queue), CompareOp::Equal, reset_rev),
            same_group(&offset_key, seen),
        ];
        let txn = Txn::new().when(cmps).and_then([
            TxnOp::put(offset_key, rec, None),
            TxnOp::delete(
                keys::claim_key(&prefix, 0),
                Some(
                    etcd_client::DeleteOptions::new()
                        .with_range(keys::claim_key(&prefix, to.saturating_add(1))),
                ),
            ),
            // Reports of finished jobs, and of any a trim moved the group past.
            self.delete_progress_between(group, queue, 0, to),
        ]);
        Ok(self.kv().txn(txn).await?.succeeded())
    }

    /// A work group's settings record and its `mod_revision` (0: none).
    pub async fn work_settings(
        &self,
        group: &str,
        queue: &str,
    ) -> Result<(Option<GroupSettings>, i64), StorageError> {
        let got = self.kv().get(self.settings_key(group, queue), None).await?;
        match got.kvs().first() {
            Some(kv) => Ok((
                Some(records::decode_settings(kv.key(), kv.value()).map_err(corrupt)?),
                kv.mod_revision(),
            )),
            None => Ok((None, 0)),
        }
    }

    /// Replaces a group's settings record if its `mod_revision` is still `expected`; returns
    /// the new record's `mod_revision` (`None`: it had changed, nothing written).
    /// `empty_bucket`: a rate limit was removed — the limit record (`limits.rs`) is put back
    /// to no bucket in the same transaction.
    ///
    /// Only while the group exists, and is the one read at `seen`: a settings record written
    /// after a deletion would be taken up by the next group of the name.
    pub async fn put_work_settings(
        &self,
        group: &str,
        queue: &str,
        record: &GroupSettings,
        expected: i64,
        seen: i64,
        empty_bucket: bool,
    ) -> Result<SettingsPut, StorageError> {
        let key = self.settings_key(group, queue);
        let offset_key = self.offset_key(group, queue);
        let mut ops = vec![TxnOp::put(key.clone(), records::encode_settings(record), None)];
        if empty_bucket {
            // A rate limit removed: its bucket goes with it (one set again starts full, as
            // embedded). Put, not deleted: every process learns the record's new revision
            // from its claim watch, and a limited claim decided before compares the old one.
            ops.push(TxnOp::put(self.limit_key(group, queue), 0u64.to_be_bytes().to_vec(), None));
        }
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key, CompareOp::Equal, expected),
                Compare::version(offset_key.clone(), CompareOp::Greater, 0),
                same_group(&offset_key, seen),
            ])
            .and_then(ops)
            .or_else([TxnOp::get(offset_key, None)]);
        let resp = self.kv().txn(txn).await?;
        if resp.succeeded() {
            return Ok(SettingsPut::Written(resp.header().map_or(0, |h| h.revision())));
        }
        match super::first_get(&resp) {
            Some(o) if o.create_revision() <= seen => Ok(SettingsPut::Changed),
            _ => Ok(SettingsPut::GroupGone),
        }
    }

    /// A stream of changes to a work group's claim records after `revision`. Ends (with `Err`)
    /// when the watch breaks or its start was compacted: the caller reloads and watches again.
    pub async fn watch_claims(
        &self,
        group: &str,
        queue: &str,
        revision: i64,
    ) -> Result<impl futures::Stream<Item = Result<Vec<ClaimEvent>, StorageError>> + use<>, StorageError>
    {
        let prefix = self.claims_prefix(group, queue);
        let opts = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let (store, p) = (self.clone(), prefix.clone());
        let mark = self.reset_mark_key(group, queue);
        let limit = self.limit_key(group, queue);
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Put if kv.key() == mark.as_slice() => records::decode_offset(kv.key(), kv.value())
                .map(|o| Some(ClaimEvent::Reset { offset: o.committed, rev: kv.mod_revision() }))
                .map_err(corrupt),
            WatchedKind::Put if kv.key() == limit.as_slice() => {
                Self::limit_record(kv).map(|l| Some(ClaimEvent::Limit(l)))
            }
            // The group went with it.
            WatchedKind::Delete { .. } if kv.key() == limit.as_slice() => Ok(None),
            WatchedKind::Put => store.claim_record(&p, kv).map(|r| Some(ClaimEvent::Put(r))),
            // The group went with its reset mark: nothing the offset passed.
            WatchedKind::Delete { .. } if kv.key() == mark.as_slice() => Ok(None),
            // A deleted record (the offset passed it) names only its sequence.
            WatchedKind::Delete { .. } => Ok(kv
                .key()
                .get(p.len()..)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(|seq| ClaimEvent::Gone { seq: u64::from_be_bytes(seq), rev: kv.mod_revision() })),
        };
        self.watch_events(prefix, opts, decode).await
    }

    /// The claim record of `seq` in work group `group` on `queue`, if there is one.
    pub async fn claim(&self, group: &str, queue: &str, seq: u64) -> Result<Option<Claim>, StorageError> {
        let key = keys::claim_key(&self.claims_prefix(group, queue), seq);
        let got = self.kv().get(key, None).await?;
        got.kvs().first().map(|kv| records::decode_claim(kv.key(), kv.value()).map_err(corrupt)).transpose()
    }

    /// The message at `seq` of queue `qid`, if stored.
    pub async fn message(&self, qid: u32, seq: u64) -> Result<Option<Vec<u8>>, StorageError> {
        crate::faults::check("rockq-etcd-message-read")?;
        let got = self.kv().get(self.message_key(qid, seq), None).await?;
        Ok(got.kvs().first().map(|kv| kv.value().to_vec()))
    }
}
