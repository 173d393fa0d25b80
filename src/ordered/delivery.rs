//! [`Delivery`]: one message handed to a consumer, and its acknowledgement.

use std::sync::Arc;
use std::time::Duration;

use super::acks::{Comeback, SubShared};
use crate::engine::boundary::RawMessage;
use crate::error::Error;

/// A message delivered to a group, to be acknowledged with [`ack`](Delivery::ack).
///
/// Dropping a delivery without acknowledging it (or calling [`nack`](Delivery::nack)) hands it
/// back: the subscription delivers it again before newer messages, or, if the subscription is
/// gone, the group's next subscriber receives it. [`nack_after`](Delivery::nack_after) hands
/// it back to be delivered again only after a delay, while newer messages flow. Delivery is
/// at-least-once: a message is redelivered until an ack for it (and for everything before it)
/// has been committed — or, with [`Group::max_deliveries`](crate::Group::max_deliveries), until
/// it has been delivered that many times, when it moves to the group's dead-letter queue.
#[must_use = "a delivery that is dropped without ack() is delivered again"]
pub struct Delivery {
    msg: Option<RawMessage>,
    delivery_count: u32,
    sub: Arc<SubShared>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &&*self.sub.group.queue.name)
            .field("group", &&*self.sub.group.name)
            .field("seq", &self.seq())
            .field("delivery_count", &self.delivery_count)
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

impl Delivery {
    pub(crate) fn new(msg: RawMessage, delivery_count: u32, sub: Arc<SubShared>) -> Self {
        Delivery { msg: Some(msg), delivery_count, sub }
    }

    crate::message::message_accessors!("delivery", "Delivery");

    /// Its message (`None` once it was handed back or settled).
    fn raw(&self) -> Option<&RawMessage> {
        self.msg.as_ref()
    }

    /// Its queue and group.
    fn names(&self) -> (&str, &str) {
        (&self.sub.group.queue.name, &self.sub.group.name)
    }

    /// How many times the group has delivered this message, starting at 1.
    ///
    /// Every delivery that came back without an ack (nack, `nack_after`, drop) counts, also
    /// across subscriptions and restarts: the count is persisted when the delivery comes back
    /// (in the writer's next round, coalesced with other writes). Not counted across a crash:
    /// a delivery still out when the process died (neither acked nor handed back), and a
    /// comeback whose record the writer had not written yet. Under
    /// [`Durability::Buffered`](crate::Durability::Buffered) a power loss can also roll back
    /// records since the last WAL sync. So the count never overstates deliveries, and may
    /// understate them after a crash.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(delivery: rockq::Delivery) -> Result<(), rockq::Error> {
    /// if delivery.delivery_count() > 3 {
    ///     delivery.dead_letter("failed 3 times")?;
    /// } else {
    ///     delivery.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    /// Acknowledges the message and returns at once: the ack is **queued**. The group's
    /// committed offset advances once every message before this one is acknowledged too; the
    /// writer commits offsets in its next round, coalesced with other writes. A crash before
    /// that commit delivers the message again (at-least-once). To wait until the ack is
    /// durable, use [`ack_durable`](Delivery::ack_durable).
    ///
    /// The same contract as [`Job::ack`](crate::Job::ack) on work-queue groups.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the broker was shut down; the message will be redelivered
    /// after the next open. [`Error::GroupDeleted`] if the group or its queue was deleted
    /// meanwhile (nothing is written). An ack of a message purged meanwhile succeeds and
    /// changes nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(mut sub: rockq::Subscription) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// while let Some(delivery) = sub.next().await {
    ///     let delivery = delivery?;
    ///     println!("{}: {:?}", delivery.seq(), delivery.payload());
    ///     delivery.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn ack(mut self) -> Result<(), Error> {
        if self.sub.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let g = &self.sub.group;
        if g.is_deleted() {
            // Dropped without a comeback: there is no group left to redeliver it to.
            self.msg = None;
            return Err(Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() });
        }
        if let Some(m) = self.msg.take() {
            let g = &self.sub.group;
            tracing::trace!(queue = %g.queue.name, group = %g.name, seq = m.seq, "rockq: acked");
            self.sub.ack(m.seq);
        }
        Ok(())
    }

    /// Acknowledges the message and waits until the ack is **durable**: the group's committed
    /// offset covers this message in the broker's [`Durability`](crate::Durability) sense.
    /// An ordered group's offset is contiguous, so this also waits for every earlier
    /// delivery of the group to be acknowledged (or dead-lettered); awaiting it while holding
    /// an earlier delivery unacknowledged never resolves.
    ///
    /// The same contract as [`Job::ack_durable`](crate::Job::ack_durable).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the broker is (or gets) shut down first;
    /// [`Error::Failed`] if it fails closed first (a write error); [`Error::GroupDeleted`] if
    /// the group or its queue is (or gets) deleted first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the ack is recorded before the first await; dropping the future only
    /// stops the waiting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(delivery: rockq::Delivery) -> Result<(), rockq::Error> {
    /// // An external side effect that must not be repeated for this message ...
    /// delivery.ack_durable().await?; // ... is followed by a durable offset.
    /// # Ok(()) }
    /// ```
    pub async fn ack_durable(self) -> Result<(), Error> {
        let (sub, seq) = (self.sub.clone(), self.seq());
        self.ack()?;
        let g = &sub.group;
        // A deletion pokes the queue's watch, not the offset: wake on both.
        let (mut poked, _watching) = g.queue.watch();
        loop {
            let moved = g.durable_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if g.durable.load(std::sync::atomic::Ordering::Acquire) >= seq {
                return Ok(());
            }
            if sub.shared.is_closed() {
                return Err(Error::Shutdown);
            }
            if let Some(failed) = sub.shared.failed() {
                // Failed closed: the offset will not become durable in this process.
                return Err(Error::Failed(failed));
            }
            if g.is_deleted() {
                return Err(Error::GroupDeleted {
                    queue: g.queue.name.to_string(),
                    group: g.name.to_string(),
                });
            }
            tokio::select! {
                _ = moved => {}
                _ = poked.changed() => {}
                _ = sub.shared.closing.cancelled() => {}
            }
        }
    }

    /// Gives up on the message now: it moves to the group's dead-letter queue
    /// ([`Group::dead_letter_queue`](crate::Group::dead_letter_queue), `<queue>.dlq` by
    /// default) with `reason`, and the group's offset can pass it. Queued like
    /// [`ack`](Delivery::ack): the writer moves it in its next round.
    ///
    /// The same contract as [`Job::dead_letter`](crate::Job::dead_letter).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the broker was shut down (or failed); the message will be
    /// redelivered after the next open. [`Error::GroupDeleted`] if the group or its queue was
    /// deleted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(delivery: rockq::Delivery) -> Result<(), rockq::Error> {
    /// if delivery.payload().is_empty() {
    ///     delivery.dead_letter("empty payload")?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn dead_letter(mut self, reason: impl std::fmt::Display) -> Result<(), Error> {
        let g = &self.sub.group;
        if g.is_deleted() {
            return Err(Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() });
        }
        if let Some(m) = self.msg.take()
            && !self.sub.dead_letter(m, self.delivery_count, reason.to_string())
        {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// Hands the message back without acknowledging it: it is delivered again (to this
    /// subscription, before newer messages), or dead-lettered if this was its last delivery
    /// ([`Group::max_deliveries`](crate::Group::max_deliveries)). Same as dropping the
    /// delivery.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(delivery: rockq::Delivery) -> Result<(), rockq::Error> {
    /// if delivery.payload().is_empty() {
    ///     delivery.nack(); // delivered again
    /// } else {
    ///     delivery.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nack(mut self) {
        self.give_back(Comeback::Nacked);
    }

    /// Hands the message back to be delivered again after `delay` on the broker's
    /// [`Clock`](crate::Clock) (no polling: the stream wakes when it is due). Meanwhile the
    /// subscription goes on with newer messages, within
    /// [`max_in_flight`](crate::Group::max_in_flight): the group's order becomes "sequence order
    /// except redeliveries", and its committed offset cannot pass the waiting message. The
    /// redelivery time is persisted with the delivery count, so it holds across a restart too.
    ///
    /// If this was the message's last delivery
    /// ([`Group::max_deliveries`](crate::Group::max_deliveries)) it is dead-lettered at once
    /// instead. A zero delay is [`nack`](Delivery::nack); delays longer than a year are
    /// clamped to a year.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(mut sub: rockq::Subscription) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// use std::time::Duration;
    /// while let Some(delivery) = sub.next().await {
    ///     let delivery = delivery?;
    ///     if delivery.payload().is_empty() {
    ///         delivery.nack_after(Duration::from_secs(30)); // try again in 30 s
    ///         continue;
    ///     }
    ///     delivery.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn nack_after(mut self, delay: Duration) {
        let how = if delay.is_zero() { Comeback::Nacked } else { Comeback::After(delay) };
        self.give_back(how);
    }

    fn give_back(&mut self, how: Comeback) {
        // A deleted group has nobody to redeliver to and nothing to record.
        if self.sub.group.is_deleted() {
            self.msg = None;
        }
        if let Some(m) = self.msg.take() {
            self.sub.give_back(m, self.delivery_count, how);
        }
    }
}

/// A transaction's view of a delivery: checked before the transaction goes to the writer,
/// then handed over whole (see `Transaction::commit`).
impl Delivery {
    /// The broker this delivery belongs to.
    pub(crate) fn shared(&self) -> &Arc<crate::engine::boundary::Shared> {
        &self.sub.shared
    }

    /// Why a transaction cannot ack this delivery now, if it cannot.
    pub(crate) fn tx_refusal(&self) -> Option<crate::error::Error> {
        let g = &self.sub.group;
        if g.is_deleted() {
            return Some(crate::error::Error::GroupDeleted {
                queue: g.queue.name.to_string(),
                group: g.name.to_string(),
            });
        }
        None
    }

    /// Hands the delivery to a transaction: from here the writer acks it, or hands it back to
    /// its subscription if it refuses the transaction (dropping this no longer does).
    pub(crate) fn into_tx(mut self) -> Option<crate::engine::boundary::TxDelivery> {
        let msg = self.msg.take()?;
        let sub: Arc<dyn crate::engine::boundary::LiveSubscription> = self.sub.clone();
        Some(crate::engine::boundary::TxDelivery {
            group: self.sub.group.clone(),
            sub,
            msg,
            deliveries: self.delivery_count,
        })
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.give_back(Comeback::Dropped);
    }
}
