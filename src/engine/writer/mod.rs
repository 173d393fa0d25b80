//! The writer: one dedicated OS thread that owns every write to the store.
//!
//! `docs/ARCHITECTURE.md` ("Write path") describes a round from end to end. This folder, by
//! concern:
//!
//! - `mod.rs` (here): the thread — taking requests and staged sends, the brief spin before
//!   sleeping, dispatching each request to its concept, writing the batch.
//! - `round.rs`: the round as handlers see it (store batch, completions, the writer's memory).
//! - `commit.rs`: after the write — the syncer (Fsync) and the completer.
//! - `queue.rs`, `groups.rs`, `ordered.rs`, `work.rs`, `retention.rs`, `settings.rs`,
//!   `dead_letter.rs`, `schedule.rs`: the requests of each concept, applied and refused;
//!   `dedup.rs`: idempotency keys, for staged sends and submits; `lifecycle.rs`: deleting
//!   and purging queues and groups; `txn.rs`: keyspaces and transactions.

mod commit;
pub(crate) mod dead_letter;
mod dedup;
mod flow;
mod groups;
mod lifecycle;
mod ordered;
mod queue;
mod retention;
mod round;
mod schedule;
mod settings;
#[cfg(test)]
mod tests;
mod txn;
mod work;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc;

use self::commit::Completer;
use self::round::{Completions, Round, RoundJobs, Written};
use super::Engine;
use super::request::Request;
use crate::error::{Closed, Failure};
use crate::options::Durability;
use crate::store::{Store, WriteMode};

/// Starts the writer thread.
pub(crate) fn spawn(
    engine: Arc<Engine>,
    store: Arc<Store>,
    rx: mpsc::Receiver<Request>,
    runtime: &tokio::runtime::Handle,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let completer = Completer::spawn(engine.clone(), runtime);
    std::thread::Builder::new()
        .name("rockq-writer".into())
        .spawn(move || Writer::new(engine, store, rx, completer).run())
}

struct Writer {
    engine: Arc<Engine>,
    /// The database: only this thread and its syncer write it.
    store: Arc<Store>,
    rx: mpsc::Receiver<Request>,
    written: Written,
    write_mode: WriteMode,
    /// Bytes of the last round's batch: the next batch is sized like it.
    batch_hint: usize,
    /// The syncer (Fsync mode only).
    syncer: Option<(std::sync::mpsc::Sender<Completions>, std::thread::JoinHandle<()>)>,
    completer: Completer,
    /// Messages in the last round: a busy round is followed by a brief spin before sleeping.
    last_round: u64,
}

/// A round of at least this many messages is "busy": more are probably on their way.
const SPIN_AFTER: u64 = 8;

impl Drop for Writer {
    /// However the writer ends (a panic included), nothing staged is left waiting: the inbox is
    /// closed and what it still holds fails (a round in hand fails with `Shutdown` as its
    /// resolver drops).
    fn drop(&mut self) {
        // After a clean stop the inbox is already closed and this takes nothing.
        self.engine.inbox.fail(&Failure::ThreadStopped("writer"));
    }
}

impl Writer {
    fn new(
        engine: Arc<Engine>,
        store: Arc<Store>,
        rx: mpsc::Receiver<Request>,
        completer: Completer,
    ) -> Self {
        let mut written = Written::default();
        let mut max_id = 0;
        for q in engine.registry.queues.iter() {
            written.next_seq.insert(q.id, q.last_seq() + 1);
            max_id = max_id.max(q.id);
        }
        // A deleted queue's id is never handed out again: the last deletion persisted the
        // lowest id never used, which may be above every remaining queue's.
        let persisted = crate::store::next_queue_id(&store)
            .inspect_err(|err| tracing::error!(%err, "rockq: the next queue id does not read"))
            .unwrap_or(0);
        written.next_queue_id = (max_id + 1).max(persisted);
        written.next_scheduled_id = engine.timer.first_id;
        written.kv_revision = engine.registry.kv_revision.load(Ordering::Relaxed);
        let flows = engine.registry.flows_at_open.lock().unwrap_or_else(|p| p.into_inner()).take();
        let flows = flows.unwrap_or_default();
        written.next_flow_id = flows.next_id.max(1);
        written.flow_jobs = flows
            .jobs
            .into_iter()
            .map(|(at, (flow, step, group))| (at, (flow, step, Arc::from(group))))
            .collect();
        written.next_keyspace_id = engine.registry.keyspaces.iter().map(|k| k.id + 1).max().unwrap_or(0);
        written.index_registry(&engine);
        // Issue 13 (enqueue stamps across a restart): stamps used to restart from the clock, going
        // back if it stepped back.
        written.last_stamp = crate::store::newest_stamp(
            &store,
            engine.registry.queues.iter().map(|q| (q.id, q.last_seq())).collect::<Vec<_>>(),
        );
        // Nothing is due before the earliest entry, and nothing new will be before the last
        // stamp: firing reads the due index from here.
        let stamp = written.last_stamp;
        written.due_floor = engine.timer.next().map_or(stamp, |first| first.min(stamp));
        // Fsync mode syncs on the syncer thread; the append itself never waits for the disk.
        let syncer = if engine.options.durability == Durability::Fsync {
            let (tx, rx) = std::sync::mpsc::channel();
            let (e, s, c) = (engine.clone(), store.clone(), completer.clone());
            std::thread::Builder::new()
                .name("rockq-syncer".into())
                .spawn(move || commit::sync_loop(&e, &s, rx, &c))
                .map(|h| (tx, h))
                .inspect_err(|err| tracing::error!(%err, "rockq: no syncer thread; syncing inline"))
                .ok()
        } else {
            None
        };
        // Without a syncer thread (it could not start), Fsync syncs inline.
        let write_mode = WriteMode::new(engine.options.durability == Durability::Fsync && syncer.is_none());
        Writer {
            engine,
            store,
            rx,
            written,
            write_mode,
            batch_hint: 64 * 1024,
            syncer,
            completer,
            last_round: 0,
        }
    }

    fn run(mut self) {
        self.rounds();
        ordered::abandon(&self.engine, &self.written);
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
                self.refuse_remaining();
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
    fn refuse_remaining(&mut self) {
        self.rx.close();
        while let Ok(req) = self.rx.try_recv() {
            req.refuse(&Closed::Shutdown);
        }
    }

    /// Runs one round. Returns true when the writer must stop.
    fn round(&mut self, pending: &mut Vec<Request>, last: bool) -> bool {
        let (engine, store) = (self.engine.clone(), self.store.clone());
        let failed = engine.failure();
        let guard = store.lock();
        let Some(batch) = guard.batch(self.batch_hint) else {
            for req in pending.drain(..) {
                req.refuse(&Closed::Shutdown);
            }
            return true;
        };
        let mut r = Round {
            batch,
            engine: &engine,
            written: &mut self.written,
            done: Completions::default(),
            jobs: RoundJobs::default(),
        };

        // Sends staged by producers, taken after this round's requests were received, so a
        // request sees every send staged before it ("latest" offsets, for one). On the last
        // round the inbox is closed and everything staged is written.
        let stopping = last || pending.iter().any(|req| matches!(req, Request::Shutdown { .. }));
        let staged = if stopping { engine.inbox.close(None) } else { engine.inbox.take() };
        match &failed {
            Some(f) => staged.into_iter().for_each(|s| s.fail(f)),
            None if !staged.is_empty() => {
                let now = r.stamp();
                for s in staged {
                    queue::put_staged(&mut r, s, now);
                }
            }
            None => {}
        }

        for req in pending.drain(..) {
            if r.done.shutdown.is_some() {
                req.refuse(&Closed::Shutdown);
                continue;
            }
            if let Some(f) = &failed
                && !matches!(req, Request::Shutdown { .. } | Request::Commit)
            {
                req.refuse(&Closed::Failed(f.clone()));
                continue;
            }
            apply(&mut r, req);
        }

        if failed.is_none() {
            work::commit_queued_acks(&mut r);
            ordered::commit_dirty(&mut r);
            work::commit_offsets(&mut r);
        } else {
            ordered::abandon(&engine, r.written);
        }

        let Round { batch, done: mut c, .. } = r;
        self.last_round = c.messages;
        let result = if batch.is_empty() {
            drop(batch);
            Ok(())
        } else {
            let bytes = batch.size_in_bytes();
            tracing::trace!(
                messages = c.messages,
                offsets = c.commits.len(),
                bytes,
                "rockq writer: group commit"
            );
            self.batch_hint = bytes.max(4096);
            let t = Instant::now();
            c.started = Some(t);
            let _span = tracing::debug_span!("rockq.write", messages = c.messages, offsets = c.commits.len())
                .entered();
            let res = batch.write(&self.write_mode);
            engine.counters.write_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            res
        };
        let stop = c.shutdown.is_some() || last;
        match (result, &self.syncer) {
            (Ok(()), Some((tx, _))) => {
                drop(guard);
                if let Err(std::sync::mpsc::SendError(c)) = tx.send(c) {
                    // Only if the syncer panicked: dropping the round answers every waiter with
                    // a shutdown error, and the broker refuses further writes (the writer fails
                    // what is staged from its next round on).
                    *engine.failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Failure::Internal("syncer thread stopped"));
                    drop(c);
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
                    Ok(()) if stop => guard.sync_wal(),
                    other => other,
                };
                drop(guard);
                // Inline only where no other thread completes (no syncer) and no request waits
                // for the writer (see `Completer`).
                let inline = self.syncer.is_none() && self.rx.is_empty();
                self.completer.complete_after_earlier(c, result.err(), inline);
            }
        }
        stop
    }
}

/// Hands a request to the concept that applies it.
fn apply(r: &mut Round<'_>, req: Request) {
    match req {
        Request::Queue(q) => queue::apply(r, q),
        Request::Ordered(o) => ordered::apply(r, o),
        Request::Work(w) => work::apply(r, w),
        Request::Retention(t) => retention::apply(r, t),
        Request::Settings(s) => settings::apply(r, s),
        Request::WorkSettings(s) => settings::apply_work(r, s),
        Request::Schedule(s) => schedule::apply(r, s),
        Request::Lifecycle(l) => lifecycle::apply(r, l),
        Request::Kv(k) => txn::apply_kv(r, k),
        Request::Tx(t) => txn::apply(r, t),
        Request::Flow(f) => flow::apply(r, f),
        Request::Commit => {}
        Request::Flush { reply } => r.done.flushes.push(reply),
        Request::Shutdown { reply } => r.done.shutdown = Some(reply),
    }
}
