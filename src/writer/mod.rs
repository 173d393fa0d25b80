//! The writer: one dedicated OS thread that owns every write to RocksDB.
//!
//! Each round it takes the requests waiting on its channel and the sends staged in its
//! `Inbox` (`engine/inbox.rs`; up to the count and byte caps), turns them into entries of one `WriteBatch` —
//! messages with freshly allocated sequences, new queue and group records, claims, and one
//! offset record per dirty group — writes it with a single WAL append (and, under `Fsync`, a
//! single fsync), then completes every waiting caller and wakes the subscribers of the queues
//! it touched. Sends and requests that arrive during the write wait and form the next round:
//! that is the group commit.
//!
//! Under `Durability::Fsync` the fsync is pipelined: the writer appends each round to the WAL
//! without syncing and hands the round to the syncer thread, which fsyncs everything appended
//! so far with one `SyncWAL` and only then completes the rounds it covered (replies, consumer
//! wake-ups, registry updates). The writer keeps appending the next rounds meanwhile, so one
//! fsync covers every round written while the previous one ran. Nothing becomes visible to
//! consumers or resolves a send before it is synced.
//!
//! Owning sequence allocation here means sequences are dense and monotonic; producers only take
//! the inbox's short staging lock. A write error makes the writer fail closed: nothing it allocated is
//! reused, because nothing is written after a failure.

mod dead_letter;
mod ordered;
mod request;
mod retention;
mod settings;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rocksdb::{WriteBatch, WriteOptions};
use tokio::sync::{mpsc, oneshot};

mod work;

pub(crate) use request::{Outcome, RedriveItem, RedriveReply, Request, SettingsChange};

use crate::engine::Staged;

use crate::consumer::StartFrom;
use crate::engine::Engine;
use crate::error::{
    AckError, CommitError, QueueError, RedriveError, SendError, StorageError, SubscribeError,
};
use crate::options::Durability;
use crate::registry::{GroupState, QueueState};
use crate::store::records::{self, QueueRecord};
use crate::store::{envelope, keys};
use crate::work::WorkGroupState;

/// Starts the writer thread.
pub(crate) fn spawn(
    engine: Arc<Engine>,
    rx: mpsc::Receiver<Request>,
    runtime: &tokio::runtime::Handle,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let completer = Completer::spawn(engine.clone(), runtime);
    std::thread::Builder::new()
        .name("rockq-writer".into())
        .spawn(move || Writer::new(engine, rx, completer).run())
}

/// Completes rounds on a task of the broker's runtime, in the order they were written.
///
/// Why a task: completing a round wakes every producer waiting in it. Woken from a foreign
/// thread, each wake is a push onto the runtime's shared inject queue (a lock) and often a
/// syscall to unpark a worker; woken from a task already running on a worker, the producers go
/// onto that worker's local run queue. One cross-thread wake per round replaces one per send,
/// and the writer (or syncer) — the pipeline's bottleneck — goes straight back to appending.
#[derive(Clone)]
struct Completer {
    tx: mpsc::UnboundedSender<(Round, Option<StorageError>)>,
    engine: Arc<Engine>,
}

impl Completer {
    fn spawn(engine: Arc<Engine>, runtime: &tokio::runtime::Handle) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Round, Option<StorageError>)>();
        let e = engine.clone();
        runtime.spawn(async move {
            while let Some((r, failed)) = rx.recv().await {
                finish(&e, r, failed);
            }
        });
        Completer { tx, engine }
    }

    /// Completes `r` after every round handed over before it: successfully, or with `failed`.
    /// A failure closes the broker at once, before any later round is built. Runs inline if
    /// the runtime is gone (its task was dropped), so no waiter is left hanging.
    fn finish(&self, r: Round, failed: Option<StorageError>) {
        if let Some(e) = &failed {
            tracing::error!(error = %e, "rockq writer: write failed; refusing further writes");
            *self.engine.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            // Sends staged behind the failed round are refused, and so is every later one.
            self.engine.inbox.fail(&e.to_string());
        }
        if let Err(mpsc::error::SendError((r, failed))) = self.tx.send((r, failed)) {
            finish(&self.engine, r, failed);
        }
    }
}

struct Writer {
    engine: Arc<Engine>,
    rx: mpsc::Receiver<Request>,
    /// Next sequence per queue id. Only this thread allocates.
    next_seq: HashMap<u32, u64>,
    next_queue_id: u32,
    write_opts: WriteOptions,
    batch_hint: usize,
    /// Queues and groups this thread has written, possibly not yet synced and so not yet in
    /// the registry: a second request for one of them waits for the same sync.
    queues: HashMap<String, Arc<QueueState>>,
    groups: HashMap<Vec<u8>, Arc<GroupState>>,
    work_groups: HashMap<Vec<u8>, Arc<WorkGroupState>>,
    /// Redrive cursors this thread has written (read from disk on first use).
    cursors: HashMap<u32, u64>,
    /// Group settings records this thread has written (read from disk on first use).
    settings: HashMap<Vec<u8>, crate::store::records::GroupSettings>,
    /// The syncer (Fsync mode only).
    syncer: Option<(std::sync::mpsc::Sender<Round>, std::thread::JoinHandle<()>)>,
    completer: Completer,
    /// The enqueue time given to the last round's sends: stamps never go backwards, even if
    /// the wall clock does.
    last_stamp: u64,
    /// Messages in the last round: a busy round is followed by a brief spin before sleeping.
    last_round: u64,
}

/// A round of at least this many messages is "busy": more are probably on their way.
const SPIN_AFTER: u64 = 8;

impl Drop for Writer {
    /// However the writer ends (a panic included), nothing staged is left waiting: the inbox
    /// is closed and what it still holds fails (a round in hand fails with `Shutdown` as its
    /// settle handle drops).
    fn drop(&mut self) {
        // After a clean stop the inbox is already closed and this takes nothing.
        self.engine.inbox.fail("the writer thread stopped unexpectedly");
    }
}

type Reply<T, E> = oneshot::Sender<Result<T, E>>;
/// Something created this round, with every caller waiting for it.
type Created<T, E> = (Arc<T>, Vec<Reply<Arc<T>, E>>);

/// Work to run once a round's write is durable (`Ok`) or has failed.
type OnDone = Box<dyn FnOnce(Result<(), &StorageError>) + Send>;

/// Completions of one round, run after the write succeeded (or failed).
#[derive(Default)]
struct Round {
    work_groups: Vec<Created<WorkGroupState, SubscribeError>>,
    /// Work-queue groups whose offset moved this round.
    work_offsets: Vec<Arc<WorkGroupState>>,
    /// Their new offsets, published before any reply of the round.
    work_durable: Vec<(Arc<WorkGroupState>, u64)>,
    /// Sequences finished this round, per group.
    work_finished: Vec<(Arc<WorkGroupState>, Vec<u64>)>,
    done: Vec<OnDone>,
    /// Staged sends written this round, with the first sequence of each send call. Their
    /// buffers are freed by the completer, off the writer thread.
    staged: Vec<(Staged, Box<[u64]>)>,
    /// Queues written this round: their last sequence and how many messages were appended.
    touched: Vec<(Arc<QueueState>, u64, u64)>,
    /// When the round's write started (for the commit-latency histogram).
    started: Option<Instant>,
    queues: Vec<Created<QueueState, QueueError>>,
    groups: Vec<Created<GroupState, SubscribeError>>,
    commits: Vec<(Arc<GroupState>, u64)>,
    flushes: Vec<oneshot::Sender<Result<(), CommitError>>>,
    shutdown: Option<oneshot::Sender<Result<(), StorageError>>>,
    messages: u64,
}

impl Round {
    fn on_done(&mut self, f: impl FnOnce(Result<(), &StorageError>) + Send + 'static) {
        self.done.push(Box::new(f));
    }
}

impl Writer {
    fn new(engine: Arc<Engine>, rx: mpsc::Receiver<Request>, completer: Completer) -> Self {
        let mut next_seq = HashMap::new();
        let mut max_id = 0;
        for q in engine.registry.queues.iter() {
            next_seq.insert(q.id, q.last_seq() + 1);
            max_id = max_id.max(q.id);
        }
        // Fsync mode syncs on the syncer thread; the append itself never waits for the disk.
        let syncer = if engine.options.durability == Durability::Fsync {
            let (tx, rx) = std::sync::mpsc::channel();
            let (e, c) = (engine.clone(), completer.clone());
            std::thread::Builder::new()
                .name("rockq-syncer".into())
                .spawn(move || sync_loop(&e, rx, &c))
                .map(|h| (tx, h))
                .inspect_err(|err| tracing::error!(%err, "rockq: no syncer thread; syncing inline"))
                .ok()
        } else {
            None
        };
        let mut write_opts = WriteOptions::default();
        // Without a syncer thread (it could not start), Fsync syncs inline.
        write_opts.set_sync(engine.options.durability == Durability::Fsync && syncer.is_none());
        // Fault 7: stamps used to restart from the clock, going back if it stepped back.
        let last_stamp = crate::store::newest_stamp(
            &engine.store,
            engine.registry.queues.iter().map(|q| (q.id, q.last_seq())).collect::<Vec<_>>(),
        );
        Writer {
            engine,
            rx,
            next_seq,
            next_queue_id: max_id + 1,
            write_opts,
            batch_hint: 64 * 1024,
            queues: HashMap::new(),
            groups: HashMap::new(),
            work_groups: HashMap::new(),
            cursors: HashMap::new(),
            settings: HashMap::new(),
            syncer,
            completer,
            last_stamp,
            last_round: 0,
        }
    }

    fn run(mut self) {
        self.rounds();
        self.ordered_abandon();
    }

    /// Rounds until every handle is gone or a shutdown's last round ran.
    fn rounds(&mut self) {
        // Requests per round; sends come through the inbox and are capped there.
        let max_requests = self.engine.options.max_batch_messages;
        let mut pending: Vec<Request> = Vec::with_capacity(1024);
        loop {
            match self.rx.try_recv() {
                Ok(req) => pending.push(req),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    // Every handle is gone: commit what the last acks left dirty, then exit.
                    self.drain_inbox();
                    self.round(&mut pending, true);
                    return;
                }
                // Nothing queued and nothing staged: block until a request or a producer's
                // nudge arrives (the inbox now nudges on the next push).
                Err(mpsc::error::TryRecvError::Empty)
                    if !self.wait_briefly() && self.engine.inbox.idle_if_empty() =>
                {
                    match self.rx.blocking_recv() {
                        Some(req) => pending.push(req),
                        None => {
                            self.drain_inbox();
                            self.round(&mut pending, true);
                            return;
                        }
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            let mut stop = pending.iter().any(|r| matches!(r, Request::Shutdown { .. }));
            while !stop && pending.len() < max_requests {
                let Ok(req) = self.rx.try_recv() else { break };
                stop = matches!(req, Request::Shutdown { .. });
                pending.push(req);
            }
            if stop {
                self.drain_inbox();
            }
            if self.round(&mut pending, false) {
                self.reject_remaining();
                return;
            }
        }
    }

    /// Before the last round: writes everything staged in rounds within the usual caps, so the
    /// final round (which closes the inbox and takes what is left) is not one oversized batch.
    /// Ends because new sends are refused once shutdown has begun or every handle is gone.
    fn drain_inbox(&mut self) {
        while self.engine.inbox.has_staged() {
            if self.round(&mut Vec::new(), false) {
                return;
            }
        }
    }

    /// After a busy round, keeps looking for staged sends or requests for up to
    /// `Options::writer_spin`, yielding the core between looks; true if work arrived. After a
    /// quiet round it returns false at once and the writer sleeps (see `Options::writer_spin`).
    fn wait_briefly(&self) -> bool {
        let spin = self.engine.options.writer_spin;
        if spin.is_zero() || self.last_round < SPIN_AFTER {
            return false;
        }
        let deadline = Instant::now() + spin;
        loop {
            if self.engine.inbox.has_staged() || !self.rx.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
        }
    }

    /// Refuses whatever raced past the shutdown flag into the channel.
    fn reject_remaining(&mut self) {
        self.rx.close();
        while let Ok(req) = self.rx.try_recv() {
            reject(req, || "broker is shut down".into(), true);
        }
    }

    /// Runs one round. Returns true when the writer must stop.
    fn round(&mut self, pending: &mut Vec<Request>, last: bool) -> bool {
        let engine = self.engine.clone();
        let failed = engine.failure();
        let mut wb = WriteBatch::with_capacity_bytes(self.batch_hint);
        let mut r = Round::default();
        let guard = engine.store.lock();
        let Some((db, cfs)) = guard.get() else {
            for req in pending.drain(..) {
                reject(req, || "broker is shut down".into(), true);
            }
            return true;
        };

        // Sends staged by producers, taken after this round's requests were received, so a
        // request sees every send staged before it ("latest" offsets, for one). On the last
        // round the inbox is closed and everything staged is written.
        let stopping = last || pending.iter().any(|req| matches!(req, Request::Shutdown { .. }));
        let staged = if stopping { engine.inbox.close(None) } else { engine.inbox.take() };
        match &failed {
            Some(f) => staged.into_iter().for_each(|s| s.fail(f)),
            None if !staged.is_empty() => {
                let now = self.stamp();
                for s in staged {
                    self.put_staged(&mut wb, cfs.messages, &mut r, s, now);
                }
            }
            None => {}
        }

        for req in pending.drain(..) {
            if r.shutdown.is_some() {
                reject(req, || "broker is shut down".into(), true);
                continue;
            }
            if let Some(f) = &failed
                && !matches!(req, Request::Shutdown { .. } | Request::Commit)
            {
                reject(req, || f.clone(), false);
                continue;
            }
            match req {
                Request::CreateQueue { name, reply } => {
                    self.create_queue(&mut wb, cfs.meta, &mut r, name, reply)
                }
                Request::CreateGroup { queue, group, start, reply } => {
                    self.create_group(&mut wb, cfs.offsets, &mut r, queue, group, start, reply)
                }
                Request::CreateWorkGroup { queue, group, start, reply } => {
                    self.create_work_group(&mut wb, cfs.offsets, &mut r, queue, group, start, reply)
                }
                Request::Claim { group, epoch, claims, reply } => {
                    // Claimed before a reset that is already in the batch: its records would
                    // bring back attempts the reset dropped.
                    if epoch != group.epoch() {
                        let (seq, attempt) = claims.first().map_or((0, 0), |(s, c)| (*s, c.attempt));
                        let _ = reply.send(Err(AckError::LeaseLost { seq, attempt }));
                        continue;
                    }
                    for (seq, rec) in &claims {
                        wb.put_cf(cfs.claims, keys::claim_key(&group.claim_prefix, *seq), rec.encode());
                    }
                    r.on_done(move |res| drop(reply.send(res.map_err(|e| AckError::Storage(e.clone())))));
                }
                Request::Settle { group, seq, attempt, epoch, outcome, reply } => {
                    if epoch != group.epoch() {
                        // Decided before a reset: the reset wins (and already forgot the slot).
                        let _ = reply.send(Err(AckError::LeaseLost { seq, attempt }));
                        continue;
                    }
                    self.settle(db, &cfs, &mut wb, &mut r, group, seq, attempt, outcome, reply)
                }
                Request::Redrive { dlq, expected, last, items, reply } => {
                    self.redrive(db, &cfs, &mut wb, &mut r, dlq, expected, last, items, reply)
                }
                Request::SetRetention { queue, retention, reply } => {
                    self.set_retention(&mut wb, cfs.meta, &mut r, queue, retention, reply)
                }
                Request::Trim { queue, to, policy, reply } => {
                    self.trim(&mut wb, &cfs, &mut r, queue, to, policy, reply)
                }
                Request::ResetOffset { group, offset, reply } => {
                    self.reset_offset(&mut wb, &cfs, &mut r, group, offset, reply)
                }
                Request::ResetWorkOffset { group, offset, reply } => {
                    self.reset_work_offset(&mut wb, &cfs, &mut r, group, offset, reply)
                }
                Request::GroupSettings { queue, group, change, reply } => {
                    self.group_settings(db, cfs.meta, &mut wb, &mut r, queue, group, change, reply)
                }
                Request::Commit => {}
                Request::Flush { reply } => r.flushes.push(reply),
                Request::Shutdown { reply } => r.shutdown = Some(reply),
            }
        }

        if failed.is_none() {
            // Acks queued in memory by worker pools.
            for g in self.engine.take_work_dirty() {
                let epoch = g.epoch();
                // Acks queued before a reset are dropped by it (see `WorkGroupState::reset`);
                // one that raced past it still carries the old epoch.
                let acks: Vec<_> = g.take_queued_acks().into_iter().filter(|a| a.epoch == epoch).collect();
                for a in &acks {
                    self.finish(&mut wb, cfs.claims, &mut r, &g, a.seq);
                }
                let engine = self.engine.clone();
                r.on_done(move |res| {
                    if res.is_ok() {
                        let (queue, group) = (&g.queue.name, &g.name);
                        crate::telemetry::group_counter(
                            crate::telemetry::ACKED,
                            queue,
                            group,
                            acks.len() as u64,
                        );
                        // Per ack: only when someone listens (events or TRACE logging).
                        let per_ack =
                            engine.events.receiver_count() > 0 || tracing::enabled!(tracing::Level::TRACE);
                        for crate::work::QueuedAck { seq, attempt, .. } in
                            acks.into_iter().filter(|_| per_ack)
                        {
                            tracing::trace!(%queue, %group, seq, attempt, "rockq: acked");
                            engine.emit(|| crate::Event::Acked {
                                queue: queue.clone(),
                                group: group.clone(),
                                seq,
                                attempt,
                            });
                        }
                    }
                });
            }
            // Coalesced offset commits: one record per dirty group per round. The flag is
            // cleared (an acquiring swap) before `acked` is read, so an ack racing with this
            // either lands in the value read here or re-marks the group for the next round.
            for g in self.engine.take_dirty() {
                g.dirty.swap(false, Ordering::AcqRel);
                // Delivery counts and dead letters first (writer/ordered.rs): a dead letter
                // counts its message acknowledged at once, so the offset below passes it in
                // this same batch.
                let before = g.acked.load(Ordering::SeqCst);
                self.ordered_records(&mut wb, &cfs, &mut r, &g, before);
                let acked = g.acked.load(Ordering::SeqCst);
                if acked > g.durable.load(Ordering::SeqCst) {
                    wb.put_cf(cfs.offsets, &g.key, records::encode_offset(acked));
                    r.commits.push((g.clone(), acked));
                }
                if acked > before {
                    // Deletes the records the new offset passed (those just written too).
                    self.ordered_records(&mut wb, &cfs, &mut r, &g, acked);
                }
            }
            // Work-queue groups: one offset record per group whose offset moved this round.
            for g in std::mem::take(&mut r.work_offsets) {
                let offset = g.progress().offset;
                wb.put_cf(cfs.offsets, &g.key, records::encode_shared_offset(offset));
                r.work_durable.push((g, offset));
            }
        } else {
            self.ordered_abandon();
        }

        self.last_round = r.messages;
        let result = if wb.is_empty() {
            Ok(())
        } else {
            tracing::trace!(
                messages = r.messages,
                offsets = r.commits.len(),
                bytes = wb.size_in_bytes(),
                "rockq writer: group commit"
            );
            self.batch_hint = wb.size_in_bytes().max(4096);
            let t = Instant::now();
            r.started = Some(t);
            let _span = tracing::debug_span!("rockq.write", messages = r.messages, offsets = r.commits.len())
                .entered();
            let res =
                crate::faults::check("rockq-writer-write").and_then(|()| db.write_opt(wb, &self.write_opts));
            self.engine.counters.write_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            res
        };
        let stop = r.shutdown.is_some() || last;
        match (result, &self.syncer) {
            (Ok(()), Some((tx, _))) => {
                drop(guard);
                if let Err(std::sync::mpsc::SendError(r)) = tx.send(r) {
                    // Only if the syncer panicked: dropping the round answers every waiter
                    // with a shutdown error, and the broker refuses further writes.
                    *self.engine.failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some("syncer thread stopped".into());
                    drop(r);
                }
                if stop {
                    // Closing the channel lets the syncer sync and complete the last rounds.
                    if let Some((tx, handle)) = self.syncer.take() {
                        drop(tx);
                        let _ = handle.join();
                    }
                }
            }
            (result, _) => {
                // A clean stop leaves nothing unsynced, whatever the durability mode.
                let result = match result {
                    Ok(()) if stop => db.flush_wal(true),
                    other => other,
                };
                drop(guard);
                self.completer.finish(r, result.err().map(StorageError));
            }
        }
        stop
    }

    /// The enqueue time of this round's sends: the broker's clock, never below the last stamp.
    fn stamp(&mut self) -> u64 {
        self.last_stamp = self.last_stamp.max(self.engine.clock().wall_micros());
        self.last_stamp
    }

    /// Puts one staged round's messages into `wb` with sequences allocated in staging order,
    /// stamped `now`.
    fn put_staged(
        &mut self,
        wb: &mut WriteBatch,
        messages: &rocksdb::ColumnFamily,
        r: &mut Round,
        mut s: Staged,
        now: u64,
    ) {
        // Next sequence of each of the round's queues: one map lookup per queue, not per message.
        let Some(mut next) =
            s.queues.iter().map(|q| self.next_seq.get(&q.id).copied()).collect::<Option<Vec<u64>>>()
        else {
            // Unreachable: a queue handle exists only once the writer has registered the queue.
            s.fail("send to a queue unknown to the writer");
            return;
        };
        let firsts = next.clone();
        let mut seqs = Vec::with_capacity(s.sends.len());
        let mut calls = s.sends.iter().peekable();
        let mut start = 0;
        for (i, &(q, end)) in s.msgs.iter().enumerate() {
            let q = q as usize;
            if calls.next_if(|&&first| first as usize == i).is_some() {
                seqs.push(next[q]);
            }
            let env = &mut s.arena[start..end];
            envelope::stamp(env, now);
            wb.put_cf(messages, keys::message_key(s.queues[q].id, next[q]), &*env);
            next[q] += 1;
            start = end;
        }
        r.messages += s.msgs.len() as u64;
        for ((queue, first), next) in s.queues.iter().zip(firsts).zip(next) {
            self.next_seq.insert(queue.id, next);
            let (last, n) = (next - 1, next - first);
            match r.touched.iter_mut().find(|(q, _, _)| q.id == queue.id) {
                Some(t) => {
                    t.1 = last;
                    t.2 += n;
                }
                None => r.touched.push((queue.clone(), last, n)),
            }
        }
        r.staged.push((s, seqs.into_boxed_slice()));
    }

    fn create_queue(
        &mut self,
        wb: &mut WriteBatch,
        meta: &rocksdb::ColumnFamily,
        r: &mut Round,
        name: String,
        reply: oneshot::Sender<Result<Arc<QueueState>, QueueError>>,
    ) {
        if let Some(q) = self.engine.registry.queues.get(name.as_str()) {
            let _ = reply.send(Ok(q.clone()));
            return;
        }
        if let Some((_, waiters)) = r.queues.iter_mut().find(|(q, _)| *q.name == *name) {
            waiters.push(reply);
            return;
        }
        if let Some(q) = self.queues.get(&name) {
            // Written in an earlier round whose sync is still running: answer after this
            // round's sync, which comes after that one.
            r.queues.push((q.clone(), vec![reply]));
            return;
        }
        match self.ensure_queue(wb, meta, r, &name) {
            Ok(_) => {
                if let Some((_, waiters)) = r.queues.iter_mut().find(|(q, _)| *q.name == *name) {
                    waiters.push(reply);
                }
            }
            Err(e) => drop(reply.send(Err(e))),
        }
    }

    /// The queue `name`, created in this round if it does not exist yet (its record goes into
    /// `wb`, and it is registered when the round completes).
    fn ensure_queue(
        &mut self,
        wb: &mut WriteBatch,
        meta: &rocksdb::ColumnFamily,
        r: &mut Round,
        name: &str,
    ) -> Result<Arc<QueueState>, QueueError> {
        if let Some(q) = self.engine.registry.queues.get(name) {
            return Ok(q.clone());
        }
        if let Some((q, _)) = r.queues.iter().find(|(q, _)| *q.name == *name) {
            return Ok(q.clone());
        }
        if let Some(q) = self.queues.get(name) {
            return Ok(q.clone());
        }
        // Id u32::MAX is reserved so that `<id + 1>` is always a valid upper bound.
        if self.next_queue_id == u32::MAX {
            return Err(QueueError::TooManyQueues);
        }
        let id = self.next_queue_id;
        self.next_queue_id += 1;
        let record = QueueRecord { id, first_seq: 1, retention: crate::Retention::default() };
        wb.put_cf(meta, keys::queue_key(name), record.encode());
        self.next_seq.insert(id, 1);
        let state = QueueState::new(id, name, 1, 0, crate::Retention::default());
        self.queues.insert(name.to_owned(), state.clone());
        r.queues.push((state.clone(), Vec::new()));
        Ok(state)
    }

    /// Appends one encoded envelope to `queue`; returns its sequence.
    fn append(
        &mut self,
        wb: &mut WriteBatch,
        messages: &rocksdb::ColumnFamily,
        r: &mut Round,
        queue: &Arc<QueueState>,
        value: &[u8],
    ) -> Option<u64> {
        let next = self.next_seq.get_mut(&queue.id)?;
        let seq = *next;
        wb.put_cf(messages, keys::message_key(queue.id, seq), value);
        *next += 1;
        r.messages += 1;
        match r.touched.iter_mut().find(|(q, _, _)| q.id == queue.id) {
            Some(t) => {
                t.1 = seq;
                t.2 += 1;
            }
            None => r.touched.push((queue.clone(), seq, 1)),
        }
        Some(seq)
    }

    /// `WrongMode` if the group key exists (or is being created) in the other mode: a name is
    /// ordered or work-queue on a queue, never both.
    fn other_mode(
        &self,
        key: &[u8],
        group: &str,
        queue: &QueueState,
        want_shared: bool,
    ) -> Option<SubscribeError> {
        let r = &self.engine.registry;
        let existing = if want_shared {
            (r.groups.contains_key(key) || self.groups.contains_key(key)).then_some("ordered")
        } else {
            (r.work_groups.contains_key(key) || self.work_groups.contains_key(key)).then_some("work-queue")
        }?;
        Some(SubscribeError::WrongMode { group: group.to_owned(), queue: queue.name.to_string(), existing })
    }

    /// The initial offset of a new group starting at `start`.
    fn start_offset(&self, queue: &QueueState, start: StartFrom) -> Result<u64, SubscribeError> {
        let first = queue.first_seq.load(Ordering::SeqCst);
        // The writer's own counter, not the published value: "latest" includes every send
        // queued before this request.
        let next = self.next_seq.get(&queue.id).copied().unwrap_or(first);
        match start {
            StartFrom::Earliest => Ok(first - 1),
            StartFrom::Latest => Ok(next - 1),
            StartFrom::Sequence(s) if (first..=next).contains(&s) => Ok(s - 1),
            StartFrom::Sequence(requested) => {
                Err(SubscribeError::SequenceOutOfRange { requested, first, next })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create_group(
        &mut self,
        wb: &mut WriteBatch,
        offsets: &rocksdb::ColumnFamily,
        r: &mut Round,
        queue: Arc<QueueState>,
        group: String,
        start: StartFrom,
        reply: oneshot::Sender<Result<Arc<GroupState>, SubscribeError>>,
    ) {
        let key = keys::offset_key(&group, &queue.name);
        if let Some(g) = self.engine.registry.groups.get(&key) {
            let _ = reply.send(Ok(g.clone()));
            return;
        }
        if let Some(e) = self.other_mode(&key, &group, &queue, false) {
            let _ = reply.send(Err(e));
            return;
        }
        if let Some((_, waiters)) = r.groups.iter_mut().find(|(g, _)| g.key == key) {
            waiters.push(reply);
            return;
        }
        if let Some(g) = self.groups.get(&key) {
            r.groups.push((g.clone(), vec![reply]));
            return;
        }
        let committed = match self.start_offset(&queue, start) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        wb.put_cf(offsets, &key, records::encode_offset(committed));
        let state = GroupState::new(&group, queue, key.clone(), committed);
        self.groups.insert(key, state.clone());
        r.groups.push((state, vec![reply]));
    }
}

/// Fsync mode: syncs the WAL once for every round the writer appended since the last sync, then
/// completes those rounds in order. After a failed sync every later round fails too.
fn sync_loop(engine: &Engine, rx: std::sync::mpsc::Receiver<Round>, completer: &Completer) {
    let mut failed: Option<StorageError> = None;
    while let Ok(first) = rx.recv() {
        let mut rounds = vec![first];
        rounds.extend(rx.try_iter());
        if failed.is_none() {
            let t = Instant::now();
            let guard = engine.store.lock();
            let synced = match guard.get() {
                Some((db, _)) => crate::faults::check("rockq-syncer-sync")
                    .and_then(|()| db.flush_wal(true))
                    .map_err(StorageError),
                None => Ok(()),
            };
            drop(guard);
            engine.counters.write_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            failed = synced.err();
        }
        for r in rounds {
            completer.finish(r, failed.clone());
        }
    }
}

/// Completes a round whose write is durable: registry updates, publication, replies.
fn complete(engine: &Engine, r: Round) {
    let c = &engine.counters;
    c.rounds.fetch_add(1, Ordering::Relaxed);
    c.messages.fetch_add(r.messages, Ordering::Relaxed);
    c.offset_commits.fetch_add(r.commits.len() as u64, Ordering::Relaxed);
    if let Some(t) = r.started {
        crate::telemetry::round(r.messages, t.elapsed());
    }
    for (g, v) in r.commits {
        let before = g.durable.fetch_max(v, Ordering::SeqCst);
        crate::telemetry::group_counter(
            crate::telemetry::ACKED,
            &g.queue.name,
            &g.name,
            v.saturating_sub(before),
        );
    }
    for (q, waiters) in r.queues {
        tracing::debug!(queue = %q.name, id = q.id, "rockq: queue created");
        engine.registry.queues.insert(q.name.clone(), q.clone());
        waiters.into_iter().for_each(|w| drop(w.send(Ok(q.clone()))));
    }
    for (g, waiters) in r.groups {
        let committed = g.durable.load(Ordering::Relaxed);
        tracing::debug!(group = %g.name, queue = %g.queue.name, committed, "rockq: group created");
        engine.registry.groups.insert(g.key.clone(), g.clone());
        waiters.into_iter().for_each(|w| drop(w.send(Ok(g.clone()))));
    }
    for (g, waiters) in r.work_groups {
        tracing::debug!(group = %g.name, queue = %g.queue.name, "rockq: work-queue group created");
        engine.registry.work_groups.insert(g.key.clone(), g.clone());
        waiters.into_iter().for_each(|w| drop(w.send(Ok(g.clone()))));
    }
    // Publish before replying, so a producer that sees its send resolve also sees it in
    // `Queue::last_seq`, and subscribers start reading while producers are being woken.
    for (q, last, n) in r.touched {
        q.last.send_replace(last);
        crate::telemetry::produced(&q.name, n);
    }
    for (g, offset) in r.work_durable {
        g.durable.fetch_max(offset, Ordering::SeqCst);
    }
    for (g, seqs) in r.work_finished {
        g.finished(&seqs);
    }
    for f in r.done {
        f(Ok(()));
    }
    let trace = tracing::enabled!(tracing::Level::TRACE);
    for (s, seqs) in r.staged {
        if trace {
            trace_sent(&s, &seqs);
        }
        s.settle.finish(Ok(seqs));
    }
    r.flushes.into_iter().for_each(|f| drop(f.send(Ok(()))));
    if let Some(s) = r.shutdown {
        let _ = s.send(Ok(()));
    }
}

/// One TRACE event per message of a staged round that became durable.
fn trace_sent(s: &Staged, seqs: &[u64]) {
    for (k, &first) in s.sends.iter().enumerate() {
        let from = first as usize;
        let to = s.sends.get(k + 1).map_or(s.msgs.len(), |&n| n as usize);
        let Some(queue) = s.msgs.get(from).and_then(|&(q, _)| s.queues.get(q as usize)) else { continue };
        for seq in (seqs[k]..).take(to.saturating_sub(from)) {
            tracing::trace!(queue = %queue.name, seq, "rockq: sent");
        }
    }
}

fn finish(engine: &Engine, r: Round, failed: Option<StorageError>) {
    match failed {
        None => complete(engine, r),
        Some(e) => fail(r, e),
    }
}

/// Answers the waiters of a round whose write or sync failed (the broker is already closed).
fn fail(r: Round, e: StorageError) {
    // Offsets in `r.commits` stay non-durable: `durable` is not advanced, and after a
    // reopen the group resumes from the last offset that did reach the disk.
    for (s, _) in r.staged {
        s.settle.finish(Err(SendError::Storage(e.clone())));
    }
    for (_, waiters) in r.queues {
        waiters.into_iter().for_each(|w| drop(w.send(Err(QueueError::Storage(e.clone())))));
    }
    for (_, waiters) in r.groups {
        waiters.into_iter().for_each(|w| drop(w.send(Err(SubscribeError::Storage(e.clone())))));
    }
    for (_, waiters) in r.work_groups {
        waiters.into_iter().for_each(|w| drop(w.send(Err(SubscribeError::Storage(e.clone())))));
    }
    for f in r.done {
        f(Err(&e));
    }
    r.flushes.into_iter().for_each(|f| drop(f.send(Err(CommitError::Storage(e.clone())))));
    if let Some(s) = r.shutdown {
        let _ = s.send(Err(e));
    }
}

/// Answers a request that will not be carried out. `shutdown` picks the error family variant.
fn reject(req: Request, why: impl Fn() -> String, shutdown: bool) {
    match req {
        Request::CreateQueue { reply, .. } => {
            let _ = reply.send(Err(if shutdown { QueueError::Shutdown } else { QueueError::Failed(why()) }));
        }
        Request::CreateGroup { reply, .. } => {
            let _ = reply.send(Err(if shutdown {
                SubscribeError::Shutdown
            } else {
                SubscribeError::Failed(why())
            }));
        }
        Request::Flush { reply } => {
            let _ =
                reply.send(Err(if shutdown { CommitError::Shutdown } else { CommitError::Failed(why()) }));
        }
        Request::Shutdown { reply } => {
            let _ = reply.send(Ok(()));
        }
        Request::CreateWorkGroup { reply, .. } => {
            let _ = reply.send(Err(if shutdown {
                SubscribeError::Shutdown
            } else {
                SubscribeError::Failed(why())
            }));
        }
        Request::Claim { reply, .. } | Request::Settle { reply, .. } => {
            let _ = reply.send(Err(if shutdown { AckError::Shutdown } else { AckError::Failed(why()) }));
        }
        Request::SetRetention { reply, .. } => {
            let _ = reply.send(Err(if shutdown { QueueError::Shutdown } else { QueueError::Failed(why()) }));
        }
        Request::Trim { reply, .. } => {
            let _ = reply.send(Err(if shutdown { QueueError::Shutdown } else { QueueError::Failed(why()) }));
        }
        Request::ResetOffset { group, reply, .. } => {
            use crate::error::ResetError;
            // The reset held the group's active slot; it is released by whoever answers.
            group.active.store(false, Ordering::Release);
            let _ = reply.send(Err(if shutdown { ResetError::Shutdown } else { ResetError::Failed(why()) }));
        }
        Request::ResetWorkOffset { reply, .. } => {
            use crate::error::ResetError;
            let _ = reply.send(Err(if shutdown { ResetError::Shutdown } else { ResetError::Failed(why()) }));
        }
        Request::Redrive { reply, .. } => {
            let _ =
                reply.send(Err(if shutdown { RedriveError::Shutdown } else { RedriveError::Failed(why()) }));
        }
        Request::GroupSettings { reply, .. } => {
            use crate::error::PauseError;
            let _ = reply.send(Err(if shutdown { PauseError::Shutdown } else { PauseError::Failed(why()) }));
        }
        Request::Commit => {}
    }
}
