//! [`TypedQueue`]: a [`Queue`] that encodes values with a [`Codec`].

use std::borrow::Borrow;
use std::marker::PhantomData;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use serde::Serialize;

use super::handle::Queue;
use crate::codec::{CODEC_HEADER, Codec};
use crate::error::Error;
use crate::message::Message;
use crate::sent::Sent;

/// A queue of `T`s: each send encodes its value with codec `C` and stamps the codec's name in
/// the [`CODEC_HEADER`](crate::CODEC_HEADER) header. Consumers decode with
/// [`Delivery::decode`](crate::Delivery::decode), [`Task::decode`](crate::Task::decode) or a
/// pool's [`run_typed`](crate::Workers::run_typed). Obtained from [`Queue::typed`] or
/// [`Queue::typed_with`]; cheap to clone.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), rockq::Error> {
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order { id: u64 }
///
/// # let dir = tempfile::tempdir()?;
/// let broker = rockq::Broker::open(dir.path()).await?;
/// let orders = broker.queue("orders").await?.typed::<Order>();
/// let seq = orders.send(&Order { id: 1 }).await?;
/// // A delay, a key, an idempotency key or headers: the same builder as `Message`.
/// orders.with(&Order { id: 2 }).deliver_after(std::time::Duration::from_secs(60)).submit().await?;
/// # assert_eq!(seq, 1);
/// # broker.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct TypedQueue<T, C> {
    queue: Queue,
    codec: C,
    _type: PhantomData<Arc<T>>,
}

impl<T, C: Clone> Clone for TypedQueue<T, C> {
    fn clone(&self) -> Self {
        TypedQueue { queue: self.queue.clone(), codec: self.codec.clone(), _type: PhantomData }
    }
}

impl<T, C: Codec> std::fmt::Debug for TypedQueue<T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedQueue")
            .field("queue", &self.queue.name())
            .field("type", &std::any::type_name::<T>())
            .field("codec", &C::NAME)
            .finish()
    }
}

impl Queue {
    /// This queue as a queue of `T`s encoded as JSON (feature `json`, on by default).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// #[derive(serde::Serialize)]
    /// struct Email<'a> { to: &'a str }
    /// queue.typed::<Email>().send(&Email { to: "a@example.com" }).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "json")]
    pub fn typed<T: Serialize>(&self) -> TypedQueue<T, crate::codec::Json> {
        self.typed_with(crate::codec::Json)
    }

    /// This queue as a queue of `T`s encoded with `codec`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[cfg(feature = "postcard")]
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let ticks = queue.typed_with::<u64, _>(rockq::Postcard);
    /// ticks.send(&42).await?;
    /// # Ok(()) }
    /// ```
    pub fn typed_with<T: Serialize, C: Codec>(&self, codec: C) -> TypedQueue<T, C> {
        TypedQueue { queue: self.clone(), codec, _type: PhantomData }
    }
}

impl<T: Serialize, C: Codec> TypedQueue<T, C> {
    /// The untyped queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let ids = queue.typed::<Vec<u64>>();
    /// ids.send(&vec![1, 2, 3]).await?;
    /// println!("{} now holds {} messages", ids.queue().name(), ids.queue().len());
    /// # Ok(()) }
    /// ```
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Starts a typed send of `value` with the same builder as [`Message`] — key,
    /// idempotency key, headers, delay — ended by [`send`](TypedSend::send) or
    /// [`submit`](TypedSend::submit). The value is encoded now; an encoding error is returned
    /// by the send.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(orders: rockq::TypedQueue<u64, rockq::Json>) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// orders.with(&7).key("customer-3").idempotency_key("order-7").send().await?;
    /// orders.with(&8).deliver_after(Duration::from_secs(60)).submit().await?;
    /// # Ok(()) }
    /// ```
    pub fn with(&self, value: &T) -> TypedSend<'_, T, C> {
        TypedSend { queue: self, message: self.encode(0, value) }
    }

    /// Encodes `value` into a [`Message`] stamped with the codec, to add a key, an idempotency
    /// key, headers or a delay before sending it with [`Queue::send`] or [`Queue::submit`]
    /// ([`with`](TypedQueue::with) does the same in one chain).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the codec cannot encode `value`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(orders: rockq::TypedQueue<u64, rockq::Json>) -> Result<(), rockq::Error> {
    /// let m = orders.message(&7)?.idempotency_key("order-7");
    /// orders.queue().submit(m).await?;
    /// # Ok(()) }
    /// ```
    pub fn message(&self, value: &T) -> Result<Message, Error> {
        self.encode(0, value)
    }

    fn encode(&self, index: usize, value: &T) -> Result<Message, Error> {
        let bytes = self.codec.encode(value).map_err(|e| Error::Encode {
            index,
            codec: C::NAME,
            source: Arc::from(e),
        })?;
        Ok(Message::new(bytes).header(CODEC_HEADER, C::NAME))
    }

    /// Encodes and sends `value`; as [`Queue::send`].
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] (nothing is sent), then as [`Queue::send`].
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::send`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(orders: rockq::TypedQueue<String, rockq::Json>) -> Result<(), rockq::Error> {
    /// let seq = orders.send(&"tea".to_string()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send(&self, value: &T) -> Result<u64, Error> {
        self.queue.send(self.encode(0, value)?).await
    }

    /// Encodes `values` and sends them atomically; as [`Queue::send_batch`].
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] naming the first value that does not encode (nothing is sent),
    /// then as [`Queue::send_batch`].
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::send_batch`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(orders: rockq::TypedQueue<u32, rockq::Json>) -> Result<(), rockq::Error> {
    /// let seqs = orders.send_batch([1, 2, 3]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_batch<I>(&self, values: I) -> Result<RangeInclusive<u64>, Error>
    where
        I: IntoIterator,
        I::Item: Borrow<T>,
    {
        let msgs = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| self.encode(i, v.borrow()))
            .collect::<Result<Vec<_>, _>>()?;
        self.queue.send_batch(msgs).await
    }

    /// Encodes `value` and submits it; as [`Queue::submit`] (for a typed message with a delay
    /// or an idempotency key, build it with [`message`](TypedQueue::message)).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`], then as [`Queue::submit`].
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::submit`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(orders: rockq::TypedQueue<u32, rockq::Json>) -> Result<(), rockq::Error> {
    /// let sent = orders.submit(&5).await?;
    /// # Ok(()) }
    /// ```
    pub async fn submit(&self, value: &T) -> Result<Sent, Error> {
        self.queue.submit(self.encode(0, value)?).await
    }
}

/// One typed message being built: [`TypedQueue::with`]. The builder methods are
/// [`Message`]'s; [`send`](TypedSend::send) or [`submit`](TypedSend::submit) sends it.
#[must_use = "nothing is sent until `send` or `submit`"]
pub struct TypedSend<'a, T, C> {
    queue: &'a TypedQueue<T, C>,
    /// The encoded message, or why the value did not encode (returned by the send).
    message: Result<Message, Error>,
}

impl<T, C> std::fmt::Debug for TypedSend<'_, T, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedSend").field("queue", &self.queue.queue).field("message", &self.message).finish()
    }
}

impl<T: Serialize, C: Codec> TypedSend<'_, T, C> {
    fn map(mut self, f: impl FnOnce(Message) -> Message) -> Self {
        self.message = self.message.map(f);
        self
    }

    /// Adds a header; see [`Message::header`].
    pub fn header(self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.map(|m| m.header(key, value))
    }

    /// Sets the ordering key; see [`Message::key`].
    pub fn key(self, key: impl Into<String>) -> Self {
        self.map(|m| m.key(key))
    }

    /// Sets the idempotency key; see [`Message::idempotency_key`].
    pub fn idempotency_key(self, key: impl Into<String>) -> Self {
        self.map(|m| m.idempotency_key(key))
    }

    /// Sets the priority; see [`Message::priority`].
    pub fn priority(self, priority: u8) -> Self {
        self.map(|m| m.priority(priority))
    }

    /// Delays it by `delay`; see [`Message::deliver_after`] (send it with
    /// [`submit`](TypedSend::submit)).
    pub fn deliver_after(self, delay: Duration) -> Self {
        self.map(|m| m.deliver_after(delay))
    }

    /// Delays it until `at`; see [`Message::deliver_at`] (send it with
    /// [`submit`](TypedSend::submit)).
    pub fn deliver_at(self, at: SystemTime) -> Self {
        self.map(|m| m.deliver_at(at))
    }

    /// The message as built (for a batch, or a transaction's `send`).
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the value did not encode.
    pub fn into_message(self) -> Result<Message, Error> {
        self.message
    }

    /// Sends it; as [`Queue::send`].
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] (nothing is sent), then as [`Queue::send`].
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::send`].
    pub async fn send(self) -> Result<u64, Error> {
        self.queue.queue.send(self.message?).await
    }

    /// Submits it (delayed or deduplicated messages); as [`Queue::submit`].
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] (nothing is sent), then as [`Queue::submit`].
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::submit`].
    pub async fn submit(self) -> Result<Sent, Error> {
        self.queue.queue.submit(self.message?).await
    }
}
