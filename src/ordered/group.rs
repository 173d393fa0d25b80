//! [`Group`]: a named consumer group on one queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::acks::{PoisonConfig, SubShared};
use super::subscription::Subscription;
use crate::engine::boundary::{
    LiveSubscription, OrderedGroupState, OrderedRequest, QueueState, Request, Shared,
};
use crate::error::{Error, NameKind};
use crate::model::StartFrom;
use crate::name::MAX_NAME_LEN;
use crate::retention::ResetTo;

/// A consumer group on one queue, in ordered mode: one active subscriber at a time receives
/// the queue's messages in sequence order and the group's offset records its progress.
///
/// Groups are independent: each has its own offset, and one group's acks never move another's.
/// Obtained from [`Queue::group`](crate::Queue::group); configuring it writes nothing.
#[derive(Clone)]
pub struct Group {
    shared: Arc<Shared>,
    queue: Arc<QueueState>,
    name: Arc<str>,
    start: StartFrom,
    max_unacked: usize,
    read_batch: usize,
    max_deliveries: Option<u32>,
    dlq: Option<String>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("name", &self.name).field("queue", &self.queue.name).finish()
    }
}

impl Group {
    pub(crate) fn new(shared: Arc<Shared>, queue: Arc<QueueState>, name: &str) -> Self {
        Group {
            shared,
            queue,
            name: Arc::from(name),
            start: StartFrom::Earliest,
            max_unacked: 1024,
            read_batch: 256,
            max_deliveries: None,
            dlq: None,
        }
    }

    crate::group_admin::group_admin!("group", "billing");

    /// Where to start if the group does not exist yet. Default [`StartFrom::Earliest`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::StartFrom;
    /// // A new group that only sees messages sent from now on.
    /// let sub = queue.group("live-view")?.start_from(StartFrom::Latest).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Most deliveries a subscription hands out beyond the committed offset (acknowledged out
    /// of order or not at all) before it waits for acks. Default 1024, at least 1. The same
    /// knob as [`WorkGroup::max_in_flight`](crate::WorkGroup::max_in_flight).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let sub = queue.group("audit")?.max_in_flight(64).read_batch(64).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_unacked = n.max(1);
        self
    }

    /// Renamed [`max_in_flight`](Group::max_in_flight), the name work groups use too.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// #[allow(deprecated)]
    /// let group = queue.group("audit")?.max_unacked(64);
    /// let group = queue.group("audit")?.max_in_flight(64); // the new name
    /// # Ok(()) }
    /// ```
    #[deprecated(since = "0.2.0", note = "renamed max_in_flight, as on WorkGroup")]
    pub fn max_unacked(self, n: usize) -> Self {
        self.max_in_flight(n)
    }

    /// Most messages read from storage at once. Default 256, at least 1. The same knob as
    /// [`WorkGroup::read_batch`](crate::WorkGroup::read_batch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// // Small messages, read in large batches.
    /// let sub = queue.group("indexer")?.read_batch(1024).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_batch(mut self, n: usize) -> Self {
        self.read_batch = n.max(1);
        self
    }

    /// Poison messages: a message whose `n`th delivery comes back without an ack (nacked,
    /// [`nack_after`](crate::Delivery::nack_after), or dropped) is moved to the group's
    /// [dead-letter queue](Group::dead_letter_queue) instead of being delivered again, and the
    /// group goes on past it. Default: unlimited (a message is redelivered until acked).
    /// `n` is at least 1 (0 counts as 1: dead-letter on the first failure).
    ///
    /// The move is one atomic write: the dead-letter copy (same format as a work group's:
    /// original payload and headers plus `rockq-dlq-*` headers, `rockq-dlq-attempts` being the
    /// deliveries) and a record marking the message done for this group, so a crash never
    /// leaves both a dead letter and a redelivery. The offset passes it in the same write
    /// unless an earlier delivery is still unacknowledged.
    /// Deliveries are counted as [`Delivery::delivery_count`](crate::Delivery::delivery_count)
    /// says: a delivery in flight when the process crashes is not counted, so a message that
    /// crashes the process is not caught by this (use a [`WorkGroup`](crate::WorkGroup), whose
    /// attempts are written before each delivery).
    ///
    /// Ordering: the group's sequence order then has holes where messages were
    /// dead-lettered; a [redrive](crate::DeadLetters::redrive) appends them to the queue again
    /// with new sequences, after everything already in it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let sub = queue.group("billing")?.max_deliveries(5).subscribe().await?; // then orders.dlq
    /// # Ok(()) }
    /// ```
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n.max(1));
        self
    }

    /// The dead-letter queue for [`max_deliveries`](Group::max_deliveries). Default
    /// `<queue>.dlq`, like work groups (so [`Broker::dead_letters`](crate::Broker::dead_letters)
    /// and redrive work on it unchanged). The name is validated at
    /// [`subscribe`](Group::subscribe), which refuses the group's own queue
    /// ([`Error::InvalidOption`]): its dead letters would come back to it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let sub = queue
    ///     .group("billing")?
    ///     .max_deliveries(5)
    ///     .dead_letter_queue("billing.poison")
    ///     .subscribe()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn dead_letter_queue(mut self, name: impl Into<String>) -> Self {
        self.dlq = Some(name.into());
        self
    }

    /// The group's engine state, once it exists.
    fn state(&self) -> Option<Arc<OrderedGroupState>> {
        // Only this handle's queue (see `WorkGroup::state`).
        self.shared.ordered_group(&self.name, &self.queue.name).filter(|g| Arc::ptr_eq(&g.queue, &self.queue))
    }

    /// The dead-letter settings of a subscription. The default queue name is checked only when
    /// it is used, so a group without `max_deliveries` on a long queue name still subscribes.
    fn poison_config(&self) -> Result<PoisonConfig, Error> {
        let dlq = match &self.dlq {
            Some(n) => {
                crate::name::validate(NameKind::Queue, n)?;
                crate::model::check_dead_letter_queue(&self.queue.name, &self.name, n)
                    .map_err(Error::InvalidOption)?;
                Arc::from(n.as_str())
            }
            None => {
                let n = crate::model::default_dead_letter_queue(&self.queue.name);
                if n.len() > MAX_NAME_LEN && self.max_deliveries.is_some() {
                    return Err(Error::DeadLetterName { queue: self.queue.name.to_string() });
                }
                Arc::from(n)
            }
        };
        Ok(PoisonConfig { max_deliveries: self.max_deliveries, dlq })
    }

    /// Replays: moves the group's committed offset so that its next subscription starts at the
    /// given sequence, or at the first message enqueued at or after the given time. The
    /// target must still be retained. Returns the sequence the next subscription starts at.
    ///
    /// # Errors
    ///
    /// [`Error::Active`] while a subscription of the group is alive,
    /// [`Error::NoSuchGroup`] if it never subscribed, [`Error::OutOfRange`] for a
    /// sequence before the first live one or past the end, or a time older than the oldest
    /// retained message; [`Error::Shutdown`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before the reset was queued, nothing changes; after, the reset
    /// still lands, and no subscription of the group can start until it has (the group stays
    /// held until the writer has made it durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::{Duration, SystemTime};
    /// let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    /// queue.group("billing")?.reset_to(rockq::ResetTo::Time(hour_ago)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset_to(&self, to: ResetTo) -> Result<u64, Error> {
        let shared = &self.shared;
        if shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let names = || (self.name.to_string(), self.queue.name.to_string());
        let Some(group) = self.state() else {
            let (group, queue) = names();
            return Err(Error::NoSuchGroup { group, queue });
        };
        // Held for the reset, so no subscription starts from the old offset meanwhile.
        if group.active.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            let (group, queue) = names();
            return Err(Error::Active { group, queue });
        }
        let mut release = ActiveGuard { group: &group, armed: true };
        let seq = shared.reset_target(&self.queue, to).await?;
        let (reply, rx) = oneshot::channel();
        let req = Request::Ordered(OrderedRequest::Reset { group: group.clone(), offset: seq - 1, reply });
        shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        // Queued: the writer releases the slot once the reset is durable (or refused), even if
        // this future is dropped now.
        release.armed = false;
        rx.await.map_err(|_| Error::Shutdown)??;
        tracing::info!(group = %self.name, queue = %self.queue.name, seq, "rockq: group reset");
        Ok(seq)
    }

    /// Starts receiving the group's messages, after its committed offset (or, for a new group,
    /// from [`start_from`](Group::start_from); the group's record is written first so that
    /// a restart resumes from the same place).
    ///
    /// # Errors
    ///
    /// [`Error::Active`] while another subscription of this group on this
    /// queue is alive (its stream or any of its deliveries): ordered mode has one active
    /// subscriber, and a second one is refused rather than queued as a standby.
    /// [`Error::OutOfRange`] for a bad [`StartFrom::Sequence`],
    /// [`Error::InvalidName`] for a bad [dead-letter queue](Group::dead_letter_queue)
    /// name, [`Error::DeadLetterName`] if [`max_deliveries`](Group::max_deliveries) is
    /// set and the default one would be too long, [`Error::Shutdown`],
    /// [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped future holds no subscription (the group may have been created).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut sub = queue.group("billing")?.subscribe().await?;
    /// if let Some(d) = sub.next().await {
    ///     d?.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(&self) -> Result<Subscription, Error> {
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if self.queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: self.queue.name.to_string() });
        }
        let poison = self.poison_config()?;
        if self.shared.work_group(&self.name, &self.queue.name).is_some() {
            return Err(Error::WrongMode {
                group: self.name.to_string(),
                queue: self.queue.name.to_string(),
                existing: "work-queue",
            });
        }
        let group = match self.state() {
            Some(g) => g,
            None => {
                let (reply, rx) = oneshot::channel();
                let req = Request::Ordered(OrderedRequest::Create {
                    queue: self.queue.clone(),
                    group: self.name.to_string(),
                    start: self.start,
                    reply,
                });
                self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
                rx.await.map_err(|_| Error::Shutdown)??
            }
        };
        if group.active.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(Error::Active { group: self.name.to_string(), queue: self.queue.name.to_string() });
        }
        // Across processes (an etcd broker), the group's one active subscriber is held by a
        // lease; its offset and marks are read afresh from where the last owner left them.
        let mut release = ActiveGuard { group: &group, armed: true };
        let owner = self.shared.own_ordered(&group).await?;
        release.armed = false;
        let resume = group.acked.load(Ordering::Acquire) + 1;
        let first = self.queue.first_seq.load(Ordering::Acquire);
        let sub = SubShared::new(self.shared.clone(), group.clone(), resume, self.max_unacked, poison, owner);
        let live: std::sync::Weak<dyn LiveSubscription> = Arc::downgrade(&sub) as _;
        *group.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(live);
        // Retention may have deleted messages the group never received: jump (and report it).
        sub.skip_to(first);
        let start = resume.max(first);
        tracing::debug!(group = %self.name, queue = %self.queue.name, start, "rockq: subscribed");
        Ok(Subscription::new(sub, self.queue.clone(), start, self.read_batch))
    }
}

/// Releases a group's active slot taken for a reset, unless the reset request was queued
/// (the writer releases it then).
struct ActiveGuard<'a> {
    group: &'a OrderedGroupState,
    armed: bool,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.group.active.store(false, Ordering::Release);
        }
    }
}
