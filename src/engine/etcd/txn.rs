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
//! Not on etcd yet, refused whole with `Unsupported` (its jobs and deliveries handed back):
//! acks of ordered deliveries, and sends with an idempotency key or a delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::dedup::submitted;
use super::known::{Known, WorkSide};
use super::side::{retrying, until};
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::{QueueState, WorkGroupState};
use crate::engine::request::{Reply, TxApplied, TxJob, TxRequest, give_back};
use crate::error::{Error, StorageError};
use crate::events::Event;
use crate::model::Claim;
use crate::sent::Sent;
use crate::stats::OutcomeKind;
use crate::store::envelope;
use crate::store::etcd::DeadLetterAppend;
use crate::store::etcd::kv::KvOp;
use crate::store::etcd::txn::{Refusal, TxnOutcome, TxnParts};
use crate::store::etcd::work::{ClaimRecord, ClaimWrite, ClaimsTxn};
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

/// The messages a transaction appends to one queue.
struct QueueAppends {
    queue: Arc<QueueState>,
    envelopes: Vec<Vec<u8>>,
    /// Indexes into the transaction's sends.
    sends: Vec<usize>,
}

impl Writer {
    /// Carries out one transaction, answering its caller: applied whole, or nothing of it
    /// (its jobs leased to their holders again, uncounted after a conflict).
    pub(super) async fn transaction(&mut self, tx: TxRequest) {
        let TxRequest { writes, sends, mut jobs, deliveries, reply } = tx;
        let refuse = |reply: Reply<TxApplied, Error>, jobs: Vec<TxJob>, e: Error| {
            give_back(jobs, Vec::new(), e.is_conflict());
            let _ = reply.send(Err(e));
        };
        if !deliveries.is_empty()
            || sends.iter().any(|s| s.msg.idempotency_key.is_some() || s.msg.due.is_some())
        {
            give_back(jobs, deliveries, false);
            let _ = reply.send(Err(capability::refusal(Flavour::Etcd, Capability::Transactions)));
            return;
        }
        // Refused on etcd for every send (`etcd::check_send`): not here either.
        if sends.iter().any(|s| envelope::priority(&s.msg.envelope) > 0) {
            return refuse(reply, jobs, capability::refusal(Flavour::Etcd, Capability::Priority));
        }
        if self.side.settings.passive {
            return refuse(reply, jobs, Error::Invalid { reason: "an inspection writes nothing".into() });
        }
        if let Err(e) = check(&jobs, &sends) {
            return refuse(reply, jobs, e);
        }
        // The jobs by group, each group's claims locked while the transaction is out: the
        // revisions it compares stay the ones this process knows.
        let mut groups: Vec<GroupAcks> = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            let at = match groups.iter().position(|g| Arc::ptr_eq(&g.group, &j.group)) {
                Some(at) => at,
                None => {
                    let Some(side) = self.work_side(&j.group) else {
                        let e = Error::Storage(StorageError::new("work group not loaded"));
                        return refuse(reply, jobs, e);
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
                let outcome = self.outcome_record(
                    g.group.keeps_outcomes(),
                    OutcomeKind::Acked,
                    j.attempt,
                    j.result.take(),
                );
                let delete_progress = g.group.forget_progress(j.seq);
                g.writes.push(ClaimWrite {
                    outcome,
                    delete_progress,
                    ..ClaimWrite::new(j.seq, expected, Claim::Done)
                });
            }
        }
        if let Some(e) = lost {
            return refuse(reply, jobs, e);
        }
        // The sends by queue, in order, stamped now.
        let now = self.stamp();
        let mut queues: Vec<QueueAppends> = Vec::new();
        for (i, s) in sends.iter().enumerate() {
            let mut env = s.msg.envelope.clone();
            envelope::stamp(&mut env, now);
            match queues.iter_mut().find(|q| Arc::ptr_eq(&q.queue, &s.queue)) {
                Some(q) => {
                    q.envelopes.push(env);
                    q.sends.push(i);
                }
                None => {
                    queues.push(QueueAppends { queue: s.queue.clone(), envelopes: vec![env], sends: vec![i] })
                }
            }
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

        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let marker = match self.marker_lease(left()).await {
            Ok(m) => m,
            Err(e) => return refuse(reply, jobs, e.into()),
        };
        // One nonce for the marker and every tail this transaction writes (whichever try
        // lands, the tails bear it).
        let nonce = self.nonce();
        let store = self.side.store.clone();
        let mut backoff = Duration::from_millis(10);
        // A try failed without an answer (it may have been applied, or land later).
        let mut in_doubt = false;
        // The tails each try compares, changed only by a refusal (which says no try was
        // applied): a try sent again after a lost answer is the same transaction, so that a
        // first try found applied by its marker appended where this one says.
        let mut tails: Vec<Option<(u64, u64)>> =
            queues.iter().map(|q| self.tails.get(&q.queue.id).copied()).collect();
        // `Err(Ok(_))`: perhaps applied; `Err(Err(_))`: refused, nothing applied.
        let outcome = 'send: loop {
            let mut appends = Vec::with_capacity(queues.len());
            for (q, tail) in queues.iter().zip(tails.iter_mut()) {
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
                let envelopes = q.envelopes.clone();
                appends.push(DeadLetterAppend {
                    qid: q.queue.id,
                    expected_last: last,
                    expected_nonce: tail_nonce,
                    nonce,
                    envelopes,
                });
            }
            let claims: Vec<ClaimsTxn<'_>> = groups
                .iter()
                .map(|g| ClaimsTxn {
                    group: &g.group.name,
                    queue: &g.group.queue.name,
                    seen: g.seen,
                    writes: &g.writes,
                })
                .collect();
            let parts = TxnParts { kv: &ops, claims: &claims, appends: &appends };
            match until(deadline, store.transaction(parts, nonce, marker)).await {
                Ok(TxnOutcome::Applied { revision, added }) => break Ok((revision, added, appends)),
                Ok(TxnOutcome::TooLarge) => {
                    return refuse(reply, jobs, capability::refusal(Flavour::Etcd, Capability::HugeMessage));
                }
                Ok(TxnOutcome::Refused(r)) => {
                    if let Some(e) = self.refused(&r, &groups, &mut known, &writes, &jobs, &queues) {
                        // A try without an answer may still land (a stalled member forwarding
                        // it later, once a condition holds again): closed first, so that this
                        // refusal is final — or that try turns out to have been applied.
                        if !in_doubt {
                            return refuse(reply, jobs, e);
                        }
                        match until(deadline, store.close_marker(nonce, marker)).await {
                            Ok(Some(revision)) => break Ok((revision, None, appends)),
                            Ok(None) => return refuse(reply, jobs, e),
                            Err(c) => break Err(Ok(c)),
                        }
                    }
                    // Only tails moved: sent again on the new ones. None moved: a large send
                    // call holds a queue (`reserve.rs`); wait a moment rather than ask again.
                    let moved: Vec<Option<(u64, u64)>> =
                        appends.iter().map(|a| Some((a.expected_last, a.expected_nonce))).collect();
                    if moved == r.tails {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for ((a, tail), now) in appends.iter().zip(tails.iter_mut()).zip(r.tails) {
                        *tail = now;
                        match now {
                            Some(t) => self.tails.insert(a.qid, t),
                            None => self.tails.remove(&a.qid),
                        };
                    }
                    if Instant::now() >= deadline {
                        break Err(Ok(StorageError::new(
                            "etcd: a queue the transaction sends to kept moving",
                        )));
                    }
                }
                // etcd's own limit on a request's bytes (what `TooLarge` counts is an estimate).
                Err(e) if e.to_string().contains("request is too large") => {
                    return refuse(reply, jobs, capability::refusal(Flavour::Etcd, Capability::HugeMessage));
                }
                Err(e) if Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, "rockq: a transaction to etcd failed; sending it again");
                    in_doubt = true;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
                Err(e) => {
                    // Out of time with tries unanswered: closed if etcd answers now (then
                    // nothing of it can land any more), or found applied.
                    let close = self.side.settings.attempt_timeout;
                    match tokio::time::timeout(close, store.close_marker(nonce, marker)).await {
                        Ok(Ok(Some(revision))) => break Ok((revision, None, appends)),
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
        let (revision, added, appends) = match outcome {
            Ok(done) => done,
            Err(Err(e)) => return refuse(reply, jobs, e),
            Err(Ok(e)) => {
                // Perhaps landed: the tails are read again before the next append.
                for q in &queues {
                    self.tails.remove(&q.queue.id);
                }
                return refuse(reply, jobs, Error::Storage(e));
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
                known.wrote(w.seq, revision);
                g.group.learn_finished(w.seq);
            }
            // As embedded, the offset has passed the jobs when the transaction is answered.
            if let Err(e) = self.advance(&g.group, known).await {
                tracing::warn!(queue = %g.group.queue.name, group = %g.group.name, error = %e, "rockq: moving a work group's offset in etcd failed; trying again next round");
            }
        }
        drop(known);
        for j in &jobs {
            let (queue, group) = (j.group.queue.name.clone(), j.group.name.clone());
            telemetry::group_counter(telemetry::ACKED, &queue, &group, 1);
            let (seq, attempt) = (j.seq, j.attempt);
            self.engine.emit(|| Event::Acked { queue, group, seq, attempt });
        }
        let mut sent = vec![Sent::Appended(0); sends.len()];
        for (q, a) in queues.iter().zip(&appends) {
            let first = a.expected_last + 1;
            let end = first + a.envelopes.len() as u64;
            self.tails.insert(q.queue.id, (end - 1, nonce));
            for (k, &i) in q.sends.iter().enumerate() {
                sent[i] = Sent::Appended(first + k as u64);
            }
            let out: Vec<Sent> = q.sends.iter().map(|&i| sent[i]).collect();
            submitted(&q.queue, first..end, &out);
        }
        let wrote = writes.iter().any(|w| !w.condition_only);
        // The jobs' holders learn it from the answer (`Transaction::commit`).
        drop(jobs);
        let _ = reply.send(Ok(TxApplied { revision: wrote.then_some(revision as u64), sent }));
    }

    /// What a refusal means: `Some` error to answer (nothing of it can apply as it stands),
    /// or `None` when only tails moved (or a reservation held one): send it again.
    fn refused(
        &mut self,
        r: &Refusal,
        groups: &[GroupAcks],
        known: &mut [tokio::sync::MutexGuard<'_, Known>],
        writes: &[crate::engine::request::KvWrite],
        jobs: &[TxJob],
        queues: &[QueueAppends],
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
        if lost.is_some() {
            return lost;
        }
        if let Some(q) = queues.iter().zip(&r.tails).find_map(|(q, t)| t.is_none().then_some(q)) {
            return Some(Error::QueueDeleted { queue: q.queue.name.to_string() });
        }
        if let Some((i, found)) = r.conflict {
            let w = &writes[i];
            return Some(Error::Conflict {
                keyspace: w.keyspace.name.to_string(),
                key: w.key.clone(),
                expected: w.expect.unwrap_or(crate::entry::Expect::Present),
                found,
            });
        }
        None
    }
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
