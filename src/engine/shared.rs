//! The handles' half of the engine: [`Shared`], what every public handle holds (the engine,
//! the writer's request channel, the shutdown state), and the periodic background tasks that
//! run on it (retention, gauges). The writer holds only the [`Engine`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::path::Path;

use tokio::sync::{broadcast, mpsc, oneshot};

use super::Engine;
use super::inbox::Staging;
use super::registry::{OrderedGroupState, QueueState, WorkGroupState};
use super::request::{Request, SettingsChange, SettingsRequest};
use crate::clock::Clock;
use crate::error::{NameKind, PauseError, ReceiveError, RedriveError, SendError, ShutdownError};
use crate::events::Event;
use crate::message::Message;
use crate::options::Options;
use crate::stats::{StorageStats, WriterStats};
use crate::store::{self, ReadOutcome};

/// The user-side half of the engine: what every public handle holds. Owns the writer's request
/// channel, so the writer stops when the last handle is dropped.
pub(crate) struct Shared {
    /// The engine itself: private to `engine/`, so what the handles may do is the methods
    /// below (listed in `boundary.rs`).
    pub(super) engine: Arc<Engine>,
    pub tx: mpsc::Sender<Request>,
    pub closed: AtomicBool,
    /// The runtime the broker was opened in: its blocking pool runs reads and the close.
    pub runtime: tokio::runtime::Handle,
    /// The writer thread, joined by shutdown.
    pub writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Cancelled when shutdown begins: work-queue subscriptions stop claiming and worker pools
    /// drain, while acks are still accepted.
    pub closing: tokio_util::sync::CancellationToken,
    /// Cancelled once shutdown is complete: the writer has stopped, so no event comes after.
    pub stopped: tokio_util::sync::CancellationToken,
    /// Running worker pools; shutdown waits for them to drain.
    pub pools: tokio_util::task::TaskTracker,
    /// The one shutdown, once begun: every caller of [`Broker::shutdown`](crate::Broker::shutdown) awaits it.
    pub shutdown: Mutex<Option<ShutdownFuture>>,
}

/// An ordered group's cross-process ownership, held by its subscription (the etcd engine);
/// nothing for the embedded engine.
/// Held for its `Drop`, which asks the writer to release the group.
#[derive(Default)]
pub(crate) struct OwnerHold {
    #[cfg(feature = "etcd")]
    _release: Option<super::etcd::owner::OwnerRelease>,
}

/// The shared outcome of the shutdown task.
type ShutdownFuture = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), ShutdownError>>>;

impl Shared {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether writes can still land: not shut down, and not failed closed.
    pub fn is_writable(&self) -> bool {
        !self.is_closed() && self.engine.failure().is_none()
    }

    /// Why the broker failed closed, if it did.
    pub fn failed(&self) -> Option<crate::error::FailedError> {
        self.engine.failure().map(Into::into)
    }

    /// The broker's clock: leases, retries, delays and enqueue times.
    pub fn clock(&self) -> &Clock {
        self.engine.clock()
    }

    pub fn options(&self) -> &Options {
        &self.engine.options
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.engine.store.path
    }

    /// Queue `name`, if it exists.
    pub fn queue(&self, name: &str) -> Option<Arc<QueueState>> {
        self.engine.registry.queue(name)
    }

    /// Names of all queues, sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.engine.registry.queues.iter().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    /// Ordered group `group` on `queue`, if it exists.
    pub fn ordered_group(&self, group: &str, queue: &str) -> Option<Arc<OrderedGroupState>> {
        self.engine.registry.ordered(group, queue)
    }

    /// Work-queue group `group` on `queue`, if it exists.
    pub fn work_group(&self, group: &str, queue: &str) -> Option<Arc<WorkGroupState>> {
        self.engine.registry.work(group, queue)
    }

    /// Stages one send call's messages for the writer's next round (see `Inbox::push`).
    pub async fn stage(&self, queue: &Arc<QueueState>, msgs: &[Message]) -> Result<Staging, SendError> {
        self.engine.inbox.push(queue, msgs).await
    }

    /// Hands an ordered group whose offset moved to the writer's next round.
    pub fn mark_dirty(&self, group: Arc<OrderedGroupState>) {
        self.engine.mark_dirty(group);
    }

    /// Hands a work-queue group with queued acks to the writer's next round.
    pub fn mark_work_dirty(&self, group: Arc<WorkGroupState>) {
        self.engine.mark_work_dirty(group);
    }

    /// The lifecycle event broadcast.
    pub fn events(&self) -> &broadcast::Sender<Event> {
        &self.engine.events
    }

    /// Broadcasts an event if anyone listens.
    pub fn emit(&self, event: impl FnOnce() -> Event) {
        self.engine.emit(event);
    }

    pub fn writer_stats(&self) -> WriterStats {
        self.engine.counters.snapshot()
    }

    pub fn storage_stats(&self) -> Option<StorageStats> {
        self.engine.store.stats()
    }

    /// Reads messages `from..=to` of `queue` (at most `max_bytes` of values). Blocking.
    pub fn read_range(
        &self,
        queue: &QueueState,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, ReceiveError> {
        #[cfg(feature = "etcd")]
        if let Some(side) = &self.engine.etcd {
            return match self.is_closed() {
                true => Ok(ReadOutcome::Closed),
                false => side.read_range(&self.runtime, queue, from, to, max_bytes),
            };
        }
        store::read_range(&self.engine.store, &queue.name, queue.id, from, to, max_bytes)
    }

    /// Reads the messages at `seqs` (ascending) of `queue`. Blocking.
    pub fn read_seqs(&self, queue: &QueueState, seqs: &[u64]) -> Result<ReadOutcome, ReceiveError> {
        #[cfg(feature = "etcd")]
        if let Some(side) = &self.engine.etcd {
            return match self.is_closed() {
                true => Ok(ReadOutcome::Closed),
                false => side.read_seqs(&self.runtime, queue, seqs),
            };
        }
        store::read_seqs(&self.engine.store, &queue.name, queue.id, seqs)
    }

    /// Takes the cross-process ownership of ordered group `group` for a new subscription: with
    /// the embedded engine, the in-process active slot (taken by the caller) is all there is.
    pub async fn own_ordered(
        &self,
        group: &Arc<OrderedGroupState>,
    ) -> Result<OwnerHold, crate::error::SubscribeError> {
        #[cfg(feature = "etcd")]
        if let Some(side) = &self.engine.etcd {
            let release = super::etcd::owner::acquire(side, group, self.tx.clone()).await?;
            return Ok(OwnerHold { _release: Some(release) });
        }
        let _ = group;
        Ok(OwnerHold::default())
    }

    /// The etcd engine: has the writer persist the extension of `seq`'s lease to `until`
    /// (the embedded engine keeps extensions in memory: nothing to do). Never blocks: with the
    /// channel full, the request is sent from a task.
    #[allow(unused_variables)]
    pub fn persist_extension(
        &self,
        group: &Arc<WorkGroupState>,
        seq: u64,
        attempt: u32,
        token: u64,
        until: std::time::Instant,
        holder: &Arc<str>,
    ) {
        #[cfg(feature = "etcd")]
        if self.engine.etcd.is_some() {
            let claim = crate::model::Claim::Leased {
                attempt,
                token,
                deadline_micros: self.clock().wall_micros_at(until),
                holder: holder.clone(),
            };
            let req = Request::Work(super::request::WorkRequest::Extend { group: group.clone(), seq, claim });
            // In order with this caller's later requests, unless the channel is full.
            if let Err(mpsc::error::TrySendError::Full(req)) = self.tx.try_send(req) {
                let tx = self.tx.clone();
                self.runtime.spawn(async move { drop(tx.send(req).await) });
            }
        }
    }

    /// The etcd engine's refusal of `operation`, if this broker runs on etcd (`None`: the
    /// embedded engine carries everything out).
    #[inline]
    pub fn unsupported(&self, operation: &'static str) -> Option<crate::error::UnsupportedError> {
        #[cfg(feature = "etcd")]
        if self.engine.etcd.is_some() {
            return Some(super::etcd::unsupported(operation));
        }
        let _ = operation;
        None
    }

    /// Refuses, on etcd, a send call the engine cannot append as one transaction (or with an
    /// idempotency key, not carried out there yet). Nothing to check for the embedded engine.
    #[inline]
    pub fn check_send(&self, msgs: &[Message]) -> Result<(), SendError> {
        #[cfg(feature = "etcd")]
        if self.engine.etcd.is_some() {
            return super::etcd::check_send(msgs);
        }
        let _ = msgs;
        Ok(())
    }

    /// Keyspace `name`, if it exists.
    pub fn keyspace(&self, name: &str) -> Option<Arc<super::registry::KeyspaceState>> {
        self.engine.registry.keyspace(name)
    }

    /// Every keyspace, sorted by name.
    pub fn keyspaces(&self) -> Vec<Arc<super::registry::KeyspaceState>> {
        let mut all: Vec<_> = self.engine.registry.keyspaces.iter().map(|k| k.clone()).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// `key` of keyspace `keyspace`: its revision and value. Blocking.
    pub fn kv_get(&self, keyspace: u32, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, crate::error::KvError> {
        if self.is_closed() {
            return Err(crate::error::KvError::Shutdown);
        }
        if let Some(u) = self.unsupported("keyspaces") {
            return Err(crate::error::KvError::Unsupported(u));
        }
        // Closed between the check and the read: that is a shutdown, not a storage error.
        store::kv_get(&self.engine.store, keyspace, key)
            .map_err(|e| if self.is_closed() { crate::error::KvError::Shutdown } else { kv_read_error(e) })
    }

    /// Up to `limit` entries of keyspace `keyspace` in `[from, to)`, in key order. Blocking.
    pub fn kv_scan(
        &self,
        keyspace: u32,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<store::RawEntry>, crate::error::KvError> {
        if self.is_closed() {
            return Err(crate::error::KvError::Shutdown);
        }
        if let Some(u) = self.unsupported("keyspaces") {
            return Err(crate::error::KvError::Unsupported(u));
        }
        store::kv_scan(&self.engine.store, keyspace, from, to, limit)
            .map_err(|e| if self.is_closed() { crate::error::KvError::Shutdown } else { kv_read_error(e) })
    }

    /// How far dead-letter queue `dlq` has been redriven. Blocking.
    pub fn read_cursor(&self, dlq: &str) -> Result<Option<u64>, RedriveError> {
        #[cfg(feature = "etcd")]
        if let Some(side) = &self.engine.etcd {
            return side.read_cursor(&self.runtime, dlq);
        }
        store::read_cursor(&self.engine.store, dlq)
    }

    /// Stops the engine: work subscriptions stop claiming and worker pools drain, new requests
    /// are refused, the writer finishes everything queued before this and stops, subscribers
    /// are woken to see the end, and the store is closed on the blocking pool.
    pub async fn close(&self) -> Result<(), ShutdownError> {
        if self.is_closed() {
            return Ok(());
        }
        // Worker pools first: they stop claiming and drain (their acks still land).
        self.closing.cancel();
        self.pools.close();
        self.pools.wait().await;
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        let flushed = match self.tx.send(Request::Shutdown { reply }).await {
            Ok(()) => rx.await.unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let engine = self.engine.clone();
        let joined = self
            .runtime
            .spawn_blocking(move || {
                let joined = handle.map(|h| h.join().is_ok()).unwrap_or(true);
                // Wake every subscriber so its stream observes the shutdown and ends.
                for q in engine.registry.queues.iter() {
                    q.poke();
                }
                let closed = engine.store.close();
                (joined, closed)
            })
            .await;
        let (joined, closed) = joined.unwrap_or((false, Ok(())));
        self.stopped.cancel();
        flushed?;
        closed?;
        if !joined {
            return Err(ShutdownError::WriterPanicked);
        }
        tracing::info!(path = %self.path().display(), "rockq: shut down");
        Ok(())
    }

    /// Asks the writer to delete group `group` on `queue`, either mode (names checked by the
    /// caller); `false` if there is none.
    pub async fn delete_group(&self, queue: &str, group: &str) -> Result<bool, crate::error::QueueError> {
        let (reply, rx) = oneshot::channel();
        let req = Request::Lifecycle(super::request::LifecycleRequest::DeleteGroup {
            queue: queue.to_owned(),
            group: group.to_owned(),
            reply,
        });
        self.ask(req, rx).await
    }

    /// Hands `req` to the writer and waits for its answer on `rx`: refused in the reply's own
    /// error family once the broker is closed, or if the writer is gone.
    pub async fn ask<T, E: From<crate::error::Closed>>(
        &self,
        req: Request,
        rx: oneshot::Receiver<Result<T, E>>,
    ) -> Result<T, E> {
        let gone = || E::from(crate::error::Closed::Shutdown);
        if self.is_closed() {
            return Err(gone());
        }
        self.tx.send(req).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Wakes the writer to commit dirty groups. Never blocks: if the channel is full the writer
    /// has work queued and takes the dirty list in its next round anyway.
    pub fn nudge_writer(&self) {
        let _ = self.tx.try_send(Request::Commit);
    }

    /// Pauses or resumes `group` on `queue` (either mode), durably.
    pub async fn set_paused(
        &self,
        queue: &Arc<QueueState>,
        group: &str,
        paused: bool,
    ) -> Result<(), PauseError> {
        crate::name::validate(NameKind::Group, group)?;
        if self.is_closed() {
            return Err(PauseError::Shutdown);
        }
        if !self.engine.registry.has_group(group, &queue.name) {
            return Err(PauseError::NoSuchGroup { group: group.to_owned(), queue: queue.name.to_string() });
        }
        let (reply, rx) = oneshot::channel();
        let change = SettingsChange::Paused(paused);
        let req = SettingsRequest { queue: queue.clone(), group: group.to_owned(), change, reply };
        self.tx.send(Request::Settings(req)).await.map_err(|_| PauseError::Shutdown)?;
        rx.await.map_err(|_| PauseError::Shutdown)??;
        let what = if paused { "rockq: group paused" } else { "rockq: group resumed" };
        tracing::info!(%group, queue = %queue.name, "{what}");
        Ok(())
    }

    /// Whether `group` on `queue` is paused (false if it does not exist).
    pub fn is_paused(&self, queue: &QueueState, group: &str) -> bool {
        let r = &self.engine.registry;
        r.ordered(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
            || r.work(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
    }

    /// Registers a running worker pool, unless shutdown has begun.
    pub fn pool_started(&self) -> Option<tokio_util::task::task_tracker::TaskTrackerToken> {
        if self.closing.is_cancelled() || self.is_closed() {
            return None;
        }
        Some(self.pools.token())
    }
}

/// The last handle is gone: the background tasks (retention, the schedule's timer) stop with it.
impl Drop for Shared {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

/// Runs `tick` every `interval` on the broker's clock until shutdown, or until `tick` returns
/// false. Holds the broker only weakly between ticks, so dropping every handle still closes it.
pub(crate) fn spawn_periodic<F, Fut>(shared: &Arc<Shared>, interval: std::time::Duration, tick: F)
where
    F: Fn(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    if interval.is_zero() {
        return;
    }
    let weak = Arc::downgrade(shared);
    let clock = shared.engine.clock().clone();
    let closing = shared.closing.clone();
    shared.runtime.spawn(async move {
        loop {
            tokio::select! {
                _ = clock.sleep_until(clock.after(interval)) => {}
                _ = closing.cancelled() => return,
            }
            let Some(shared) = weak.upgrade() else { return };
            if !tick(shared).await {
                return;
            }
        }
    });
}

fn kv_read_error(e: store::ReadError) -> crate::error::KvError {
    match e {
        store::ReadError::Storage(s) => crate::error::KvError::Storage(s),
        store::ReadError::Corrupt(c) => crate::error::KvError::Corrupt(c),
    }
}
