//! [`Delivery`]: one message handed to a consumer, and its acknowledgement.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::acks::SubShared;
use crate::error::AckError;
use crate::store::RawMessage;

/// A message delivered to a group, to be acknowledged with [`ack`](Delivery::ack).
///
/// Dropping a delivery without acknowledging it (or calling [`nack`](Delivery::nack)) hands it
/// back: the subscription delivers it again before newer messages, or, if the subscription is
/// gone, the group's next subscriber receives it. Delivery is at-least-once: a message is
/// redelivered until an ack for it (and for everything before it) has been committed.
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

static EMPTY: Bytes = Bytes::from_static(b"");

impl Delivery {
    pub(crate) fn new(msg: RawMessage, delivery_count: u32, sub: Arc<SubShared>) -> Self {
        Delivery { msg: Some(msg), delivery_count, sub }
    }

    fn msg(&self) -> Option<&RawMessage> {
        self.msg.as_ref()
    }

    /// The message's sequence in its queue.
    pub fn seq(&self) -> u64 {
        self.msg().map_or(0, |m| m.seq)
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        self.msg().map_or(&EMPTY, |m| &m.payload)
    }

    /// The headers, in the order they were added.
    pub fn headers(&self) -> &[(String, Bytes)] {
        self.msg().map_or(&[][..], |m| m.headers.as_slice())
    }

    /// The first header named `key`.
    pub fn header(&self, key: &str) -> Option<&Bytes> {
        self.headers().iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// When the message was sent: the broker's clock at the group commit that wrote it.
    /// Along one queue these times never decrease (except for messages moved by a
    /// redrive, which keep their original time).
    pub fn enqueued_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.msg().map_or(0, |m| m.enqueued_at_micros))
    }

    /// The queue this message is from.
    pub fn queue(&self) -> &str {
        &self.sub.group.queue.name
    }

    /// The group it was delivered to.
    pub fn group(&self) -> &str {
        &self.sub.group.name
    }

    /// How many times this subscription has handed out this message, starting at 1. Counted in
    /// memory: after a restart it starts again at 1.
    pub fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    /// Acknowledges the message. The group's committed offset advances once every message
    /// before this one is acknowledged too; commits are coalesced by the writer, so this does
    /// not wait for the disk (use [`Subscription::commit`](crate::Subscription::commit) to
    /// wait).
    ///
    /// # Errors
    ///
    /// [`AckError::Shutdown`] if the broker was shut down; the message will be redelivered
    /// after the next open.
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
    pub fn ack(mut self) -> Result<(), AckError> {
        if self.sub.shared.is_closed() {
            return Err(AckError::Shutdown);
        }
        if let Some(m) = self.msg.take() {
            let g = &self.sub.group;
            tracing::trace!(queue = %g.queue.name, group = %g.name, seq = m.seq, "rockq: acked");
            self.sub.ack(m.seq);
        }
        Ok(())
    }

    /// Hands the message back without acknowledging it: it is delivered again (to this
    /// subscription, before newer messages). Same as dropping the delivery.
    pub fn nack(self) {
        drop(self);
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(m) = self.msg.take() {
            self.sub.give_back(m, self.delivery_count);
        }
    }
}
