//! After a round's write: the syncer (Fsync mode's pipelined WAL sync) and the completer, which
//! completes durable rounds in order — registry updates, publication, replies, wake-ups — or
//! answers every waiter of a round that failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::mpsc;

use super::round::Completions;
use crate::engine::Engine;
use crate::engine::inbox::Staged;
use crate::engine::registry::QueueState;
use crate::error::{Error, Failure, StorageError};
use crate::store::Store;
use crate::telemetry;

/// Completes rounds in the order they were written: on the writer thread itself when the
/// writer allows it and every earlier round is complete, otherwise on a task of the broker's
/// runtime.
///
/// Why inline: in `Buffered` mode a round is durable as soon as the writer's write returned,
/// and its producers are the ones who fill the next round. Handing the round to a task costs a
/// cross-thread wake of that task, and the producers run only once a runtime worker got to it;
/// completing on the writer wakes them at once. Paired runs of the user-style bench (500k
/// awaited sends from 64 tasks, 2026-12-03): 756k / 689k / 782k msg/s through the task,
/// 865k / 933k / 920k inline. The writer allows it only with no request waiting in its
/// channel: completing every round inline made the end-to-end row (sends, a subscriber, its
/// acks) 7–15 % slower in three pairs, the acks waiting behind the writer's wake-ups.
///
/// Why a task at all: a round handed over while an earlier one is still being completed there
/// must wait its turn (replies and publications stay in write order), and `Fsync` rounds are
/// completed by the syncer thread, which must go straight back to syncing. The count of rounds
/// handed to the task, decremented after each is complete, tells the writer when completing
/// inline keeps the order: only the writer without a syncer completes inline, so at zero no
/// earlier round is left.
#[derive(Clone)]
pub(super) struct Completer {
    tx: mpsc::UnboundedSender<(Completions, Option<StorageError>)>,
    engine: Arc<Engine>,
    /// Rounds handed to the task and not completed yet.
    queued: Arc<AtomicUsize>,
    /// Entered while completing inline, so whatever a completion spawns lands on the broker's
    /// runtime.
    runtime: tokio::runtime::Handle,
}

impl Completer {
    pub fn spawn(engine: Arc<Engine>, runtime: &tokio::runtime::Handle) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Completions, Option<StorageError>)>();
        let queued = Arc::new(AtomicUsize::new(0));
        let (e, q) = (engine.clone(), queued.clone());
        runtime.spawn(async move {
            while let Some((c, failed)) = rx.recv().await {
                complete_or_fail(&e, c, failed);
                // Release: the writer that reads zero sees this round's completion done.
                q.fetch_sub(1, Ordering::Release);
            }
        });
        Completer { tx, engine, queued, runtime: runtime.clone() }
    }

    /// Completes a round after every round handed over before it: successfully, or with
    /// `failed`. A failure closes the broker at once, before any later round is built. Runs
    /// inline when the caller allows it (`inline`: the writer without a syncer, with no request
    /// waiting) and nothing earlier is waiting, or if the runtime is gone (its task was
    /// dropped), so no waiter is left hanging.
    pub fn complete_after_earlier(&self, c: Completions, failed: Option<StorageError>, inline: bool) {
        if let Some(e) = &failed {
            tracing::error!(error = %e, "rockq writer: write failed; refusing further writes");
            self.engine.fail(Failure::Storage(e.clone()));
        }
        if inline && self.queued.load(Ordering::Acquire) == 0 {
            let _runtime = self.runtime.enter();
            complete_or_fail(&self.engine, c, failed);
            return;
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::error::SendError((c, failed))) = self.tx.send((c, failed)) {
            complete_or_fail(&self.engine, c, failed);
        }
    }
}

/// Fsync mode: syncs the WAL once for every round the writer appended since the last sync, then
/// completes those rounds in order. After a failed sync every later round fails too.
pub(super) fn sync_loop(
    engine: &Engine,
    store: &Store,
    rx: std::sync::mpsc::Receiver<Completions>,
    completer: &Completer,
) {
    let mut failed: Option<StorageError> = None;
    while let Ok(first) = rx.recv() {
        let mut rounds = vec![first];
        rounds.extend(rx.try_iter());
        if failed.is_none() {
            let t = Instant::now();
            // Checked under the lock and only while open, so a paused failpoint holds `close`.
            let guard = store.lock();
            let synced = match guard.is_open() {
                true => crate::faults::check("rockq-syncer-sync").and_then(|()| guard.sync_wal()),
                false => Ok(()),
            };
            drop(guard);
            engine.counters.write_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            failed = synced.err();
        }
        for c in rounds {
            completer.complete_after_earlier(c, failed.clone(), false);
        }
    }
}

fn complete_or_fail(engine: &Engine, c: Completions, failed: Option<StorageError>) {
    match failed {
        None => complete(engine, c),
        Some(e) => fail(c, e),
    }
}

/// Completes a round whose write is durable: registry updates, publication, replies.
pub(super) fn complete(engine: &Engine, c: Completions) {
    let counters = &engine.counters;
    counters.rounds.fetch_add(1, Ordering::Relaxed);
    counters.messages.fetch_add(c.messages, Ordering::Relaxed);
    counters.offset_commits.fetch_add(c.commits.len() as u64, Ordering::Relaxed);
    if let Some(t) = c.started {
        telemetry::round(c.messages, t.elapsed());
    }
    for (g, v) in c.commits {
        let before = g.durable.fetch_max(v, Ordering::SeqCst);
        if v > before {
            g.durable_moved.notify_waiters();
        }
        telemetry::group_counter(telemetry::ACKED, &g.queue.name, &g.name, v.saturating_sub(before));
    }
    for (q, waiters) in c.queues {
        tracing::debug!(queue = %q.name, id = q.id, "rockq: queue created");
        // Deleted in the round that created it: its waiters get the deleted state, whose
        // handles refuse every use.
        if !q.is_deleted() {
            engine.registry.queues.insert(q.name.clone(), q.clone());
        }
        waiters.into_iter().for_each(|w| drop(w.send(Ok(q.clone()))));
    }
    for (g, waiters) in c.ordered {
        let committed = g.durable.load(Ordering::Relaxed);
        tracing::debug!(group = %g.name, queue = %g.queue.name, committed, "rockq: group created");
        if !g.is_deleted() {
            engine.registry.ordered.insert(g.keys.id().to_vec(), g.clone());
        }
        waiters.into_iter().for_each(|w| drop(w.send(Ok(g.clone()))));
    }
    for (g, waiters) in c.work {
        tracing::debug!(group = %g.name, queue = %g.queue.name, "rockq: work-queue group created");
        if !g.is_deleted() {
            engine.registry.work.insert(g.keys.id().to_vec(), g.clone());
        }
        waiters.into_iter().for_each(|w| drop(w.send(Ok(g.clone()))));
    }
    // Publish before replying, so a producer that sees its send resolve also sees it in
    // `Queue::last_seq`, and subscribers start reading while producers are being woken.
    QueueState::publish_all(c.touched.values().iter().map(|(q, last, _)| (&**q, *last)));
    for (q, _, n) in c.touched {
        telemetry::produced(&q.produced, n);
    }
    for (g, offset) in c.work_durable {
        if offset > g.durable.fetch_max(offset, Ordering::SeqCst) {
            g.settled.notify_waiters();
        }
    }
    for (g, seqs) in c.work_finished {
        g.finished(&seqs);
    }
    for f in c.callbacks {
        f(Ok(()));
    }
    let trace = tracing::enabled!(tracing::Level::TRACE);
    for (s, seqs) in c.staged {
        if trace {
            trace_sent(&s, &seqs);
        }
        s.resolver.resolve(Ok(seqs));
    }
    c.flushes.into_iter().for_each(|f| drop(f.send(Ok(()))));
    if let Some(s) = c.shutdown {
        let _ = s.send(Ok(()));
    }
}

/// One TRACE event per message of a staged round that became durable.
fn trace_sent(s: &Staged, seqs: &[u64]) {
    for (k, &first) in s.sends.iter().enumerate() {
        let from = first as usize;
        let to = s.sends.get(k + 1).map_or(s.msgs.len(), |&n| n as usize);
        let Some(queue) = s.msgs.get(from).and_then(|&(q, _)| s.queues.get(q as usize)) else { continue };
        if let crate::sent::Sent::Duplicate(original) = crate::engine::completion::staged_sent(seqs[k]) {
            tracing::trace!(queue = %queue.name, ?original, "rockq: duplicate not sent");
            continue;
        }
        for seq in (seqs[k]..).take(to.saturating_sub(from)) {
            tracing::trace!(queue = %queue.name, seq, "rockq: sent");
        }
    }
}

/// Answers the waiters of a round whose write or sync failed (the broker is already closed).
fn fail(c: Completions, e: StorageError) {
    // Offsets in `c.commits` stay non-durable: `durable` is not advanced, and after a reopen
    // the group resumes from the last offset that did reach the disk.
    for (s, _) in c.staged {
        s.resolver.resolve(Err(Error::Storage(e.clone())));
    }
    for (_, waiters) in c.queues {
        waiters.into_iter().for_each(|w| drop(w.send(Err(Error::Storage(e.clone())))));
    }
    for (_, waiters) in c.ordered {
        waiters.into_iter().for_each(|w| drop(w.send(Err(Error::Storage(e.clone())))));
    }
    for (_, waiters) in c.work {
        waiters.into_iter().for_each(|w| drop(w.send(Err(Error::Storage(e.clone())))));
    }
    for f in c.callbacks {
        f(Err(&e));
    }
    c.flushes.into_iter().for_each(|f| drop(f.send(Err(Error::Storage(e.clone())))));
    if let Some(s) = c.shutdown {
        let _ = s.send(Err(e));
    }
}
