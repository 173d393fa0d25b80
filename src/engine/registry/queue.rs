//! One queue's in-memory state: its id, first live sequence, published last sequence (and the
//! `watch` channel its subscribers wait on) and retention policy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::watch;

use super::priority::Priorities;
use crate::retention::Retention;

/// One queue.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub id: u32,
    pub name: Arc<str>,
    /// First live sequence (retention moves it forward).
    pub first_seq: AtomicU64,
    /// Last sequence written and visible to readers: the writer publishes it after each round
    /// that touched the queue.
    last: AtomicU64,
    /// Subscribers waiting on `wake` (see [`QueueState::publish`]).
    watchers: AtomicUsize,
    /// Wakes subscribers instead of polling; carries the last sequence published to it.
    wake: watch::Sender<u64>,
    /// Retention policy (persisted in the queue record; the writer changes it).
    pub retention: std::sync::Mutex<Retention>,
    /// How long idempotency keys are remembered, µs (persisted in the queue record; the writer
    /// changes it).
    dedup_window: AtomicU64,
    /// Delayed messages waiting for this queue, as the writer counts them (for the gauges;
    /// counted from the store at open).
    pub scheduled: AtomicU64,
    /// Set by the writer as the queue's deletion enters a batch: handles refuse to send,
    /// subscriptions end, and the writer refuses every later request naming this state (a
    /// queue created again under the name is a new state with a new id).
    deleted: AtomicBool,
    /// Everything up to here was purged (`Broker::purge_queue`): a subscription passing over
    /// it does not count those messages as skipped by retention.
    pub purged_through: AtomicU64,
    /// Its retained messages sent with a priority (`priority.rs`).
    priorities: std::sync::Mutex<Priorities>,
    /// Whether `priorities` may hold any: claims in a queue that never had one skip its lock.
    prioritised: AtomicBool,
    /// The key of its produced-messages counter, built once (`telemetry::produced`).
    pub produced: metrics::Key,
}

impl QueueState {
    pub fn new(id: u32, name: &str, first_seq: u64, last_seq: u64, retention: Retention) -> Arc<Self> {
        let name: Arc<str> = Arc::from(name);
        Arc::new(QueueState {
            id,
            produced: crate::telemetry::produced_key(&name),
            name,
            first_seq: AtomicU64::new(first_seq),
            last: AtomicU64::new(last_seq),
            watchers: AtomicUsize::new(0),
            wake: watch::Sender::new(last_seq),
            retention: std::sync::Mutex::new(retention),
            dedup_window: AtomicU64::new(crate::model::DEFAULT_DEDUP_WINDOW.as_micros() as u64),
            scheduled: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            purged_through: AtomicU64::new(0),
            priorities: std::sync::Mutex::new(Priorities::default()),
            prioritised: AtomicBool::new(false),
        })
    }

    /// Indexes message `seq`'s priority (the writer as it appends it; the index loaded at
    /// open). Before the message is published, so a claim that sees it sees its priority.
    pub fn index_priority(&self, seq: u64, priority: u8) {
        if priority > 0 {
            self.priorities().insert(seq, priority);
            self.prioritised.store(true, Ordering::Release);
        }
    }

    /// The index of prioritised messages, if the queue ever had one (else `None`, lock-free).
    pub fn priorities_if_any(&self) -> Option<std::sync::MutexGuard<'_, Priorities>> {
        self.prioritised.load(Ordering::Acquire).then(|| self.priorities())
    }

    /// Message `seq`'s priority (0: none, or not retained).
    pub fn priority_of(&self, seq: u64) -> u8 {
        self.priorities_if_any().map_or(0, |p| p.of(seq))
    }

    /// Retention deleted everything through `through`: their index entries go.
    pub fn forget_priorities_through(&self, through: u64) {
        if let Some(mut p) = self.priorities_if_any() {
            p.forget_through(through);
        }
    }

    fn priorities(&self) -> std::sync::MutexGuard<'_, Priorities> {
        self.priorities.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the queue was deleted (this state is then dead for good).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// The writer deleted the queue: marks it and wakes every subscriber, which sees it.
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.poke();
    }

    /// The writer scheduled (`+1`) or took out (`-1`) a delayed message of this queue.
    pub fn count_scheduled(&self, up: bool) {
        if up {
            self.scheduled.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self.scheduled.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// How long the queue remembers idempotency keys.
    pub fn dedup_window(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.dedup_window.load(Ordering::Relaxed))
    }

    /// Sets the window (at open from the record; by the writer when it persists a change).
    pub fn set_dedup_window(&self, window: std::time::Duration) {
        let micros = window.as_micros().min(u128::from(u64::MAX)) as u64;
        self.dedup_window.store(micros, Ordering::Relaxed);
    }

    pub fn retention(&self) -> Retention {
        *self.retention.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn last_seq(&self) -> u64 {
        self.last.load(Ordering::SeqCst)
    }

    /// Publishes `last` alone: [`publish_all`](Self::publish_all) for one queue (tests).
    #[cfg(test)]
    pub fn publish(&self, last: u64) {
        Self::publish_all(std::iter::once((self, last)));
    }

    /// Publishes the last sequences of the queues a durable round touched (the writer's
    /// completer) and wakes their subscribers, where a queue has any.
    ///
    /// Why the watcher count: a watch send takes its lock and notifies eight `Notify`s even
    /// with no receiver, and a round for thousands of queues publishes each. Why plain stores
    /// and one fence: a `SeqCst` store is a locked instruction that waits for its cache line,
    /// and in such a round each queue's line is on the other core (its producer staged
    /// there); plain stores queue up and their misses overlap.
    ///
    /// Skipping the send loses no wake-up. Each store of `last` is sequenced before the
    /// `SeqCst` fence, and each load of `watchers` after it; a watcher
    /// ([`QueueState::watch`]) increments `watchers`, then loads `last`, both `SeqCst`. If the
    /// load here misses the increment, the increment — and so the watcher's load of `last` —
    /// follows the fence in the single total order, and a `SeqCst` load that follows a fence
    /// sees every store sequenced before it: the watcher sees this `last`. If the load sees
    /// the watcher, the send reaches its receiver, or happened before it subscribed (and so
    /// before its look at `last`).
    pub fn publish_all<'a>(tails: impl Iterator<Item = (&'a QueueState, u64)> + Clone) {
        for (q, last) in tails.clone() {
            q.last.store(last, Ordering::Release);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        for (q, last) in tails {
            if q.watchers.load(Ordering::Relaxed) > 0 {
                q.wake.send_replace(last);
            }
        }
    }

    /// Publishes `last` unless a later tail was published already (the etcd engine: its writer
    /// and its watch both publish, in either order).
    #[allow(dead_code)] // the etcd engine's
    pub fn publish_max(&self, last: u64) {
        let before = self.last.fetch_max(last, Ordering::SeqCst);
        if last > before && self.watchers.load(Ordering::SeqCst) > 0 {
            self.wake.send_replace(last);
        }
    }

    /// Wakes every subscriber (to re-check a pause flag, or see the broker closed).
    pub fn poke(&self) {
        self.wake.send_replace(self.last_seq());
    }

    /// Subscribes to wake-ups: the receiver, and a guard that counts it as a watcher while it
    /// lives (keep the two together). Look at [`QueueState::last_seq`] after this, and again
    /// after each wake-up: the receiver's own value may be older than it.
    pub fn watch(self: &Arc<Self>) -> (watch::Receiver<u64>, Watching) {
        self.watchers.fetch_add(1, Ordering::SeqCst);
        let guard = Watching(self.clone());
        (self.wake.subscribe(), guard)
    }
}

/// Counts one subscriber of a queue's wake-ups while it lives ([`QueueState::watch`]).
#[derive(Debug)]
pub(crate) struct Watching(Arc<QueueState>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_publish_without_watchers_is_seen_by_the_next_one_and_later_ones_wake_it() {
        let q = QueueState::new(1, "q", 1, 0, Retention::default());
        q.publish(5);
        assert_eq!(q.last_seq(), 5);
        let (mut rx, watching) = q.watch();
        assert_eq!(q.watchers.load(Ordering::SeqCst), 1);
        // The receiver may hold an older value; the atomic is current.
        assert_eq!(q.last_seq(), 5);
        q.publish(9);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 9);
        drop(watching);
        assert_eq!(q.watchers.load(Ordering::SeqCst), 0);
        // No watcher: nothing is sent, the value still moves.
        q.publish(12);
        assert!(!rx.has_changed().unwrap());
        assert_eq!(q.last_seq(), 12);
        // A poke always wakes, with the current value.
        q.poke();
        assert_eq!(*rx.borrow_and_update(), 12);
    }

    #[tokio::test]
    async fn publishing_many_at_once_moves_every_tail_and_wakes_only_the_watched() {
        let (a, b) = (
            QueueState::new(1, "a", 1, 0, Retention::default()),
            QueueState::new(2, "b", 1, 0, Retention::default()),
        );
        let (mut rx, _watching) = b.watch();
        QueueState::publish_all([(&*a, 3), (&*b, 7)].into_iter());
        assert_eq!((a.last_seq(), b.last_seq()), (3, 7));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 7);
        let (unwatched, watching) = a.watch();
        drop(watching);
        QueueState::publish_all([(&*a, 4)].into_iter());
        assert_eq!(a.last_seq(), 4);
        assert!(!unwatched.has_changed().unwrap(), "no watcher counted: nothing sent");
    }
}
