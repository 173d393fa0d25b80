//! The etcd engine's writer: one task that takes the same requests and staged sends as the
//! embedded writer thread and carries them out as etcd transactions.
//!
//! A round: the staged sends (group commit: each queue's messages go in as few transactions as
//! etcd's limits allow, each a compare-and-set on the queue's tail; a single call larger than
//! one transaction reserves its sequences first, `reserve.rs`), then the requests, then
//! the ordered groups' offset commits (each compared with the group's owner key). A send
//! resolves when its transaction is committed by a quorum of the cluster.
//!
//! In-doubt writes: when a transaction fails without an answer (the leader died, a timeout),
//! it may still have been applied. The tail record carries the nonce of the append that wrote
//! it, so the writer looks: if the first message it meant to write exists and was created
//! together with a tail bearing its nonce, the append stands; if the tail has not moved, the
//! same transaction is sent again (both compare the same tail, so at most one applies);
//! otherwise another process appended and the messages get new sequences. No sequence is used
//! twice and none is skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::plan::{Done, Extra, Split};
use super::side::{EtcdSide, register_queue, retrying, until};
use crate::engine::Engine;
use crate::engine::capability::{self, Flavour};
use crate::engine::dead_letter::{self, Origin};
use crate::engine::inbox::Staged;
use crate::engine::registry::{OrderedGroupState, PendingRecord, QueueState};
use crate::engine::request::{
    KvRequest, LifecycleRequest, OrderedRequest, QueueRequest, Request, RetentionRequest, ScheduleRequest,
    SettingsRequest, WorkRequest,
};
use crate::error::{Closed, Error, Failure, StorageError, UnsupportedError};
use crate::events::Event;
use crate::model::{GroupMode, GroupOffset, OrderedMark, QueueMeta, StartFrom};
use crate::store::envelope;
use crate::store::etcd::Along;
use crate::store::etcd::segment::Tally;
use crate::store::etcd::{
    Appended, CommitOutcome, DeadLetterAppend, MAX_TXN_BYTES, MAX_TXN_OPS, OrderedCommit,
};
use crate::telemetry;

/// Operations an append transaction's messages (a put per run, or per message in a namespace
/// that does not pack) and idempotency records take at most: etcd's limit, less the tail's put.
const APPEND_OPS: usize = MAX_TXN_OPS - 1;

pub(super) struct Writer {
    pub(super) engine: Arc<Engine>,
    pub(super) side: Arc<EtcdSide>,
    /// Each queue's tail as this process last saw it: (last, nonce).
    pub(super) tails: HashMap<u32, (u64, u64)>,
    /// Flow change records this writer's writes put, applied before their callers are
    /// answered (`flows.rs`).
    pub(super) own_changes: Vec<(crate::store::etcd::flows::FlowChangeWrite, i64)>,
    /// Flows found larger than a whole read (`etcd/flows.rs`): their changes skip the batched
    /// application, which would read a part of them for nothing.
    pub(super) large_flows: std::collections::HashSet<u64>,
    /// The latest enqueue time stamped (wall micros), shared with the appender.
    pub(super) stamps: Arc<std::sync::atomic::AtomicU64>,
    /// After a failed commit: when to try the dirty groups again.
    pub(super) retry_after: Option<Duration>,
    /// The last request found etcd unreachable (a transient error) and none succeeded since:
    /// work other than sends is then tried with one attempt's deadline, and once per kind
    /// per round, so that sends staged meanwhile are not held behind a whole request timeout
    /// per claim, ack and offset (issue 37).
    pub(super) unreachable: bool,
    /// The broker stopped (ends the work groups' watches).
    pub(super) stop: tokio_util::sync::CancellationToken,
    /// The progress reports the last claim write read back (`work.rs`), taken by its caller.
    pub(super) read_back: Vec<(u64, bytes::Bytes)>,
    /// Wakes this writer without keeping it alive (a work group's watch saw its offset behind).
    pub(super) nudge: mpsc::WeakSender<Request>,
    /// The leases dedup records go under, per window: (lease, handed out until).
    pub(super) dedup_leases: HashMap<Duration, (i64, Instant)>,
    /// Schedule ids taken from the namespace's counter and not handed out yet: `next..end`.
    pub(super) scheduled_ids: (u64, u64),
    /// The lease submit markers go under, and until when it is handed out (`delayed.rs`).
    pub(super) marker_lease: Option<(i64, Instant)>,
    /// Large flows' submits in flight, each a task of its own (`flow_submit.rs`), and what
    /// tells them the writer is stopping.
    pub(super) submits: tokio::task::JoinSet<()>,
    pub(super) submits_stop: tokio_util::sync::CancellationToken,
}

/// Operations an ordered group's commit gives its dead letters at most (the rest of etcd's
/// 128 left for the offset, the dead-letter queue's tail and the marks).
const MAX_LETTER_OPS: usize = 96;

/// The most extra commits a flush or a shutdown waits for (each up to a transaction of marks:
/// a burst of 100,000 comebacks), so that subscriptions acking all the while cannot hold it.
const MAX_FLUSH_ROUNDS: usize = 1024;

/// Asked of the appender (`appender.rs`, which writes staged sends beside this writer): write
/// every send staged before it, answer `done`, and write nothing more until `hold` is
/// released (the writer's round is over); `stop`: close the inbox first, and end after
/// answering.
pub(super) struct Barrier {
    pub stop: bool,
    pub done: tokio::sync::oneshot::Sender<()>,
    pub hold: tokio::sync::oneshot::Receiver<()>,
}

/// Whether `r` may be carried out while the appender writes: it reads no queue's tail and
/// appends nothing (a pool's hot requests).
fn beside_appends(r: &Request) -> bool {
    use crate::engine::request::Outcome;
    match r {
        Request::Commit => true,
        Request::Work(WorkRequest::Claim { .. } | WorkRequest::Extend(_)) => true,
        Request::Work(WorkRequest::Outcome { outcome, .. }) => !matches!(outcome, Outcome::DeadLetter { .. }),
        _ => false,
    }
}

/// The appender task, as the writer holds it: how to ask it, and its end.
pub(super) struct Appender {
    pub barriers: mpsc::Sender<Barrier>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Runs until every handle is gone or a shutdown is asked for; `w` is this writer, `appender`
/// the task writing staged sends beside it.
pub(super) async fn run(mut w: Writer, mut rx: mpsc::Receiver<Request>, appender: Appender) {
    // However this ends — a stop, or dropped with its runtime — the broker's stop token is
    // cancelled with it: the watches and event streams end (`close` cancels it too, later).
    let _stopped = w.stop.clone().drop_guard();
    let Appender { barriers: to_appender, task: appender } = appender;
    let max_requests = w.engine.options.max_batch_messages;
    let mut pending: Vec<Request> = Vec::new();
    loop {
        let mut gone = false;
        {
            // A commit that failed (etcd unreachable, an election) left its groups dirty: try
            // them again after a pause even if nothing else arrives.
            let retry = w.retry_after;
            let next = async {
                match retry {
                    Some(d) => tokio::time::timeout(d, rx.recv()).await.unwrap_or(Some(Request::Commit)),
                    None => rx.recv().await,
                }
            };
            match next.await {
                Some(req) => pending.push(req),
                None => gone = true,
            }
        }
        while !gone && pending.len() < max_requests {
            match rx.try_recv() {
                Ok(req) => pending.push(req),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => gone = true,
            }
        }
        let stop = gone || pending.iter().any(|r| matches!(r, Request::Shutdown { .. }));
        // Any request but a pool's claims, extensions and outcomes (which read no tail and
        // append nothing) sees every send staged before it, as embedded (a purge, a group
        // starting at the latest message, a flush, a shutdown: the inbox closed, every staged
        // send written or failed), and appends with no transaction of the appender racing its
        // own for a queue's tail: the appender writes what was staged, then waits for this
        // round to end.
        let mut hold = None;
        if stop || !pending.iter().all(beside_appends) || w.engine.dirty_letters() {
            let (done, written) = tokio::sync::oneshot::channel();
            let (release, held) = tokio::sync::oneshot::channel();
            if to_appender.send(Barrier { stop, done, hold: held }).await.is_ok() {
                let _ = written.await;
                hold = Some(release);
            }
        }
        let mut flushes = Vec::new();
        let mut shutdowns = Vec::new();
        for req in pending.drain(..) {
            match req {
                Request::Flush { reply } => flushes.push(reply),
                Request::Shutdown { reply } => shutdowns.push(reply),
                req => w.apply(req).await,
            }
        }
        let acks = w.commit_work_acks().await;
        let offsets = w.move_work_offsets().await;
        let mut committed = w.commit_dirty().await.and(acks).and(offsets);
        // A flush or a shutdown is answered once what a commit left for the next round (a
        // burst of marks larger than one transaction) is written too.
        let mut rounds = 0;
        while (stop || !flushes.is_empty())
            && committed.is_ok()
            && w.engine.has_dirty()
            && rounds < MAX_FLUSH_ROUNDS
        {
            committed = w.commit_dirty().await;
            rounds += 1;
        }
        w.retry_after = match &committed {
            Ok(()) => None,
            Err(_) => Some(next_retry(w.retry_after)),
        };
        for f in flushes {
            let _ = f.send(committed.clone().map_err(crate::error::Error::Storage));
        }
        drop(hold);
        w.side.owners.release_clean();
        if stop {
            // No large flow's submit writes after the shutdown is answered (unless etcd left
            // one unsettled for longer than its grace: `finish_submits`).
            w.finish_submits().await;
            // The leases go before the shutdown is answered: another process may take the
            // groups over at once.
            let revoking = w.side.owners.release_all();
            let _ =
                tokio::time::timeout(w.side.settings.request_timeout, futures::future::join_all(revoking))
                    .await;
            rx.close();
            while let Ok(req) = rx.try_recv() {
                req.refuse(&Closed::Shutdown);
            }
            drop(to_appender);
            let _ = appender.await;
            for s in shutdowns {
                let _ = s.send(Ok(()));
            }
            return;
        }
    }
}

impl Drop for Writer {
    /// However the writer or the appender task ends, no call is left waiting for a task that
    /// is gone (`Engine::lose_tasks`): the inbox is closed, what it still holds fails with
    /// `Shutdown` as its resolvers drop, and every later call, reads included, is refused with
    /// `Shutdown` (after a clean stop all of that holds already). The case this is for: the
    /// runtime that connected the broker was dropped while handles live on in another.
    /// Embedded, the writer is a thread of its own and outlives that runtime; here the
    /// engine's tasks are that runtime's, and the etcd client's connections with them. A task
    /// that panicked fails what is staged with `ThreadStopped`, as embedded (the other task's
    /// end then refuses later calls with `Shutdown`).
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.engine.inbox.fail(&Failure::ThreadStopped("etcd writer"));
        } else {
            self.engine.lose_tasks();
        }
    }
}

impl Writer {
    /// A writer with nothing learned yet; `stamps` is shared by this process's writers, so
    /// that enqueue times never go back within it.
    pub(super) fn new(
        engine: Arc<Engine>,
        side: Arc<EtcdSide>,
        stop: tokio_util::sync::CancellationToken,
        nudge: mpsc::WeakSender<Request>,
        stamps: Arc<std::sync::atomic::AtomicU64>,
    ) -> Writer {
        Writer {
            engine,
            side,
            tails: HashMap::new(),
            own_changes: Vec::new(),
            large_flows: Default::default(),
            stamps,
            retry_after: None,
            unreachable: false,
            stop,
            read_back: Vec::new(),
            nudge,
            dedup_leases: HashMap::new(),
            scheduled_ids: (0, 0),
            marker_lease: None,
            submits: tokio::task::JoinSet::new(),
            submits_stop: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// A fresh append's nonce: 64 random bits (never 0, the nonce of a new queue's tail), so
    /// that two processes' appends are told apart with a chance of 2^-64 of a mix-up.
    pub(super) fn nonce(&self) -> u64 {
        fastrand::u64(1..)
    }

    /// The time this writer stamps what it writes now (wall micros): the clock's, never below
    /// an earlier stamp, so enqueue times never go back within this process.
    pub(super) fn stamp(&mut self) -> u64 {
        let now = self.engine.clock().wall_micros();
        self.stamps.fetch_max(now, Ordering::AcqRel).max(now)
    }

    /// Carries out one request, or refuses it as unsupported.
    async fn apply(&mut self, req: Request) {
        match req {
            Request::Queue(QueueRequest::Create { name, reply }) => {
                let _ = reply.send(self.create_queue(&name).await);
            }
            Request::Ordered(OrderedRequest::Create { queue, group, start, reply }) => {
                let _ = reply.send(self.create_ordered(queue, group, start).await);
            }
            Request::Work(WorkRequest::Create { queue, group, start, reply }) => {
                let _ = reply.send(self.create_work(queue, group, start).await);
            }
            Request::Work(WorkRequest::Claim { group, claims, bucket, limit_rev, reply, .. }) => {
                self.claim(group, claims, (bucket, limit_rev), reply).await;
            }
            Request::Work(WorkRequest::Outcome {
                group, seq, attempt, outcome, taken_from, reply, ..
            }) => {
                self.outcome(group, (seq, attempt, taken_from), outcome, reply).await;
            }
            Request::Work(WorkRequest::Extend(extension)) => self.extend(extension).await,
            Request::Lifecycle(LifecycleRequest::PurgeQueue { name, reply }) => {
                let _ = reply.send(self.purge_queue(&name).await);
            }
            Request::Lifecycle(LifecycleRequest::DeleteGroup { queue, group, reply }) => {
                let _ = reply.send(self.delete_group(&queue, &group).await);
            }
            Request::Lifecycle(LifecycleRequest::DeleteQueue { name, reply }) => {
                let _ = reply.send(self.delete_queue(&name).await);
            }
            Request::Ordered(OrderedRequest::Reset { group, offset, reply }) => {
                let _ = reply.send(self.reset_ordered(group, offset).await);
            }
            Request::Work(WorkRequest::Reset { group, offset, reply }) => {
                let _ = reply.send(self.reset_work(group, offset).await);
            }
            Request::Work(WorkRequest::Redrive { dlq, expected, last, items, reply }) => {
                self.redrive(dlq, expected, last, items, reply).await;
            }
            Request::Work(WorkRequest::SettleLetter { dlq, seq, item, reply }) => {
                self.settle_letter(dlq, seq, item, reply).await;
            }
            Request::WorkSettings(req) => self.work_settings(req).await,
            Request::Retention(RetentionRequest::SetPolicy { queue, retention, reply }) => {
                let _ = reply.send(self.set_queue_record(&queue, |m| QueueMeta { retention, ..m }).await);
            }
            // Not delayed: appended now, in one transaction (large calls reserve first).
            Request::Schedule(ScheduleRequest::Submit { queue, msgs, reply })
                if msgs.iter().all(|m| m.due.is_none()) =>
            {
                let _ = reply.send(self.submit_now(&queue, msgs).await);
            }
            Request::Schedule(ScheduleRequest::Submit { queue, msgs, reply }) => {
                let _ = reply.send(self.submit_delayed(&queue, msgs).await);
            }
            Request::Schedule(ScheduleRequest::Cancel { queue, id, reply }) => {
                let _ = reply.send(self.cancel_delayed(&queue, id).await);
            }
            Request::Schedule(ScheduleRequest::Reschedule { queue, id, due, reply }) => {
                let _ = reply.send(self.reschedule_delayed(&queue, id, due).await);
            }
            Request::Schedule(ScheduleRequest::Fire) => self.fire().await,
            Request::Schedule(ScheduleRequest::Upsert { name, record, reply }) => {
                let _ = reply.send(self.upsert_schedule(&name, record).await);
            }
            Request::Schedule(ScheduleRequest::Pause { name, paused, reply }) => {
                let _ = reply.send(self.pause_schedule(&name, paused).await);
            }
            Request::Schedule(ScheduleRequest::Delete { name, reply }) => {
                let _ = reply.send(self.delete_schedule(&name).await);
            }
            Request::Settings(req) => {
                let SettingsRequest { queue, group, change, reply } = req;
                let _ = reply.send(self.change_settings(&queue, &group, change).await);
            }
            Request::Queue(QueueRequest::SetDedupWindow { queue, window, reply }) => {
                let _ = reply
                    .send(self.set_queue_record(&queue, |m| QueueMeta { dedup_window: window, ..m }).await);
            }
            Request::Kv(KvRequest::Create { name, reply }) => {
                let _ = reply.send(self.create_keyspace(&name).await);
            }
            Request::Tx(tx) => self.transaction(tx).await,
            Request::Flow(f) => self.flow(f).await,
            Request::Commit => {}
            // No handler here: refused as the capability table says (a request the table
            // says this engine carries out but that reaches here is a bug, refused all the same).
            other => {
                let refused =
                    capability::for_request(&other).map(|cap| capability::check(Flavour::Etcd, cap));
                let why = match refused {
                    Some(Err(u)) => u,
                    _ => UnsupportedError::new("this request", Flavour::Etcd.name()),
                };
                other.refuse(&Closed::Unsupported(why));
            }
        }
    }

    pub(super) async fn create_queue(&mut self, name: &str) -> Result<Arc<QueueState>, Error> {
        if let Some(q) = self.engine.registry.queue(name) {
            return Ok(q);
        }
        let store = &self.side.store;
        let t = self.side.settings.request_timeout;
        // An inspection makes nothing: a queue it was asked about was deleted meanwhile.
        if self.side.settings.passive {
            let Some((meta, last)) = retrying(t, || store.queue(name)).await? else {
                return Err(Error::NoSuchQueue { queue: name.to_owned() });
            };
            return Ok(register_queue(&self.engine, name, &meta, last));
        }
        let (meta, last) = retrying(t, || store.create_queue(name)).await?;
        let q = register_queue(&self.engine, name, &meta, last);
        tracing::debug!(queue = %name, id = meta.id, "rockq: queue created or found in etcd");
        Ok(q)
    }

    async fn create_ordered(
        &mut self,
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
    ) -> Result<Arc<OrderedGroupState>, Error> {
        let id = crate::store::group_id(&group, &queue.name);
        // A stale handle's queue (deleted; the name may have made another): not the new one's.
        if queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: queue.name.to_string() });
        }
        if let Some(g) = self.engine.registry.ordered.get(&id) {
            return Ok(g.clone());
        }
        let wrong =
            |existing| Error::WrongMode { group: group.clone(), queue: queue.name.to_string(), existing };
        let store = &self.side.store;
        let t = self.side.settings.request_timeout;
        let (stood, seen) = match retrying(t, || store.offset_at(&group, &queue.name)).await? {
            (Some(o), rev) => (o, rev),
            // An inspection makes nothing.
            (None, _) if self.side.settings.passive => {
                return Err(Error::NoSuchGroup { group, queue: queue.name.to_string() });
            }
            (None, _) => {
                let offset = GroupOffset {
                    mode: GroupMode::Ordered,
                    committed: self.start_offset(&queue, start).await?,
                };
                retrying(t, || store.create_group(&group, &queue.name, offset)).await?
            }
        };
        if stood.mode != GroupMode::Ordered {
            return Err(wrong("work-queue"));
        }
        let g = OrderedGroupState::new(&group, queue.clone(), stood.committed);
        // Before the registry: a deletion the watch brings later is judged by this revision.
        self.side.group_seen.insert(id.clone(), seen);
        self.engine.registry.ordered.insert(id, g.clone());
        // One the watch applied while this group was read.
        super::forget::forget_if_deleted_since(&self.engine, &self.side, &group, &queue.name, seen);
        super::settings::adopt(&self.engine, &self.side, &group, &queue.name);
        Ok(g)
    }

    /// The offset a new group starting at `start` gets: the queue's first sequence and tail
    /// as etcd holds them now (another process may have trimmed or appended since this one
    /// last heard).
    pub(super) async fn start_offset(&self, queue: &QueueState, start: StartFrom) -> Result<u64, Error> {
        let (store, t) = (&self.side.store, self.side.settings.request_timeout);
        if let Some((meta, _)) = retrying(t, || store.queue_record(&queue.name)).await? {
            queue.first_seq.fetch_max(meta.first_seq, Ordering::AcqRel);
        }
        let first = queue.first_seq.load(Ordering::Acquire);
        let next = retrying(t, || store.tail(queue.id)).await?.unwrap_or(first - 1).max(first - 1) + 1;
        match start {
            StartFrom::Earliest => Ok(first - 1),
            StartFrom::Latest => Ok(next - 1),
            StartFrom::Sequence(s) if (first..=next).contains(&s) => Ok(s - 1),
            StartFrom::Sequence(requested) => Err(Error::OutOfRange { requested, first, next }),
        }
    }

    /// Changes `queue`'s record (its retention policy, its dedup window) as `change` says, by
    /// a compare-and-set on the record as read: another process's change (a trim's first
    /// sequence, the other setting) is kept.
    async fn set_queue_record(
        &mut self,
        queue: &QueueState,
        change: impl Fn(QueueMeta) -> QueueMeta,
    ) -> Result<(), Error> {
        let (store, t) = (&self.side.store, self.side.settings.request_timeout);
        loop {
            let Some((meta, rev)) = retrying(t, || store.queue_record(&queue.name)).await? else {
                return Err(Error::QueueDeleted { queue: queue.name.to_string() });
            };
            let next = change(meta);
            if retrying(t, || store.put_queue_record(&queue.name, &next, rev)).await? {
                super::watch::learn_queue(&self.engine, &self.side, &queue.name, &next).await;
                return Ok(());
            }
        }
    }

    /// Appends one staged round: each queue's messages in transactions of at most etcd's
    /// limits (a send call is never split), queues side by side.
    pub(super) async fn append_staged(&mut self, mut s: Staged) {
        if let Some(f) = self.engine.failure() {
            s.fail(&f);
            return;
        }
        let now = self.stamp();
        let started = std::time::Instant::now();
        // Each send call: its queue, and its messages' byte ranges in the arena.
        let mut calls: Vec<(usize, Vec<(usize, usize)>)> = Vec::with_capacity(s.sends.len());
        let mut start = 0;
        let mut next_call = s.sends.iter().peekable();
        for (i, &(q, end)) in s.msgs.iter().enumerate() {
            if next_call.next_if(|&&first| first as usize == i).is_some() {
                calls.push((q as usize, Vec::new()));
            }
            envelope::stamp(&mut s.arena[start..end], now);
            if let Some(call) = calls.last_mut() {
                call.1.push((start, end));
            }
            start = end;
        }
        // The sends' request timeout counts from when the first of them was staged: a send
        // that waited behind a round stuck in an outage does not get a whole timeout more.
        let t = self.side.settings.request_timeout;
        let deadline = s.since.map_or_else(|| Instant::now() + t, |at| at + t);
        // Per queue: its calls, in staging order, cut into transactions.
        let mut per_queue: Vec<Vec<usize>> = vec![Vec::new(); s.queues.len()];
        let packs = self.side.store.packs();
        for (c, (q, _)) in calls.iter().enumerate() {
            per_queue[*q].push(c);
        }
        let mut firsts: Vec<u64> = vec![0; calls.len()];
        let mut hits = 0u64;
        let mut result: Result<(), StorageError> = Ok(());
        // Sends to a queue deleted before they were written: answered `QueueDeleted`.
        let mut refused: Vec<(usize, Arc<str>)> = Vec::new();
        for (qi, cs) in per_queue.iter().enumerate() {
            if cs.is_empty() {
                continue;
            }
            let queue = s.queues[qi].clone();
            if queue.is_deleted() {
                for &c in cs {
                    firsts[c] = crate::engine::completion::DELETED_VALUE;
                    refused.push((c, queue.name.clone()));
                }
                continue;
            }
            let mut chunk: Vec<usize> = Vec::new();
            // What the chunk's messages put (runs in a packed namespace, `segment::Tally`) and
            // its idempotency records.
            let (mut tally, mut records) = (Tally::new(packs), 0);
            let mut chunks: Vec<Vec<usize>> = Vec::new();
            for &c in cs {
                // A message with an idempotency key (a call of its own) also puts its record.
                let keyed = calls[c]
                    .1
                    .first()
                    .is_some_and(|&(a, z)| envelope::idempotency_key(&s.arena[a..z]).is_some());
                let with = |mut t: Tally| {
                    calls[c].1.iter().for_each(|&(a, z)| t.add(&s.arena[a..z]));
                    t
                };
                let (mut next, keyed) = (with(tally), usize::from(keyed));
                if !chunk.is_empty()
                    && (next.ops + records + keyed > APPEND_OPS || next.bytes > MAX_TXN_BYTES)
                {
                    chunks.push(std::mem::take(&mut chunk));
                    (next, records) = (with(Tally::new(packs)), 0);
                }
                chunk.push(c);
                tally = next;
                records += keyed;
            }
            chunks.push(chunk);
            for (ci, chunk) in chunks.iter().enumerate() {
                let envs: Vec<&[u8]> =
                    chunk.iter().flat_map(|&c| calls[c].1.iter().map(|&(a, z)| &s.arena[a..z])).collect();
                let keys: Vec<(usize, String)> = envs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, e)| envelope::idempotency_key(e).map(|k| (i, k.to_owned())))
                    .collect();
                let appended = self.append(&queue, &envs, &keys, now, deadline).await;
                self.note(&appended);
                match appended {
                    Ok((first, duplicates)) => {
                        let written = envs.len() - duplicates.len();
                        let mut dups = duplicates.into_iter().peekable();
                        let (mut seq, mut i) = (first, 0);
                        for &c in chunk {
                            // Only calls of one message carry a key: a duplicate is a whole call.
                            match dups.next_if(|(at, _)| *at == i) {
                                Some((_, original)) => {
                                    firsts[c] = crate::engine::completion::duplicate_value(original);
                                    hits += 1;
                                }
                                None => {
                                    firsts[c] = seq;
                                    seq += calls[c].1.len() as u64;
                                }
                            }
                            i += calls[c].1.len();
                        }
                        if written > 0 {
                            queue.publish_max(seq - 1);
                            telemetry::produced(&queue.produced, seq - first);
                        }
                        if hits > 0 {
                            telemetry::queue_counter(
                                telemetry::DEDUP_HITS,
                                &queue.name,
                                std::mem::take(&mut hits),
                            );
                        }
                    }
                    Err(e) => {
                        // Deleted by another process since this one last heard (its tail is
                        // gone): this chunk and the later ones were not written. (An outage's
                        // errors are transient: no more time is spent on them.)
                        if !e.is_transient() && self.queue_gone(&queue).await {
                            for &c in chunks[ci..].iter().flatten() {
                                firsts[c] = crate::engine::completion::DELETED_VALUE;
                                refused.push((c, queue.name.clone()));
                            }
                            break;
                        }
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        if !refused.is_empty() {
            s.resolver.completion().note_deleted(refused.into_boxed_slice());
        }
        let counters = &self.engine.counters;
        counters.rounds.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(()) => {
                counters.messages.fetch_add(s.msgs.len() as u64, Ordering::Relaxed);
                // As embedded: a sample per round written, its messages and how long its
                // writes took.
                telemetry::round(s.msgs.len() as u64, started.elapsed());
                let Staged { resolver, .. } = s;
                resolver.resolve(Ok(firsts.into_boxed_slice()));
            }
            Err(e) => {
                tracing::error!(error = %e, "rockq: an append to etcd failed; its sends fail");
                let Staged { resolver, .. } = s;
                resolver.resolve(Err(Error::from(e)));
            }
        }
    }

    /// Appends `envs` to `queue` as one transaction, recording the idempotency keys `keys`
    /// (`(index, key)`, ascending) at `now` (wall micros) unless a key makes its message a
    /// duplicate (`dedup.rs`); returns the first sequence written and the duplicates with
    /// their originals. Gives up at `deadline` (each request is cut short there too), with the
    /// outcome unknown.
    pub(super) async fn append(
        &mut self,
        queue: &QueueState,
        envs: &[&[u8]],
        keys: &[(usize, String)],
        now: u64,
        deadline: Instant,
    ) -> Result<(u64, Vec<(usize, crate::sent::Original)>), StorageError> {
        match self.append_with(queue, envs, keys, now, deadline, Extra::Nothing).await? {
            Done::Stored { first, originals } => Ok((first, originals)),
            // Only a firing's compares can refuse it.
            Done::Changed => Err(StorageError::new("etcd: an append was refused without cause")),
        }
    }

    /// [`append`](Self::append), with what `extra` says: some of the messages delayed (their
    /// records written instead, in the same transaction or, if nothing is appended now, in
    /// one of their own), or the messages fired from the schedule (their records deleted,
    /// compared as read: [`Done::Changed`] if one changed meanwhile, nothing written).
    pub(super) async fn append_with(
        &mut self,
        queue: &QueueState,
        envs: &[&[u8]],
        keys: &[(usize, String)],
        now: u64,
        deadline: Instant,
        extra: Extra<'_>,
    ) -> Result<Done, StorageError> {
        let store = self.side.store.clone();
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let (mut last, mut cur_nonce) = match self.tails.get(&queue.id) {
            Some(&t) => t,
            None => match retrying(left(), || store.get_tail(queue.id)).await? {
                Some(t) => t,
                // Deleted by another process: the round answers its sends (`queue_gone`).
                None => {
                    return Err(StorageError::new(format!(
                        "etcd: queue {} has no tail: deleted",
                        queue.name
                    )));
                }
            },
        };
        let nonce = self.nonce();
        let mut backoff = Duration::from_millis(10);
        let mut held = Duration::from_millis(2);
        // A try's outcome was unknown and it was found not applied: it may still land (a
        // request etcd had not answered yet), so a moved tail is looked at for it.
        let mut in_doubt = false;
        loop {
            // Keys are read again on every try: a race lost on a key is a duplicate now.
            let plan = self.plan_dedup(queue, envs.len(), keys, now, left()).await?;
            if plan.written.is_empty() {
                return Ok(Done::Stored { first: last + 1, originals: plan.originals(last + 1) });
            }
            let lease = match plan.records.is_empty() {
                true => None,
                false => Some(self.dedup_lease(queue, left()).await?),
            };
            let split = Split::of(&plan, &extra);
            let written: Vec<&[u8]> = split.now.iter().map(|&i| envs[i]).collect();
            let n = written.len() as u64;
            if written.is_empty() {
                // Every message written is delayed: no tail moves (`delayed.rs`).
                let dedup = lease.map(|l| (&split.records[..], l));
                let puts = split.puts(envs);
                if self.put_delayed(queue, &puts, dedup, deadline).await? {
                    return Ok(Done::Stored { first: last + 1, originals: split.originals(&plan, last + 1) });
                }
                // A key was recorded meanwhile: planned again, it is a duplicate now.
                continue;
            }
            let along = match &extra {
                Extra::Fired(f) => Along::Fired(f),
                Extra::Schedule(w) => Along::Schedule(w),
                _ => Along::Nothing,
            };
            let puts = split.puts(envs);
            let along = if puts.is_empty() { along } else { Along::Delayed(&puts) };
            if !crate::store::etcd::reserve::fits_one(
                store.packs(),
                &written,
                split.records.len() + along.ops(),
            ) {
                // Callers size what they send along to fit (`delayed.rs`, `schedules.rs`).
                if !matches!(along, Along::Nothing) {
                    return Err(StorageError::new("etcd: a submit or a firing larger than one transaction"));
                }
                let dedup = lease.map(|l| (&split.records[..], l));
                match self
                    .append_reserved(queue.id, (last, cur_nonce), nonce, &written, dedup, deadline)
                    .await
                {
                    Ok(None) => {
                        self.tails.insert(queue.id, (last + n, nonce));
                        index_sent(queue, last + 1, &written);
                        return Ok(Done::Stored { first: last + 1, originals: plan.originals(last + 1) });
                    }
                    Ok(Some((l, n))) => (last, cur_nonce) = (l, n),
                    Err(e) if self.forget_dedup_lease(&e) => {}
                    Err(e) => {
                        self.tails.remove(&queue.id);
                        return Err(e);
                    }
                }
                if Instant::now() >= deadline {
                    self.tails.remove(&queue.id);
                    return Err(StorageError::new("etcd: appending timed out under contention"));
                }
                continue;
            }
            let dedup = lease.map(|l| (&split.records[..], l));
            match until(deadline, store.append(queue.id, (last, cur_nonce), nonce, &written, dedup, along))
                .await
            {
                Ok(Appended::Stored) => {
                    self.tails.insert(queue.id, (last + n, nonce));
                    index_sent(queue, last + 1, &written);
                    return Ok(Done::Stored { first: last + 1, originals: split.originals(&plan, last + 1) });
                }
                // The tail as read, no reservation: a fired message's record changed.
                Ok(Appended::Moved { last: l, nonce: n })
                    if (l, n) == (last, cur_nonce)
                        && matches!(extra, Extra::Fired(_) | Extra::Schedule(_)) =>
                {
                    return Ok(Done::Changed);
                }
                Ok(Appended::Moved { last: l, nonce: n }) => {
                    if in_doubt
                        && let Ok((true, _, _)) =
                            until(deadline, store.resolve_append(queue.id, last, nonce)).await
                    {
                        // The earlier try landed late: stored once, there.
                        self.tails.remove(&queue.id);
                        index_sent(queue, last + 1, &written);
                        return Ok(Done::Stored {
                            first: last + 1,
                            originals: split.originals(&plan, last + 1),
                        });
                    }
                    (last, cur_nonce) = (l, n);
                }
                // Deleted by another process: the round answers its sends (`queue_gone`).
                Ok(Appended::NoTail) => {
                    self.tails.remove(&queue.id);
                    return Err(StorageError::new(format!(
                        "etcd: queue {} has no tail: deleted",
                        queue.name
                    )));
                }
                // A large send call holds the queue (`reserve.rs`): wait for its commit.
                Ok(Appended::Reserved) => {
                    tokio::time::sleep(held).await;
                    held = (held * 2).min(Duration::from_millis(100));
                }
                Err(e) if self.forget_dedup_lease(&e) => {}
                Err(e) => {
                    // The outcome is unknown: find out before anything else.
                    loop {
                        if Instant::now() >= deadline {
                            self.tails.remove(&queue.id);
                            return Err(e);
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(super::side::RETRY_CAP);
                        match until(deadline, store.resolve_append(queue.id, last, nonce)).await {
                            Ok((true, _, _)) => {
                                self.tails.remove(&queue.id);
                                index_sent(queue, last + 1, &written);
                                let originals = split.originals(&plan, last + 1);
                                return Ok(Done::Stored { first: last + 1, originals });
                            }
                            Ok((false, l, n)) => {
                                (last, cur_nonce) = (l, n);
                                in_doubt = true;
                                break;
                            }
                            Err(_) => continue,
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                self.tails.remove(&queue.id);
                return Err(StorageError::new("etcd: appending timed out under contention"));
            }
        }
    }

    /// Commits the ordered groups whose offsets moved (and their marks and dead letters), each
    /// as one transaction compared with its owner key.
    pub(super) async fn commit_dirty(&mut self) -> Result<(), StorageError> {
        let mut result = Ok(());
        for g in self.engine.take_dirty() {
            if result.as_ref().is_err_and(StorageError::is_transient) {
                // etcd is unreachable this round: the rest waits for the next.
                self.engine.mark_dirty(g);
                continue;
            }
            g.dirty.swap(false, Ordering::AcqRel);
            let committed = self.commit_group(&g).await;
            self.note(&committed);
            if let Err(e) = committed {
                tracing::warn!(group = %g.name, queue = %g.queue.name, error = %e, "rockq: offset commit to etcd failed; trying again next round");
                if g.mark() {
                    self.engine.mark_dirty(g.clone());
                }
                result = Err(e);
            }
        }
        result
    }

    async fn commit_group(&mut self, g: &Arc<OrderedGroupState>) -> Result<(), StorageError> {
        if !self.side.owners.holds(g) {
            // Not held here (any more): nothing of it may be written by this process.
            drop(std::mem::take(&mut g.records().pending));
            return Ok(());
        }
        let acked = g.acked.load(Ordering::SeqCst);
        let floor = g.records_moot_through(acked);
        let (pending, passed) = {
            let mut rec = g.records();
            let passed: Vec<u64> = rec.stored.iter().copied().filter(|&s| s <= floor).collect();
            (std::mem::take(&mut rec.pending), passed)
        };
        let mut marks: Vec<(u64, OrderedMark)> = Vec::new();
        let mut redeliver = Vec::new();
        let mut letters: Vec<(PendingLetter, Vec<u8>)> = Vec::new();
        let mut dlq: Option<Arc<QueueState>> = None;
        // Operations the letters take (each its mark, its copy and a prioritised copy's index
        // entry): those past `MAX_LETTER_OPS` go next round, so that a burst of them cannot
        // make a commit larger than one transaction.
        let (mut letter_ops, mut deferred) = (0, false);
        // And their copies' bytes (at least one letter goes, whatever its size): a burst of
        // large poison messages otherwise made a request etcd refuses, round after round.
        let mut letter_bytes = 0;
        for p in pending {
            match p {
                PendingRecord::Failed { seq, .. } if seq <= floor => {}
                PendingRecord::Failed { seq, deliveries, not_before_micros } => {
                    marks.push((seq, OrderedMark::CameBack { deliveries, not_before_micros }));
                }
                PendingRecord::DeadLetter { msg, deliveries, reason, sub } => {
                    let cost = 2 + usize::from(msg.priority > 0);
                    if letter_ops + cost > MAX_LETTER_OPS {
                        g.records().pending.push(PendingRecord::DeadLetter { msg, deliveries, reason, sub });
                        deferred = true;
                        continue;
                    }
                    letter_ops += cost;
                    let name = sub.dead_letter_queue();
                    let q = match &dlq {
                        Some(q) if q.name == name => q.clone(),
                        Some(_) => {
                            // One dead-letter queue per commit: the rest go next round.
                            letter_ops -= cost;
                            deferred = true;
                            g.records().pending.push(PendingRecord::DeadLetter {
                                msg,
                                deliveries,
                                reason,
                                sub,
                            });
                            continue;
                        }
                        None => {
                            let q = self
                                .create_queue(&name)
                                .await
                                .map_err(|e| StorageError::new(e.to_string()))?;
                            dlq = Some(q.clone());
                            q
                        }
                    };
                    drop(q);
                    let stamped = self.stamp();
                    let origin =
                        Origin { queue: &g.queue, group: &g.name, seq: msg.seq, attempts: deliveries };
                    match dead_letter::copy(&origin, &reason, msg.envelope(), stamped) {
                        Ok((env, _)) if !letters.is_empty() && letter_bytes + env.len() > MAX_TXN_BYTES => {
                            letter_ops -= cost;
                            g.records().pending.push(PendingRecord::DeadLetter {
                                msg,
                                deliveries,
                                reason,
                                sub,
                            });
                            deferred = true;
                        }
                        Ok((env, reason)) => {
                            letter_bytes += env.len();
                            marks.push((msg.seq, OrderedMark::DeadLettered { deliveries }));
                            letters.push((PendingLetter { msg, deliveries, reason, sub }, env));
                        }
                        Err(e) => {
                            tracing::error!(group = %g.name, seq = msg.seq, error = %e, "rockq: dead-lettering failed; delivering again");
                            redeliver.push((sub, msg, deliveries));
                        }
                    }
                }
            }
        }
        // Letters count their messages acknowledged: the offset passes them in this commit.
        for (l, _) in &letters {
            l.sub.ack(l.msg.seq);
        }
        let acked = g.acked.load(Ordering::SeqCst);
        let durable = g.durable.load(Ordering::SeqCst);
        let offset = (acked > durable).then_some(acked);
        for (sub, msg, deliveries) in redeliver {
            sub.redeliver(msg, deliveries);
        }
        // Marks the offset passes in this same commit are not needed (a dead letter's copy
        // still goes: the offset passing its message is what its mark would have said).
        let floor = g.records_moot_through(acked);
        marks.retain(|(s, _)| *s > floor);
        // One operation per key in a transaction (etcd refuses duplicates): a message that
        // came back twice since the last commit keeps its latest count.
        let marks: Vec<(u64, OrderedMark)> =
            marks.into_iter().collect::<std::collections::BTreeMap<_, _>>().into_iter().collect();
        // One transaction holds the whole commit: the offset and the dead letters (each
        // letter's mark, copy and index entry, and the queue's tail) first, then came-back
        // marks, then deletions of marks the offset passed; what does not fit goes next round.
        // A burst of comebacks (a window of deliveries nacked during an outage downstream)
        // made every later commit of the group larger than etcd takes: none landed again.
        let room = MAX_TXN_OPS
            .saturating_sub(usize::from(offset.is_some()))
            .saturating_sub(if letters.is_empty() { 0 } else { 1 + letter_ops });
        let Fitted { marks, late, deletes, deletes_left } = fit_commit(marks, passed, room);
        if !late.is_empty() {
            // Ahead of anything queued since, which is newer for the same message.
            let back = late.into_iter().filter_map(|(seq, m)| match m {
                OrderedMark::CameBack { deliveries, not_before_micros } => {
                    Some(PendingRecord::Failed { seq, deliveries, not_before_micros })
                }
                _ => None,
            });
            g.records().pending.splice(0..0, back);
            deferred = true;
        }
        deferred |= deletes_left;
        let dead_letters = match (&dlq, letters.is_empty()) {
            (Some(q), false) => {
                let (last, nonce) = match self.tails.get(&q.id) {
                    Some(&t) => t,
                    None => {
                        let store = &self.side.store;
                        retrying(self.side.settings.request_timeout, || store.tail_record(q.id)).await?
                    }
                };
                Some((
                    q.clone(),
                    DeadLetterAppend {
                        qid: q.id,
                        expected_last: last,
                        expected_nonce: nonce,
                        nonce: self.nonce(),
                        envelopes: letters.iter().map(|(_, e)| e.clone()).collect(),
                    },
                ))
            }
            _ => None,
        };
        let dl_meta =
            dead_letters.as_ref().map(|(q, d)| (q.clone(), d.expected_last, d.nonce, d.envelopes.len()));
        let commit = OrderedCommit {
            group: &g.name,
            queue: &g.queue.name,
            owner: &self.side.owner_id,
            offset,
            put_marks: &marks,
            delete_marks: &deletes,
            dead_letters: dead_letters.map(|(_, d)| d),
        };
        match self.side.store.commit_ordered(commit).await {
            Ok(CommitOutcome::TailMoved) => {
                // Another process appended to the dead-letter queue meanwhile: nothing was
                // written; the letters and marks go again next round, on the new tail.
                if let Some((q, ..)) = dl_meta {
                    self.tails.remove(&q.id);
                }
                let mut rec = g.records();
                for (l, _) in letters {
                    let PendingLetter { msg, deliveries, reason, sub } = l;
                    rec.pending.push(PendingRecord::DeadLetter { msg, deliveries, reason, sub });
                }
                for (seq, m) in marks {
                    if let OrderedMark::CameBack { deliveries, not_before_micros } = m {
                        rec.pending.push(PendingRecord::Failed { seq, deliveries, not_before_micros });
                    }
                }
                drop(rec);
                Err(StorageError::new("etcd: the dead-letter queue moved; committing again"))
            }
            Ok(CommitOutcome::Done) => {
                let mut rec = g.records();
                for s in &deletes {
                    rec.stored.remove(s);
                }
                // Records passed but not deleted (no room, or passed since `passed` was read)
                // stay known, for the next commit to delete.
                let left = rec.forget_through(floor);
                rec.stored.extend(left);
                for (s, m) in &marks {
                    rec.stored.insert(*s);
                    if matches!(m, OrderedMark::DeadLettered { .. }) {
                        rec.dead.insert(*s);
                    }
                }
                drop(rec);
                if let Some(v) = offset {
                    let before = g.durable.fetch_max(v, Ordering::SeqCst);
                    if v > before {
                        g.durable_moved.notify_waiters();
                    }
                    self.engine.counters.offset_commits.fetch_add(1, Ordering::Relaxed);
                    telemetry::group_counter(
                        telemetry::ACKED,
                        &g.queue.name,
                        &g.name,
                        v.saturating_sub(before),
                    );
                }
                if deferred {
                    // The letters, marks or deletions left for the next round: committed
                    // then, without waiting for another request.
                    if g.mark() {
                        self.engine.mark_dirty(g.clone());
                    }
                    if let Some(tx) = self.nudge.upgrade() {
                        let _ = tx.try_send(Request::Commit);
                    }
                }
                if let Some((q, last, nonce, n)) = dl_meta {
                    self.tails.insert(q.id, (last + n as u64, nonce));
                    index_sent(&q, last + 1, letters.iter().map(|(_, e)| e));
                    q.publish_max(last + n as u64);
                    telemetry::produced(&q.produced, n as u64);
                    for (i, (l, _)) in letters.into_iter().enumerate() {
                        let PendingLetter { msg, deliveries, reason, sub } = l;
                        let (queue, group, dlq, dlq_seq) =
                            (g.queue.name.clone(), g.name.clone(), q.name.clone(), last + 1 + i as u64);
                        tracing::warn!(%queue, %group, seq = msg.seq, attempt = deliveries, %reason, %dlq, dlq_seq, "rockq: dead-lettered");
                        telemetry::group_counter(telemetry::DEAD_LETTERED, &queue, &group, 1);
                        // As embedded: the subscription (and its active slot) is released
                        // before anyone hears of the dead letter.
                        drop(sub);
                        self.engine.emit(|| Event::DeadLettered {
                            queue,
                            group,
                            seq: msg.seq,
                            attempts: deliveries,
                            reason,
                            dlq,
                            dlq_seq,
                        });
                    }
                }
                Ok(())
            }
            Ok(CommitOutcome::Lost) => {
                // Another process owns the group now (this one's lease lapsed): nothing was
                // written; the subscription here ends, and the new owner delivers again what
                // was not committed (at-least-once).
                if let Some((q, ..)) = dl_meta {
                    self.tails.remove(&q.id);
                }
                for (l, _) in letters {
                    drop(l.sub);
                }
                self.side.owners.lost(g);
                Ok(())
            }
            Err(e) => {
                if let Some((q, ..)) = dl_meta {
                    self.tails.remove(&q.id);
                }
                // Nothing known to be written: deliver the letters again rather than lose them.
                for (l, _) in letters {
                    l.sub.redeliver(l.msg, l.deliveries);
                }
                for (seq, m) in marks {
                    if let OrderedMark::CameBack { deliveries, not_before_micros } = m {
                        g.records().pending.push(PendingRecord::Failed {
                            seq,
                            deliveries,
                            not_before_micros,
                        });
                    }
                }
                Err(e)
            }
        }
    }
}

/// An ordered commit's marks and mark deletions, fitted to the operations left in its
/// transaction ([`fit_commit`]).
#[derive(Debug, PartialEq)]
struct Fitted {
    /// Marks written now: every dead letter's (its copy is in this transaction) and the
    /// came-back marks that fit.
    marks: Vec<(u64, OrderedMark)>,
    /// Came-back marks left for the next round.
    late: Vec<(u64, OrderedMark)>,
    /// Marks the offset passed, deleted now.
    deletes: Vec<u64>,
    /// Whether some passed marks are left for the next round.
    deletes_left: bool,
}

/// Fits an ordered commit's marks and deletions to `room` operations (dead letters' marks are
/// counted in their letters' budget and always kept): came-back marks first, which carry
/// delivery counts that must survive a restart, then deletions, which only tidy up.
fn fit_commit(marks: Vec<(u64, OrderedMark)>, mut passed: Vec<u64>, room: usize) -> Fitted {
    let (mut kept, mut late) = (Vec::with_capacity(marks.len()), Vec::new());
    let mut used = 0;
    for (seq, m) in marks {
        match m {
            OrderedMark::CameBack { .. } if used >= room => late.push((seq, m)),
            OrderedMark::CameBack { .. } => {
                used += 1;
                kept.push((seq, m));
            }
            _ => kept.push((seq, m)),
        }
    }
    let fit = room.saturating_sub(used).min(passed.len());
    let deletes_left = passed.len() > fit;
    passed.truncate(fit);
    Fitted { marks: kept, late, deletes: passed, deletes_left }
}

/// A dead letter on its way, held until its commit is answered.
struct PendingLetter {
    msg: crate::store::RawMessage,
    deliveries: u32,
    reason: String,
    sub: Arc<dyn crate::engine::registry::LiveSubscription>,
}

impl Writer {
    /// Notes whether etcd answered a request.
    pub(super) fn note<T>(&mut self, r: &Result<T, StorageError>) {
        match r {
            Ok(_) => self.unreachable = false,
            Err(e) if e.is_transient() => self.unreachable = true,
            Err(_) => {}
        }
    }

    /// How long work other than sends may try a request now: four attempts' deadlines (at
    /// most the request timeout), or one while etcd is unreachable. Sends staged meanwhile wait
    /// behind it, and a send must be answered within its request timeout; what gives up here is
    /// tried again (claims by their subscription, acks and offsets by the next round).
    pub(super) fn budget(&self) -> Duration {
        let s = &self.side.settings;
        if self.unreachable { s.attempt_timeout } else { s.request_timeout.min(s.attempt_timeout * 4) }
    }
}

/// Indexes the priorities of `envs`, appended by this process at `first ..`, before the caller
/// publishes them (other processes learn them from the watch, in the revision that published
/// them): a claim that sees a message sees its priority.
pub(super) fn index_sent<E: AsRef<[u8]>>(queue: &QueueState, first: u64, envs: impl IntoIterator<Item = E>) {
    for (i, e) in envs.into_iter().enumerate() {
        queue.index_priority(first + i as u64, envelope::priority(e.as_ref()));
    }
}

/// How long the writer waits before trying a failed commit again, after waiting `last`: 20 ms,
/// doubling up to [`RETRY_CAP`](super::side::RETRY_CAP). Acks wait for this after an election,
/// so it is short; a cluster that stays down costs one attempt per group per wait.
pub(super) fn next_retry(last: Option<Duration>) -> Duration {
    last.map_or(Duration::from_millis(20), |d| (d * 2).min(super::side::RETRY_CAP))
}

#[cfg(test)]
mod tests {
    use super::{Fitted, OrderedMark, fit_commit};

    fn back(seq: u64) -> (u64, OrderedMark) {
        (seq, OrderedMark::CameBack { deliveries: 1, not_before_micros: 0 })
    }

    #[test]
    fn a_commit_keeps_dead_letters_marks_then_comebacks_then_deletions_within_its_room() {
        let letter = (7, OrderedMark::DeadLettered { deliveries: 3 });
        let marks = vec![back(5), letter, back(9), back(11)];
        // Room for two: the letter's mark is counted with its letter, two comebacks fit, the
        // third and every deletion wait.
        let f = fit_commit(marks.clone(), vec![1, 2, 3], 2);
        assert_eq!(
            f,
            Fitted {
                marks: vec![back(5), letter, back(9)],
                late: vec![back(11)],
                deletes: vec![],
                deletes_left: true
            }
        );
        // Room for five: every mark, and two of the three deletions.
        let f = fit_commit(marks.clone(), vec![1, 2, 3], 5);
        assert_eq!((f.late.len(), f.deletes, f.deletes_left), (0, vec![1, 2], true));
        // Room for everything: nothing left.
        let f = fit_commit(marks, vec![1, 2, 3], 6);
        assert_eq!((f.marks.len(), f.late.len(), f.deletes.len(), f.deletes_left), (4, 0, 3, false));
        // No room: only the letter's mark.
        let f = fit_commit(vec![letter, back(9)], vec![1], 0);
        assert_eq!((f.marks, f.late, f.deletes_left), (vec![letter], vec![back(9)], true));
    }
}
