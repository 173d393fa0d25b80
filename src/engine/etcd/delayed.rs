//! Delayed messages on etcd, the writer's side (the records: `store/etcd/delayed.rs`).
//!
//! - **Submit**: a call's messages due later get schedule ids (blocks of the namespace's
//!   counter) and records; those due now are appended; both, with the idempotency keys'
//!   records, in one transaction — atomic as embedded. Its size is one transaction's: a
//!   call that does not fit is refused (`HugeMessage`), nothing written.
//! - **Fire**: every process's timer wakes at the earliest due time it knows (its own writes,
//!   and every other process's through the namespace watch), reads what is due and appends it
//!   to its queue, deleting the records in the same transaction, compared with each record's
//!   revision as read. Processes racing for one message: one transaction wins, the others'
//!   compares fail and they read again — each message fires once, whichever process fires it,
//!   and whichever process dies. A delayed message gets its sequence when it fires, as
//!   embedded.
//! - **Cancel / reschedule**: compared with the record's revision as read; a firing or another
//!   process's change in between makes them read again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::plan::{Done, Extra};
use super::side::{retrying, until};
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::QueueState;
use crate::engine::request::Submission;
use crate::error::{Error, StorageError};
use crate::sent::{ScheduledMessage, Sent};
use crate::store::envelope;
use crate::store::etcd::delayed::{DelayedRecord, Marked};
use crate::store::etcd::{DedupWrite, MAX_TXN_BYTES, MAX_TXN_OPS};
use crate::store::etcd::{DelayedPut, Fired};
use crate::store::keys::RECURRING;

/// Due entries one firing reads at a time.
const FIRE_READ: usize = 256;
/// Messages one firing transaction appends: each is a put (and its priority index entry) and
/// two deletes, with the tail's put.
const FIRE_TXN: usize = (MAX_TXN_OPS - 1) / 4;
/// Reads of due entries one `Fire` request makes before it lets other requests in (the timer
/// asks again at once if more is due).
const FIRE_ROUNDS: usize = 4;

impl Writer {
    /// A fresh schedule id (the namespace's counter is asked for a block when this process's
    /// is used up).
    pub(super) async fn scheduled_id(&mut self, left: Duration) -> Result<u64, StorageError> {
        if self.scheduled_ids.0 >= self.scheduled_ids.1 {
            let store = self.side.store.clone();
            self.scheduled_ids = retrying(left, || store.take_scheduled_ids()).await?;
        }
        let id = self.scheduled_ids.0;
        self.scheduled_ids.0 += 1;
        Ok(id)
    }

    /// Writes delayed messages that nothing appended goes with (`Writer::append_with`):
    /// `false` if a key's record changed meanwhile (nothing written; the caller plans again).
    /// Its answer lost, the call's marker says whether it was applied.
    pub(super) async fn put_delayed(
        &mut self,
        queue: &QueueState,
        puts: &[DelayedPut<'_>],
        dedup: Option<(&[DedupWrite], i64)>,
        deadline: Instant,
    ) -> Result<bool, StorageError> {
        let store = self.side.store.clone();
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let marked = self.marked(left()).await?;
        let mut backoff = Duration::from_millis(10);
        loop {
            match until(deadline, store.put_delayed(queue.id, puts, dedup, marked)).await {
                Ok(written) => return Ok(written),
                Err(e) => loop {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(super::side::RETRY_CAP);
                    match until(deadline, store.marker_exists(marked.nonce)).await {
                        Ok(true) => return Ok(true),
                        // Not applied: sent again (the same ids; puts of the same records).
                        Ok(false) => break,
                        Err(_) => continue,
                    }
                },
            }
        }
    }

    /// The lease markers go under: handed out for a minute, lasting a request timeout
    /// and a minute more, so a marker outlives every lookup of it.
    pub(super) async fn marker_lease(&mut self, left: Duration) -> Result<i64, StorageError> {
        if let Some((lease, until)) = self.marker_lease
            && Instant::now() < until
        {
            return Ok(lease);
        }
        let bucket = Duration::from_secs(60);
        let store = self.side.store.clone();
        let ttl = bucket + self.side.settings.request_timeout + Duration::from_secs(60);
        let lease = retrying(left, || store.grant_expiring(ttl)).await?;
        self.marker_lease = Some((lease, Instant::now() + bucket));
        Ok(lease)
    }

    /// `Queue::submit` and `submit_batch` of a call with delayed messages: one transaction.
    pub(super) async fn submit_delayed(
        &mut self,
        queue: &QueueState,
        mut msgs: Vec<Submission>,
    ) -> Result<Vec<Sent>, Error> {
        if let Some(f) = self.engine.failure() {
            return Err(crate::error::Closed::Failed(f).into());
        }
        let now = self.stamp();
        let delayed = |m: &Submission| m.due.is_some_and(|d| d > now);
        // One transaction: each message appended now is a put (and its index entry if it has a
        // priority), each delayed one two, each key one more, with the tail's put.
        let ops = msgs.iter().map(|m| {
            let now = 1 + usize::from(envelope::priority(&m.envelope) > 0);
            (if delayed(m) { 2 } else { now }) + usize::from(m.idempotency_key.is_some())
        });
        let bytes: usize = msgs.iter().map(|m| m.envelope.len() + 8).sum();
        if ops.sum::<usize>() + 1 > MAX_TXN_OPS || bytes > MAX_TXN_BYTES {
            return Err(capability::refusal(Flavour::Etcd, Capability::HugeMessage));
        }
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let mut delays = Vec::with_capacity(msgs.len());
        for m in &mut msgs {
            // The time field holds when it was sent; it is stamped again when it fires.
            envelope::stamp(&mut m.envelope, now);
            delays.push(match m.due.filter(|&d| d > now) {
                Some(due) => Some((self.scheduled_id(t).await?, due)),
                None => None,
            });
        }
        let envs: Vec<&[u8]> = msgs.iter().map(|m| m.envelope.as_slice()).collect();
        let keys: Vec<(usize, String)> =
            msgs.iter().enumerate().filter_map(|(i, m)| m.idempotency_key.clone().map(|k| (i, k))).collect();
        let appended = self.append_with(queue, &envs, &keys, now, deadline, Extra::Delays(&delays)).await;
        self.note(&appended);
        let Done::Stored { first, originals } = appended? else {
            return Err(Error::Internal("a submit's append reported a firing's refusal".into()));
        };
        let mut dups = originals.into_iter().peekable();
        let mut seq = first;
        let mut out = Vec::with_capacity(msgs.len());
        for (i, d) in delays.iter().enumerate() {
            out.push(match (dups.next_if(|(at, _)| *at == i), d) {
                (Some((_, original)), _) => Sent::Duplicate(original),
                (None, Some((id, due))) => {
                    self.engine.timer.offer(*due);
                    Sent::Scheduled(ScheduledMessage { id: *id, due: crate::schedule::time_of(*due) })
                }
                (None, None) => {
                    seq += 1;
                    Sent::Appended(seq - 1)
                }
            });
        }
        super::dedup::submitted(queue, first..seq, &out);
        Ok(out)
    }

    /// `Queue::cancel`: `false` if `id` is not scheduled on `queue`.
    pub(super) async fn cancel_delayed(&mut self, queue: &QueueState, id: u64) -> Result<bool, Error> {
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        let marked = self.marked(t).await?;
        let mut sent = false;
        loop {
            let Some(r) = retrying(t, || store.delayed(queue.id, id)).await? else {
                // Gone: by this call's own cancel if a try whose answer was lost landed (the
                // retry, compared with the record as first read, was refused).
                return Ok(sent && retrying(t, || store.marker_exists(marked.nonce)).await?);
            };
            sent = true;
            if retrying(t, || store.cancel_delayed(&r, Some(marked))).await? {
                return Ok(true);
            }
        }
    }

    /// A marker for one call's transactions: a fresh nonce under the current marker lease.
    pub(super) async fn marked(&mut self, left: Duration) -> Result<Marked, StorageError> {
        let lease = self.marker_lease(left).await?;
        Ok(Marked { nonce: self.nonce(), lease })
    }

    /// `Queue::reschedule`: `None` if `id` is not scheduled on `queue`.
    pub(super) async fn reschedule_delayed(
        &mut self,
        queue: &QueueState,
        id: u64,
        due: u64,
    ) -> Result<Option<ScheduledMessage>, Error> {
        let now = self.stamp();
        // A time in the past is due now.
        let due = due.max(now);
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        loop {
            let Some(r) = retrying(t, || store.delayed(queue.id, id)).await? else { return Ok(None) };
            if retrying(t, || store.move_delayed(&r, due)).await? {
                self.engine.timer.offer(due);
                return Ok(Some(ScheduledMessage { id, due: crate::schedule::time_of(due) }));
            }
        }
    }

    /// The timer found something due: appends what is due, then tells the timer the earliest
    /// due time left (with any the watch brought meanwhile).
    pub(super) async fn fire(&mut self) {
        let side = self.side.clone();
        let offers = &side.due_offers;
        offers.store(u64::MAX, Ordering::Release);
        let now = self.stamp();
        let next = match self.fire_due(now).await {
            Ok(()) => {
                let store = self.side.store.clone();
                let read = retrying(self.budget(), || store.first_due()).await;
                self.note(&read);
                read.map_err(
                    |e| tracing::warn!(error = %e, "rockq: reading the next due time from etcd failed"),
                )
                .unwrap_or(Some(now.saturating_add(1_000_000)))
            }
            Err(e) => {
                // Try again in a second rather than spin on a failing cluster.
                tracing::warn!(error = %e, "rockq: firing delayed messages failed; trying again in 1 s");
                Some(now.saturating_add(1_000_000))
            }
        };
        let offered = Some(offers.load(Ordering::Acquire)).filter(|&o| o != u64::MAX);
        let next = match (next, offered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.engine.timer.set(next);
        // An offer the watch made between the load above and this `set` was overwritten by
        // it: made again.
        if let Some(o) = Some(offers.load(Ordering::Acquire)).filter(|&o| o != u64::MAX) {
            self.engine.timer.offer(o);
        }
    }

    /// Fires what is due at `now`, in due order. An error on one queue or schedule leaves its
    /// entries for the next firing (in a second) and the others fire all the same; the first
    /// such error is returned.
    async fn fire_due(&mut self, now: u64) -> Result<(), StorageError> {
        let store = self.side.store.clone();
        let deadline = Instant::now() + self.budget();
        let mut failed: Option<StorageError> = None;
        for _ in 0..FIRE_ROUNDS {
            let entries = retrying(self.budget(), || store.due_entries(now, FIRE_READ)).await?;
            if entries.is_empty() {
                break;
            }
            let ids: Vec<(u32, u64)> = entries.iter().map(|&(_, q, id)| (q, id)).collect();
            let records = retrying(self.budget(), || store.delayed_records(&ids)).await?;
            // An entry whose record is gone or due at another time was fired, cancelled or
            // moved after the entry was read (record and entry change in one transaction): its
            // key is gone too. Found again (only a foreign write leaves one), it would hold the
            // timer: deleted, compared with the record as read.
            let mut live: Vec<DelayedRecord> = Vec::new();
            for (&entry, r) in entries.iter().zip(records) {
                let rev = match r {
                    Some(Ok(r)) if r.due == entry.0 => {
                        live.push(r);
                        continue;
                    }
                    Some(Ok(r)) => r.rev,
                    None => 0,
                    // Cannot fire: its entry, left in place, would come first in every read
                    // and hold the timer at its due time, every queue's delayed messages behind
                    // it. The entry goes; the record stays for an operator (listing it reports
                    // the corruption).
                    Some(Err(bad)) => {
                        let (_, qid, id) = entry;
                        tracing::error!(qid, id, error = %bad.error, "rockq: a delayed message's record does not decode; it will not fire");
                        bad.rev
                    }
                };
                retrying(self.budget(), || store.drop_due_entry(entry, rev)).await?;
            }
            // In due order: the delayed messages due before a schedule's firing are appended
            // before it, so a queue both feed gets its sequences in due order as embedded.
            let mut changed = false;
            let mut pending: Vec<&DelayedRecord> = Vec::new();
            for r in &live {
                if r.qid != RECURRING {
                    pending.push(r);
                    continue;
                }
                if !self.fire_pending(&mut pending, now, deadline, &mut failed).await {
                    changed = true;
                    break;
                }
                match self.fire_recurring(r, now, deadline).await {
                    Ok(true) => {}
                    Ok(false) => {
                        changed = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "rockq: firing a recurring schedule failed; trying again in 1 s");
                        failed.get_or_insert(e);
                    }
                }
            }
            if !changed {
                changed = !self.fire_pending(&mut pending, now, deadline, &mut failed).await;
            }
            if entries.len() < FIRE_READ && !changed {
                break;
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Fires `pending` (due delayed messages, in due order), queue by queue. `false`: a record
    /// changed meanwhile, and the caller reads again rather than fire later ones first.
    async fn fire_pending(
        &mut self,
        pending: &mut Vec<&DelayedRecord>,
        now: u64,
        deadline: Instant,
        failed: &mut Option<StorageError>,
    ) -> bool {
        let due = std::mem::take(pending);
        let mut queues: Vec<u32> = due.iter().map(|r| r.qid).collect();
        queues.sort_unstable();
        queues.dedup();
        for qid in queues {
            let mine: Vec<&DelayedRecord> = due.iter().copied().filter(|r| r.qid == qid).collect();
            let fired = self.fire_queue(qid, &mine, now, deadline).await;
            match fired {
                Ok(true) => {}
                Ok(false) => return false,
                Err(e) => {
                    tracing::warn!(qid, error = %e, "rockq: firing delayed messages failed; trying again in 1 s");
                    failed.get_or_insert(e);
                }
            }
        }
        true
    }

    /// Fires `mine`, the due messages of queue `qid` (`false`: one changed meanwhile).
    async fn fire_queue(
        &mut self,
        qid: u32,
        mine: &[&DelayedRecord],
        now: u64,
        deadline: Instant,
    ) -> Result<bool, StorageError> {
        let Some(queue) = self.queue_by_id(qid).await? else {
            // Only a foreign write (queues are not deleted on etcd) names a queue etcd does
            // not hold: dropped, as embedded, rather than hold the timer for good.
            tracing::error!(qid, n = mine.len(), "rockq: delayed messages name no queue; dropped");
            let store = self.side.store.clone();
            for r in mine {
                retrying(self.budget(), || store.cancel_delayed(r, None)).await?;
            }
            return Ok(true);
        };
        for chunk in chunks(mine) {
            if !self.fire_chunk(&queue, chunk, now, deadline).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Queue `qid` as registered here, or — created by another process a moment ago, not yet
    /// brought by the watch — learnt from etcd now.
    async fn queue_by_id(&mut self, qid: u32) -> Result<Option<Arc<QueueState>>, StorageError> {
        let known = |w: &Writer| w.engine.registry.queues.iter().find(|q| q.id == qid).map(|q| q.clone());
        if let Some(q) = known(self) {
            return Ok(Some(q));
        }
        let store = self.side.store.clone();
        let loaded = retrying(self.budget(), || store.load()).await?;
        for (name, meta, _) in loaded.queues.iter().filter(|(_, m, _)| m.id == qid) {
            super::watch::learn_queue(&self.engine, &self.side, name, meta).await;
        }
        Ok(known(self))
    }

    /// Appends `chunk` (due messages of `queue`, in due order) and deletes their records, in
    /// one transaction; a record changed meanwhile leaves them for the next read (`false`).
    async fn fire_chunk(
        &mut self,
        queue: &Arc<QueueState>,
        chunk: &[&DelayedRecord],
        now: u64,
        deadline: Instant,
    ) -> Result<bool, StorageError> {
        let mut envs: Vec<Vec<u8>> = chunk.iter().map(|r| r.env.clone()).collect();
        for e in &mut envs {
            envelope::stamp(e, now);
        }
        let envs: Vec<&[u8]> = envs.iter().map(Vec::as_slice).collect();
        let fired: Vec<Fired> = chunk.iter().map(|r| Fired { id: r.id, due: r.due, rev: r.rev }).collect();
        let done = self.append_with(queue, &envs, &[], now, deadline, Extra::Fired(&fired)).await;
        self.note(&done);
        match done? {
            Done::Stored { first, .. } => {
                let last = first + envs.len() as u64 - 1;
                queue.publish_max(last);
                crate::telemetry::produced(&queue.produced, envs.len() as u64);
                tracing::debug!(queue = %queue.name, first, last, "rockq: delayed messages fired");
                Ok(true)
            }
            Done::Changed => Ok(false),
        }
    }
}

/// `due` cut into transactions: at most [`FIRE_TXN`] messages and [`MAX_TXN_BYTES`] of
/// envelopes each (one message at least).
fn chunks<'a>(due: &'a [&'a DelayedRecord]) -> impl Iterator<Item = &'a [&'a DelayedRecord]> + 'a {
    let mut rest = due;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let n = rest
            .iter()
            .take(FIRE_TXN)
            .take_while(|r| {
                bytes += r.env.len();
                bytes <= MAX_TXN_BYTES
            })
            .count()
            .max(1);
        let (chunk, more) = rest.split_at(n);
        rest = more;
        Some(chunk)
    })
}
