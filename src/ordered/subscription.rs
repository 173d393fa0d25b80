//! [`Subscription`]: a group's deliveries as a `futures::Stream`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::WatchStream;

use super::acks::{MAX_NACK_DELAY, SubShared};
use super::delivery::Delivery;
use crate::engine::boundary::{QueueState, RawMessage, ReadOutcome, Request, Watching};
use crate::error::Error;

/// Upper bound on the bytes of one storage read, whatever `read_batch` says.
const READ_BYTES: usize = 4 << 20;

type ReadTask = JoinHandle<Result<ReadOutcome, Error>>;

/// The first wait before reading again after the store could not be reached.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// A wait on the broker's clock for the first delayed redelivery, with its deadline. (In a
/// `Mutex` only to keep `Subscription: Sync`; it is polled through `&mut`, never locked.)
type Timer = (Instant, std::sync::Mutex<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>);

/// The deliveries of one group on one queue, in sequence order: a
/// `Stream<Item = Result<Delivery, Error>>`.
///
/// Reads happen in batches on Tokio's blocking pool with bounded iterators, one batch ahead of
/// the consumer. When caught up, the stream waits for the writer to publish new messages of
/// this queue — no polling. At most [`Group::max_in_flight`](crate::Group::max_in_flight)
/// deliveries are outstanding beyond the committed offset; past that the stream waits for acks.
///
/// The stream ends (`None`) when the broker shuts down. It yields an `Err` and then ends if a
/// message cannot be read or decoded: an ordered group never skips a message.
///
/// Works with every `StreamExt`/`TryStreamExt` combinator; acks may come in any order.
///
/// # Cancel safety
///
/// `next()` (`StreamExt::next`) is cancel safe: a read in progress and the messages read ahead
/// stay with the subscription, and a delivery is counted as handed out only when `next()`
/// returns it. Dropping a `next()` future (a `select!` branch losing) loses no message; the
/// next call continues in order.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
/// use futures::{StreamExt, TryStreamExt};
///
/// let sub = queue.group("audit")?.subscribe().await?;
/// sub.take(100)
///     .map_ok(|d| async move {
///         // ... handle d.payload() ...
///         d.ack().map_err(rockq::Error::from)
///     })
///     .try_buffer_unordered(16)
///     .try_collect::<Vec<()>>()
///     .await?;
/// # Ok(()) }
/// ```
pub struct Subscription {
    sub: Arc<SubShared>,
    queue: Arc<QueueState>,
    changes: WatchStream<u64>,
    /// Counts us as a watcher of the queue while `changes` lives.
    _watching: Watching,
    /// Last sequence the writer published that we know of.
    known_last: u64,
    /// Next sequence to read from storage.
    next_read: u64,
    buffer: VecDeque<RawMessage>,
    reading: Option<ReadTask>,
    read_batch: usize,
    /// The wait before reading again after the store could not be reached (doubles while
    /// it stays so; back to the start after a read succeeds).
    read_backoff: Duration,
    done: bool,
    /// The queue's purge mark last applied to the handed-back deliveries.
    purge_seen: u64,
    /// Deliveries not yet added to the metrics counter (flushed once per batch).
    delivered: u64,
    /// Wakes the stream when the first `nack_after` redelivery is due.
    timer: Option<Timer>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("queue", &self.queue.name)
            .field("group", &self.sub.group.name)
            .field("next_read", &self.next_read)
            .finish()
    }
}

impl Subscription {
    pub(crate) fn new(sub: Arc<SubShared>, queue: Arc<QueueState>, start: u64, read_batch: usize) -> Self {
        let (rx, watching) = queue.watch();
        let known_last = queue.last_seq();
        Subscription {
            sub,
            changes: WatchStream::from_changes(rx),
            _watching: watching,
            known_last,
            next_read: start,
            buffer: VecDeque::new(),
            reading: None,
            queue,
            read_batch,
            read_backoff: FIRST_BACKOFF,
            done: false,
            purge_seen: 0,
            delivered: 0,
            timer: None,
        }
    }

    /// The group's committed offset as last made durable.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(mut sub: rockq::Subscription) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// if let Some(delivery) = sub.next().await {
    ///     delivery?.ack_durable().await?;
    /// }
    /// println!("committed up to #{}", sub.committed());
    /// # Ok(()) }
    /// ```
    pub fn committed(&self) -> u64 {
        self.sub.group.durable.load(Ordering::Acquire)
    }

    /// Waits until every acknowledgement made so far is committed durably, and returns the
    /// committed offset. Commits happen anyway, coalesced; this is for callers that must know.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] after shutdown, [`Error::Storage`] if the write failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future does not undo or delay the commit.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(mut sub: rockq::Subscription) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// for _ in 0..100 {
    ///     let Some(delivery) = sub.next().await else { break };
    ///     delivery?.ack()?; // queued, returns at once
    /// }
    /// let offset = sub.commit().await?; // now durable
    /// println!("committed up to #{offset}");
    /// # Ok(()) }
    /// ```
    pub async fn commit(&self) -> Result<u64, Error> {
        let shared = &self.sub.shared;
        if shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let (reply, rx) = oneshot::channel();
        shared.tx.send(Request::Flush { reply }).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)??;
        Ok(self.committed())
    }

    fn deliver(&mut self, msg: RawMessage, count: u32) -> Poll<Option<Result<Delivery, Error>>> {
        self.delivered += 1;
        // Flushed every 32 too, so a busy stream's counter never lags far behind its acks.
        if self.delivered >= 32 {
            self.flush_metrics();
        }
        let g = &self.sub.group;
        tracing::trace!(queue = %g.queue.name, group = %g.name, seq = msg.seq, delivery = count, "rockq: delivered");
        Poll::Ready(Some(Ok(Delivery::new(msg, count, self.sub.clone()))))
    }

    /// Adds the deliveries since the last flush to the metrics counter.
    fn flush_metrics(&mut self) {
        let g = &self.sub.group;
        crate::telemetry::delivered(&g.queue.name, &g.name, "ordered", std::mem::take(&mut self.delivered));
    }

    fn start_read(&mut self) {
        self.flush_metrics();
        let from = self.next_read;
        let to = self.known_last.min(from.saturating_add(self.read_batch as u64 - 1));
        let shared = self.sub.shared.clone();
        let queue = self.queue.clone();
        self.reading = Some(
            shared.runtime.clone().spawn_blocking(move || shared.read_range(&queue, from, to, READ_BYTES)),
        );
    }

    /// The store could not be reached (`e` is transient; on etcd, no member answered within
    /// the request timeout): the subscription does not end. It reports the outage
    /// (`Event::StoreUnavailable`) and reads the same range again after a backoff.
    fn read_again_later(&mut self, e: crate::error::StorageError) {
        let from = self.next_read;
        let to = self.known_last.min(from.saturating_add(self.read_batch as u64 - 1));
        let shared = self.sub.shared.clone();
        let queue = self.queue.clone();
        let group = self.sub.group.name.clone();
        let mut backoff = self.read_backoff;
        self.read_backoff = (backoff * 2).min(Duration::from_secs(2));
        self.reading = Some(shared.runtime.clone().spawn(async move {
            if !shared.ride_out(&queue.name, &group, &e, &mut backoff).await {
                return Ok(ReadOutcome::Closed);
            }
            let reader = shared.clone();
            match shared.runtime.spawn_blocking(move || reader.read_range(&queue, from, to, READ_BYTES)).await
            {
                Ok(res) => res,
                Err(join) => Err(Error::Internal(format!("read task failed: {join}"))),
            }
        }));
    }

    /// Polls the wait for the first delayed redelivery (re-armed when that changes). True if
    /// it is due: the caller goes round again to hand it out.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(due) = self.sub.window().next_due() else {
            self.timer = None;
            return false;
        };
        if self.timer.as_ref().is_none_or(|(at, _)| *at != due) {
            let clock = self.sub.shared.clock().clone();
            let sleep: Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
                Box::pin(async move { clock.sleep_until(due).await });
            self.timer = Some((due, std::sync::Mutex::new(sleep)));
        }
        let fired = self.timer.as_mut().is_some_and(|(_, t)| {
            t.get_mut().unwrap_or_else(|p| p.into_inner()).as_mut().poll(cx).is_ready()
        });
        if fired {
            self.timer = None;
        }
        fired
    }

    /// Ends the stream, optionally with a last error item.
    fn end(&mut self, last: Option<Error>) -> Poll<Option<Result<Delivery, Error>>> {
        self.flush_metrics();
        self.done = true;
        self.buffer.clear();
        Poll::Ready(last.map(Err))
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        this.sub.waker.register(cx.waker());
        loop {
            if this.sub.shared.is_closed() {
                return this.end(None);
            }
            if this.sub.group.is_deleted() {
                let g = &this.sub.group;
                let e = Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() };
                return this.end(Some(e));
            }
            if this.sub.group.ownership_lost() {
                let g = &this.sub.group;
                let e = Error::OwnershipLost { queue: g.queue.name.to_string(), group: g.name.to_string() };
                return this.end(Some(e));
            }
            // A purge deleted messages read ahead (or handed back) but not handed out yet: they
            // are gone for the group too (the window counts them done without an entry).
            // Retention's trims keep what was read, as they always did.
            let purged = this.queue.purged_through.load(Ordering::Acquire);
            if this.buffer.front().is_some_and(|m| m.seq <= purged) {
                while this.buffer.front().is_some_and(|m| m.seq <= purged) {
                    this.buffer.pop_front();
                }
                this.sub.skip_to(purged.saturating_add(1));
            }
            if purged > this.purge_seen {
                // Handed back before the purge (nacked, delayed) and not in the buffer: gone
                // too, counted done (`skip_to` drops them from the window).
                this.purge_seen = purged;
                this.sub.skip_to(purged.saturating_add(1));
            }
            if this.sub.group.paused.load(Ordering::Acquire) {
                // Paused: hand out nothing. Resuming touches the queue's watch, waking us.
                match this.changes.poll_next_unpin(cx) {
                    Poll::Ready(Some(last)) => {
                        this.known_last = this.known_last.max(last).max(this.queue.last_seq());
                        continue;
                    }
                    Poll::Ready(None) => return this.end(None),
                    Poll::Pending => return Poll::Pending,
                }
            }
            {
                let mut w = this.sub.window();
                if !w.delayed.is_empty() {
                    w.release_due(this.sub.shared.clock().now());
                }
                // Handed-back deliveries go first: they are older than anything buffered.
                if let Some((_, (msg, count))) = w.redeliver.pop_first() {
                    drop(w);
                    return this.deliver(msg, count.saturating_add(1));
                }
                if !this.sub.is_full(&w)
                    && let Some(msg) = this.buffer.pop_front()
                {
                    let seq = msg.seq;
                    if seq < w.next() {
                        // Passed already: dead-lettered right after the offset.
                        continue;
                    }
                    w.push(seq);
                    if w.is_dead(seq) {
                        // Dead-lettered by an earlier subscription: done, never delivered again.
                        let advanced = w.ack(seq);
                        drop(w);
                        this.sub.advanced(advanced);
                        continue;
                    }
                    let mut count = 1;
                    if !w.prior.is_empty()
                        && let Some((failed, not_before)) = w.prior.remove(&seq)
                    {
                        count = failed.saturating_add(1);
                        let clock = this.sub.shared.clock();
                        let wall = clock.wall_micros();
                        if not_before > wall {
                            // Nacked with a delay before a restart: it still waits (never longer
                            // than the longest delay, whatever the record says).
                            let wait = Duration::from_micros(not_before - wall).min(MAX_NACK_DELAY);
                            let now = clock.now();
                            let due = now.checked_add(wait).unwrap_or(now);
                            w.delayed.insert((due, seq), (msg, failed));
                            drop(w);
                            continue;
                        }
                    }
                    drop(w);
                    // Read the next batch while the consumer works through the second half of
                    // this one.
                    if this.reading.is_none()
                        && this.buffer.len() <= this.read_batch / 2
                        && this.next_read <= this.known_last
                    {
                        this.start_read();
                    }
                    return this.deliver(msg, count);
                }
            }
            // Retention deleted the head past where this subscription stands: jump to the first
            // live message (only before a read is started, so the buffer stays contiguous).
            let first = this.queue.first_seq.load(Ordering::Acquire);
            if this.reading.is_none() && this.buffer.is_empty() && this.next_read < first {
                this.next_read = first;
                this.sub.skip_to(first);
            }
            if let Some(task) = this.reading.as_mut() {
                if let Poll::Ready(res) = task.poll_unpin(cx) {
                    this.reading = None;
                    match res {
                        // The range was trimmed while it was being read: skip, don't fail.
                        Ok(Err(Error::Gap { expected, .. }))
                            if expected < this.queue.first_seq.load(Ordering::Acquire) =>
                        {
                            this.buffer.clear();
                            continue;
                        }
                        Ok(Ok(ReadOutcome::Messages(msgs))) => {
                            this.read_backoff = FIRST_BACKOFF;
                            if let Some(last) = msgs.last() {
                                this.next_read = last.seq + 1;
                            }
                            this.buffer.extend(msgs);
                            continue;
                        }
                        Ok(Ok(ReadOutcome::Closed)) => return this.end(None),
                        Ok(Err(Error::Storage(e))) if e.is_transient() => {
                            this.read_again_later(e);
                            continue;
                        }
                        Ok(Err(e)) => return this.end(Some(e)),
                        Err(join) => {
                            let e = Error::Internal(format!("read task failed: {join}"));
                            return this.end(Some(e));
                        }
                    }
                }
            } else if this.buffer.is_empty() && this.next_read <= this.known_last {
                this.start_read();
                continue;
            }
            // Nothing to hand out now: wait for the writer (new messages or shutdown), an ack
            // (window space, registered above), the read in flight, or a delayed redelivery.
            if this.poll_timer(cx) {
                continue;
            }
            match this.changes.poll_next_unpin(cx) {
                Poll::Ready(Some(last)) => {
                    this.known_last = this.known_last.max(last).max(this.queue.last_seq());
                    continue;
                }
                Poll::Ready(None) => return this.end(None),
                Poll::Pending => {
                    this.flush_metrics();
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.flush_metrics();
    }
}
