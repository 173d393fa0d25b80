//! Redriving dead letters on etcd: each batch the handle read is appended to its target queues
//! and the dead-letter queue's cursor moved, in transactions compared with the cursor's
//! revision (a concurrent redrive of the same queue, in any process, is refused with
//! `Conflict`) and with each target's tail (another process appending meanwhile: the batch goes
//! again on the new tails). A batch too large for one transaction goes in parts, each moving
//! the cursor over what it carried, so an interruption never leaves a letter moved twice.

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
use crate::store::etcd::redrive::RedriveOutcome;
use crate::store::etcd::{DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::telemetry;

/// Letters per transaction: each may go to its own target (a message and a tail each), plus
/// the cursor.
const PER_TXN: usize = (MAX_TXN_OPS - 1) / 2;

/// A letter on its way: its dead-letter sequence, its target and its encoded envelope.
type Letter = (u64, Arc<QueueState>, Vec<u8>);

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
        let (cursor, mut cursor_rev) = retrying(t, || store.cursor(&dlq.name)).await?;
        if cursor != expected {
            return Err(Error::RedriveConflict { dlq: dlq.name.to_string() });
        }
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
        let mut moved = Vec::with_capacity(items.len());
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let to = if i + 1 == n { last } else { part.last().map_or(last, |l| l.0) };
            let (rev, got) = self.redrive_part(dlq, cursor_rev, to, &part).await?;
            cursor_rev = rev;
            telemetry::queue_counter(telemetry::REDRIVEN, &dlq.name, got.len() as u64);
            for ((dlq_seq, _, _), (queue, seq)) in part.iter().zip(&got) {
                let (dlq_seq, seq, queue) = (*dlq_seq, *seq, queue.clone());
                self.engine.emit(|| Event::Redriven { dlq: dlq.name.clone(), dlq_seq, queue, seq });
            }
            moved.extend(got);
        }
        Ok(moved)
    }

    /// One transaction's part; returns the cursor's new revision and where each letter went.
    async fn redrive_part(
        &mut self,
        dlq: &QueueState,
        cursor_rev: i64,
        to: u64,
        part: &[Letter],
    ) -> Result<(i64, Vec<(Arc<str>, u64)>), Error> {
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let mut per_target: BTreeMap<u32, (Arc<QueueState>, Vec<Vec<u8>>)> = BTreeMap::new();
        for (_, q, env) in part {
            per_target.entry(q.id).or_insert_with(|| (q.clone(), Vec::new())).1.push(env.clone());
        }
        loop {
            let mut appends = Vec::with_capacity(per_target.len());
            for (qid, (_, envs)) in &per_target {
                let (last, nonce) = match self.tails.get(qid) {
                    Some(&tail) => tail,
                    None => retrying(t, || store.tail_record(*qid)).await?,
                };
                appends.push(DeadLetterAppend {
                    qid: *qid,
                    expected_last: last,
                    expected_nonce: nonce,
                    nonce: self.nonce(),
                    envelopes: envs.clone(),
                });
            }
            match store.redrive(&dlq.name, cursor_rev, to, &appends).await {
                Ok(RedriveOutcome::Done { rev }) => {
                    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
                    for a in &appends {
                        let end = a.expected_last + a.envelopes.len() as u64;
                        self.tails.insert(a.qid, (end, a.nonce));
                        if let Some((q, _)) = per_target.get(&a.qid) {
                            q.publish_max(end);
                        }
                        next.insert(a.qid, a.expected_last + 1);
                    }
                    let mut got = Vec::with_capacity(part.len());
                    for (_, q, _) in part {
                        let seq = next.entry(q.id).or_insert(0);
                        got.push((q.name.clone(), *seq));
                        *seq += 1;
                    }
                    return Ok((rev, got));
                }
                Ok(RedriveOutcome::Refused { cursor, tails }) => {
                    if cursor.1 != cursor_rev {
                        return Err(Error::RedriveConflict { dlq: dlq.name.to_string() });
                    }
                    for (a, tail) in appends.iter().zip(tails) {
                        match tail {
                            Some(tail) => self.tails.insert(a.qid, tail),
                            None => self.tails.remove(&a.qid),
                        };
                    }
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
                    return Err(Error::Storage(e));
                }
            }
        }
    }
}
