//! Admin operations on a live [`Broker`]: stats and inspection (computed from the disk, with
//! the live subscriptions' in-flight counts), pause/resume and mode-agnostic resets.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::collect;
use super::types::{GroupMode, PendingClaim, Stats, StoredMessage};
use crate::broker::Broker;
use crate::engine::Shared;
use crate::error::{InspectError, NameKind, PauseError, ResetError};
use crate::registry::QueueState;
use crate::store::{Store, keys};
use crate::writer::{Request, SettingsChange};

/// Pauses or resumes `group` on `queue` (either mode), durably.
pub(crate) async fn set_paused(
    shared: &Arc<Shared>,
    queue: &Arc<QueueState>,
    group: &str,
    paused: bool,
) -> Result<(), PauseError> {
    crate::name::validate(NameKind::Group, group)?;
    if shared.is_closed() {
        return Err(PauseError::Shutdown);
    }
    let key = keys::offset_key(group, &queue.name);
    let registry = &shared.engine.registry;
    if !registry.groups.contains_key(&key) && !registry.work_groups.contains_key(&key) {
        return Err(PauseError::NoSuchGroup { group: group.to_owned(), queue: queue.name.to_string() });
    }
    let (reply, rx) = oneshot::channel();
    let req = Request::GroupSettings {
        queue: queue.clone(),
        group: group.to_owned(),
        change: SettingsChange::Paused(paused),
        reply,
    };
    shared.tx.send(req).await.map_err(|_| PauseError::Shutdown)?;
    rx.await.map_err(|_| PauseError::Shutdown)??;
    let what = if paused { "rockq: group paused" } else { "rockq: group resumed" };
    tracing::info!(%group, queue = %queue.name, "{what}");
    Ok(())
}

/// Whether `group` on `queue` is paused (false if it does not exist).
pub(crate) fn is_paused(shared: &Shared, queue: &QueueState, group: &str) -> bool {
    let key = keys::offset_key(group, &queue.name);
    let r = &shared.engine.registry;
    r.groups.get(&key).is_some_and(|g| g.paused.load(Ordering::Acquire))
        || r.work_groups.get(&key).is_some_and(|g| g.paused.load(Ordering::Acquire))
}

impl Broker {
    /// This process's live leases of every work group (or of `only`), in wall-clock µs.
    ///
    /// Why an overlay rather than a write: [`Job::extend`](crate::Job::extend) and the pool's
    /// heartbeat move only the in-memory deadline, which is what fencing checks. Persisting
    /// each extension would put a write per heartbeat on the writer and either make `extend`
    /// wait (it is synchronous) or make the record lag when the writer's queue is full; and a
    /// persisted deadline is never used again anyway (after a restart every lease is void, see
    /// `WorkGroupState::restore`). So the live broker reports the deadlines fencing enforces;
    /// a read-only [`Inspector`](crate::Inspector) sees the claim-time deadlines on disk.
    fn live_leases(&self, only: Option<(&str, &str)>) -> collect::LiveLeases {
        let clock = self.shared.engine.clock();
        let mut out = collect::LiveLeases::new();
        for entry in self.shared.engine.registry.work_groups.iter() {
            let g = entry.value();
            if only.is_some_and(|(group, queue)| *g.name != *group || *g.queue.name != *queue) {
                continue;
            }
            let leases = g.live_leases();
            if leases.is_empty() {
                continue;
            }
            let map = leases
                .into_iter()
                .map(|(seq, attempt, t)| (seq, (attempt, clock.wall_micros_at(t))))
                .collect();
            out.insert((g.name.to_string(), g.queue.name.to_string()), map);
        }
        out
    }

    async fn inspect<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store, u64) -> Result<T, InspectError> + Send + 'static,
    ) -> Result<T, InspectError> {
        if self.shared.is_closed() {
            return Err(InspectError::Shutdown);
        }
        let shared = self.shared.clone();
        let now = shared.engine.clock().wall_micros();
        self.shared
            .runtime
            .spawn_blocking(move || f(&shared.engine.store, now))
            .await
            .map_err(|_| InspectError::Shutdown)?
    }

    /// Every queue (first and last sequence, length, bytes on disk, age of the oldest
    /// message) and every group (committed offset, lag as a count and as the age of the
    /// oldest unfinished message, in flight, waiting for retry, dead-letter depth, paused).
    ///
    /// The figures come from the records on disk, which a restart would also find; ordered
    /// groups add the live subscription's unacknowledged deliveries as in flight, and work
    /// groups count a job as in flight by its live lease deadline in this process (so a lease
    /// extended by [`Job::extend`](crate::Job::extend) or a pool's heartbeat counts). Costs one
    /// scan of the registry and claims and one point read per queue and group: meant for
    /// dashboards and tools, not for every message.
    ///
    /// # Errors
    ///
    /// [`InspectError::Shutdown`], [`InspectError::Corrupt`], [`InspectError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread, which finishes on its own). If the
    /// future is dropped the figures are lost and the gauges are not refreshed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let stats = broker.stats().await?;
    /// for g in &stats.groups {
    ///     println!("{}/{} lag {} oldest {:?}", g.queue, g.group, g.lag, g.oldest_unacked_age);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stats(&self) -> Result<Stats, InspectError> {
        let live = self.live_leases(None);
        let mut stats = self.inspect(move |s, now| collect::stats(s, now, &live)).await?;
        let registry = &self.shared.engine.registry;
        for g in stats.groups.iter_mut().filter(|g| g.mode == GroupMode::Ordered) {
            if let Some(state) = registry.groups.get(&keys::offset_key(&g.group, &g.queue)) {
                g.in_flight = state.in_flight();
            }
        }
        crate::telemetry::publish(&stats);
        Ok(stats)
    }

    /// The claimed, unfinished messages of work-queue group `group` on `queue`: who holds
    /// each (its [consumer name](crate::WorkGroup::consumer_name)), which attempt, until when;
    /// and those waiting for a retry. Empty for an ordered group. Lease deadlines held in this
    /// process are the live ones, extensions included (the records on disk keep the deadline
    /// set at claim time).
    ///
    /// # Errors
    ///
    /// [`InspectError::NoSuchGroup`], [`InspectError::InvalidName`],
    /// [`InspectError::Shutdown`], [`InspectError::Corrupt`], [`InspectError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for p in broker.pending("mailer", "emails").await? {
    ///     println!("#{} attempt {} held by {:?} until {:?}", p.seq, p.attempt, p.holder, p.lease_deadline);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pending(&self, group: &str, queue: &str) -> Result<Vec<PendingClaim>, InspectError> {
        let (g, q) = (group.to_owned(), queue.to_owned());
        let live = self.live_leases(Some((group, queue)));
        self.inspect(move |s, now| collect::pending(s, &g, &q, now, &live)).await
    }

    /// Up to `limit` stored messages of `queue`, from sequence `from` (default: the first
    /// live one). Reading changes nothing: no group sees it.
    ///
    /// # Errors
    ///
    /// [`InspectError::NoSuchQueue`], [`InspectError::InvalidName`],
    /// [`InspectError::Shutdown`], [`InspectError::Corrupt`], [`InspectError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for m in broker.peek("orders", None, 10).await? {
    ///     println!("#{} {:?}", m.seq, m.payload);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, InspectError> {
        let q = queue.to_owned();
        self.inspect(move |s, _| collect::peek(s, &q, from, limit)).await
    }

    fn queue_state(&self, queue: &str) -> Option<Arc<QueueState>> {
        self.shared.engine.registry.queues.get(queue).map(|q| q.clone())
    }

    /// Pauses group `group` on `queue` (ordered or work-queue), durably: its subscriptions
    /// and worker pools hand out nothing new until [`resume_group`](Broker::resume_group),
    /// across restarts too. Acks of what was already handed out still land, and jobs already
    /// claimed by a subscription are still handed out; leases run as usual.
    ///
    /// # Errors
    ///
    /// [`PauseError::NoSuchGroup`], [`PauseError::InvalidName`], [`PauseError::Shutdown`],
    /// [`PauseError::Storage`], [`PauseError::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the group is paused or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.pause_group("billing", "orders").await?;
    /// // ... fix the downstream system ...
    /// broker.resume_group("billing", "orders").await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause_group(&self, group: &str, queue: &str) -> Result<(), PauseError> {
        self.set_paused(group, queue, true).await
    }

    /// Resumes a group paused by [`pause_group`](Broker::pause_group); waiting subscriptions
    /// continue at once. Resuming a group that is not paused does nothing.
    ///
    /// # Errors
    ///
    /// As for [`pause_group`](Broker::pause_group).
    ///
    /// # Cancel safety
    ///
    /// As for [`pause_group`](Broker::pause_group): the group is resumed or not.
    pub async fn resume_group(&self, group: &str, queue: &str) -> Result<(), PauseError> {
        self.set_paused(group, queue, false).await
    }

    async fn set_paused(&self, group: &str, queue: &str, paused: bool) -> Result<(), PauseError> {
        crate::name::validate(NameKind::Queue, queue)?;
        let Some(q) = self.queue_state(queue) else {
            return Err(PauseError::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
        };
        set_paused(&self.shared, &q, group, paused).await
    }

    /// Moves group `group` on `queue`, whichever its mode, as
    /// [`Group::reset_to`](crate::Group::reset_to) or
    /// [`WorkGroup::reset_to`](crate::WorkGroup::reset_to) would. Returns the sequence its
    /// next delivery starts at.
    ///
    /// # Errors
    ///
    /// As for those methods; [`ResetError::NoSuchGroup`] for an unknown queue or group.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the offset is either moved or not.
    pub async fn reset_group(&self, group: &str, queue: &str, to: crate::ResetTo) -> Result<u64, ResetError> {
        let missing = || ResetError::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() };
        if crate::name::validate(NameKind::Queue, queue).is_err()
            || crate::name::validate(NameKind::Group, group).is_err()
        {
            return Err(missing());
        }
        let q = self.queue_state(queue).ok_or_else(missing)?;
        let key = keys::offset_key(group, queue);
        if self.shared.engine.registry.work_groups.contains_key(&key) {
            crate::WorkGroup::new(self.shared.clone(), q, group).reset_to(to).await
        } else {
            crate::Group::new(self.shared.clone(), q, group).reset_to(to).await
        }
    }
}
