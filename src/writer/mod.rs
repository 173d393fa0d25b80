//! The writer: one dedicated OS thread that owns every write to RocksDB.
//!
//! Each round it drains the request channel (up to the count and byte caps), turns every request
//! into entries of one `WriteBatch` — messages with freshly allocated sequences, new queue and
//! group records, and one offset record per dirty group — writes it with a single WAL append
//! (and, under `Fsync`, a single fsync), then completes every waiting caller and wakes the
//! subscribers of the queues it touched. Requests that arrive during the write wait in the
//! channel and form the next round: that is the group commit.
//!
//! Owning sequence allocation here means sequences are dense and monotonic without any lock
//! on the producer path. A write error makes the writer fail closed: nothing it allocated is
//! reused, because nothing is written after a failure.

mod request;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rocksdb::{WriteBatch, WriteOptions};
use tokio::sync::{mpsc, oneshot};

pub(crate) use request::{Payloads, Request};

use crate::consumer::StartFrom;
use crate::engine::Engine;
use crate::error::{CommitError, QueueError, SendError, StorageError, SubscribeError};
use crate::options::Durability;
use crate::registry::{GroupState, QueueState};
use crate::store::keys;
use crate::store::records::{self, QueueRecord};

/// Starts the writer thread.
pub(crate) fn spawn(
    engine: Arc<Engine>,
    rx: mpsc::Receiver<Request>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("rockq-writer".into()).spawn(move || Writer::new(engine, rx).run())
}

struct Writer {
    engine: Arc<Engine>,
    rx: mpsc::Receiver<Request>,
    /// Next sequence per queue id. Only this thread allocates.
    next_seq: HashMap<u32, u64>,
    next_queue_id: u32,
    write_opts: WriteOptions,
    batch_hint: usize,
}

type Reply<T, E> = oneshot::Sender<Result<T, E>>;
/// Something created this round, with every caller waiting for it.
type Created<T, E> = (Arc<T>, Vec<Reply<Arc<T>, E>>);

/// Completions of one round, run after the write succeeded (or failed).
#[derive(Default)]
struct Round {
    sends: Vec<(Reply<u64, SendError>, u64)>,
    touched: Vec<(Arc<QueueState>, u64)>,
    queues: Vec<Created<QueueState, QueueError>>,
    groups: Vec<Created<GroupState, SubscribeError>>,
    commits: Vec<(Arc<GroupState>, u64)>,
    flushes: Vec<oneshot::Sender<Result<(), CommitError>>>,
    shutdown: Option<oneshot::Sender<Result<(), StorageError>>>,
    messages: u64,
}

impl Writer {
    fn new(engine: Arc<Engine>, rx: mpsc::Receiver<Request>) -> Self {
        let mut next_seq = HashMap::new();
        let mut max_id = 0;
        for q in engine.registry.queues.iter() {
            next_seq.insert(q.id, q.last_seq() + 1);
            max_id = max_id.max(q.id);
        }
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(engine.options.durability == Durability::Fsync);
        Writer { engine, rx, next_seq, next_queue_id: max_id + 1, write_opts, batch_hint: 64 * 1024 }
    }

    fn run(mut self) {
        let max_msgs = self.engine.options.max_batch_messages;
        let max_bytes = self.engine.options.max_batch_bytes;
        let mut pending: Vec<Request> = Vec::with_capacity(1024);
        loop {
            let Some(first) = self.rx.blocking_recv() else {
                // Every handle is gone: commit what the last acks left dirty, then exit.
                self.round(&mut pending, true);
                return;
            };
            let (mut msgs, mut bytes) = first.weight();
            let mut stop = matches!(first, Request::Shutdown { .. });
            pending.push(first);
            while !stop && msgs < max_msgs && bytes < max_bytes {
                let Ok(req) = self.rx.try_recv() else { break };
                let (m, b) = req.weight();
                msgs += m;
                bytes += b;
                stop = matches!(req, Request::Shutdown { .. });
                pending.push(req);
            }
            if self.round(&mut pending, false) {
                self.reject_remaining();
                return;
            }
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
                Request::Send { queue, payloads, reply } => {
                    let Some(next) = self.next_seq.get_mut(&queue.id) else {
                        let _ = reply.send(Err(SendError::Failed(format!("unknown queue id {}", queue.id))));
                        continue;
                    };
                    let first = *next;
                    let mut put = |v: &[u8]| {
                        wb.put_cf(cfs.messages, keys::message_key(queue.id, *next), v);
                        *next += 1;
                    };
                    match &payloads {
                        Payloads::One(v) => put(v),
                        Payloads::Many(vs) => vs.iter().for_each(|v| put(v)),
                    }
                    let last_seq = *next - 1;
                    r.messages += payloads.len() as u64;
                    match r.touched.iter_mut().find(|(q, _)| q.id == queue.id) {
                        Some(t) => t.1 = last_seq,
                        None => r.touched.push((queue, last_seq)),
                    }
                    r.sends.push((reply, first));
                }
                Request::CreateQueue { name, reply } => {
                    self.create_queue(&mut wb, cfs.meta, &mut r, name, reply)
                }
                Request::CreateGroup { queue, group, start, reply } => {
                    self.create_group(&mut wb, cfs.offsets, &mut r, queue, group, start, reply)
                }
                Request::Commit => {}
                Request::Flush { reply } => r.flushes.push(reply),
                Request::Shutdown { reply } => r.shutdown = Some(reply),
            }
        }

        if failed.is_none() {
            // Coalesced offset commits: one record per dirty group per round. The flag is
            // cleared (an acquiring swap) before `acked` is read, so an ack racing with this
            // either lands in the value read here or re-marks the group for the next round.
            for g in self.engine.take_dirty() {
                g.dirty.swap(false, Ordering::AcqRel);
                let acked = g.acked.load(Ordering::SeqCst);
                if acked > g.durable.load(Ordering::SeqCst) {
                    wb.put_cf(cfs.offsets, &g.key, records::encode_offset(acked));
                    r.commits.push((g, acked));
                }
            }
        }

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
            let res = db.write_opt(wb, &self.write_opts);
            self.engine.counters.write_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            res
        };
        // A clean stop leaves nothing unsynced, whatever the durability mode.
        let result = match result {
            Ok(()) if r.shutdown.is_some() || last => db.flush_wal(true),
            other => other,
        };
        drop(guard);
        let stop = r.shutdown.is_some() || last;
        match result {
            Ok(()) => self.complete(r),
            Err(e) => self.fail(r, StorageError(e)),
        }
        stop
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
        // Id u32::MAX is reserved so that `<id + 1>` is always a valid upper bound.
        if self.next_queue_id == u32::MAX {
            let _ = reply.send(Err(QueueError::TooManyQueues));
            return;
        }
        let id = self.next_queue_id;
        self.next_queue_id += 1;
        let record = QueueRecord { id, first_seq: 1 };
        wb.put_cf(meta, keys::queue_key(&name), record.encode());
        self.next_seq.insert(id, 1);
        r.queues.push((QueueState::new(id, &name, 1, 0), vec![reply]));
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
        if let Some((_, waiters)) = r.groups.iter_mut().find(|(g, _)| g.key == key) {
            waiters.push(reply);
            return;
        }
        let first = queue.first_seq.load(Ordering::SeqCst);
        // The writer's own counter, not the published value: "latest" includes every send
        // queued before this request.
        let next = self.next_seq.get(&queue.id).copied().unwrap_or(first);
        let committed = match start {
            StartFrom::Earliest => first - 1,
            StartFrom::Latest => next - 1,
            StartFrom::Sequence(s) if (first..=next).contains(&s) => s - 1,
            StartFrom::Sequence(requested) => {
                let _ = reply.send(Err(SubscribeError::SequenceOutOfRange { requested, first, next }));
                return;
            }
        };
        wb.put_cf(offsets, &key, records::encode_offset(committed));
        r.groups.push((GroupState::new(&group, queue, key, committed), vec![reply]));
    }

    fn complete(&mut self, r: Round) {
        let c = &self.engine.counters;
        c.rounds.fetch_add(1, Ordering::Relaxed);
        c.messages.fetch_add(r.messages, Ordering::Relaxed);
        c.offset_commits.fetch_add(r.commits.len() as u64, Ordering::Relaxed);
        for (g, v) in r.commits {
            g.durable.fetch_max(v, Ordering::SeqCst);
        }
        for (q, waiters) in r.queues {
            tracing::debug!(queue = %q.name, id = q.id, "rockq: queue created");
            self.engine.registry.queues.insert(q.name.clone(), q.clone());
            waiters.into_iter().for_each(|w| drop(w.send(Ok(q.clone()))));
        }
        for (g, waiters) in r.groups {
            let committed = g.durable.load(Ordering::Relaxed);
            tracing::debug!(group = %g.name, queue = %g.queue.name, committed, "rockq: group created");
            self.engine.registry.groups.insert(g.key.clone(), g.clone());
            waiters.into_iter().for_each(|w| drop(w.send(Ok(g.clone()))));
        }
        // Publish before replying, so a producer that sees its send resolve also sees it in
        // `Queue::last_seq`, and subscribers start reading while producers are being woken.
        for (q, last) in r.touched {
            q.last.send_replace(last);
        }
        for (reply, seq) in r.sends {
            let _ = reply.send(Ok(seq));
        }
        r.flushes.into_iter().for_each(|f| drop(f.send(Ok(()))));
        if let Some(s) = r.shutdown {
            let _ = s.send(Ok(()));
        }
    }

    fn fail(&mut self, r: Round, e: StorageError) {
        tracing::error!(error = %e, "rockq writer: write failed; refusing further writes");
        *self.engine.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        // Offsets in `r.commits` stay non-durable: `durable` is not advanced, and after a
        // reopen the group resumes from the last offset that did reach the disk.
        for (reply, _) in r.sends {
            let _ = reply.send(Err(SendError::Storage(e.clone())));
        }
        for (_, waiters) in r.queues {
            waiters.into_iter().for_each(|w| drop(w.send(Err(QueueError::Storage(e.clone())))));
        }
        for (_, waiters) in r.groups {
            waiters.into_iter().for_each(|w| drop(w.send(Err(SubscribeError::Storage(e.clone())))));
        }
        r.flushes.into_iter().for_each(|f| drop(f.send(Err(CommitError::Storage(e.clone())))));
        if let Some(s) = r.shutdown {
            let _ = s.send(Err(e));
        }
    }
}

/// Answers a request that will not be carried out. `shutdown` picks the error family variant.
fn reject(req: Request, why: impl Fn() -> String, shutdown: bool) {
    match req {
        Request::Send { reply, .. } => {
            let _ = reply.send(Err(if shutdown { SendError::Shutdown } else { SendError::Failed(why()) }));
        }
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
        Request::Commit => {}
    }
}
