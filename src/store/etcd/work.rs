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

use super::claim_ranges::{self, ClaimKey};
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
    /// Held in the range record ending at this sequence (`claim_ranges.rs`), whose revision
    /// `rev` is; `None`: a record of its own.
    pub run: Option<u64>,
}

/// A change to a group's claim records, seen by a watch.
#[derive(Debug, Clone)]
pub(crate) enum ClaimEvent {
    /// Written at `rev`.
    Put(ClaimRecord),
    /// A range record written at their `rev`: a claim of each of its jobs
    /// (`claim_ranges.rs`).
    PutRun(Vec<ClaimRecord>),
    /// Deleted at `rev`: the offset passed it (or a reset at `rev` deleted every record). For
    /// a range record, its last sequence.
    Gone { seq: u64, rev: i64 },
    /// The group was reset to `offset` at `rev` (`reset.rs`): every record went in the same
    /// revision.
    Reset { offset: u64, rev: i64 },
    /// The group's limit record was written (`limits.rs`): by a claim of a limited group, in
    /// the revision of the claims it admitted.
    Limit(LimitRecord),
    /// The group's offset was moved to `to` at `rev` (its echo, `claim_ranges::MOVED_SUFFIX`):
    /// a move passing jobs held in a range record that ends further on deletes no key.
    Moved { to: u64, rev: i64 },
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
    /// The job is held in the range record ending at this sequence (whose revision
    /// `expected` is): the write compares that record, and no key of the job's stretch made
    /// since it ([`run_stretches`]).
    pub run: Option<u64>,
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
            run: None,
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
    /// Every record written at revision `rev`, with the progress reports read back, and the
    /// range records the new leases went in (first and last sequence of each).
    Written { rev: i64, progress: Vec<(u64, bytes::Bytes)>, runs: Vec<(u64, u64)> },
    /// Nothing written: the offset and the records as they are now (`None`: no record), the
    /// dead-letter queue's tail if one was compared, and the fences if they were.
    Refused {
        offset: u64,
        found: Vec<(u64, Option<ClaimRecord>)>,
        tail: Option<(u64, u64)>,
        fences: Option<FencesFound>,
        /// The keys new leases could have met, as read with the refusal: every record in
        /// those claim key ranges (per-job and range records) is in `found`, as of its
        /// revision ([`ClaimsTxn::view`] for the next try over them).
        seen: Option<SeenKeys>,
    },
}

/// Ranges of claim keys read whole at one revision (`ClaimsOutcome::Refused::seen`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenKeys {
    /// Each range: the first sequence whose keys were read, and the one before which the read
    /// ended ([`fresh_windows`]).
    pub windows: Vec<(u64, u64)>,
    pub at: i64,
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
    /// For a claim of new leases: the revision through which the writer knows every claim
    /// record of the group (its watch's, or a refusal's for the keys it read). Its new leases
    /// go in range records (`claim_ranges.rs`), fenced by one compare: no key that could hold
    /// one of them created after it. `None`: every write has a record of its own.
    pub view: Option<i64>,
}

/// The windows of claim keys the writes of jobs no record is known to hold compare (new
/// leases, and an operator's action on a job never claimed): each from a first such job to
/// [`MAX_RUN`](claim_ranges::MAX_RUN) past a last (a range record holding one of them ends no
/// further), a new window wherever two of them lie further apart than that (jobs claimed out of
/// order, by priority, are not compared with every key between them). Empty: there are none.
pub(crate) fn fresh_windows(writes: &[ClaimWrite]) -> Vec<(u64, u64)> {
    let mut seqs: Vec<u64> = writes.iter().filter(|w| unheld(w)).map(|w| w.seq).collect();
    seqs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for s in seqs {
        let end = s.saturating_add(claim_ranges::MAX_RUN);
        match out.last_mut() {
            Some((_, to)) if s < *to => *to = end,
            _ => out.push((s, end)),
        }
    }
    out
}

/// The range records of the new leases of `writes`: first and last sequence, and the value.
fn fresh_runs(writes: &[ClaimWrite]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut fresh: Vec<(u64, &Claim)> =
        writes.iter().filter(|w| is_fresh(w)).map(|w| (w.seq, &w.record)).collect();
    fresh.sort_unstable_by_key(|(s, _)| *s);
    let token = |c: &Claim| match c {
        Claim::Leased { token, .. } => *token,
        _ => 0,
    };
    claim_ranges::runs(&fresh)
        .into_iter()
        .filter_map(|r| {
            let run = fresh.get(r)?;
            let (&(first, head), &(last, _)) = (run.first()?, run.last()?);
            let Claim::Leased { attempt, deadline_micros, holder, .. } = head else { return None };
            let tokens: Vec<u64> = run.iter().map(|(_, c)| token(c)).collect();
            Some((first, last, claim_ranges::encode(*attempt, *deadline_micros, holder, &tokens)))
        })
        .collect()
}

/// Each new lease of `writes` a write with `view` puts in a range record, with the last
/// sequence of its record.
fn fresh_runs_of(view: Option<i64>, writes: &[ClaimWrite]) -> Vec<(u64, u64)> {
    if view.is_none() {
        return Vec::new();
    }
    fresh_runs(writes)
        .into_iter()
        .flat_map(|(first, last, _)| (first..=last).map(move |s| (s, last)))
        .collect()
}

/// The stretches of consecutive jobs `writes` names within one range record each (writes of
/// jobs still held in one): (the record's last sequence, first and last job of the stretch,
/// the record's revision), in order. Each is compared as one range, "no key in it made after
/// the record", instead of each job's own key absent (etcd counts every compare against its
/// operations per transaction).
pub(crate) fn run_stretches(writes: &[ClaimWrite]) -> Vec<(u64, u64, u64, i64)> {
    let mut held: Vec<(u64, u64, i64)> =
        writes.iter().filter_map(|w| Some((w.run?, w.seq, w.expected))).collect();
    held.sort_unstable_by_key(|&(last, seq, _)| (last, seq));
    held.dedup_by_key(|&mut (last, seq, _)| (last, seq));
    let mut out: Vec<(u64, u64, u64, i64)> = Vec::new();
    for (last, seq, rev) in held {
        match out.last_mut() {
            Some((l, _, to, _)) if *l == last && to.checked_add(1) == Some(seq) => *to = seq,
            _ => out.push((last, seq, seq, rev)),
        }
    }
    out
}

/// A write over a job no record is known to hold.
fn unheld(w: &ClaimWrite) -> bool {
    w.expected == 0 && w.run.is_none()
}

/// A new lease of a job no record holds: written in a range record.
fn is_fresh(w: &ClaimWrite) -> bool {
    unheld(w) && matches!(w.record, Claim::Leased { .. }) && w.outcome.is_none() && w.flow.is_none()
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
        let ClaimsTxn { group, queue, seen, writes, view } = c;
        let prefix = self.claims_prefix(group, queue);
        let offset_key = self.offset_key(group, queue);
        let windows = if view.is_some() { fresh_windows(writes) } else { Vec::new() };
        let mut runs_read = Vec::new();
        let floor = writes.iter().map(|w| w.seq).min().unwrap_or(u64::MAX);
        let below = GroupOffset { mode: GroupMode::WorkQueue, committed: floor };
        cmps.push(Compare::value(
            offset_key.clone(),
            CompareOp::Less,
            records::encode_offset(&below).to_vec(),
        ));
        cmps.push(same_group(&offset_key, seen));
        gets.push(TxnOp::get(offset_key, None));
        // Each range record compared and read once, however many of its jobs are written
        // (etcd counts compares and reads against its operations per transaction).
        let mut runs_compared = std::collections::HashSet::new();
        for w in writes {
            let key = keys::claim_key(&prefix, w.seq);
            // New leases go in range records, below; the window's compare and read cover
            // every write over a job no record is known to hold.
            let windowed = !windows.is_empty() && unheld(w);
            if !(windowed && is_fresh(w)) {
                match w.run {
                    None => cmps.push(Compare::mod_revision(key.clone(), CompareOp::Equal, w.expected)),
                    // Still in its range record, and no record of its own since (another
                    // process's, taking it over once the run's lease ran out).
                    // Its range record unchanged (and, below, no key of its stretch made
                    // since: another process's own record, taking it over once the run's
                    // lease ran out).
                    Some(last) => {
                        if runs_compared.insert(last) {
                            let run = claim_ranges::range_key(&prefix, last);
                            cmps.push(Compare::mod_revision(run.clone(), CompareOp::Equal, w.expected));
                            runs_read.push(TxnOp::get(run, None));
                        }
                    }
                }
                if w.seq > passed || w.record != Claim::Done {
                    ops.push(TxnOp::put(key.clone(), records::encode_claim(&w.record), None));
                }
                if !windowed && w.run.is_none() {
                    gets.push(TxnOp::get(key, None));
                }
            }
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
        // The range records' reads after the jobs' own, in the order first met.
        gets.append(&mut runs_read);
        // Each stretch of jobs held in one range record: no key from its first job's to its
        // last's made after the record (the record's own key, at the end of its last job's
        // stretch, was made with it). Read whole: a refusal finds another process's records.
        for (_, lo, hi, rev) in run_stretches(writes) {
            let (from, to) = (keys::claim_key(&prefix, lo), keys::claim_key(&prefix, hi.saturating_add(1)));
            let made_since = Compare::create_revision(from.clone(), CompareOp::Less, rev.saturating_add(1));
            cmps.push(made_since.with_range(to.clone()));
            gets.push(TxnOp::get(from, Some(GetOptions::new().with_range(to))));
        }
        if let (Some(view), false) = (view, windows.is_empty()) {
            for (_, last, value) in fresh_runs(writes) {
                ops.push(TxnOp::put(claim_ranges::range_key(&prefix, last), value, None));
            }
            // No record that could hold one of them — a job's own, or a range record ending
            // within a run's length past them — made since `view`, through which this
            // process knows them all (and decided on them).
            for (lo, hi) in windows {
                let (from, to) = (keys::claim_key(&prefix, lo), keys::claim_key(&prefix, hi));
                let made_since =
                    Compare::create_revision(from.clone(), CompareOp::Less, view.saturating_add(1));
                cmps.push(made_since.with_range(to.clone()));
                gets.push(TxnOp::get(from, Some(GetOptions::new().with_range(to))));
            }
        }
    }

    /// What a refused transaction's gets of [`push_claims`](Self::push_claims) found, taken
    /// from `answers` (each get's whole answer, in order): the group's offset, and each
    /// record as it is now (`None`: none), then every other record in the windows the new
    /// leases compared.
    /// `None`: the group has no offset record (deleted).
    pub(super) fn refused_claims(
        &self,
        c: &ClaimsTxn<'_>,
        answers: &mut impl Iterator<Item = Vec<etcd_client::KeyValue>>,
    ) -> Result<Option<FoundClaims>, StorageError> {
        let prefix = self.claims_prefix(c.group, c.queue);
        let n_windows = if c.view.is_some() { fresh_windows(c.writes).len() } else { 0 };
        let windowed = n_windows > 0;
        let own_gets = |w: &ClaimWrite| usize::from(!(windowed && unheld(w)) && w.run.is_none());
        let mut run_lasts: Vec<u64> = Vec::new();
        for last in c.writes.iter().filter_map(|w| w.run) {
            if !run_lasts.contains(&last) {
                run_lasts.push(last);
            }
        }
        let n_stretches = run_stretches(c.writes).len();
        let offset = match answers.next().and_then(|kvs| kvs.into_iter().next()) {
            Some(o) => records::decode_offset(o.key(), o.value()).map_err(corrupt)?.committed,
            None => {
                // (Its records' answers are skipped with it.)
                let n =
                    c.writes.iter().map(own_gets).sum::<usize>() + run_lasts.len() + n_stretches + n_windows;
                answers.take(n).for_each(drop);
                return Ok(None);
            }
        };
        // The jobs' own records, in order; then the range records'.
        let own: Vec<Option<etcd_client::KeyValue>> =
            c.writes
                .iter()
                .map(|w| {
                    if own_gets(w) == 1 {
                        answers.next().and_then(|kvs| kvs.into_iter().next())
                    } else {
                        None
                    }
                })
                .collect();
        let mut runs = std::collections::HashMap::new();
        for last in run_lasts {
            if let Some(kv) = answers.next().and_then(|kvs| kvs.into_iter().next()) {
                runs.insert(last, self.claim_records(&prefix, &kv)?);
            }
        }
        // The stretches' keys: the jobs' own records made over their range records, and any
        // other range record found there (the jobs' own were read above): whatever refused
        // the stretch is learned, not sent again unseen.
        let mut over_runs = std::collections::HashMap::new();
        let mut other_runs: std::collections::HashMap<u64, ClaimRecord> = std::collections::HashMap::new();
        for kv in answers.take(n_stretches).flatten() {
            let own = matches!(claim_ranges::parse(&prefix, kv.key()), Some(ClaimKey::Job(_)));
            for r in self.claim_records(&prefix, &kv)? {
                if own {
                    over_runs.insert(r.seq, r);
                } else if r.seq > offset && other_runs.get(&r.seq).is_none_or(|o| o.rev < r.rev) {
                    other_runs.insert(r.seq, r);
                }
            }
        }
        // The window's records, a job's own standing over its range record's.
        let mut seen = std::collections::BTreeMap::new();
        let mut in_runs = Vec::new();
        // (A range record's entries at or below the offset are finished jobs, not records:
        // the offset passed them without deleting the record, which holds later jobs too.)
        for kv in answers.take(n_windows).flatten() {
            for r in
                self.claim_records(&prefix, &kv)?.into_iter().filter(|r| r.run.is_none() || r.seq > offset)
            {
                if r.run.is_some() {
                    in_runs.push(r)
                } else {
                    seen.insert(r.seq, r);
                }
            }
        }
        for r in in_runs {
            seen.entry(r.seq).or_insert(r);
        }
        let mut found = Vec::with_capacity(c.writes.len() + seen.len());
        for (w, own) in c.writes.iter().zip(own) {
            if let Some(last) = w.run {
                let in_run =
                    runs.get(&last).and_then(|rs| rs.iter().find(|r| r.seq == w.seq && r.seq > offset));
                // The newer of its entries in range records; its own record over both.
                let entry = match (in_run, other_runs.get(&w.seq)) {
                    (Some(a), Some(b)) => Some(if b.rev > a.rev { b } else { a }),
                    (a, b) => a.or(b),
                };
                found.push((w.seq, over_runs.remove(&w.seq).or_else(|| entry.cloned())));
                continue;
            }
            if own_gets(w) == 0 {
                found.push((w.seq, seen.remove(&w.seq)));
                continue;
            }
            let rec = match own {
                Some(kv) => self.claim_records(&prefix, &kv)?.pop(),
                None => None,
            };
            found.push((w.seq, rec));
        }
        found.extend(seen.into_iter().filter(|(seq, _)| *seq > offset).map(|(seq, r)| (seq, Some(r))));
        Ok(Some((offset, found)))
    }

    /// The key of the group's offset echo (`claim_ranges::MOVED_SUFFIX`): after the reset mark
    /// and the limit record, so that neither a reset's deletion nor a load reaches it.
    pub(super) fn moved_key(&self, group: &str, queue: &str) -> Vec<u8> {
        let mut key = self.reset_mark_key(group, queue);
        key.push(claim_ranges::MOVED_SUFFIX);
        key
    }

    pub(super) fn claims_prefix(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"c/", &keys::claim_prefix(group, queue))
    }
    pub(super) fn settings_key(&self, group: &str, queue: &str) -> Vec<u8> {
        self.key(b"g/", &keys::group_key(group, queue))
    }

    /// The claims `kv` (a key under the group's claim `prefix`) holds: one for a job's own
    /// record, each of its jobs' for a range record.
    fn claim_records(
        &self,
        prefix: &[u8],
        kv: &etcd_client::KeyValue,
    ) -> Result<Vec<ClaimRecord>, StorageError> {
        let rev = kv.mod_revision();
        match claim_ranges::parse(prefix, kv.key()) {
            Some(ClaimKey::Job(seq)) => {
                let claim = records::decode_claim(kv.key(), kv.value()).map_err(corrupt)?;
                Ok(vec![ClaimRecord { seq, claim, rev, run: None }])
            }
            Some(ClaimKey::Run(last)) => Ok(claim_ranges::decode(kv.key(), last, kv.value())
                .map_err(corrupt)?
                .into_iter()
                .map(|(seq, claim)| ClaimRecord { seq, claim, rev, run: Some(last) })
                .collect()),
            None => Err(corrupt(CorruptionError::new("claim", kv.key(), "bad sequence"))),
        }
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
        // A job's own record stands over its range record's (it was written later).
        let mut records = std::collections::BTreeMap::new();
        let mut in_runs = Vec::new();
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
            for r in self.claim_records(&prefix, kv)?.into_iter().filter(|r| r.seq > offset) {
                if r.run.is_some() {
                    in_runs.push(r);
                } else {
                    records.insert(r.seq, r);
                }
            }
        }
        for r in in_runs {
            records.entry(r.seq).or_insert(r);
        }
        let records = records.into_values().collect();
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
        view: Option<i64>,
    ) -> Result<ClaimsOutcome, StorageError> {
        let (mut cmps, mut ops, mut gets) = (Vec::new(), Vec::new(), Vec::new());
        let passed = moving.map_or(0, |m| m.to);
        let c = ClaimsTxn { group, queue, seen, writes, view };
        self.push_claims_passed(c, passed, &mut cmps, &mut ops, &mut gets);
        let windows = if view.is_some() { fresh_windows(writes) } else { Vec::new() };
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
        if ops.len() > super::MAX_TXN_OPS
            || cmps.len() > super::MAX_TXN_OPS
            || gets.len() > super::MAX_TXN_OPS
        {
            return Err(StorageError::new(format!(
                "a claim write of {} operations exceeds etcd's {} per transaction",
                ops.len().max(cmps.len()).max(gets.len()),
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
            let runs = fresh_runs_of(view, writes);
            return Ok(ClaimsOutcome::Written { rev, progress, runs });
        }
        // The answers to the gets, in order: the offset, each record, the range records, the
        // stretches, the windows, the tail, the reset mark, the limit.
        let at = resp.header().map_or(0, |h| h.revision());
        let seen_keys = (!windows.is_empty()).then_some(SeenKeys { windows, at });
        let mut whole = super::whole_answers(&resp);
        let c = ClaimsTxn { group, queue, seen, writes, view };
        let Some((offset, found)) = self.refused_claims(&c, &mut whole)? else {
            return Err(StorageError::new(format!("work group {group} on {queue} has no offset record")));
        };
        let mut answers = whole.map(|kvs| kvs.into_iter().next());
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
        Ok(ClaimsOutcome::Refused { offset, found, tail, fences, seen: seen_keys })
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
        ops.push(TxnOp::put(self.moved_key(group, queue), m.to.to_be_bytes().to_vec(), None));
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
            TxnOp::put(self.moved_key(group, queue), to.to_be_bytes().to_vec(), None),
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
        let moved = self.moved_key(group, queue);
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Put if kv.key() == moved.as_slice() => <[u8; 8]>::try_from(kv.value())
                .map(|to| Some(ClaimEvent::Moved { to: u64::from_be_bytes(to), rev: kv.mod_revision() }))
                .map_err(|_| corrupt(CorruptionError::new("offset echo", kv.key(), "expected a u64"))),
            WatchedKind::Delete { .. } if kv.key() == moved.as_slice() => Ok(None),
            WatchedKind::Put if kv.key() == mark.as_slice() => records::decode_offset(kv.key(), kv.value())
                .map(|o| Some(ClaimEvent::Reset { offset: o.committed, rev: kv.mod_revision() }))
                .map_err(corrupt),
            WatchedKind::Put if kv.key() == limit.as_slice() => {
                Self::limit_record(kv).map(|l| Some(ClaimEvent::Limit(l)))
            }
            // The group went with it.
            WatchedKind::Delete { .. } if kv.key() == limit.as_slice() => Ok(None),
            WatchedKind::Put => {
                store.claim_records(&p, kv).map(|mut r| match claim_ranges::parse(&p, kv.key()) {
                    Some(ClaimKey::Run(_)) => Some(ClaimEvent::PutRun(r)),
                    _ => r.pop().map(ClaimEvent::Put),
                })
            }
            // The group went with its reset mark: nothing the offset passed.
            WatchedKind::Delete { .. } if kv.key() == mark.as_slice() => Ok(None),
            // A deleted record (the offset passed it) names only its sequence (a range record,
            // its last).
            WatchedKind::Delete { .. } => Ok(claim_ranges::parse(&p, kv.key()).map(|k| {
                let (ClaimKey::Job(seq) | ClaimKey::Run(seq)) = k;
                ClaimEvent::Gone { seq, rev: kv.mod_revision() }
            })),
        };
        self.watch_events(prefix, opts, decode).await
    }

    /// The claim record of `seq` in work group `group` on `queue`, if there is one.
    pub async fn claim(&self, group: &str, queue: &str, seq: u64) -> Result<Option<Claim>, StorageError> {
        let prefix = self.claims_prefix(group, queue);
        // Its own record, else the range record holding it (one ends within a run's length
        // past it): read at once, the first key found is its own if it has one.
        let opts =
            GetOptions::new().with_range(keys::claim_key(&prefix, seq.saturating_add(claim_ranges::MAX_RUN)));
        let got = self.kv().get(keys::claim_key(&prefix, seq), Some(opts)).await?;
        for kv in got.kvs() {
            if let Some(r) = self.claim_records(&prefix, kv)?.into_iter().find(|r| r.seq == seq) {
                return Ok(Some(r.claim));
            }
        }
        Ok(None)
    }

    /// The message at `seq` of queue `qid`, if stored.
    pub async fn message(&self, qid: u32, seq: u64) -> Result<Option<Vec<u8>>, StorageError> {
        crate::faults::check("rockq-etcd-message-read")?;
        Ok(self.message_at(qid, seq).await?.map(|(env, _)| env))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(seq: u64) -> ClaimWrite {
        let claim = Claim::Leased { attempt: 1, token: seq, deadline_micros: 9, holder: "h".into() };
        ClaimWrite::new(seq, 0, claim)
    }

    #[test]
    fn new_leases_compare_windows_that_reach_a_run_past_each_and_split_at_wide_gaps() {
        let run = claim_ranges::MAX_RUN;
        // A retry of a held job (its record known) and an ack compare their own records.
        let held = ClaimWrite::new(3, 17, Claim::Done);
        let in_run = ClaimWrite { run: Some(9), ..ClaimWrite::new(7, 17, Claim::Done) };
        let writes = [held, in_run, lease(100), lease(101), lease(100 + run), lease(500), lease(40)];
        assert_eq!(fresh_windows(&writes), vec![(40, 100 + 2 * run), (500, 500 + run)]);
        assert_eq!(fresh_windows(&writes[..2]), Vec::<(u64, u64)>::new());
    }

    #[test]
    fn new_leases_go_in_runs_of_consecutive_jobs_and_nothing_else_does() {
        let mut writes: Vec<ClaimWrite> = (10..=12).chain([20]).map(lease).collect();
        writes.push(ClaimWrite { outcome: None, ..ClaimWrite::new(13, 5, writes[0].record.clone()) });
        let runs: Vec<(u64, u64)> = fresh_runs(&writes).into_iter().map(|(f, l, _)| (f, l)).collect();
        assert_eq!(runs, vec![(10, 12), (20, 20)]);
        assert_eq!(fresh_runs_of(None, &writes), Vec::<(u64, u64)>::new());
        assert_eq!(fresh_runs_of(Some(1), &writes), vec![(10, 12), (11, 12), (12, 12), (20, 20)]);
    }

    #[test]
    fn jobs_held_in_range_records_compare_one_stretch_per_consecutive_part_of_each() {
        let done =
            |seq, run: u64, rev| ClaimWrite { run: Some(run), ..ClaimWrite::new(seq, rev, Claim::Done) };
        // Out of order, a gap inside the first record, a second record right after it, a
        // job of its own (not in a stretch), a job named twice.
        let writes = [
            done(12, 20, 7),
            done(10, 20, 7),
            done(11, 20, 7),
            ClaimWrite::new(13, 9, Claim::Done),
            done(15, 20, 7),
            done(21, 30, 8),
            done(22, 30, 8),
            done(22, 30, 8),
        ];
        assert_eq!(run_stretches(&writes), vec![(20, 10, 12, 7), (20, 15, 15, 7), (30, 21, 22, 8)]);
        assert_eq!(run_stretches(&writes[3..4]), Vec::new());
    }
}
