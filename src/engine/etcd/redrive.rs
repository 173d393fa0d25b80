//! Redriving dead letters on etcd: each batch the handle read is appended to its target queues
//! and the dead-letter queue's cursor moved, in transactions compared with the cursor's
//! revision (a concurrent redrive of the same queue, in any process, is refused with
//! `Conflict`) and with each target's tail (another process appending meanwhile: the batch goes
//! again on the new tails). A batch too large for one transaction goes in parts, each moving
//! the cursor over what it carried, so an interruption never leaves a letter moved twice.
//!
//! One letter settled on its own (`DeadLetters::redrive_one`, `delete`) is one transaction:
//! its copy, and the cursor moved over it (the next letter) or its mark. Every such write
//! rewrites the cursor, so a redrive whose cursor was rewritten meanwhile with its value
//! unchanged lost no race to another redrive: it reads the marks again, leaves out the letters
//! settled meanwhile (as the embedded writer does) and goes on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::side::retrying;
use super::writer::Writer;
use crate::engine::registry::QueueState;
use crate::engine::request::{RedriveItem, RedriveReply};
use crate::error::{Error, FailedError, StorageError};
use crate::events::Event;
use crate::store::envelope;
use crate::store::etcd::redrive::{RedriveOutcome, SettleLetter};
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// Letters per transaction: each may go to its own target (a message, its priority index entry
/// and a tail each) and be a flow step (its change record), plus the cursor and the deletion of
/// the marks it passes.
const PER_TXN: usize = (MAX_TXN_OPS - 2) / 4;

/// A letter on its way: its dead-letter sequence, its target and its encoded envelope.
type Letter = (u64, Arc<QueueState>, Vec<u8>);

/// A part written (the cursor's new revision, where each letter went), or refused because the
/// cursor was rewritten meanwhile (its value and revision now).
type PartOutcome = Result<(i64, Vec<(Arc<str>, u64)>), (u64, i64)>;

/// The cursor as callers read it: raised to just below the queue's first message (a purge or
/// trim that moved the head past the stored cursor covered those letters too).
fn effective(dlq: &QueueState, stored: u64) -> u64 {
    stored.max(dlq.first_seq.load(std::sync::atomic::Ordering::Acquire).saturating_sub(1))
}

impl Writer {
    pub(super) async fn redrive(
        &mut self,
        dlq: Arc<QueueState>,
        expected: u64,
        last: u64,
        items: Vec<RedriveItem>,
        reply: RedriveReply,
    ) {
        let _ = reply.send(self.redrive_batch(&dlq, expected, last, items).await);
    }

    async fn redrive_batch(
        &mut self,
        dlq: &Arc<QueueState>,
        expected: u64,
        last: u64,
        items: Vec<RedriveItem>,
    ) -> Result<Vec<(Arc<str>, u64)>, Error> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        // Tests settle a letter here, after the handle read the marks (in this process or
        // another): the marks read below leave it out.
        crate::faults::reached("rockq-etcd-redrive-received");
        let (cursor, mut cursor_rev) = retrying(t, || store.cursor(&dlq.name)).await?;
        if effective(dlq, cursor) != expected {
            return Err(Error::RedriveConflict { dlq: dlq.name.to_string() });
        }
        // The marks as they are at the cursor's revision (read after it: a settle since then
        // rewrites the cursor, and the transactions below are refused and read them again).
        // The handle's were read before this request was queued: a letter settled in between
        // would otherwise be moved as well.
        let marks = retrying(t, || store.letter_marks(&dlq.name)).await?;
        let items: Vec<RedriveItem> = items.into_iter().filter(|i| !marks.contains(&i.dlq_seq)).collect();
        crate::faults::reached("rockq-etcd-redrive-planned");
        // Every message encoded and every target resolved first: a bad one moves nothing.
        let mut letters = Vec::with_capacity(items.len());
        for item in &items {
            let env = envelope::encode(&item.message, item.enqueued_at_micros).map_err(|e| {
                Error::Failed(FailedError::internal(format!(
                    "cannot re-encode dead letter {}: {e:?}",
                    item.dlq_seq
                )))
            })?;
            let target = self.create_queue(&item.target).await.map_err(|e| {
                Error::Failed(FailedError::internal(format!("target {:?}: {e}", item.target)))
            })?;
            letters.push((item.dlq_seq, target, env));
        }
        let mut parts: Vec<Vec<Letter>> = Vec::new();
        let mut bytes = 0;
        for l in letters {
            let full = parts.last().is_none_or(|p| p.len() >= PER_TXN || bytes + l.2.len() > MAX_TXN_BYTES);
            if full {
                parts.push(Vec::new());
                bytes = 0;
            }
            bytes += l.2.len();
            if let Some(p) = parts.last_mut() {
                p.push(l);
            }
        }
        // Where each part moves the cursor, fixed before any letter is left out of a part.
        let n = parts.len();
        let tos: Vec<u64> = (0..n)
            .map(|i| match i + 1 == n {
                true => last,
                false => parts[i].last().map_or(last, |l| l.0),
            })
            .collect();
        let mut moved = Vec::with_capacity(items.len());
        let (mut i, mut from) = (0, expected);
        let deadline = Instant::now() + t;
        while i < n {
            match self.redrive_part(dlq, cursor_rev, tos[i], &parts[i]).await? {
                Ok((rev, got)) => {
                    cursor_rev = rev;
                    telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, got.len() as u64);
                    for ((dlq_seq, _, _), (queue, seq)) in parts[i].iter().zip(&got) {
                        let (dlq_seq, seq, queue) = (*dlq_seq, *seq, queue.clone());
                        self.engine.emit(|| Event::Redriven { dlq: dlq.name.clone(), dlq_seq, queue, seq });
                    }
                    moved.extend(got);
                    from = tos[i];
                    i += 1;
                }
                // Rewritten with another value: another redrive (or a settle of the next
                // letter) moved it.
                Err((value, _)) if effective(dlq, value) != from => {
                    return Err(Error::RedriveConflict { dlq: dlq.name.to_string() });
                }
                // Rewritten unchanged: a letter was settled on its own meanwhile.
                Err((_, rev)) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Storage(StorageError::new(
                            "etcd: letters kept being settled during a redrive",
                        )));
                    }
                    let marks = retrying(t, || store.letter_marks(&dlq.name)).await?;
                    for p in &mut parts[i..] {
                        p.retain(|l| !marks.contains(&l.0));
                    }
                    cursor_rev = rev;
                }
            }
        }
        Ok(moved)
    }

    /// Settles dead letter `seq` of `dlq` on its own (see the module's docs): answers with
    /// where its copy went (`None` for a delete).
    pub(super) async fn settle_letter(
        &mut self,
        dlq: Arc<QueueState>,
        seq: u64,
        item: Option<RedriveItem>,
        reply: crate::engine::request::Reply<Option<(Arc<str>, u64)>, Error>,
    ) {
        let _ = reply.send(self.settle_one(&dlq, seq, item).await);
    }

    async fn settle_one(
        &mut self,
        dlq: &Arc<QueueState>,
        seq: u64,
        item: Option<RedriveItem>,
    ) -> Result<Option<(Arc<str>, u64)>, Error> {
        if dlq.is_deleted() {
            return Err(Error::QueueDeleted { queue: dlq.name.to_string() });
        }
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        // The copy encoded and its target found first: a bad one changes nothing.
        let copy = match item {
            Some(item) => {
                let env = envelope::encode(&item.message, item.enqueued_at_micros).map_err(|e| {
                    Error::Failed(FailedError::internal(format!("cannot re-encode dead letter {seq}: {e:?}")))
                })?;
                let target = self.create_queue(&item.target).await.map_err(|e| {
                    Error::Failed(FailedError::internal(format!("target {:?}: {e}", item.target)))
                })?;
                Some((target, env))
            }
            None => None,
        };
        let deadline = Instant::now() + t;
        loop {
            // The cursor first: the transaction compares its revision, which every change of
            // the marks moves too, so marks read after it are the ones it was written with.
            let (stored, rev) = retrying(t, || store.cursor(&dlq.name)).await?;
            let marks = retrying(t, || store.letter_marks(&dlq.name)).await?;
            let cursor = effective(dlq, stored);
            if seq <= cursor || marks.contains(&seq) {
                return Err(Error::NoSuchLetter { dlq: dlq.name.to_string(), seq });
            }
            // Settled letters right above the cursor count as passed: a batch redrive leaves
            // the marks above its last letter for the next move to sweep.
            let mut next = cursor;
            while marks.contains(&(next + 1)) {
                next += 1;
            }
            let cursor_to = (seq == next + 1).then(|| {
                let mut to = seq;
                while marks.contains(&(to + 1)) {
                    to += 1;
                }
                to
            });
            let append = match &copy {
                Some((q, env)) => {
                    let (last, nonce) = match self.tails.get(&q.id) {
                        Some(&tail) => tail,
                        None => retrying(t, || store.tail_record(q.id)).await?,
                    };
                    Some(DeadLetterAppend {
                        qid: q.id,
                        expected_last: last,
                        expected_nonce: nonce,
                        nonce: self.nonce(),
                        envelopes: vec![env.clone()],
                    })
                }
                None => None,
            };
            let flow = match (&copy, &append) {
                (Some((q, env)), Some(a)) => self.revived(&dlq.name, seq, q, a.expected_last + 1, env),
                _ => None,
            };
            let settle = SettleLetter { seq, cursor, cursor_to, copy: append, flow };
            match store.settle_letter(&dlq.name, rev, &settle).await {
                Ok(RedriveOutcome::Done { rev }) => {
                    self.wrote_changes(settle.flow.iter().cloned(), rev);
                    self.apply_own().await;
                    let moved = match (&copy, &settle.copy) {
                        (Some((q, _)), Some(a)) => {
                            let at = a.expected_last + 1;
                            self.tails.insert(q.id, (at, a.nonce));
                            super::writer::index_sent(q, at, &a.envelopes);
                            q.publish_max(at);
                            telemetry::produced(&q.produced, 1);
                            telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, 1);
                            let (queue, seq_in) = (q.name.clone(), at);
                            self.engine.emit(|| Event::Redriven {
                                dlq: dlq.name.clone(),
                                dlq_seq: seq,
                                queue,
                                seq: seq_in,
                            });
                            Some((q.name.clone(), at))
                        }
                        _ => None,
                    };
                    tracing::info!(dlq = %dlq.name, seq, redriven = ?moved, "rockq: dead letter settled");
                    return Ok(moved);
                }
                Ok(RedriveOutcome::Refused { tails, .. }) => {
                    self.learn_tails(settle.copy.as_slice(), tails).await;
                    if Instant::now() >= deadline {
                        return Err(Error::Storage(StorageError::new(
                            "etcd: the dead-letter queue or the target kept moving while settling a letter",
                        )));
                    }
                }
                // The outcome is unknown: it may have been applied (as a send that fails).
                Err(e) => {
                    if let Some((q, _)) = &copy {
                        self.tails.remove(&q.id);
                    }
                    return Err(Error::from(e));
                }
            }
        }
    }

    /// One transaction's part; returns the cursor's new revision and where each letter went,
    /// or, if the cursor was rewritten meanwhile, its value and revision now.
    async fn redrive_part(
        &mut self,
        dlq: &QueueState,
        cursor_rev: i64,
        to: u64,
        part: &[Letter],
    ) -> Result<PartOutcome, Error> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let mut per_target: BTreeMap<u32, (Arc<QueueState>, Vec<Vec<u8>>)> = BTreeMap::new();
        for (_, q, env) in part {
            per_target.entry(q.id).or_insert_with(|| (q.clone(), Vec::new())).1.push(env.clone());
        }
        loop {
            let mut appends = Vec::with_capacity(per_target.len());
            let mut flows = Vec::new();
            for (qid, (q, envs)) in &per_target {
                let (last, nonce) = match self.tails.get(qid) {
                    Some(&tail) => tail,
                    None => retrying(t, || store.tail_record(*qid)).await?,
                };
                // Where each letter lands: a flow step's is queued again there.
                let letters = part.iter().filter(|(_, lq, _)| lq.id == *qid);
                for (k, (dlq_seq, _, env)) in letters.enumerate() {
                    flows.extend(self.revived(&dlq.name, *dlq_seq, q, last + 1 + k as u64, env));
                }
                appends.push(DeadLetterAppend {
                    qid: *qid,
                    expected_last: last,
                    expected_nonce: nonce,
                    nonce: self.nonce(),
                    envelopes: envs.clone(),
                });
            }
            match store.redrive(&dlq.name, cursor_rev, to, &appends, &flows).await {
                Ok(RedriveOutcome::Done { rev }) => {
                    self.wrote_changes(flows, rev);
                    self.apply_own().await;
                    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
                    for a in &appends {
                        let end = a.expected_last + a.envelopes.len() as u64;
                        self.tails.insert(a.qid, (end, a.nonce));
                        if let Some((q, _)) = per_target.get(&a.qid) {
                            super::writer::index_sent(q, a.expected_last + 1, &a.envelopes);
                            q.publish_max(end);
                            telemetry::produced(&q.produced, a.envelopes.len() as u64);
                        }
                        next.insert(a.qid, a.expected_last + 1);
                    }
                    let mut got = Vec::with_capacity(part.len());
                    for (_, q, _) in part {
                        let seq = next.entry(q.id).or_insert(0);
                        got.push((q.name.clone(), *seq));
                        *seq += 1;
                    }
                    return Ok(Ok((rev, got)));
                }
                Ok(RedriveOutcome::Refused { cursor, tails }) => {
                    if cursor.1 != cursor_rev {
                        return Ok(Err(cursor));
                    }
                    self.learn_tails(&appends, tails).await;
                    if Instant::now() >= deadline {
                        return Err(Error::Storage(StorageError::new(
                            "etcd: the target queues kept moving during a redrive",
                        )));
                    }
                }
                Err(e) => {
                    for a in &appends {
                        self.tails.remove(&a.qid);
                    }
                    return Err(Error::from(e));
                }
            }
        }
    }

    /// The change record of letter `dlq_seq` of `dlq` redriven to `target` as `seq`, if it is
    /// a flow step's copy (`flows.rs` decides whether it was that step's own letter).
    fn revived(
        &self,
        dlq: &str,
        dlq_seq: u64,
        target: &QueueState,
        seq: u64,
        env: &[u8],
    ) -> Option<crate::store::etcd::flows::FlowChangeWrite> {
        let headers = envelope::decode(b"", env).ok()?.headers;
        let at = crate::flow_state::FlowStep::in_headers(&headers)?;
        let change = crate::store::etcd::flows::FlowChange::Revived {
            step: at.step,
            queue: target.name.to_string(),
            seq,
            letter: (dlq.to_owned(), dlq_seq),
        };
        Some(crate::store::etcd::flows::FlowChangeWrite { flow: at.flow, id: self.nonce(), change })
    }

    /// After a transaction with `appends` was refused: learns each target's tail as it is now
    /// (`tails`, in order; `None`: no tail record). A tail still the one compared means a large
    /// send call holds that queue (`reserve.rs`): wait a moment rather than ask again at once.
    async fn learn_tails(&mut self, appends: &[DeadLetterAppend], tails: Vec<Option<(u64, u64)>>) {
        let held = appends.iter().zip(&tails).any(|(a, t)| *t == Some((a.expected_last, a.expected_nonce)));
        if held {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for (a, tail) in appends.iter().zip(tails) {
            match tail {
                Some(tail) => self.tails.insert(a.qid, tail),
                None => self.tails.remove(&a.qid),
            };
        }
    }
}
