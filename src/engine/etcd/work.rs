//! Work-queue groups on etcd, shared by every process of the namespace.
//!
//! Each process keeps the embedded claim state machine (`registry/work.rs`) and decides claims
//! in it as embedded; etcd decides which decision stands. Every claim record this process
//! writes compares the `mod_revision` it last saw for that record (0: none), and the group's
//! offset, so a claim decided on a stale view writes nothing; the transaction's answer then
//! carries the records as they are, and the state machine learns them: a lease another process
//! holds becomes a slot leased under a token nobody here has (claimable once its deadline
//! passes), a retry waits, a finished message is counted finished. A watch on the group's
//! claim records teaches the same from every other process's writes, without polling.
//!
//! The `mod_revision` a claim was written at is its holder's fencing token: an outcome
//! (ack, retry, dead letter) compares it, so once another process claimed the message after
//! the lease ran out, the old holder's outcome changes nothing and is answered `LeaseLost`.
//!
//! The offset moves over finished messages, whoever finished them: any process that sees the
//! run finished writes `If offset < new Then offset = new, delete records <= new`; the loser
//! of a race finds the offset already there.
//!
//! Lock order: a group's `Known` (an async mutex, held across the transactions that change
//! its records, so the watch applies nothing this process is still writing) before the claim
//! state machine's locks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::claims::{advance, load};
use super::known::{Known, WorkSide};
use super::side::{retrying, until};
use super::writer::Writer;
use crate::engine::dead_letter::{self, Origin};
use crate::engine::registry::{QueueState, QueuedAck, WorkGroupState};
use crate::engine::request::{Extension, Outcome, Reply, SettingsMode, WorkSettingsRequest};
use crate::error::{Error, StorageError};
use crate::events::Event;
use crate::model::WorkSettings;
use crate::model::{Claim, GroupMode, GroupOffset, StartFrom};
use crate::stats::{JobOutcome, OutcomeKind};
use crate::store::envelope;
use crate::store::etcd::work::{ClaimFences, FencesFound};
use crate::store::etcd::work::{
    ClaimRecord, ClaimWrite, ClaimsOutcome, OffsetMove, SeenKeys, SettingsPut, fresh_windows,
};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// Records per claim or ack transaction: etcd's operation limit, with room for the offset
/// compare and a dead-letter append.
const MAX_RECORDS: usize = MAX_TXN_OPS - 8;

/// Writes of one chunk of claims, each after a refusal that took some of them elsewhere.
const CLAIM_TRIES: u32 = 3;

impl Writer {
    /// Creates a work-queue group (or finds it), loads its claim records into a new state
    /// machine and starts watching them.
    pub(super) async fn create_work(
        &mut self,
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
    ) -> Result<Arc<WorkGroupState>, Error> {
        let id = crate::store::group_id(&group, &queue.name);
        // A stale handle's queue (deleted; the name may have made another): not the new one's.
        if queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: queue.name.to_string() });
        }
        if let Some(g) = self.engine.registry.work.get(&id) {
            return Ok(g.clone());
        }
        let store = &self.side.store;
        let t = self.side.settings.request_timeout;
        let stood = match retrying(t, || store.offset(&group, &queue.name)).await? {
            Some(o) => o,
            // An inspection makes nothing: the group was deleted since it was found.
            None if self.side.settings.passive => {
                return Err(Error::NoSuchGroup { group, queue: queue.name.to_string() });
            }
            None => {
                let committed = self.start_offset(&queue, start).await?;
                // Tests trim the queue here, after the head was read.
                crate::faults::reached("rockq-etcd-work-group-planned");
                let offset = GroupOffset { mode: GroupMode::WorkQueue, committed };
                retrying(t, || store.create_group(&group, &queue.name, offset)).await?.0
            }
        };
        if stood.mode != GroupMode::WorkQueue {
            return Err(Error::WrongMode {
                group: group.clone(),
                queue: queue.name.to_string(),
                existing: "ordered",
            });
        }
        match load(&self.engine, &self.side, queue.clone(), &group, &self.stop, &self.nudge).await? {
            Some(g) => Ok(g),
            // Deleted by another process between the read above and the load.
            None => Err(Error::GroupDeleted { group, queue: queue.name.to_string() }),
        }
    }

    /// A work group's settings, resolved against the stored record as the embedded writer
    /// does (`writer/settings.rs`), and stored with a compare on the record's revision.
    pub(super) async fn work_settings(&mut self, req: WorkSettingsRequest) {
        let WorkSettingsRequest { group, requested, mode, reply } = req;
        let _ = reply.send(self.store_work_settings(&group, &requested, mode).await);
    }

    async fn store_work_settings(
        &mut self,
        group: &Arc<WorkGroupState>,
        requested: &crate::model::RequestedWork,
        mode: SettingsMode,
    ) -> Result<Arc<WorkSettings>, Error> {
        let store = &self.side.store;
        let t = self.side.settings.request_timeout;
        let (gname, qname) = (&group.name, &group.queue.name);
        loop {
            let (current, rev) = retrying(t, || store.work_settings(gname, qname)).await?;
            let current = current.unwrap_or_default();
            let next = match (WorkSettings::stored(&current, qname), mode) {
                (Some(stored), SettingsMode::Adopt) => match requested.mismatch(&stored) {
                    Some(m) => return Err(m.into_error(gname, qname)),
                    None => stored,
                },
                (Some(stored), SettingsMode::Update) => requested.applied_to(&stored),
                (None, _) => requested.initial(&current, qname),
            };
            next.check_key_setting(gname, qname)?;
            if next.dead_letter_queue.len() > crate::name::MAX_NAME_LEN {
                return Err(Error::DeadLetterName { queue: qname.to_string() });
            }
            let record = next.stored_in(&current);
            let seen = self.side.seen(gname, qname);
            // A rate limit removed empties its bucket in the same transaction.
            let had_rate = WorkSettings::stored(&current, qname).is_some_and(|s| s.rate_limit.is_some());
            let empty_bucket = had_rate && next.rate_limit.is_none();
            let put = match record == current {
                true => SettingsPut::Written(rev),
                false => {
                    retrying(t, || store.put_work_settings(gname, qname, &record, rev, seen, empty_bucket))
                        .await?
                }
            };
            if put == SettingsPut::GroupGone {
                return Err(Error::GroupDeleted { group: gname.to_string(), queue: qname.to_string() });
            }
            if let SettingsPut::Written(_) = put {
                let next = Arc::new(next);
                group.set_settings(next.clone());
                return Ok(next);
            }
            // Another process changed the record meanwhile: resolve against the new one.
        }
    }

    /// The claims' view of `g` — of this very group: one of the name made anew after `g` was
    /// deleted has its own, which `g`'s late requests must not reach.
    pub(super) fn work_side(&self, g: &WorkGroupState) -> Option<Arc<WorkSide>> {
        let ws = self.side.work.get(&crate::store::group_id(&g.name, &g.queue.name)).map(|w| w.clone())?;
        std::ptr::eq(Arc::as_ptr(&ws.group), g).then_some(ws)
    }

    /// Persists claims decided here, but those another process took or finished since
    /// (answered: the subscription drops them from its batch). Two processes draining one
    /// group decide their claims on views a few milliseconds old, so their batches overlap
    /// now and then: the overlap is left out, not the batch — a whole batch refused would
    /// cost the loser a round, and with large batches the loser would keep losing.
    ///
    /// A claim decided before the watch taught this process otherwise is left out unwritten
    /// (its expected revision would be the other process's, and the write would take that
    /// process's live lease). A write refused by etcd teaches the records it found; the claims
    /// still this process's are written again, at most [`CLAIM_TRIES`] times, then the claim
    /// answers `LeaseLost` (the subscription gives everything back and claims again).
    ///
    /// Claims decided under the group's rate or concurrency limit (`limit_rev`: the revision
    /// of its limit record they were decided on) rewrite that record, compared: decided on a
    /// view that missed another process's limited claim, they are given back whole
    /// (`LeaseLost`) — left out one by one, the rest would still be counted on a stale view.
    /// `bucket`: the rate bucket after them (wall micros), written to the record.
    pub(super) async fn claim(
        &mut self,
        group: Arc<WorkGroupState>,
        claims: Vec<(u64, Claim)>,
        (bucket, limit_rev): (Option<u64>, Option<i64>),
        reply: Reply<Vec<u64>, Error>,
    ) {
        let Some(ws) = self.work_side(&group) else {
            let _ = reply.send(Err(Error::Storage(StorageError::new("work group not loaded"))));
            return;
        };
        let mut known = ws.known.lock().await;
        let clock = self.engine.clock().clone();
        let mut dropped = Vec::new();
        let mut held = |group: &WorkGroupState, (seq, c): &(u64, Claim)| {
            let held = matches!(c, Claim::Leased { token, .. } if group.holds_lease(*seq, *token));
            if !held {
                dropped.push(*seq);
            }
            held
        };
        let mut rest: std::collections::VecDeque<(u64, Claim)> = claims.iter().cloned().collect();
        // Claim keys a refusal read whole: a later try over them compares what it read (claims
        // put back for a transaction of their own too: `view_over` checks they are covered).
        let mut seen: Option<SeenKeys> = None;
        while !rest.is_empty() {
            let n = first_claims(rest.make_contiguous(), &known);
            let mut left: Vec<(u64, Claim)> = rest.drain(..n).filter(|c| held(&group, c)).collect();
            let mut tries = 0;
            while !left.is_empty() {
                // Fewer claims may cost more than the chunk they came from (a job taken out of
                // a run splits it in two): what no longer fits goes back, for a transaction of
                // its own.
                let fits = first_claims(&left, &known);
                for c in left.drain(fits..).rev() {
                    rest.push_front(c);
                }
                let Ok(limit) = known.limit_write(&group, bucket, limit_rev) else {
                    let (seq, attempt) = left.first().map_or((0, 0), |(s, c)| (*s, attempt_of(c)));
                    tracing::debug!(queue = %group.queue.name, group = %group.name, "rockq: limited claims decided before another process's were learned: given back");
                    let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                    return;
                };
                // A later attempt reads back the last report of an earlier one, which another
                // process may have written, in the claim's own transaction (no round trip more).
                let writes: Vec<ClaimWrite> = left
                    .iter()
                    .map(|(seq, c)| ClaimWrite {
                        read_progress: attempt_of(c) > 1,
                        run: known.run(*seq),
                        ..ClaimWrite::new(*seq, known.expected(*seq), c.clone())
                    })
                    .collect();
                let view = view_over(&known, &writes, seen.as_ref());
                let fences = Some(ClaimFences { reset_rev: known.reset_rev, limit });
                match self.write(&group, &writes, None, None, (fences, view)).await {
                    Ok(Written::Yes(rev, runs)) => {
                        let runs: std::collections::HashMap<u64, u64> = runs.into_iter().collect();
                        for w in &writes {
                            known.wrote(w.seq, rev, runs.get(&w.seq).copied(), &w.record);
                        }
                        if limit.is_some() {
                            known.limit_rev = rev;
                        }
                        for (seq, report) in std::mem::take(&mut self.read_back) {
                            group.restore_progress(seq, report);
                        }
                        break;
                    }
                    Ok(Written::No { offset, found, fences, seen: read, .. }) => {
                        // Records made since the view, in the keys the refusal read: the
                        // next try compares what it read (learned below), not the view.
                        let news = read.as_ref().is_some_and(|r| {
                            r.at > view && found.iter().any(|(_, f)| f.as_ref().is_some_and(|f| f.rev > view))
                        });
                        if read.is_some() {
                            seen = read;
                        }
                        let FencesFound { reset, limit: found_limit } =
                            fences.unwrap_or(FencesFound { reset: None, limit: None });
                        if let Some((to, rev)) = reset.filter(|(_, rev)| *rev > known.reset_rev) {
                            // A reset this process's watch has not brought yet: applied as
                            // the watch would, and learned with it the records written since
                            // (a missing one is what the reset left, unclaimed already). Every
                            // claim of this call was decided before it — an earlier chunk's
                            // too, whose records it deleted: none stands (answered as taken,
                            // not as an overlap with another process's claims).
                            known.reset(&group, to, rev);
                            let since =
                                found.into_iter().filter(|(_, r)| r.as_ref().is_some_and(|r| r.rev > rev));
                            known.learn(&group, offset, since.collect(), &clock);
                            tracing::debug!(queue = %group.queue.name, group = %group.name, "rockq: claims decided before a reset this process had not learned: given back");
                            let _ = reply.send(Ok(claims.iter().map(|(seq, _)| *seq).collect()));
                            return;
                        }
                        known.learn(&group, offset, found, &clock);
                        if let Some(l) = found_limit.filter(|l| l.rev != known.limit_rev) {
                            // Another process's limited claim: no limited claim is decided
                            // here until the watch has taught what it wrote.
                            group.note_limit(l.rev);
                        }
                        tries += 1;
                        let before = left.len();
                        left.retain(|c| held(&group, c));
                        // Nothing learned took one of them (the offset or the group moved,
                        // or it kept losing): given back whole, as any lost claim. Unless
                        // what refused it was records made since the view that hold none of
                        // them (another process's claims just past these): tried again over
                        // the keys as read.
                        if (left.len() == before && !news) || tries == CLAIM_TRIES {
                            group.note_overlap(dropped.len() as u64);
                            let (seq, attempt) = left.first().map_or((0, 0), |(s, c)| (*s, attempt_of(c)));
                            let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                            return;
                        }
                    }
                    Err(e) => {
                        // Given back uncounted by the subscription; if it landed, it is ours.
                        for w in &writes {
                            known.doubt(w.seq, w.record.clone());
                        }
                        let _ = reply.send(Err(Error::from(e)));
                        return;
                    }
                }
            }
        }
        if !dropped.is_empty() {
            group.note_overlap(dropped.len() as u64);
            tracing::debug!(queue = %group.queue.name, group = %group.name, left_out = dropped.len(), "rockq: claims another process took first were left out");
        }
        let _ = reply.send(Ok(dropped));
    }

    /// Writes `writes` (and dead letters) in one transaction. An answer lost in transit is
    /// found out by sending it again: if every record found is the one this write meant to
    /// put, it had landed.
    ///
    /// `view`: the revision through which this process knows every claim record of the group
    /// (`Known::view_rev`), which writes over jobs no record is known to hold compare (new
    /// leases go in range records).
    async fn write(
        &mut self,
        group: &WorkGroupState,
        writes: &[ClaimWrite],
        dead_letters: Option<&DeadLetterAppend>,
        moving: Option<OffsetMove>,
        (fences, view): (Option<ClaimFences>, i64),
    ) -> Result<Written, StorageError> {
        let mut r = self.write_once(group, writes, dead_letters, moving, fences, view).await;
        // A write over a job no record is known to hold (an operator's action on a job never
        // claimed) compares that no record that could hold it was made since the view. One made
        // since that holds none of them (this process's own claim just past it, not back
        // through its watch yet) refuses it: sent once more, compared with what the refusal
        // read. (A claim of new leases does the same itself, with what the refusal taught.)
        let unheld = |w: &ClaimWrite| w.expected == 0 && w.run.is_none();
        if let Ok(Written::No { found, seen: Some(read), .. }) = &r
            && fences.is_none()
            && read.at > view
            && writes.iter().any(unheld)
            && writes.iter().zip(found).all(|(w, (_, f))| !unheld(w) || f.is_none())
        {
            let view = read.at;
            r = self.write_once(group, writes, dead_letters, moving, fences, view).await;
        }
        self.note(&r);
        r
    }

    async fn write_once(
        &mut self,
        group: &WorkGroupState,
        writes: &[ClaimWrite],
        dead_letters: Option<&DeadLetterAppend>,
        moving: Option<OffsetMove>,
        fences: Option<ClaimFences>,
        view: i64,
    ) -> Result<Written, StorageError> {
        let store = self.side.store.clone();
        let deadline = Instant::now() + self.budget();
        let mut backoff = Duration::from_millis(20);
        let mut in_doubt = false;
        loop {
            let seen = self.side.seen(&group.name, &group.queue.name);
            match until(
                deadline,
                store.write_claims(
                    &group.name,
                    &group.queue.name,
                    seen,
                    writes,
                    dead_letters,
                    moving,
                    fences,
                    Some(view),
                ),
            )
            .await
            {
                Ok(ClaimsOutcome::Written { rev, progress, runs }) => {
                    self.read_back = progress;
                    return Ok(Written::Yes(rev, runs));
                }
                Ok(ClaimsOutcome::Refused { offset, found, tail, fences: found_fences, seen }) => {
                    // After an unknown outcome: ours if every record is the one this write
                    // meant to put (a `Done` may since have been passed by the offset and
                    // deleted), and the dead-letter copies are where it put them (another
                    // process's `Done` alone must not pass for a dead letter that never landed).
                    let landed = |w: &ClaimWrite, (seq, r): &(u64, Option<ClaimRecord>)| match r {
                        Some(r) => r.claim == w.record,
                        None => w.record == Claim::Done && *seq <= offset,
                    };
                    let copies = dead_letters.is_none_or(|dl| {
                        tail == Some((dl.expected_last + dl.envelopes.len() as u64, dl.nonce))
                    });
                    let mut ours = in_doubt
                        && !found.is_empty()
                        && copies
                        && writes.iter().zip(&found).all(|(w, f)| landed(w, f));
                    // And the outcome records are the ones it meant to put (another process's
                    // `Done`, an operator's delete, comes with an outcome of its own).
                    // Unknown still if it cannot be read: the write's outcome is unknown.
                    for w in writes {
                        if let (true, Some(o)) = (ours, &w.outcome) {
                            let (g, q) = (&group.name, &group.queue.name);
                            ours = until(deadline, store.outcome_is(g, q, w.seq, o)).await?;
                        }
                    }
                    if ours {
                        // (Of this write's records: what else the refusal read may be newer.)
                        let rev = found
                            .iter()
                            .take(writes.len())
                            .filter_map(|(_, r)| r.as_ref().map(|r| r.rev))
                            .max()
                            .unwrap_or(0);
                        let runs = found
                            .iter()
                            .take(writes.len())
                            .filter_map(|(seq, r)| Some((*seq, r.as_ref()?.run?)))
                            .collect();
                        return Ok(Written::Yes(rev, runs));
                    }
                    return Ok(Written::No { offset, found, tail, fences: found_fences, seen });
                }
                Err(e) => {
                    if Instant::now() + backoff >= deadline {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "rockq: claim write to etcd failed; trying again");
                    in_doubt = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(super::side::RETRY_CAP);
                }
            }
        }
    }

    /// Records the outcome of one attempt, compared with the holder's claim revision. One that
    /// fails to reach etcd puts the message back: to claimable, or for an operator's action
    /// (`taken_from`) to the state it was taken from (a retry keeps its due time).
    pub(super) async fn outcome(
        &mut self,
        group: Arc<WorkGroupState>,
        (seq, attempt, taken_from): (u64, u32, Option<crate::engine::registry::TakenFrom>),
        outcome: Outcome,
        reply: Reply<(), Error>,
    ) {
        let undo = |group: &WorkGroupState| match taken_from {
            Some(previous) => group.operator_revert(seq, previous),
            None => group.revert(seq),
        };
        let Some(ws) = self.work_side(&group) else {
            undo(&group);
            let _ = reply.send(Err(Error::Storage(StorageError::new("work group not loaded"))));
            return;
        };
        let mut known = ws.known.lock().await;
        let clock = self.engine.clock().clone();
        // The revision the outcome was decided on: this process's claim for a holder's retry
        // (the job made the slot wait already); for an ack, a dead letter or an operator's
        // retry (`work/operator.rs`: the slot stays settling until this answers), whatever the
        // record was when the slot was set settling (a job's claim, a message out of attempts,
        // a retry waiting, nothing), unless the watch taught something newer since (then the
        // slot is no longer settling). The write compares that revision: anything another
        // process wrote since refuses it.
        let settled = || group.is_settling(seq).then(|| known.expected(seq));
        let expected = match &outcome {
            Outcome::Retry { .. } => known.own(seq).or_else(settled),
            _ => settled(),
        };
        let Some(expected) = expected else {
            // Another process's write to it was learned since: its state stands.
            let _ = reply.send(Err(group.lease_lost(seq, attempt)));
            return;
        };
        let (queue, gname) = (group.queue.name.clone(), group.name.clone());
        match outcome {
            Outcome::Ack { .. } | Outcome::Deleted => {
                let (kind, result, at) = match outcome {
                    Outcome::Ack { result, flow } => (OutcomeKind::Acked, result, flow),
                    // An operator's: the flow step is read from the message.
                    _ => match self.flow_step_of(&group.queue, seq).await {
                        Ok(at) => (OutcomeKind::Deleted, None, at),
                        Err(e) => {
                            undo(&group);
                            let _ = reply.send(Err(Error::from(e)));
                            return;
                        }
                    },
                };
                let flow = self.flow_change(&group, seq, at, (&kind, attempt, result.as_ref()));
                let outcome = self.outcome_record(group.keeps_outcomes(), kind, attempt, result);
                let delete_progress = group.forget_progress(seq);
                let writes = [ClaimWrite {
                    outcome,
                    flow,
                    delete_progress,
                    run: known.run(seq),
                    ..ClaimWrite::new(seq, expected, Claim::Done)
                }];
                let view = known.view_rev;
                // With the offset move if it closes the run above the offset (as the queued
                // acks'); refused with the record as expected, the move's own compares
                // refused it, and it goes again without. Not for a message that has no
                // record (an operator's delete of a job never claimed): deleting a key that
                // is not there tells no watch anything, so the other processes would never
                // learn it finished — its `Done` goes, and the move follows.
                let mut moving = if expected == 0 { None } else { self.move_with(&group, &known, &[seq]) };
                let mut written = self.write(&group, &writes, None, moving, (None, view)).await;
                if let (Some(_), Ok(Written::No { found, .. })) = (moving, &written)
                    && found.iter().all(|(s, r)| r.as_ref().map(|r| r.rev) == Some(known.expected(*s)))
                {
                    moving = None;
                    written = self.write(&group, &writes, None, None, (None, view)).await;
                }
                match written {
                    Ok(Written::Yes(rev, _)) => {
                        known.wrote(seq, rev, None, &Claim::Done);
                        group.learn_finished(seq);
                        if let Some(m) = moving {
                            known.learn_offset(&group, m.to);
                            self.engine.counters.offset_commits.fetch_add(1, Ordering::Relaxed);
                        }
                        // As embedded, the offset has passed it when the ack is answered.
                        if let Err(e) = self.advance(&group, &mut known).await {
                            tracing::warn!(%queue, group = %gname, error = %e, "rockq: moving a work group's offset in etcd failed; trying again next round");
                        }
                        // And its flow has moved on (no group's records held meanwhile).
                        self.wrote_changes(writes.iter().filter_map(|w| w.flow.clone()), rev);
                        drop(known);
                        self.apply_own().await;
                        telemetry::group_counter(telemetry::ACKED, &queue, &gname, 1);
                        self.engine.emit(|| Event::Acked { queue, group: gname, seq, attempt });
                        let _ = reply.send(Ok(()));
                    }
                    Ok(Written::No { offset, found, .. }) => {
                        known.learn(&group, offset, found, &clock);
                        let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                    }
                    Err(e) => {
                        undo(&group);
                        let _ = reply.send(Err(Error::from(e)));
                    }
                }
            }
            Outcome::Retry { claim, delay } => {
                let error = match &claim {
                    Claim::Waiting { last_error, .. } => last_error.clone(),
                    _ => String::new(),
                };
                let writes = [ClaimWrite { run: known.run(seq), ..ClaimWrite::new(seq, expected, claim) }];
                match self.write(&group, &writes, None, None, (None, known.view_rev)).await {
                    Ok(Written::Yes(rev, _)) => {
                        known.wrote(seq, rev, None, &writes[0].record);
                        tracing::debug!(%queue, group = %gname, seq, attempt, ?delay, %error, "rockq: retry scheduled");
                        telemetry::group_counter(telemetry::RETRIED, &queue, &gname, 1);
                        self.engine.emit(|| Event::Retried {
                            queue,
                            group: gname,
                            seq,
                            attempt,
                            delay,
                            error,
                        });
                        let _ = reply.send(Ok(()));
                    }
                    Ok(Written::No { offset, found, .. }) => {
                        known.learn(&group, offset, found, &clock);
                        let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                    }
                    Err(e) => {
                        // Waiting here already; claimable when due, as after a crash.
                        let _ = reply.send(Err(Error::from(e)));
                    }
                }
            }
            Outcome::DeadLetter { reason, dlq } => {
                let res = self.dead_letter(&group, &mut known, (seq, attempt, expected), &reason, &dlq).await;
                match res {
                    Ok(Some((dlq_seq, reason))) => {
                        group.learn_finished(seq);
                        if let Err(e) = self.advance(&group, &mut known).await {
                            tracing::warn!(%queue, group = %gname, error = %e, "rockq: moving a work group's offset in etcd failed; trying again next round");
                        }
                        // Its flow has moved on (no group's records held meanwhile).
                        drop(known);
                        self.apply_own().await;
                        tracing::warn!(%queue, group = %gname, seq, attempt, %reason, %dlq, dlq_seq, "rockq: dead-lettered");
                        telemetry::group_counter(telemetry::DEAD_LETTERED, &queue, &gname, 1);
                        self.engine.emit(|| Event::DeadLettered {
                            queue,
                            group: gname,
                            seq,
                            attempts: attempt,
                            reason,
                            dlq,
                            dlq_seq,
                        });
                        let _ = reply.send(Ok(()));
                    }
                    Ok(None) => {
                        let _ = reply.send(Err(group.lease_lost(seq, attempt)));
                    }
                    Err(e) => {
                        undo(&group);
                        let _ = reply.send(Err(Error::from(e)));
                    }
                }
            }
        }
    }

    /// Rewrites a lease with the latest deadline its holder asked for, compared with this
    /// holder's claim.
    ///
    /// - Written: that deadline is what others read now; the holder's lease is it again (an
    ///   earlier failed extension may have shortened it), unless a later extension is on its way.
    /// - Lost meanwhile (another process claimed it after the old deadline): learned, and the
    ///   holder's outcome is refused.
    /// - Not written (etcd unreachable, or the answer lost) or not tried (the lease is no
    ///   longer held as it was): the holder's lease goes back to the deadline others read, so
    ///   that it never believes it holds the job after another process may have claimed it.
    pub(super) async fn extend(&mut self, ext: Extension) {
        let Extension { group, seq, attempt, token, holder, number, lease } = ext;
        let clock = self.engine.clock().clone();
        let take_back = |group: &WorkGroupState| {
            let mut l = lease.lock().unwrap_or_else(|p| p.into_inner());
            l.deadline = l.deadline.min(l.persisted);
            group.cap_lease(seq, token, l.persisted);
        };
        let Some(ws) = self.work_side(&group) else { return };
        let mut known = ws.known.lock().await;
        let Some(expected) = known.own(seq).filter(|_| group.holds_lease(seq, token)) else {
            take_back(&group);
            return;
        };
        let requested = lease.lock().unwrap_or_else(|p| p.into_inner()).requested;
        let claim =
            Claim::Leased { attempt, token, deadline_micros: clock.wall_micros_at(requested), holder };
        let writes = [ClaimWrite { run: known.run(seq), ..ClaimWrite::new(seq, expected, claim.clone()) }];
        match self.write(&group, &writes, None, None, (None, known.view_rev)).await {
            Ok(Written::Yes(rev, _)) => {
                known.wrote(seq, rev, None, &claim);
                let mut l = lease.lock().unwrap_or_else(|p| p.into_inner());
                l.persisted = requested;
                if l.extensions == number && group.extend(seq, token, clock.now(), requested).is_ok() {
                    l.deadline = requested;
                }
            }
            Ok(Written::No { offset, found, .. }) => known.learn(&group, offset, found, &clock),
            Err(e) => {
                tracing::warn!(queue = %group.queue.name, group = %group.name, seq, error = %e, "rockq: a lease extension did not reach etcd; the holder keeps the deadline other processes see");
                // If it landed after all, the watch shows this process's own record.
                known.doubt(seq, claim);
                take_back(&group);
            }
        }
    }

    /// Copies the message to `dlq` and marks it done, in one transaction compared with the
    /// claim and the dead-letter queue's tail. `Ok(None)`: the claim was lost (learned).
    async fn dead_letter(
        &mut self,
        group: &WorkGroupState,
        known: &mut Known,
        (seq, attempt, expected): (u64, u32, i64),
        reason: &str,
        dlq: &str,
    ) -> Result<Option<(u64, String)>, StorageError> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let delete_progress = group.forget_progress(seq);
        let q = self.create_queue(dlq).await.map_err(|e| StorageError::new(e.to_string()))?;
        let stored = retrying(t, || store.message(group.queue.id, seq)).await?;
        let (env, reason) = match stored {
            Some(v) => {
                let env = envelope::decode(b"", &v).unwrap_or_else(|_| envelope::Envelope {
                    payload: bytes::Bytes::from(v),
                    ..envelope::Envelope::default()
                });
                (env, reason.to_owned())
            }
            None => (envelope::Envelope::default(), format!("{reason} (the stored message was missing)")),
        };
        let at = crate::flow_state::FlowStep::in_headers(&env.headers);
        let stamped = self.stamp();
        let origin = Origin { queue: &group.queue, group: &group.name, seq, attempts: attempt };
        let (copy, reason) = dead_letter::copy(&origin, &reason, env, stamped).map_err(StorageError::new)?;
        let deadline = Instant::now() + t;
        loop {
            let (last, nonce) = match self.tails.get(&q.id) {
                Some(&tail) => tail,
                None => retrying(t, || store.tail_record(q.id)).await?,
            };
            let append = DeadLetterAppend {
                qid: q.id,
                expected_last: last,
                expected_nonce: nonce,
                nonce: self.nonce(),
                envelopes: vec![copy.clone()],
            };
            let kind = OutcomeKind::DeadLettered {
                reason: reason.clone(),
                dead_letter_queue: dlq.to_owned(),
                dead_letter_seq: last + 1,
            };
            let flow = self.flow_change(group, seq, at, (&kind, attempt, None));
            let outcome = self.outcome_record(group.keeps_outcomes(), kind, attempt, None);
            let writes = [ClaimWrite {
                outcome,
                flow,
                delete_progress,
                run: known.run(seq),
                ..ClaimWrite::new(seq, expected, Claim::Done)
            }];
            match self.write(group, &writes, Some(&append), None, (None, known.view_rev)).await {
                Ok(Written::Yes(rev, _)) => {
                    known.wrote(seq, rev, None, &Claim::Done);
                    self.tails.insert(q.id, (last + 1, append.nonce));
                    super::writer::index_sent(&q, last + 1, &append.envelopes);
                    q.publish_max(last + 1);
                    telemetry::produced(&q.produced, 1);
                    self.wrote_changes(writes.iter().filter_map(|w| w.flow.clone()), rev);
                    return Ok(Some((last + 1, reason)));
                }
                Ok(Written::No { offset, found, tail, .. }) => {
                    let still_ours = offset < seq
                        && found.first().and_then(|(_, r)| r.as_ref()).is_some_and(|r| r.rev == expected);
                    if still_ours && Instant::now() < deadline {
                        // Only the dead-letter queue's tail moved: append on the new one. Not
                        // moved at all: a large send call holds the queue (`reserve.rs`); wait
                        // a moment rather than ask again at once.
                        if tail == Some((last, nonce)) {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        match tail {
                            Some(t) => self.tails.insert(q.id, t),
                            None => self.tails.remove(&q.id),
                        };
                        continue;
                    }
                    self.tails.remove(&q.id);
                    if still_ours {
                        return Err(StorageError::new("etcd: the dead-letter queue kept moving"));
                    }
                    known.learn(group, offset, found, &self.engine.clock().clone());
                    return Ok(None);
                }
                Err(e) => {
                    self.tails.remove(&q.id);
                    return Err(e);
                }
            }
        }
    }

    /// Acks queued by jobs (`Job::ack`), per group as `Done` records in transactions of up to
    /// [`MAX_RECORDS`]. An ack whose claim another process took since is dropped (the message
    /// is that process's now: delivered again, at least once).
    pub(super) async fn commit_work_acks(&mut self) -> Result<(), StorageError> {
        let mut result = Ok(());
        for g in self.engine.take_work_dirty() {
            let acks = g.take_queued_acks();
            let Some(ws) = self.work_side(&g) else { continue };
            let mut known = ws.known.lock().await;
            let clock = self.engine.clock().clone();
            self.write_progress(&g, &known).await;
            // Read once: the settings watch may change it while a chunk is written.
            let keeps = g.keeps_outcomes();
            // The jobs whose reports go with their acks (taken from memory once: a chunk
            // written again after a refusal still deletes them).
            let with_progress: std::collections::HashSet<u64> =
                acks.iter().filter(|a| g.forget_progress(a.seq)).map(|a| a.seq).collect();
            let steps = acks.iter().any(|a| a.flow.is_some());
            let per_ack =
                1 + usize::from(keeps) + usize::from(!with_progress.is_empty()) + usize::from(steps);
            // In order: the jobs held in one range record, acked together, compare one stretch.
            let mut acks = acks;
            acks.sort_by_key(|a| a.seq);
            let mut rest = std::collections::VecDeque::from(acks);
            while !rest.is_empty() {
                let n = acks_fit(rest.make_contiguous(), per_ack, |seq| known.run(seq));
                let mut left: Vec<QueuedAck> = rest.drain(..n).collect();
                // Claims another process took since (as learned): lost, nothing is sent. One
                // learned finished (most often this very ack, written by a round whose answer
                // was lost, and learned back from the watch) is acknowledged: reported so.
                let mut finished = Vec::new();
                left.retain(|a| {
                    let own = known.own(a.seq).is_some();
                    if !own {
                        let p = g.progress();
                        if a.seq <= p.offset || p.done.contains(a.seq) {
                            finished.push(a.clone());
                        } else {
                            tracing::debug!(queue = %g.queue.name, group = %g.name, seq = a.seq, "rockq: an ack lost its claim to another process");
                        }
                    }
                    own
                });
                self.acked(&g, &finished);
                // The offset moves in the acks' own transaction when they (with what is known
                // finished) extend the finished run above it; a refusal that changed none of
                // them sends them again without it (a reset not learned yet, or another
                // process moved the offset past a gap below them).
                let mut with_move = true;
                while !left.is_empty() {
                    // Fewer acks may cost more compares than the chunk they came from (a job
                    // taken out of a stretch splits it in two): what no longer fits goes back,
                    // for a transaction of its own.
                    let fits = acks_fit(&left, per_ack, |seq| known.run(seq));
                    for a in left.drain(fits..).rev() {
                        rest.push_front(a);
                    }
                    if result.as_ref().is_err_and(StorageError::is_transient) {
                        // etcd is unreachable this round: these wait for the next, untried.
                        if left.drain(..).fold(false, |d, a| g.queue_ack(a) | d) {
                            self.engine.mark_work_dirty(g.clone());
                        }
                        break;
                    }
                    let writes: Vec<ClaimWrite> = left
                        .iter()
                        .filter_map(|a| {
                            known.own(a.seq).map(|expected| ClaimWrite {
                                seq: a.seq,
                                expected,
                                run: known.run(a.seq),
                                record: Claim::Done,
                                outcome: self.outcome_record(
                                    keeps,
                                    OutcomeKind::Acked,
                                    a.attempt,
                                    a.result.clone(),
                                ),
                                flow: self.flow_change(
                                    &g,
                                    a.seq,
                                    a.flow,
                                    (&OutcomeKind::Acked, a.attempt, a.result.as_ref()),
                                ),
                                delete_progress: with_progress.contains(&a.seq),
                                read_progress: false,
                            })
                        })
                        .collect();
                    let acked: Vec<u64> = left.iter().map(|a| a.seq).collect();
                    let moving = if with_move { self.move_with(&g, &known, &acked) } else { None };
                    match self.write(&g, &writes, None, moving, (None, known.view_rev)).await {
                        Ok(Written::Yes(rev, _)) => {
                            for a in &left {
                                known.wrote(a.seq, rev, None, &Claim::Done);
                            }
                            for a in &left {
                                g.learn_finished(a.seq);
                            }
                            self.wrote_changes(writes.iter().filter_map(|w| w.flow.clone()), rev);
                            if let Some(m) = moving {
                                known.learn_offset(&g, m.to);
                                self.engine.counters.offset_commits.fetch_add(1, Ordering::Relaxed);
                            }
                            self.acked(&g, &left);
                            left.clear();
                        }
                        Ok(Written::No { offset, found, .. }) => {
                            // Keep the acks whose records did not change; learn the rest.
                            let mut lost = Vec::new();
                            let mut changed = Vec::new();
                            // Found finished: most often this ack, written in an earlier round
                            // whose answer was lost (an outage); else another process finished
                            // it. Either way the message is acknowledged: reported as such.
                            let mut finished = Vec::new();
                            for (a, (seq, rec)) in left.iter().zip(found) {
                                let same = seq > offset && rec.as_ref().map(|r| r.rev) == known.own(seq);
                                if !same {
                                    let done = match &rec {
                                        Some(r) => r.claim == Claim::Done,
                                        None => seq <= offset,
                                    };
                                    if done {
                                        finished.push(a.clone());
                                    } else {
                                        tracing::debug!(queue = %g.queue.name, group = %g.name, seq, "rockq: an ack lost its claim to another process");
                                    }
                                    lost.push(a.seq);
                                    changed.push((seq, rec));
                                }
                            }
                            if lost.is_empty() {
                                // Every record as expected: the move's own compares refused.
                                with_move = false;
                            }
                            known.learn(&g, offset, changed, &clock);
                            self.acked(&g, &finished);
                            left.retain(|a| !lost.contains(&a.seq));
                        }
                        Err(e) if e.is_transient() => {
                            // etcd unreachable for the whole request timeout: the handlers
                            // succeeded, so the acks stay queued (their messages settling, not
                            // claimable here) and go with a later round. Fenced as ever: if
                            // another process claims one meanwhile (its lease ran out), that
                            // ack is refused and learned then.
                            tracing::warn!(queue = %g.queue.name, group = %g.name, error = %e, acks = left.len(), "rockq: acks could not reach etcd; keeping them for the next round");
                            let mut dirty = false;
                            for a in left.drain(..) {
                                dirty |= g.queue_ack(a);
                            }
                            if dirty {
                                self.engine.mark_work_dirty(g.clone());
                            }
                            let retry_in = super::writer::next_retry(self.retry_after);
                            telemetry::group_counter(telemetry::STORE_UNAVAILABLE, &g.queue.name, &g.name, 1);
                            self.engine.emit(|| Event::StoreUnavailable {
                                queue: g.queue.name.clone(),
                                group: g.name.clone(),
                                error: e.message().to_owned(),
                                retry_in,
                            });
                            result = Err(e);
                        }
                        Err(e) => {
                            tracing::warn!(queue = %g.queue.name, group = %g.name, error = %e, "rockq: acks to etcd failed; their messages are delivered again when their leases run out");
                            for a in &left {
                                g.revert(a.seq);
                            }
                            result = Err(e);
                            left.clear();
                        }
                    }
                }
            }
        }
        // Their flows moved on, with no group's records held.
        self.apply_own().await;
        result
    }

    /// The offset move that goes with `acks` (`None`: they extend no finished run above the
    /// stored offset): over the run the group knows finished above its offset, and these.
    fn move_with(&self, g: &WorkGroupState, known: &Known, acks: &[u64]) -> Option<OffsetMove> {
        // Tests hold an offset move back to a later round (a reset lands in between).
        crate::faults::check("rockq-etcd-offset-move").ok()?;
        let acked: std::collections::HashSet<u64> = acks.iter().copied().collect();
        let p = g.progress();
        let mut to = p.offset;
        while p.done.contains(to + 1) || acked.contains(&(to + 1)) {
            to += 1;
        }
        (to > known.stored_offset).then_some(OffsetMove { to, reset_rev: known.reset_rev })
    }

    fn acked(&self, g: &WorkGroupState, acks: &[QueuedAck]) {
        let (queue, group) = (&g.queue.name, &g.name);
        telemetry::group_counter(telemetry::ACKED, queue, group, acks.len() as u64);
        if self.engine.events.receiver_count() > 0 {
            for a in acks {
                let (seq, attempt) = (a.seq, a.attempt);
                self.engine.emit(|| Event::Acked {
                    queue: queue.clone(),
                    group: group.clone(),
                    seq,
                    attempt,
                });
            }
        }
    }

    /// Moves each work group's stored offset over what this process knows to be finished.
    pub(super) async fn move_work_offsets(&mut self) -> Result<(), StorageError> {
        let sides: Vec<Arc<WorkSide>> = self.side.work.iter().map(|w| w.clone()).collect();
        let mut result = Ok(());
        for ws in sides {
            if result.as_ref().is_err_and(StorageError::is_transient) {
                break; // etcd is unreachable this round: the rest moves next round.
            }
            let mut known = ws.known.lock().await;
            if let Err(e) = self.advance(&ws.group, &mut known).await {
                result = Err(e);
            }
        }
        result
    }

    /// Moves `g`'s stored offset over the finished run above it, if this process knows of one.
    pub(super) async fn advance(
        &mut self,
        g: &WorkGroupState,
        known: &mut Known,
    ) -> Result<(), StorageError> {
        let moved = until(Instant::now() + self.budget(), advance(&self.side, g, known)).await;
        self.note(&moved);
        if moved? {
            self.engine.counters.offset_commits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Writer {
    /// Writes `g`'s queued progress reports, each only while the reporting holder's claim is
    /// still this process's (compared by revision in etcd). A report whose holder lost its
    /// claim, or that etcd did not take, is dropped: the slot keeps it for this attempt's
    /// lookups here, and the holder's next report goes again.
    async fn write_progress(&mut self, g: &WorkGroupState, known: &Known) {
        let reports = g.take_queued_progress();
        if reports.is_empty() {
            return;
        }
        let store = self.side.store.clone();
        let deadline = Instant::now() + self.budget();
        for (seq, report) in reports {
            let Some(rev) = known.own(seq) else { continue };
            let at = (seq, known.run(seq));
            let put = until(deadline, store.put_progress(&g.name, &g.queue.name, at, rev, &report)).await;
            match put {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(queue = %g.queue.name, group = %g.name, seq, "rockq: a progress report lost its claim; not written");
                }
                Err(e) => {
                    tracing::warn!(queue = %g.queue.name, group = %g.name, seq, error = %e, "rockq: a progress report could not be written to etcd");
                }
            }
        }
    }

    /// Job `seq`'s outcome record if `keeps` (its group keeps outcomes: read once by the
    /// caller, so that a batch cut for it gets outcomes all or none), stamped with the broker's
    /// wall clock now.
    pub(super) fn outcome_record(
        &self,
        keeps: bool,
        kind: OutcomeKind,
        attempt: u32,
        result: Option<bytes::Bytes>,
    ) -> Option<JobOutcome> {
        if !keeps {
            return None;
        }
        let finished_at = std::time::UNIX_EPOCH + Duration::from_micros(self.engine.clock().wall_micros());
        Some(JobOutcome { kind, finished_at, attempt, result })
    }
}

/// Progress reports read back in one claim transaction at most: each is up to 64 KiB, and the
/// answer must stay within the client's 4 MiB.
const READ_BACKS: usize = 32;

/// Keys a claim transaction's windows may span (`store/etcd/work.rs::fresh_windows`): a
/// refusal reads them whole, and the answer must stay within the client's 4 MiB.
const MAX_WINDOW_SPAN: u64 = 4096;

/// How many of `claims` (at least one) go in one transaction of at most [`MAX_RECORDS`]
/// operations, counting writes, compares and reads alike (etcd does): a claim of a job held by
/// a record takes its own write, compare and read, one more for a range record it is held in,
/// and one more if it reads its progress report back (a later attempt; at most [`READ_BACKS`]
/// do). New leases of jobs no record holds (`unheld`) go in range records, fenced by windows
/// (`store/etcd/work.rs`): they take one for each run they start — a range record's put, and
/// at most one window's compare and read — however many jobs the run holds, and the windows
/// span at most [`MAX_WINDOW_SPAN`] keys.
fn claims_fit(claims: &[(u64, Claim)], in_run: impl Fn(u64) -> bool, unheld: impl Fn(u64) -> bool) -> usize {
    let run_len = crate::store::etcd::claim_ranges::MAX_RUN;
    let (mut ops, mut reads, mut span) = (0, 0, 0);
    // The last new lease counted and the length of its run so far; the last unheld job and
    // the end of its window.
    let mut streak: Option<(u64, &Claim, u64)> = None;
    let mut window: Option<(u64, u64)> = None;
    for (i, (seq, c)) in claims.iter().enumerate() {
        let read = usize::from(attempt_of(c) > 1);
        let unheld = unheld(*seq) && !in_run(*seq);
        let fresh = matches!(c, Claim::Leased { .. }) && unheld;
        // Whether it goes in the run of the last new lease counted (an over-count when the
        // claims are out of order: a run is only ever counted more often, never less).
        let extends = streak.is_some_and(|(last, lease, n)| {
            last.checked_add(1) == Some(*seq) && alike(lease, c) && n < run_len
        });
        let n = match (fresh, extends) {
            (true, true) => read,
            (true, false) => 1 + read,
            // Its own record; an unheld job's is fenced by a window too.
            (false, _) => 1 + read + usize::from(in_run(*seq)) + usize::from(unheld),
        };
        // A window reaches a run's length past each job, and one within it extends it (out
        // of order, a job counts a window of its own: never fewer keys than the store's).
        let end = seq.saturating_add(run_len);
        let keys = match window {
            _ if !unheld => 0,
            Some((last, to)) if last < *seq && *seq < to => end - to,
            _ => run_len,
        };
        if i > 0 && (ops + n > MAX_RECORDS || reads + read > READ_BACKS || span + keys > MAX_WINDOW_SPAN) {
            return i;
        }
        if unheld {
            window = Some((*seq, end));
        }
        if fresh {
            streak = Some(match streak {
                Some((_, lease, len)) if extends => (*seq, lease, len + 1),
                _ => (*seq, c, 1),
            });
        }
        (ops, reads, span) = (ops + n, reads + read, span + keys);
    }
    claims.len()
}

/// How many of `claims` go in the first transaction ([`claims_fit`]), as `known` holds their
/// jobs.
fn first_claims(claims: &[(u64, Claim)], known: &Known) -> usize {
    claims_fit(claims, |seq| known.run(seq).is_some(), |seq| known.expected(seq) == 0)
}

/// Whether two leases go in one range record (`claim_ranges::runs`).
fn alike(a: &Claim, b: &Claim) -> bool {
    match (a, b) {
        (
            Claim::Leased { attempt: a1, deadline_micros: d1, holder: h1, .. },
            Claim::Leased { attempt: a2, deadline_micros: d2, holder: h2, .. },
        ) => a1 == a2 && d1 == d2 && h1 == h2,
        _ => false,
    }
}

/// How many of `acks` (in order of sequence; at least one) go in one transaction of at most
/// [`MAX_RECORDS`] operations: `per_ack` writes each (its `Done`, its outcome record, the
/// deletion of its progress report), and as many compares and reads, which etcd counts alike:
/// one each for a job's own record, and for jobs held in a range record (`run_of`: its last
/// sequence) one for each stretch of consecutive ones and one for the record. Their results
/// together stay within [`MAX_TXN_BYTES`] (at least one ack: a result is at most 1 MiB, within
/// etcd's request limit).
fn acks_fit(acks: &[QueuedAck], per_ack: usize, run_of: impl Fn(u64) -> Option<u64>) -> usize {
    let (mut bytes, mut writes, mut reads) = (0, 0, 0);
    let mut prev: Option<(u64, Option<u64>)> = None;
    for (i, a) in acks.iter().enumerate() {
        // A flow step's change record carries the result again.
        let size = a.result.as_ref().map_or(0, |r| r.len()) * (1 + usize::from(a.flow.is_some()));
        let run = run_of(a.seq);
        // Compared and read: its own record; or, in a range record, a new stretch (and the
        // record, once a transaction: counted again when the record's jobs are not adjacent).
        let read = match (run, prev) {
            (None, _) => 1,
            (Some(last), Some((p, Some(l)))) if l == last => usize::from(p.checked_add(1) != Some(a.seq)),
            (Some(_), _) => 2,
        };
        if i > 0
            && (writes + per_ack > MAX_RECORDS || reads + read > MAX_RECORDS || bytes + size > MAX_TXN_BYTES)
        {
            return i;
        }
        (bytes, writes, reads) = (bytes + size, writes + per_ack, reads + read);
        prev = Some((a.seq, run));
    }
    acks.len()
}

/// The answer to [`Writer::write`].
enum Written {
    /// Written at this revision; the jobs it put in range records, each with the last
    /// sequence of its record.
    Yes(i64, Vec<(u64, u64)>),
    No {
        offset: u64,
        found: Vec<(u64, Option<ClaimRecord>)>,
        tail: Option<(u64, u64)>,
        /// The fences as found, if the write compared them.
        fences: Option<FencesFound>,
        /// The claim keys read whole with the refusal (`ClaimsOutcome::Refused::seen`).
        seen: Option<SeenKeys>,
    },
}

/// The revision a claim's writes over jobs no record is known to hold compare: the view of
/// every record this process has, or a refusal's read of the keys they compare, if newer and
/// covering them all.
fn view_over(known: &Known, writes: &[ClaimWrite], seen: Option<&SeenKeys>) -> i64 {
    let windows = fresh_windows(writes);
    match seen {
        Some(r)
            if !windows.is_empty()
                && windows.iter().all(|&(from, to)| r.windows.iter().any(|&(f, t)| f <= from && to <= t)) =>
        {
            known.view_rev.max(r.at)
        }
        _ => known.view_rev,
    }
}

fn attempt_of(c: &Claim) -> u32 {
    match c {
        Claim::Leased { attempt, .. } | Claim::Waiting { attempt, .. } => *attempt,
        Claim::Done => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::etcd::claim_ranges;
    use crate::store::etcd::work::run_stretches;

    fn ack(seq: u64) -> QueuedAck {
        QueuedAck { seq, attempt: 1, epoch: 0, result: None, flow: None }
    }

    /// The compares (and as many reads) a chunk's acks cost in etcd: a job's own record each,
    /// a stretch each and a range record once for jobs held in range records.
    fn compares(chunk: &[QueuedAck], run_of: &impl Fn(u64) -> Option<u64>) -> usize {
        let writes: Vec<ClaimWrite> = chunk
            .iter()
            .map(|a| ClaimWrite { run: run_of(a.seq), ..ClaimWrite::new(a.seq, 5, Claim::Done) })
            .collect();
        let own = writes.iter().filter(|w| w.run.is_none()).count();
        let runs: std::collections::HashSet<u64> = writes.iter().filter_map(|w| w.run).collect();
        own + run_stretches(&writes).len() + runs.len()
    }

    /// `items` cut into transactions as the writer sends them, `fit` telling how many of the
    /// rest go in the next.
    fn cut<T>(mut items: &[T], fit: impl Fn(&[T]) -> usize) -> Vec<&[T]> {
        let mut out = Vec::new();
        while !items.is_empty() {
            let (chunk, rest) = items.split_at(fit(items));
            out.push(chunk);
            items = rest;
        }
        out
    }

    fn claim_chunks(
        claims: &[(u64, Claim)],
        in_run: impl Fn(u64) -> bool + Copy,
        unheld: impl Fn(u64) -> bool + Copy,
    ) -> Vec<&[(u64, Claim)]> {
        cut(claims, |c| claims_fit(c, in_run, unheld))
    }

    fn ack_chunks(
        acks: &[QueuedAck],
        per_ack: usize,
        run_of: impl Fn(u64) -> Option<u64> + Copy,
    ) -> Vec<&[QueuedAck]> {
        cut(acks, |a| acks_fit(a, per_ack, run_of))
    }

    fn lease(seq: u64) -> (u64, Claim) {
        (seq, Claim::Leased { attempt: 1, token: seq, deadline_micros: 7, holder: "h".into() })
    }

    #[test]
    fn new_leases_cost_a_transaction_one_operation_a_run_and_held_jobs_their_own() {
        let lens = |claims: &[(u64, Claim)], unheld: &dyn Fn(u64) -> bool| -> Vec<usize> {
            claim_chunks(claims, |_| false, unheld).iter().map(|c| c.len()).collect()
        };
        // 1,000 consecutive new leases: 16 range records, one transaction.
        let run: Vec<(u64, Claim)> = (1..=1000).map(lease).collect();
        assert_eq!(lens(&run, &|_| true), vec![1000]);
        // Held by records (later attempts after another process's): one each.
        assert_eq!(lens(&run, &|_| false), vec![MAX_RECORDS; 8].into_iter().chain([40]).collect::<Vec<_>>());
        // Every other job: a record each.
        let sparse: Vec<(u64, Claim)> = (1..=2000).step_by(2).map(lease).collect();
        assert!(lens(&sparse, &|_| true).iter().all(|&n| n <= MAX_RECORDS));
        // Unlike leases break runs (another deadline).
        let mut unlike = run.clone();
        for (i, c) in unlike.iter_mut().enumerate() {
            if let Claim::Leased { deadline_micros, .. } = &mut c.1 {
                *deadline_micros = i as u64;
            }
        }
        assert!(lens(&unlike, &|_| true).iter().all(|&n| n <= MAX_RECORDS));
        // Windows span at most MAX_WINDOW_SPAN keys (a run's length past the last job): 8,192
        // consecutive new leases go in three transactions (the ops alone would take one).
        let long: Vec<(u64, Claim)> = (1..=8192).map(lease).collect();
        let most = (MAX_WINDOW_SPAN - claim_ranges::MAX_RUN + 1) as usize;
        assert_eq!(lens(&long, &|_| true), vec![most, most, 8192 - 2 * most]);
        // Sparse ones (every other job) share a window: a run each, 120 to a transaction.
        assert_eq!(lens(&sparse, &|_| true)[0], MAX_RECORDS);
        // Fewer can cost more: 120 runs of three fill a chunk; without each middle job they
        // are 240 runs, cut again before they are sent.
        let triples: Vec<(u64, Claim)> = (0..120).flat_map(|t| (4 * t..4 * t + 3).map(lease)).collect();
        let known = Known::default();
        assert_eq!(first_claims(&triples, &known), triples.len());
        let left: Vec<(u64, Claim)> = triples.into_iter().filter(|(s, _)| s % 4 != 1).collect();
        assert_eq!(first_claims(&left, &known), MAX_RECORDS);
    }

    #[test]
    fn acks_of_jobs_in_range_records_fill_a_transaction_and_none_outgrows_etcds_limits() {
        // Runs of 64 jobs: 1..=64, 65..=128, ...; every fifth job has a record of its own.
        let run_of = |seq: u64| (!seq.is_multiple_of(5)).then(|| seq.div_ceil(64) * 64);
        let all: Vec<QueuedAck> = (1..=1000).map(ack).collect();
        let chunks = ack_chunks(&all, 1, run_of);
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), 1000);
        for c in &chunks {
            assert!(c.len() <= MAX_RECORDS, "{} writes", c.len());
            assert!(compares(c, &run_of) <= MAX_RECORDS, "{} compares", compares(c, &run_of));
        }
        // Consecutive jobs of range records: a stretch each, not a compare per job.
        let in_runs = |seq: u64| Some(seq.div_ceil(64) * 64);
        assert!(
            ack_chunks(&all, 1, in_runs)
                .iter()
                .all(|c| c.len() == MAX_RECORDS || c.len() == 1000 % MAX_RECORDS)
        );
        // Scattered jobs (every other one): a stretch each, the records once a transaction.
        let scattered: Vec<QueuedAck> = (1..=1000).step_by(2).map(ack).collect();
        for c in ack_chunks(&scattered, 1, in_runs) {
            assert!(compares(c, &in_runs) <= MAX_RECORDS, "{} compares", compares(c, &in_runs));
        }
        // Fewer acks can cost more: 30 one-job records and 30 of three jobs fill a chunk;
        // with each three-job record's middle job taken over (refused, left out), the rest
        // needs 150 compares, and is cut again before it is sent.
        let run_of = |seq: u64| Some(if seq < 100 { seq } else { 100 + (seq - 100) / 3 * 3 + 2 });
        let mixed: Vec<QueuedAck> = (70..100).chain(100..190).map(ack).collect();
        assert_eq!(acks_fit(&mixed, 1, run_of), mixed.len());
        assert_eq!(compares(&mixed, &run_of), MAX_RECORDS);
        let left: Vec<QueuedAck> =
            mixed.into_iter().filter(|a| a.seq < 100 || (a.seq - 100) % 3 != 1).collect();
        assert!(compares(&left, &run_of) > MAX_RECORDS);
        let n = acks_fit(&left, 1, run_of);
        assert!(n < left.len() && compares(&left[..n], &run_of) <= MAX_RECORDS);
        // Writes per ack bound it too (an outcome record, a report's deletion).
        assert!(ack_chunks(&all, 3, in_runs).iter().all(|c| c.len() <= MAX_RECORDS / 3));
    }
}
