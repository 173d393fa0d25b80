//! The lifecycle half of [`Broker`]: looking a queue up without creating it, and deleting and
//! purging queues and groups. Every change is one request to the writer, applied in one
//! atomic write (`engine/writer/lifecycle.rs`).

use tokio::sync::oneshot;

use super::Broker;
use crate::engine::boundary::{LifecycleRequest, Request};
use crate::error::{Error, NameKind};
use crate::queue::Queue;

impl Broker {
    /// A handle to the queue `name` if it exists, without creating it (nothing is written).
    /// `None` for a queue that does not exist and for a name that is not a valid queue name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// match broker.get_queue("orders") {
    ///     Some(q) => println!("orders holds {} messages", q.len()),
    ///     None => println!("no orders queue"),
    /// }
    /// # }
    /// ```
    pub fn get_queue(&self, name: &str) -> Option<Queue> {
        crate::name::validate(NameKind::Queue, name).ok()?;
        if self.shared.is_closed() {
            return None;
        }
        let q = self.shared.queue(name).filter(|q| !q.is_deleted())?;
        Some(Queue::new(self.shared.clone(), q))
    }

    /// Deletes the queue `queue` with everything of it, in one atomic write: its record, every
    /// message, every group's offset, claims, delivery records and settings, its delayed
    /// messages, its idempotency keys and its redrive cursor. Returns `false` (and changes
    /// nothing) if there is no such queue.
    ///
    /// Once this returns:
    ///
    /// - [`get_queue`](Broker::get_queue) gives `None` and [`stats`](Broker::stats) no longer
    ///   lists it; [`queue`](Broker::queue) creates a new, empty queue under the name (with a
    ///   new internal id: nothing of the old one can show up in it). Ids are never reused,
    ///   across restarts too.
    /// - Every live [`Subscription`](crate::Subscription) and
    ///   [`WorkSubscription`](crate::WorkSubscription) of it yields
    ///   [`Error::GroupDeleted`](crate::Error::GroupDeleted) and then ends; a running
    ///   worker pool returns that error from [`Workers::run`](crate::Workers::run).
    ///   Deliveries and jobs still out fail to settle with
    ///   [`Error::GroupDeleted`](crate::Error::GroupDeleted), writing nothing.
    /// - Existing [`Queue`] handles refuse sends with
    ///   [`Error::QueueDeleted`](crate::Error::QueueDeleted). A send racing with the
    ///   deletion either resolved before it (its message was written, and is deleted with the
    ///   queue) or fails with that error (nothing of it was written).
    ///
    /// Recurring schedules ([`Broker::schedule`](crate::Broker::schedule)) that target the
    /// queue are kept: a schedule is a named object of its own, and its next firing creates the
    /// queue again. Delete them with [`Broker::delete_schedule`](crate::Broker::delete_schedule)
    /// first if the queue must stay gone. A work group's dead-letter queue is a queue of its
    /// own and is not deleted with it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] (nothing changed), [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once the request reached the writer, the queue is deleted whether
    /// or not the future is still awaited; calling again then returns `false`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// if broker.delete_queue("orders-2023").await? {
    ///     println!("deleted");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delete_queue(&self, queue: &str) -> Result<bool, Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        let (reply, rx) = oneshot::channel();
        let req = Request::Lifecycle(LifecycleRequest::DeleteQueue { name: queue.to_owned(), reply });
        self.shared.ask(req, rx).await
    }

    /// Deletes every message currently in the queue `queue` and moves every group past them,
    /// in one atomic write; returns how many messages were deleted (0 if there is no such
    /// queue). Sequences continue: the next message gets the next sequence, never a purged
    /// one.
    ///
    /// Every group moves to the queue's last sequence: ordered groups' offsets, work groups'
    /// offsets (their claims and waiting retries in the purged range go). Live subscriptions
    /// and worker pools keep running and simply see no purged message: not even one read
    /// ahead before the purge. Purged messages are not counted as skipped. A delivery of a
    /// purged message still out acks as a no-op; a job of one has lost its lease (settling or
    /// extending it fails with [`Error::LeaseLost`](crate::Error::LeaseLost)). Nothing
    /// is written for either.
    ///
    /// Delayed messages that are not due yet are not purged (cancel them with
    /// [`Queue::cancel`](crate::Queue::cancel)), and idempotency keys are kept: a message sent
    /// again with a purged message's key within the queue's dedup window is still a duplicate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] (nothing changed), [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once the request reached the writer, the queue is purged whether
    /// or not the future is still awaited; the count is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let removed = broker.purge_queue("orders").await?;
    /// println!("purged {removed} messages");
    /// # Ok(()) }
    /// ```
    pub async fn purge_queue(&self, queue: &str) -> Result<u64, Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        let (reply, rx) = oneshot::channel();
        let req = Request::Lifecycle(LifecycleRequest::PurgeQueue { name: queue.to_owned(), reply });
        self.shared.ask(req, rx).await
    }

    /// Deletes group `group` on `queue`, whichever its mode, in one atomic write: its offset,
    /// claims, delivery records and settings (pause flag, recorded dead-letter queue). Returns
    /// `false` (and changes nothing) if there is no such queue or group. The queue and its
    /// other groups are untouched.
    ///
    /// A live subscription or worker pool of the group ends as for
    /// [`delete_queue`](Broker::delete_queue), and its deliveries or jobs still out fail to
    /// settle with [`Error::GroupDeleted`](crate::Error::GroupDeleted). A later subscribe creates
    /// the group anew, starting where its `start_from` says.
    ///
    /// Purging a group (skipping everything it has not consumed) is
    /// [`reset_group`](Broker::reset_group) to
    /// [`ResetTo::Sequence`](crate::ResetTo::Sequence) of the queue's
    /// [`last_seq`](crate::Queue::last_seq) + 1.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an invalid queue or group name (nothing changed),
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once the request reached the writer, the group is deleted whether
    /// or not the future is still awaited; calling again then returns `false`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.delete_group("orders", "old-billing").await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_group(&self, queue: &str, group: &str) -> Result<bool, Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        crate::name::validate(NameKind::Group, group)?;
        self.shared.delete_group(queue, group).await
    }
}
