//! [`EventStream`]: the broker's lifecycle events as a `Stream`, filtered by queue and group.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::{Future, Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::Broker;
use crate::events::Event;

/// The broker's [`Event`]s as a `Stream<Item = Event>`, optionally only those of one queue
/// and/or one group. Made by [`Broker::event_stream`].
///
/// Like [`Broker::events`], it sees the events sent after it was made, and a stream that
/// falls behind the bounded channel loses the oldest ones: they are skipped (never an error
/// that ends the stream) and counted in [`missed`](EventStream::missed), with a warning in the
/// log. The stream ends when [`Broker::shutdown`] has completed, after the last events (those
/// of pools draining and of the final flush).
///
/// # Cancel safety
///
/// `next()` is cancel safe: an event is taken from the channel only when returned.
pub struct EventStream {
    inner: BroadcastStream<Event>,
    /// Ends the stream once shutdown is complete (pools drained, the writer stopped: no event
    /// comes after), even while handles keep the channel's sender alive.
    closing: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    queue: Option<Arc<str>>,
    group: Option<Arc<str>>,
    missed: Arc<AtomicU64>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("queue", &self.queue)
            .field("group", &self.group)
            .field("missed", &self.missed())
            .finish()
    }
}

impl Broker {
    /// The broker's lifecycle events as a `Stream` (see [`EventStream`]); narrow it with
    /// [`queue`](EventStream::queue) and [`group`](EventStream::group).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// use futures::StreamExt;
    /// let mut dead = broker
    ///     .event_stream()
    ///     .queue("orders")
    ///     .filter(|e| std::future::ready(matches!(e, rockq::Event::DeadLettered { .. })));
    /// while let Some(event) = dead.next().await {
    ///     eprintln!("{event:?}");
    /// }
    /// # }
    /// ```
    pub fn event_stream(&self) -> EventStream {
        EventStream {
            inner: BroadcastStream::new(self.shared.events().subscribe()),
            closing: Box::pin(self.shared.stopped.clone().cancelled_owned()),
            queue: None,
            group: None,
            missed: Arc::default(),
        }
    }
}

impl EventStream {
    /// Only events about `queue` (see [`Event::queue`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// use futures::StreamExt;
    /// let mut orders = broker.event_stream().queue("orders");
    /// while let Some(event) = orders.next().await {
    ///     assert_eq!(event.queue(), "orders");
    /// }
    /// # }
    /// ```
    pub fn queue(mut self, queue: &str) -> Self {
        self.queue = Some(Arc::from(queue));
        self
    }

    /// Only events about group `group` (see [`Event::group`]; events about no group are
    /// left out).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// use futures::StreamExt;
    /// let mut billing = broker.event_stream().queue("orders").group("billing");
    /// while let Some(event) = billing.next().await {
    ///     assert_eq!(event.group(), Some("billing"));
    /// }
    /// # }
    /// ```
    pub fn group(mut self, group: &str) -> Self {
        self.group = Some(Arc::from(group));
        self
    }

    /// Events lost because this stream fell behind the channel (of any queue or group: the
    /// filter runs after the channel).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// use futures::StreamExt;
    /// let mut events = broker.event_stream();
    /// while let Some(event) = events.next().await {
    ///     println!("{event:?} ({} missed so far)", events.missed());
    /// }
    /// # }
    /// ```
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    fn wanted(&self, e: &Event) -> bool {
        self.queue.as_deref().is_none_or(|q| e.queue() == q)
            && self.group.as_deref().is_none_or(|g| e.group() == Some(g))
    }
}

impl Stream for EventStream {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        loop {
            match this.inner.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(e))) if this.wanted(&e) => return Poll::Ready(Some(e)),
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(n)))) => {
                    this.missed.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(missed = n, "rockq: event stream fell behind; events lost");
                }
                Poll::Ready(None) => return Poll::Ready(None),
                // Everything sent before the writer stopped was taken above.
                Poll::Pending => return this.closing.as_mut().poll(cx).map(|()| None),
            }
        }
    }
}
