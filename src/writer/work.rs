//! The writer's half of work-queue groups: creating them, recording outcomes (ack, retry,
//! dead-letter) and redriving dead letters. Each request becomes entries of the round's one
//! `WriteBatch`, so a dead letter's copy, its claim deletion and the offset move are atomic.

use std::sync::Arc;

use bytes::Bytes;
use rocksdb::{DB, WriteBatch};
use tokio::sync::oneshot::Sender;

use super::{Outcome, RedriveItem, RedriveReply, Round, Writer};
use crate::Event;
use crate::consumer::StartFrom;
use crate::error::{AckError, RedriveError, StorageError, SubscribeError};
use crate::registry::QueueState;
use crate::store::records::{self, ClaimRecord, ClaimState};
use crate::store::{Cfs, envelope, get_envelope, keys};
use crate::telemetry;
use crate::work::WorkGroupState;

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_work_group(
        &mut self,
        wb: &mut WriteBatch,
        offsets: &rocksdb::ColumnFamily,
        r: &mut Round,
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: Sender<Result<Arc<WorkGroupState>, SubscribeError>>,
    ) {
        let key = keys::offset_key(&group, &queue.name);
        if let Some(g) = self.engine.registry.work_groups.get(&key) {
            let _ = reply.send(Ok(g.clone()));
            return;
        }
        if let Some(e) = self.other_mode(&key, &group, &queue, true) {
            let _ = reply.send(Err(e));
            return;
        }
        if let Some((_, waiters)) = r.work_groups.iter_mut().find(|(g, _)| g.key == key) {
            waiters.push(reply);
            return;
        }
        if let Some(g) = self.work_groups.get(&key) {
            r.work_groups.push((g.clone(), vec![reply]));
            return;
        }
        let committed = match self.start_offset(&queue, start) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        wb.put_cf(offsets, &key, records::encode_shared_offset(committed));
        let state = WorkGroupState::new(&group, queue, committed);
        self.work_groups.insert(key, state.clone());
        r.work_groups.push((state, vec![reply]));
    }

    /// Marks `seq` finished: the offset moves over every contiguous finished sequence (their
    /// claim records are deleted); a finished sequence above a gap keeps a `Done` record so a
    /// restart does not deliver it again.
    pub(super) fn finish(
        &mut self,
        wb: &mut WriteBatch,
        claims: &rocksdb::ColumnFamily,
        r: &mut Round,
        g: &Arc<WorkGroupState>,
        seq: u64,
    ) {
        let mut p = g.progress();
        if seq <= p.offset || !p.done.insert(seq) {
            return;
        }
        let before = p.offset;
        while p.done.first() == Some(&(p.offset + 1)) {
            p.done.pop_first();
            p.offset += 1;
            wb.delete_cf(claims, keys::claim_key(&g.claim_prefix, p.offset));
        }
        if p.done.contains(&seq) {
            let done = ClaimRecord {
                state: ClaimState::Done,
                attempt: 0,
                token: 0,
                deadline_micros: 0,
                not_before_micros: 0,
                last_error: String::new(),
                holder: Arc::from(""),
            };
            wb.put_cf(claims, keys::claim_key(&g.claim_prefix, seq), done.encode());
        }
        let moved = p.offset > before;
        drop(p);
        if moved && !r.work_offsets.iter().any(|x| Arc::ptr_eq(x, g)) {
            r.work_offsets.push(g.clone());
        }
        // Forgotten in memory once durable, per group in one lock (see `complete`).
        match r.work_finished.iter_mut().find(|(x, _)| Arc::ptr_eq(x, g)) {
            Some((_, seqs)) => seqs.push(seq),
            None => r.work_finished.push((g.clone(), vec![seq])),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle(
        &mut self,
        db: &DB,
        cfs: &Cfs<'_>,
        wb: &mut WriteBatch,
        r: &mut Round,
        g: Arc<WorkGroupState>,
        seq: u64,
        attempt: u32,
        outcome: Outcome,
        reply: Sender<Result<(), AckError>>,
    ) {
        let engine = self.engine.clone();
        let (queue, group) = (g.queue.name.clone(), g.name.clone());
        match outcome {
            Outcome::Ack => {
                self.finish(wb, cfs.claims, r, &g, seq);
                r.on_done(move |res| {
                    if res.is_ok() {
                        tracing::trace!(%queue, %group, seq, attempt, "rockq: acked");
                        telemetry::group_counter(telemetry::ACKED, &queue, &group, 1);
                        engine.emit(|| Event::Acked { queue, group, seq, attempt });
                    }
                    let _ = reply.send(res.map_err(|e| AckError::Storage(e.clone())));
                });
            }
            Outcome::Retry { record, delay } => {
                let error = record.last_error.clone();
                wb.put_cf(cfs.claims, keys::claim_key(&g.claim_prefix, seq), record.encode());
                r.on_done(move |res| {
                    if res.is_ok() {
                        tracing::debug!(%queue, %group, seq, attempt, ?delay, %error, "rockq: retry scheduled");
                        telemetry::group_counter(telemetry::RETRIED, &queue, &group, 1);
                        engine.emit(|| Event::Retried { queue, group, seq, attempt, delay, error });
                    }
                    let _ = reply.send(res.map_err(|e| AckError::Storage(e.clone())));
                });
            }
            Outcome::DeadLetter { reason, dlq } => {
                // Every refusal below puts the message back to claimable (`refuse`): a
                // `Settling` slot that nobody reverts would hold the group's offset (and
                // retention) forever.
                let stored = match get_envelope(db, cfs.messages, g.queue.id, seq) {
                    Ok(v) => v,
                    Err(e) => return refuse(&g, seq, reply, AckError::Storage(e)),
                };
                let msg_key = keys::message_key(g.queue.id, seq);
                let (env, reason) = match stored {
                    Some(stored) => {
                        // A record that does not decode is dead-lettered as it is stored: its
                        // raw bytes become the payload, so nothing is lost and the group can
                        // move past it.
                        let env =
                            envelope::decode(&msg_key, &stored).unwrap_or_else(|_| envelope::Envelope {
                                enqueued_at_micros: 0,
                                headers: Vec::new(),
                                payload: Bytes::from(stored.to_vec()),
                            });
                        (env, reason)
                    }
                    None if seq < g.queue.first_seq.load(std::sync::atomic::Ordering::Acquire) => {
                        // Retention deleted it meanwhile (and moved the group past it).
                        let _ = reply.send(Ok(()));
                        return;
                    }
                    // Gone from storage (outside rockq's doing): refusing would bring it back
                    // as exhausted again and again; the group moves on and the dead-letter
                    // queue records the loss.
                    None => (
                        envelope::Envelope {
                            enqueued_at_micros: 0,
                            headers: Vec::new(),
                            payload: Bytes::new(),
                        },
                        format!("{reason} (the stored message was missing)"),
                    ),
                };
                let (dlq_seq, reason) = match self
                    .append_dead_letter(wb, cfs, r, &g.queue, &g.name, seq, attempt, &reason, env, &dlq)
                {
                    Ok(done) => done,
                    Err(e) => return refuse(&g, seq, reply, AckError::Failed(e)),
                };
                self.finish(wb, cfs.claims, r, &g, seq);
                r.on_done(move |res| {
                    if res.is_ok() {
                        tracing::warn!(%queue, %group, seq, attempt, %reason, dlq = %dlq, dlq_seq, "rockq: dead-lettered");
                        telemetry::group_counter(telemetry::DEAD_LETTERED, &queue, &group, 1);
                        engine.emit(|| Event::DeadLettered {
                            queue,
                            group,
                            seq,
                            attempts: attempt,
                            reason,
                            dlq,
                            dlq_seq,
                        });
                    }
                    let _ = reply.send(res.map_err(|e| AckError::Storage(e.clone())));
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn redrive(
        &mut self,
        db: &DB,
        cfs: &Cfs<'_>,
        wb: &mut WriteBatch,
        r: &mut Round,
        dlq: Arc<QueueState>,
        expected: u64,
        last: u64,
        items: Vec<RedriveItem>,
        reply: RedriveReply,
    ) {
        let key = keys::redrive_key(&dlq.name);
        let cursor = match self.cursors.get(&dlq.id) {
            Some(c) => *c,
            None => match db.get_cf(cfs.meta, &key) {
                Ok(Some(v)) => match records::decode_cursor(&key, &v) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = reply.send(Err(RedriveError::Receive(e.into())));
                        return;
                    }
                },
                Ok(None) => 0,
                Err(e) => {
                    let _ = reply.send(Err(RedriveError::Storage(StorageError(e))));
                    return;
                }
            },
        };
        if cursor != expected {
            let _ = reply.send(Err(RedriveError::Conflict { dlq: dlq.name.to_string() }));
            return;
        }
        // Resolve every target first, so a bad one leaves nothing half-written.
        let mut targets = Vec::with_capacity(items.len());
        for item in &items {
            match self.ensure_queue(wb, cfs.meta, r, &item.target) {
                Ok(q) => targets.push(q),
                Err(e) => {
                    let _ = reply.send(Err(RedriveError::Failed(format!("target {:?}: {e}", item.target))));
                    return;
                }
            }
        }
        let mut moved = Vec::with_capacity(items.len());
        let mut events = Vec::with_capacity(items.len());
        for (item, q) in items.into_iter().zip(targets) {
            let Some(seq) = self.append(wb, cfs.messages, r, &q, &item.envelope) else { continue };
            events.push((item.dlq_seq, q.name.clone(), seq));
            moved.push((q.name.clone(), seq));
        }
        wb.put_cf(cfs.meta, &key, records::encode_cursor(last));
        self.cursors.insert(dlq.id, last);
        let engine = self.engine.clone();
        r.on_done(move |res| {
            if res.is_ok() {
                telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, events.len() as u64);
                for (dlq_seq, queue, seq) in events {
                    engine.emit(|| Event::Redriven { dlq: dlq.name.clone(), dlq_seq, queue, seq });
                }
            }
            let _ = reply.send(res.map(|()| moved).map_err(|e| RedriveError::Storage(e.clone())));
        });
    }
}

/// Answers a refused outcome and puts its message back to claimable.
fn refuse(g: &WorkGroupState, seq: u64, reply: Sender<Result<(), AckError>>, e: AckError) {
    g.revert(seq);
    let _ = reply.send(Err(e));
}
