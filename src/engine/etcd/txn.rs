//! The etcd writer's half of transactions (`Transaction::commit`, a pool handler's
//! `TaskTx`): keyspace writes and conditions, work-group acks and sends as one etcd
//! transaction (`store/etcd/txn.rs`) — the exactly-once pipeline across processes.
//!
//! Each part is fenced as it is on its own: a keyspace condition by the key's revision, a
//! job's ack by the revision of the claim its holder wrote (another process that took the
//! job since refuses the whole transaction: `LeaseLost`), an append by the queue's tail (a
//! tail another process moved meanwhile is read and the transaction sent again — nothing of
//! it was applied). A transaction whose answer is lost is settled by its marker.
//!
//! A send's idempotency key is looked up before each plan of the transaction and recorded in
//! it, compared with the revision it was read at (`dedup.rs`): a key another process recorded
//! meanwhile refuses the transaction, and the next plan reports that send a duplicate. A
//! delayed send gets its schedule id before the first try and its records in the
//! transaction (`delayed.rs`). The plan changes only after a refusal (or a dedup lease etcd
//! lost), and a new plan after a try in doubt settles that try first (its marker closed): so a
//! try found applied by its marker wrote what the last plan says. (A refusal that only moved
//! tails keeps the plan: a try on the old tails can never land.)
//!
//! An ordered delivery's ack is an `Acked` mark in the transaction, compared with the group's
//! owner key (this process's subscription owns the group); once applied, the delivery counts
//! acknowledged, and the group's offset is committed before the transaction is answered (as
//! embedded, where the round that applies it commits the offset). A transaction refused for
//! an owner key another process holds now answers `LeaseLost` and ends this process's hold
//! of the group.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::dedup::submitted;
use super::known::{Known, WorkSide};
use super::plan::{DedupPlan, Extra, Split};
use super::side::{retrying, until};
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::{OrderedGroupState, QueueState, WorkGroupState};
use crate::engine::request::{Reply, TxApplied, TxDelivery, TxJob, TxRequest, give_back};
use crate::error::{Error, StorageError};
use crate::events::Event;
use crate::model::Claim;
use crate::sent::{ScheduledMessage, Sent};
use crate::stats::OutcomeKind;
use crate::store::envelope;
use crate::store::etcd::kv::KvOp;
use crate::store::etcd::txn::{OrderedAcksTxn, QueueExtras, Refusal, TxnOutcome, TxnParts};
use crate::store::etcd::work::{ClaimRecord, ClaimWrite, ClaimsTxn};
use crate::store::etcd::{DeadLetterAppend, DelayedPut};
use crate::telemetry;

/// The jobs of one work group that a transaction acks.
struct GroupAcks {
    group: Arc<WorkGroupState>,
    side: Arc<WorkSide>,
    /// Indexes into the transaction's jobs.
    jobs: Vec<usize>,
    writes: Vec<ClaimWrite>,
    /// The revision this process read the group at.
    seen: i64,
}

/// The messages a transaction sends to one queue.
struct QueueAppends {
    queue: Arc<QueueState>,
    envelopes: Vec<Vec<u8>>,
    /// Indexes into the transaction's sends.
    sends: Vec<usize>,
    /// The idempotency keys: `(index in envelopes, key)`.
    keys: Vec<(usize, String)>,
    /// Per envelope: `(schedule id, due)` if it is delayed.
    delays: Vec<Option<(u64, u64)>>,
}

/// One plan of what a transaction writes to one queue: which sends are duplicates, which are
/// appended now and which delayed, and the lease its keys' records go under.
struct QueuePlan {
    plan: DedupPlan,
    split: Split,
    lease: i64,
}

impl Writer {
    /// Carries out one transaction, answering its caller: applied whole, or nothing of it
    /// (its jobs leased to their holders again, uncounted after a conflict).
    pub(super) async fn transaction(&mut self, tx: TxRequest) {
        let TxRequest { writes, sends, mut jobs, deliveries, reply } = tx;
        let refuse =
            |reply: Reply<TxApplied, Error>, jobs: Vec<TxJob>, deliveries: Vec<TxDelivery>, e: Error| {
                give_back(jobs, deliveries, e.is_conflict());
                let _ = reply.send(Err(e));
            };
        if self.side.settings.passive {
            return refuse(
                reply,
                jobs,
                deliveries,
                Error::Invalid { reason: "an inspection writes nothing".into() },
            );
        }
        if let Err(e) = check(&jobs, &sends) {
            return refuse(reply, jobs, deliveries, e);
        }
        // The ordered acks by group: each above the group's acknowledged offset, in a group
        // this process owns (as `commit_ordered` writes only as the owner).
        let mut ordered: Vec<OrderedAcks> = Vec::new();
        for d in &deliveries {
            let g = &d.group;
            if g.is_deleted() {
                let e = Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() };
                return refuse(reply, jobs, deliveries, e);
            }
            if d.msg.seq <= g.acked.load(Ordering::SeqCst) || !self.side.owners.holds(g) {
                let e = ordered_lost(g, d.msg.seq);
                return refuse(reply, jobs, deliveries, e);
            }
            match ordered.iter_mut().find(|o| Arc::ptr_eq(&o.group, g)) {
                Some(o) => o.seqs.push(d.msg.seq),
                None => ordered.push(OrderedAcks { group: g.clone(), seqs: vec![d.msg.seq] }),
            }
        }
        let owner_id = self.side.owner_id.clone();
        // The jobs by group, each group's claims locked while the transaction is out: the
        // revisions it compares stay the ones this process knows.
        let mut groups: Vec<GroupAcks> = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            let at = match groups.iter().position(|g| Arc::ptr_eq(&g.group, &j.group)) {
                Some(at) => at,
                None => {
                    let Some(side) = self.work_side(&j.group) else {
                        let e = Error::Storage(StorageError::new("work group not loaded"));
                        return refuse(reply, jobs, deliveries, e);
                    };
                    let seen = self.side.seen(&j.group.name, &j.group.queue.name);
                    let g = GroupAcks {
                        group: j.group.clone(),
                        side,
                        jobs: Vec::new(),
                        writes: Vec::new(),
                        seen,
                    };
                    groups.push(g);
                    groups.len() - 1
                }
            };
            groups[at].jobs.push(i);
        }
        let sides: Vec<Arc<WorkSide>> = groups.iter().map(|g| g.side.clone()).collect();
        let mut known = Vec::with_capacity(sides.len());
        for s in &sides {
            known.push(s.known.lock().await);
        }
        let mut lost = None;
        'fence: for (g, known) in groups.iter_mut().zip(&known) {
            for &i in &g.jobs {
                let j = &mut jobs[i];
                // Fenced by the caller (settling): the revision of the claim it holds.
                let Some(expected) = g.group.is_settling(j.seq).then(|| known.expected(j.seq)) else {
                    lost = Some(g.group.lease_lost(j.seq, j.attempt));
                    break 'fence;
                };
                let flow = self.flow_change(
                    &g.group,
                    j.seq,
                    j.flow,
                    (&OutcomeKind::Acked, j.attempt, j.result.as_ref()),
                );
                let outcome = self.outcome_record(
                    g.group.keeps_outcomes(),
                    OutcomeKind::Acked,
                    j.attempt,
                    j.result.take(),
                );
                let delete_progress = g.group.forget_progress(j.seq);
                g.writes.push(ClaimWrite {
                    outcome,
                    flow,
                    delete_progress,
                    run: known.run(j.seq),
                    ..ClaimWrite::new(j.seq, expected, Claim::Done)
                });
            }
        }
        if let Some(e) = lost {
            return refuse(reply, jobs, deliveries, e);
        }
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        // The sends by queue, in order, stamped now (a delayed one is stamped again when it
        // fires), each delayed one with its schedule id.
        let now = self.stamp();
        let mut queues: Vec<QueueAppends> = Vec::new();
        for (i, s) in sends.iter().enumerate() {
            let mut env = s.msg.envelope.clone();
            envelope::stamp(&mut env, now);
            let delay = match s.msg.due.filter(|&d| d > now) {
                Some(due) => match self.scheduled_id(left()).await {
                    Ok(id) => Some((id, due)),
                    Err(e) => return refuse(reply, jobs, deliveries, e.into()),
                },
                None => None,
            };
            let at = match queues.iter().position(|q| Arc::ptr_eq(&q.queue, &s.queue)) {
                Some(at) => at,
                None => {
                    queues.push(QueueAppends {
                        queue: s.queue.clone(),
                        envelopes: Vec::new(),
                        sends: Vec::new(),
                        keys: Vec::new(),
                        delays: Vec::new(),
                    });
                    queues.len() - 1
                }
            };
            let q = &mut queues[at];
            if let Some(key) = &s.msg.idempotency_key {
                q.keys.push((q.envelopes.len(), key.clone()));
            }
            q.envelopes.push(env);
            q.sends.push(i);
            q.delays.push(delay);
        }
        let ops: Vec<KvOp> = writes
            .iter()
            .map(|w| KvOp {
                keyspace: w.keyspace.id,
                key: w.key.clone(),
                value: w.value.clone(),
                expect: w.expect,
                condition_only: w.condition_only,
            })
            .collect();

        let marker = match self.marker_lease(left()).await {
            Ok(m) => m,
            Err(e) => return refuse(reply, jobs, deliveries, e.into()),
        };
        // One nonce for the marker and every tail this transaction writes (whichever try
        // lands, the tails bear it); a new one once a refusal settled every try before.
        let mut nonce = self.nonce();
        let store = self.side.store.clone();
        let mut backoff = Duration::from_millis(10);
        // A try failed without an answer (it may have been applied, or land later).
        let mut in_doubt = false;
        // The tails each try compares, changed only by a refusal (which says no try was
        // applied): a try sent again after a lost answer is the same transaction, so that a
        // first try found applied by its marker appended where this one says.
        let mut tails: Vec<Option<(u64, u64)>> =
            queues.iter().map(|q| self.tails.get(&q.queue.id).copied()).collect();
        // The plans each try writes, made again only after a refusal (which settled every
        // try before it: none can land later).
        let mut plans: Vec<QueuePlan> = Vec::new();
        let mut replan = true;
        // The last try's appends, and the queue each is of.
        let (mut appends, mut appended): (Vec<DeadLetterAppend>, Vec<usize>) = (Vec::new(), Vec::new());
        // `Err(Ok(_))`: perhaps applied; `Err(Err(_))`: refused, nothing applied.
        let outcome = 'send: loop {
            if replan {
                // A new plan after a try in doubt: that try is settled first (its plan and
                // tails are the last try's, so found applied it is reported as that one);
                // closed, none before can land, and the new plan goes under a new nonce. (A
                // refusal that only moved tails needs none: a try on the old tails cannot land.)
                if in_doubt {
                    match until(deadline, store.close_marker(nonce, marker)).await {
                        Ok(Some(revision)) => break Ok((revision, None, appends, appended)),
                        Ok(None) => {
                            in_doubt = false;
                            nonce = self.nonce();
                        }
                        Err(c) => break Err(Ok(c)),
                    }
                }
                match self.plan_queues(&queues, now, left()).await {
                    Ok(p) => plans = p,
                    Err(e) => break 'send Err(Err(Error::from(e))),
                }
                replan = false;
            }
            // The queues that append now (the others' sends are duplicates or delayed).
            appends = Vec::with_capacity(queues.len());
            appended = Vec::with_capacity(queues.len());
            for (at, ((q, tail), p)) in queues.iter().zip(tails.iter_mut()).zip(&plans).enumerate() {
                if p.split.now.is_empty() {
                    continue;
                }
                let (last, tail_nonce) = match *tail {
                    Some(t) => t,
                    None => match retrying(left(), || store.get_tail(q.queue.id)).await {
                        Ok(Some(t)) => *tail.insert(t),
                        // Deleted (by any process): nothing to append to.
                        Ok(None) => {
                            break 'send Err(Err(Error::QueueDeleted { queue: q.queue.name.to_string() }));
                        }
                        Err(e) => break 'send Err(Ok(e)),
                    },
                };
                let envelopes = p.split.now.iter().map(|&i| q.envelopes[i].clone()).collect();
                appends.push(DeadLetterAppend {
                    qid: q.queue.id,
                    expected_last: last,
                    expected_nonce: tail_nonce,
                    nonce,
                    envelopes,
                });
                appended.push(at);
            }
            let envs: Vec<Vec<&[u8]>> =
                queues.iter().map(|q| q.envelopes.iter().map(Vec::as_slice).collect()).collect();
            let puts: Vec<Vec<DelayedPut<'_>>> =
                plans.iter().zip(&envs).map(|(p, envs)| p.split.puts(envs)).collect();
            let mut extras = Vec::new();
            for (at, (q, p)) in queues.iter().zip(&plans).enumerate() {
                if p.split.records.is_empty() && puts[at].is_empty() {
                    continue;
                }
                let first =
                    appended.iter().position(|&a| a == at).map_or(0, |k| appends[k].expected_last + 1);
                let records = p.split.records.as_slice();
                extras.push(QueueExtras {
                    qid: q.queue.id,
                    first,
                    dedup: (!records.is_empty()).then_some((records, p.lease)),
                    delayed: &puts[at],
                });
            }
            let claims: Vec<ClaimsTxn<'_>> = groups
                .iter()
                .map(|g| ClaimsTxn {
                    group: &g.group.name,
                    queue: &g.group.queue.name,
                    seen: g.seen,
                    writes: &g.writes,
                    view: None,
                })
                .collect();
            let acks: Vec<OrderedAcksTxn<'_>> = ordered
                .iter()
                .map(|o| OrderedAcksTxn {
                    group: &o.group.name,
                    queue: &o.group.queue.name,
                    owner: &owner_id,
                    seqs: &o.seqs,
                })
                .collect();
            let parts =
                TxnParts { kv: &ops, claims: &claims, appends: &appends, extras: &extras, ordered: &acks };
            let tried = until(deadline, store.transaction(parts, nonce, marker)).await;
            match tried {
                Ok(TxnOutcome::Applied { revision, added }) => {
                    break Ok((revision, added, appends, appended));
                }
                Ok(TxnOutcome::TooLarge) => {
                    return refuse(
                        reply,
                        jobs,
                        deliveries,
                        capability::refusal(Flavour::Etcd, Capability::HugeMessage),
                    );
                }
                Ok(TxnOutcome::Refused(r)) => {
                    let tailed: Vec<&QueueAppends> = appended.iter().map(|&at| &queues[at]).collect();
                    let refusal = self
                        .claims_refused(&r, &groups, &mut known, &jobs)
                        .or_else(|| self.ordered_refused(&r, &ordered))
                        .or_else(|| sends_or_conditions_refused(&r, &tailed, &writes));
                    if let Some(e) = refusal {
                        // A try without an answer may still land (a stalled member forwarding
                        // it later, once a condition holds again): closed first, so that this
                        // refusal is final — or that try turns out to have been applied.
                        if !in_doubt {
                            return refuse(reply, jobs, deliveries, e);
                        }
                        match until(deadline, store.close_marker(nonce, marker)).await {
                            Ok(Some(revision)) => break Ok((revision, None, appends, appended)),
                            Ok(None) => return refuse(reply, jobs, deliveries, e),
                            Err(c) => break Err(Ok(c)),
                        }
                    }
                    // Only tails moved, or a key was recorded meanwhile: sent again on the
                    // new tails and records. No tail moved: a large send call holds a queue
                    // (`reserve.rs`) or a key's record changed; wait a moment rather than ask
                    // again at once.
                    let moved: Vec<Option<(u64, u64)>> =
                        appends.iter().map(|a| Some((a.expected_last, a.expected_nonce))).collect();
                    if moved == r.tails {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for ((a, &at), now) in appends.iter().zip(&appended).zip(r.tails) {
                        tails[at] = now;
                        match now {
                            Some(t) => self.tails.insert(a.qid, t),
                            None => self.tails.remove(&a.qid),
                        };
                    }
                    replan = queues.iter().any(|q| !q.keys.is_empty());
                    if Instant::now() >= deadline {
                        let moving = "etcd: a queue the transaction sends to kept moving";
                        break match in_doubt {
                            true => Err(Ok(StorageError::new(moving))),
                            false => Err(Err(Error::Storage(StorageError::new(format!(
                                "{moving} (nothing of the transaction was applied)"
                            ))))),
                        };
                    }
                }
                // etcd's own limit on a request's bytes (what `TooLarge` counts is an estimate).
                Err(e) if e.to_string().contains("request is too large") => {
                    return refuse(
                        reply,
                        jobs,
                        deliveries,
                        capability::refusal(Flavour::Etcd, Capability::HugeMessage),
                    );
                }
                // The keys' lease ran out early: refused whole by etcd, planned again under a
                // new one.
                Err(e) if self.forget_dedup_lease(&e) => {
                    replan = true;
                    if Instant::now() >= deadline {
                        break match in_doubt {
                            true => Err(Ok(e)),
                            false => Err(Err(Error::from(e))),
                        };
                    }
                }
                Err(e) if Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, "rockq: a transaction to etcd failed; sending it again");
                    in_doubt = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(super::side::RETRY_CAP);
                }
                Err(e) => {
                    // Out of time with tries unanswered: closed if etcd answers now (then
                    // nothing of it can land any more), or found applied.
                    let close = self.side.settings.attempt_timeout;
                    match tokio::time::timeout(close, store.close_marker(nonce, marker)).await {
                        Ok(Ok(Some(revision))) => break Ok((revision, None, appends, appended)),
                        Ok(Ok(None)) => {
                            let e =
                                StorageError::new(format!("{e} (nothing of the transaction was applied)"));
                            break Err(Ok(e));
                        }
                        _ => break Err(Ok(e)),
                    }
                }
            }
        };
        let (revision, added, appends, appended) = match outcome {
            Ok(done) => done,
            Err(Err(e)) => return refuse(reply, jobs, deliveries, e),
            Err(Ok(e)) => {
                // Perhaps landed: the tails are read again before the next append.
                for q in &queues {
                    self.tails.remove(&q.queue.id);
                }
                return refuse(reply, jobs, deliveries, Error::from(e));
            }
        };

        // Applied: the keyspaces' counts, the jobs finished, the messages published.
        match added {
            Some(added) => {
                for (id, delta) in added {
                    if let Some(w) = writes.iter().find(|w| w.keyspace.id == id) {
                        w.keyspace.set_keys(w.keyspace.keys().saturating_add_signed(delta));
                    }
                }
            }
            // Applied by a try whose answer was lost: counted again from etcd.
            None => {
                for w in writes.iter().filter(|w| !w.condition_only) {
                    if let Ok(keys) = retrying(left(), || store.kv_count(w.keyspace.id)).await {
                        w.keyspace.set_keys(keys);
                    }
                }
            }
        }
        for (g, known) in groups.iter().zip(known.iter_mut()) {
            for w in &g.writes {
                known.wrote(w.seq, revision, None, &w.record);
                g.group.learn_finished(w.seq);
            }
            // As embedded, the offset has passed the jobs when the transaction is answered.
            if let Err(e) = self.advance(&g.group, known).await {
                tracing::warn!(queue = %g.group.queue.name, group = %g.group.name, error = %e, "rockq: moving a work group's offset in etcd failed; trying again next round");
            }
        }
        drop(known);
        // The ordered acks applied: counted acknowledged as an ack is (the group's offset
        // moves past what is contiguous), then committed before the answer.
        for d in &deliveries {
            acked_in_transaction(d);
        }
        if !deliveries.is_empty() {
            // A failure leaves the groups dirty for the next round (the marks hold the acks).
            let _ = self.commit_dirty().await;
        }
        drop(deliveries);
        for j in &jobs {
            let (queue, group) = (j.group.queue.name.clone(), j.group.name.clone());
            telemetry::group_counter(telemetry::ACKED, &queue, &group, 1);
            let (seq, attempt) = (j.seq, j.attempt);
            self.engine.emit(|| Event::Acked { queue, group, seq, attempt });
        }
        let mut sent = vec![Sent::Appended(0); sends.len()];
        for (at, (q, p)) in queues.iter().zip(&plans).enumerate() {
            let append = appended.iter().position(|&a| a == at).map(|k| &appends[k]);
            let first = append.map_or(0, |a| a.expected_last + 1);
            let mut dups = p.split.originals(&p.plan, first).into_iter().peekable();
            let mut seq = first;
            for (k, &i) in q.sends.iter().enumerate() {
                sent[i] = match (dups.next_if(|(d, _)| *d == k), q.delays[k]) {
                    (Some((_, original)), _) => Sent::Duplicate(original),
                    (None, Some((id, due))) => {
                        self.engine.timer.offer(due);
                        Sent::Scheduled(ScheduledMessage { id, due: crate::schedule::time_of(due) })
                    }
                    (None, None) => {
                        seq += 1;
                        Sent::Appended(seq - 1)
                    }
                };
            }
            if let Some(a) = append {
                self.tails.insert(q.queue.id, (seq - 1, a.nonce));
                super::writer::index_sent(&q.queue, first, &a.envelopes);
            }
            let out: Vec<Sent> = q.sends.iter().map(|&i| sent[i]).collect();
            submitted(&q.queue, first..seq, &out);
        }
        let wrote = writes.iter().any(|w| !w.condition_only);
        // The jobs' flows moved on, as their acks' are.
        let flows: Vec<_> =
            groups.iter().flat_map(|g| g.writes.iter().filter_map(|w| w.flow.clone())).collect();
        self.wrote_changes(flows, revision);
        self.apply_own().await;
        // The jobs' holders learn it from the answer (`Transaction::commit`).
        drop(jobs);
        let _ = reply.send(Ok(TxApplied { revision: wrote.then_some(revision as u64), sent }));
    }

    /// What a refusal means, first part: a lost lease, as the embedded engine fences leases
    /// before it checks conditions (`None`: no job's claim moved). With
    /// [`ordered_refused`](Self::ordered_refused) and [`sends_or_conditions_refused`]: `Some`
    /// error to answer (nothing of it can apply as it stands), or `None` when only tails moved
    /// (or a reservation held one, or a key was recorded meanwhile): send it again.
    fn claims_refused(
        &mut self,
        r: &Refusal,
        groups: &[GroupAcks],
        known: &mut [tokio::sync::MutexGuard<'_, Known>],
        jobs: &[TxJob],
    ) -> Option<Error> {
        // A lost lease first, as the embedded engine fences leases before it checks
        // conditions: every group's moved claims learned (only those: the others are still
        // this process's to give back).
        let mut lost = None;
        for ((g, known), found) in groups.iter().zip(known.iter_mut()).zip(&r.claims) {
            let Some((offset, found)) = found else {
                let (queue, group) = (g.group.queue.name.to_string(), g.group.name.to_string());
                return Some(Error::GroupDeleted { queue, group });
            };
            let offset = *offset;
            let moved: Vec<(u64, Option<ClaimRecord>)> = g
                .writes
                .iter()
                .zip(found.iter())
                .filter(|(w, (_, rec))| w.seq <= offset || rec.as_ref().map_or(0, |r| r.rev) != w.expected)
                .map(|(_, f)| f.clone())
                .collect();
            if let Some((seq, _)) = moved.first().filter(|_| lost.is_none()) {
                let attempt =
                    g.jobs.iter().map(|&i| &jobs[i]).find(|j| j.seq == *seq).map_or(0, |j| j.attempt);
                lost = Some(g.group.lease_lost(*seq, attempt));
            }
            let clock = self.engine.clock().clone();
            known.learn(&g.group, offset, moved, &clock);
        }
        lost
    }

    /// An ordered group another process owns now (or nobody: this one's lease lapsed): this
    /// process's hold of it ends, as when an offset commit finds it so.
    fn ordered_refused(&self, r: &Refusal, ordered: &[OrderedAcks]) -> Option<Error> {
        let mut lost = None;
        for (o, _) in ordered.iter().zip(&r.owners).filter(|(_, held)| !**held) {
            self.side.owners.lost(&o.group);
            lost.get_or_insert_with(|| ordered_lost(&o.group, o.seqs[0]));
        }
        lost
    }
}

/// A refusal's last part: a queue deleted, then a failed keyspace condition.
fn sends_or_conditions_refused(
    r: &Refusal,
    queues: &[&QueueAppends],
    writes: &[crate::engine::request::KvWrite],
) -> Option<Error> {
    if let Some(q) = queues.iter().zip(&r.tails).find_map(|(q, t)| t.is_none().then_some(q)) {
        return Some(Error::QueueDeleted { queue: q.queue.name.to_string() });
    }
    let (i, found) = r.conflict?;
    let w = &writes[i];
    Some(Error::Conflict {
        keyspace: w.keyspace.name.to_string(),
        key: w.key.clone(),
        expected: w.expect.unwrap_or(crate::entry::Expect::Present),
        found,
    })
}

/// The deliveries a transaction acks in one ordered group.
struct OrderedAcks {
    group: Arc<OrderedGroupState>,
    seqs: Vec<u64>,
}

/// The refusal of an ordered delivery's ack this process may not write (no longer its owner,
/// or passed by the offset).
fn ordered_lost(g: &OrderedGroupState, seq: u64) -> Error {
    Error::LeaseLost { queue: g.queue.name.to_string(), group: g.name.to_string(), seq, attempt: 0 }
}

/// An applied transaction's ack of `d`, in memory: its mark stored and the message done for
/// the group, and the delivery counted acknowledged (the group is dirty: its offset moves).
fn acked_in_transaction(d: &TxDelivery) {
    let dropped = d.group.records().acked_by_transaction(d.msg.seq);
    drop(dropped);
    d.sub.ack(d.msg.seq);
}

/// What refuses a transaction before anything is sent, as the embedded writer checks it: a
/// deleted group or queue, a job claimed before a reset or passed by the offset.
fn check(jobs: &[TxJob], sends: &[crate::engine::request::TxSend]) -> Result<(), Error> {
    for j in jobs {
        let g = &j.group;
        if g.is_deleted() {
            return Err(Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() });
        }
        if j.epoch != g.epoch() || j.seq <= g.progress().offset {
            return Err(g.lease_lost(j.seq, j.attempt));
        }
    }
    for s in sends {
        if s.queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: s.queue.name.to_string() });
        }
    }
    Ok(())
}

impl Writer {
    /// Plans what a transaction writes to each queue: its keys' records read now (a key
    /// within its window makes its send a duplicate), its delayed sends apart.
    async fn plan_queues(
        &mut self,
        queues: &[QueueAppends],
        now: u64,
        left: Duration,
    ) -> Result<Vec<QueuePlan>, StorageError> {
        let mut plans = Vec::with_capacity(queues.len());
        for q in queues {
            let plan = self.plan_dedup(&q.queue, q.envelopes.len(), &q.keys, now, left).await?;
            let lease = match plan.records.is_empty() {
                true => 0,
                false => self.dedup_lease(&q.queue, left).await?,
            };
            let split = Split::of(&plan, &Extra::Delays(&q.delays));
            plans.push(QueuePlan { plan, split, lease });
        }
        Ok(plans)
    }
}
