//! [`Decoded`]: a subscription whose deliveries come with their payload decoded.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;

use super::delivery::Delivery;
use super::subscription::Subscription;
use crate::error::Error;

/// A [`Subscription`] whose items are `(T, Delivery)`: each payload decoded with the codec its
/// [`CODEC_HEADER`](crate::CODEC_HEADER) names. Made by [`Subscription::decoded`].
///
/// A payload that does not decode is **dead-lettered at once** (to the group's dead-letter
/// queue, with the [`DecodeError`](crate::DecodeError) as the reason, as
/// [`Delivery::dead_letter`] does) and yielded as `Err(Error::Decode(..))`; the stream then
/// goes on with the next message. No later attempt could decode it, and an ordered group must
/// not stop on it forever; the dead letter keeps it, for a fix and a redrive. A message whose
/// codec this build lacks ([`DecodeError::is_unknown_codec`](crate::DecodeError::is_unknown_codec))
/// is not the message's fault: it is yielded as the error, handed back, and the stream ends
/// (as after a read error), so a consumer built with the codec gets it. Other errors end the
/// stream as they end a [`Subscription`].
///
/// # Cancel safety
///
/// As [`Subscription`]: `next()` is cancel safe.
pub struct Decoded<T> {
    inner: Subscription,
    ended: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Decoded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("type", &std::any::type_name::<T>())
            .field("inner", &self.inner)
            .finish()
    }
}

impl Subscription {
    /// This subscription with every payload decoded as a `T` (see [`Decoded`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: u64 }
    ///
    /// let mut orders = queue.group("audit")?.subscribe().await?.decoded::<Order>();
    /// while let Some(item) = orders.next().await {
    ///     match item {
    ///         Ok((order, delivery)) => { println!("order {}", order.id); delivery.ack()?; }
    ///         Err(rockq::Error::Decode(e)) => eprintln!("dead-lettered: {e}"),
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn decoded<T: DeserializeOwned>(self) -> Decoded<T> {
        Decoded { inner: self, ended: false, _t: PhantomData }
    }
}

impl<T> Decoded<T> {
    /// The underlying subscription (for [`commit`](Subscription::commit) and
    /// [`committed`](Subscription::committed)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: u64 }
    /// let orders = queue.group("billing")?.subscribe().await?.decoded::<Order>();
    /// println!("committed up to #{}", orders.subscription().committed());
    /// # Ok(()) }
    /// ```
    pub fn subscription(&self) -> &Subscription {
        &self.inner
    }
}

impl<T: DeserializeOwned> Stream for Decoded<T> {
    type Item = Result<(T, Delivery), Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(delivery))) => Poll::Ready(Some(match delivery.decode::<T>() {
                Ok(value) => Ok((value, delivery)),
                Err(e) if e.is_unknown_codec() => {
                    // A build without the codec: nothing is wrong with the message. It goes
                    // back (dropped) and the stream ends, as after a read error: a consumer
                    // with the codec delivers it.
                    this.ended = true;
                    drop(delivery);
                    Err(Error::Decode(e))
                }
                Err(e) => {
                    tracing::warn!(queue = %delivery.queue(), group = %delivery.group(), seq = delivery.seq(), error = %e, "rockq: payload does not decode; dead-lettered");
                    // After a shutdown the delivery comes back at the next open instead.
                    let _ = delivery.dead_letter(&e);
                    Err(Error::Decode(e))
                }
            })),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
