//! [`Queue`]: send messages, name groups.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::receipt::SendReceipt;
use crate::engine::boundary::{
    self, EncodeError, QueueRequest, QueueState, Request, RetentionRequest, ScheduleRequest, Shared,
    Submission,
};
use crate::error::{Error, NameError, NameKind};
use crate::message::{Due, Message};
use crate::ordered::Group;
use crate::retention::Retention;
use crate::schedule::DelayedInfo;
use crate::sent::{ScheduledMessage, Sent};
use crate::work::WorkGroup;
use std::time::Duration;

// The trace context a send call writes into its messages (feature `otel`), read once per call.
#[cfg(feature = "otel")]
use crate::otel::Outgoing as Trace;

/// Without feature `otel`, sends carry no trace context.
#[cfg(not(feature = "otel"))]
struct Trace;

#[cfg(not(feature = "otel"))]
impl Trace {
    fn current() -> Self {
        Trace
    }
}

/// A handle to one queue. Cheap to clone; all clones send to the same queue.
///
/// Obtained from [`Broker::queue`](crate::Broker::queue).
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
    state: Arc<QueueState>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("name", &self.state.name).field("id", &self.state.id).finish()
    }
}

impl Queue {
    pub(crate) fn new(shared: Arc<Shared>, state: Arc<QueueState>) -> Self {
        Queue { shared, state }
    }

    pub(crate) fn state(&self) -> &Arc<QueueState> {
        &self.state
    }

    /// The queue's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let orders = broker.queue("orders").await?;
    /// assert_eq!(orders.name(), "orders");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The first live sequence: the oldest message still stored is at or after it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) {
    /// println!("stored: #{}..=#{}", queue.first_seq(), queue.last_seq());
    /// # }
    /// ```
    pub fn first_seq(&self) -> u64 {
        self.state.first_seq.load(Ordering::Acquire)
    }

    /// The last sequence written (0 if nothing was ever sent).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let seq = queue.send("hello").await?;
    /// assert_eq!(queue.last_seq(), seq);
    /// # Ok(()) }
    /// ```
    pub fn last_seq(&self) -> u64 {
        self.state.last_seq()
    }

    /// Number of messages stored (not yet removed by retention).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rockq::Error> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let queue = broker.queue("orders").await?;
    /// queue.send_batch(["a", "b", "c"]).await?;
    /// assert_eq!(queue.len(), 3);
    /// # broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> u64 {
        (self.last_seq() + 1).saturating_sub(self.first_seq())
    }

    /// Whether the queue stores no messages.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// if queue.is_empty() {
    ///     queue.send("first").await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one message and returns its sequence once it is durable (see
    /// [`Durability`](crate::Durability)).
    ///
    /// Sends from all producers are group-committed by the writer: many sends share one
    /// WriteBatch and one WAL sync. Sequences of one queue are dense and increase in the order
    /// the writer received the sends.
    ///
    /// # Errors
    ///
    /// [`Error::MessageTooLarge`], [`Error::InvalidHeader`] and
    /// [`Error::InvalidKey`] before anything is queued; [`Error::NeedsSubmit`] for a
    /// delayed message, and for one whose idempotency key names a *delayed* original (it has
    /// no sequence yet); [`Error::Shutdown`] after
    /// [`Broker::shutdown`](crate::Broker::shutdown); [`Error::Storage`] if the write
    /// failed, after which the broker fails closed ([`Error::Failed`]).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the message was staged for the writer, the message may
    /// still be written; it is never written partially. Applies backpressure: it waits while
    /// [`Options::channel_capacity`](crate::Options::channel_capacity) messages are already
    /// staged.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let seq = queue.send(b"payload").await?;
    /// assert!(seq >= 1);
    /// # Ok(()) }
    /// ```
    pub async fn send(&self, message: impl Into<Message>) -> Result<u64, Error> {
        self.enqueue(message).await?.await
    }

    /// Hands one message to the writer and returns as soon as it is queued, with a
    /// [`SendReceipt`] that resolves to its sequence once it is durable.
    ///
    /// This is [`send`](Queue::send) split at the point where the message's place is fixed.
    /// A task that enqueues several messages before awaiting their receipts keeps them all in
    /// flight — they share group commits, and the task is woken once per commit instead of
    /// once per message — while their order is still the order of the `enqueue` calls:
    /// messages enqueued one after another get increasing sequences. Nothing is durable, and
    /// nothing is visible to consumers, before its receipt resolves.
    ///
    /// # Errors
    ///
    /// As [`send`](Queue::send): validation errors and [`Error::Shutdown`] here; storage
    /// errors from the receipt.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped before it completes, the message was not queued. Once it has
    /// returned the receipt, the message will be written whether or not the receipt is
    /// awaited. Applies backpressure: it waits while
    /// [`Options::channel_capacity`](crate::Options::channel_capacity) messages are already
    /// staged for the writer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// // Keep up to 16 sends in flight from one task, in order.
    /// let mut in_flight = std::collections::VecDeque::new();
    /// for i in 0..1000u32 {
    ///     if in_flight.len() == 16 {
    ///         let receipt: rockq::SendReceipt = in_flight.pop_front().unwrap();
    ///         receipt.await?;
    ///     }
    ///     in_flight.push_back(queue.enqueue(i.to_be_bytes().to_vec()).await?);
    /// }
    /// for receipt in in_flight {
    ///     receipt.await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn enqueue(&self, message: impl Into<Message>) -> Result<SendReceipt, Error> {
        let mut message = message.into();
        self.check(0, &mut message, &Trace::current())?;
        // A single message may carry an idempotency key: the writer checks it as it appends.
        Self::plain(0, &message, true)?;
        self.stage(std::slice::from_ref(&message)).await
    }

    /// Appends messages atomically: all of them get contiguous sequences and become visible
    /// together, or none does. Returns the range of sequences assigned.
    ///
    /// # Errors
    ///
    /// As [`send`](Queue::send), plus [`Error::EmptyBatch`] and
    /// [`Error::BatchTooLarge`] (more than
    /// [`Options::max_batch_messages`](crate::Options::max_batch_messages)). Validation
    /// happens before anything is queued: one bad message rejects the whole call.
    ///
    /// On etcd a call larger than one transaction (127 messages or 1 MiB) is just as atomic:
    /// its sequences are reserved first and other appends to the queue wait until it is
    /// visible (`docs/etcd.md`); a message over 1 MiB is [`Error::Unsupported`] there.
    ///
    /// # Cancel safety
    ///
    /// As [`send`](Queue::send): a dropped future may still have written the whole batch, never
    /// part of it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let seqs = queue.send_batch(["a", "b", "c"]).await?;
    /// assert_eq!(seqs.end() - seqs.start(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn send_batch<I>(&self, messages: I) -> Result<RangeInclusive<u64>, Error>
    where
        I: IntoIterator,
        I::Item: Into<Message>,
    {
        let batch = self.checked_batch(messages, true)?;
        let n = batch.len() as u64;
        let first = self.stage(&batch).await?.await?;
        Ok(first..=first + n - 1)
    }

    /// Names a consumer group on this queue. Nothing is written until the group first
    /// subscribes.
    ///
    /// # Errors
    ///
    /// [`NameError`] if `name` is empty, too long or has characters outside `[A-Za-z0-9._-]`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::StartFrom;
    /// let sub = queue.group("billing")?.start_from(StartFrom::Latest).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn group(&self, name: &str) -> Result<Group, NameError> {
        crate::name::validate(NameKind::Group, name)?;
        Ok(Group::new(self.shared.clone(), self.state.clone(), name))
    }

    /// The queue's retention policy.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) {
    /// if let rockq::Retention::MaxLen(n) = queue.retention() {
    ///     println!("{} keeps its last {n} messages", queue.name());
    /// }
    /// # }
    /// ```
    pub fn retention(&self) -> Retention {
        self.state.retention()
    }

    /// Sets and persists the queue's retention policy; it applies from the next retention pass
    /// ([`Broker::trim`](crate::Broker::trim) or the background task).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the policy is either set or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// queue.set_retention(rockq::Retention::MaxAge(Duration::from_secs(24 * 3600))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_retention(&self, retention: Retention) -> Result<(), Error> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req =
            Request::Retention(RetentionRequest::SetPolicy { queue: self.state.clone(), retention, reply });
        self.shared.ask(req, rx).await
    }

    /// Names a work-queue (shared) consumer group on this queue: competing consumers with
    /// leases, retries and a dead-letter queue. Nothing is written until it first subscribes.
    ///
    /// # Errors
    ///
    /// [`NameError`] if `name` is empty, too long or has characters outside `[A-Za-z0-9._-]`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut jobs = queue.work_group("resize")?.subscribe().await?;
    /// while let Some(job) = jobs.next().await {
    ///     job?.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn work_group(&self, name: &str) -> Result<WorkGroup, NameError> {
        crate::name::validate(NameKind::Group, name)?;
        Ok(WorkGroup::new(self.shared.clone(), self.state.clone(), name))
    }

    /// Refuses a message before anything is staged: after shutdown, over the size limit, or
    /// with headers that cannot be encoded. Every send passes here, so this is also where the
    /// `otel` feature writes the current trace context into the headers (before the size
    /// check, which then counts them).
    fn check(&self, index: usize, m: &mut Message, trace: &Trace) -> Result<(), Error> {
        check_message(&self.shared, &self.state, index, m, trace)
    }

    /// The messages of a batch call, each checked, before anything is staged: at most
    /// `max_batch_messages`, at least one; `plain` refuses those that need `submit` (a range of
    /// sequences cannot hold a delayed message or a duplicate).
    fn checked_batch<I>(&self, messages: I, plain: bool) -> Result<Vec<Message>, Error>
    where
        I: IntoIterator,
        I::Item: Into<Message>,
    {
        let max = self.shared.options().max_batch_messages;
        let trace = Trace::current();
        let mut batch: Vec<Message> = Vec::new();
        for (index, m) in messages.into_iter().enumerate() {
            if index >= max {
                return Err(Error::BatchTooLarge { len: index + 1, max });
            }
            let mut m = m.into();
            self.check(index, &mut m, &trace)?;
            if plain {
                Self::plain(index, &m, false)?;
            }
            batch.push(m);
        }
        if batch.is_empty() {
            return Err(Error::EmptyBatch);
        }
        Ok(batch)
    }

    /// Refuses, for the calls that return sequences, a message that needs
    /// [`submit`](Queue::submit).
    fn plain(index: usize, m: &Message, dedup_ok: bool) -> Result<(), Error> {
        if m.due.is_some() {
            return Err(Error::NeedsSubmit { index, reason: "is delayed (it gets no sequence until due)" });
        }
        if m.idempotency_key.is_some() && !dedup_ok {
            return Err(Error::NeedsSubmit {
                index,
                reason: "has an idempotency key (a duplicate gets no sequence of its own)",
            });
        }
        Ok(())
    }

    /// For a transaction: message `m` checked like a submit's (at position `index`) and
    /// encoded, with the queue's state and the broker it belongs to.
    pub(crate) fn transactional(
        &self,
        index: usize,
        mut m: Message,
    ) -> Result<(Arc<Shared>, Arc<QueueState>, Submission), Error> {
        self.check(index, &mut m, &Trace::current())?;
        let due = m.due.map(|d| due_micros(self.shared.clock(), d));
        let sub =
            Submission { envelope: boundary::encode(&m), due, idempotency_key: m.idempotency_key.clone() };
        Ok((self.shared.clone(), self.state.clone(), sub))
    }

    /// Checks and encodes the messages of a submit call and hands them to the writer.
    async fn submit_checked(&self, msgs: Vec<Message>) -> Result<Vec<Sent>, Error> {
        // The one send check of submits (a plain send's is in `stage`): what an engine may
        // refuse of a message itself.
        if msgs.iter().any(|m| m.priority > 0) {
            self.shared.check(boundary::Capability::Priority)?;
        }
        let clock = self.shared.clock();
        let subs = msgs
            .iter()
            .map(|m| {
                let due = m.due.map(|d| due_micros(clock, d));
                Submission { envelope: boundary::encode(m), due, idempotency_key: m.idempotency_key.clone() }
            })
            .collect();
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Schedule(ScheduleRequest::Submit { queue: self.state.clone(), msgs: subs, reply });
        self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// Sends one message whatever it carries — a delay, an idempotency key — and says what
    /// became of it, once durable: appended (with its sequence), scheduled (with its schedule
    /// id and due time), or a duplicate of an earlier message with the same idempotency key
    /// (nothing written; the original's sequence or schedule id).
    ///
    /// The idempotency check and the write are one step of the writer: of two sends with the
    /// same key, however close, exactly one is written. A delayed message becomes visible when
    /// it is due and gets its sequence then (see
    /// [`Message::deliver_after`](crate::Message::deliver_after)).
    ///
    /// # Errors
    ///
    /// As [`send`](Queue::send), plus [`Error::InvalidKey`]; [`Error::Corrupt`] if the
    /// key's dedup record does not decode.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the message was handed to the writer, it may still be
    /// written (and its key recorded): submit it again with the same idempotency key to learn
    /// which.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// use rockq::{Message, Sent};
    /// let later = queue.submit(Message::new("remind").deliver_after(Duration::from_secs(60))).await?;
    /// if let Sent::Scheduled(s) = later {
    ///     queue.cancel(s.id).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn submit(&self, message: impl Into<Message>) -> Result<Sent, Error> {
        let mut message = message.into();
        self.check(0, &mut message, &Trace::current())?;
        if message.due.is_none() {
            // Not delayed: staged like a plain send (one shared round), the key checked by the
            // writer as it appends.
            return self.stage(std::slice::from_ref(&message)).await?.sent().await;
        }
        let mut sent = self.submit_checked(vec![message]).await?;
        sent.pop().ok_or_else(|| {
            Error::Failed(crate::error::FailedError::internal("the writer answered no outcome"))
        })
    }

    /// [`submit`](Queue::submit) for several messages, atomically: every outcome is written in
    /// one batch, or none is. Outcomes come in the order of the messages. A key that appears
    /// twice in the call is a duplicate the second time.
    ///
    /// # Errors
    ///
    /// As [`send_batch`](Queue::send_batch) and [`submit`](Queue::submit).
    ///
    /// # Cancel safety
    ///
    /// As [`submit`](Queue::submit).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::{Message, Sent};
    /// let outcomes = queue
    ///     .submit_batch([
    ///         Message::new("charge").idempotency_key("order-42/charge"),
    ///         Message::new("email").idempotency_key("order-42/email"),
    ///     ])
    ///     .await?;
    /// for sent in outcomes {
    ///     if let Sent::Duplicate(original) = sent {
    ///         println!("already sent: {original:?}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn submit_batch<I>(&self, messages: I) -> Result<Vec<Sent>, Error>
    where
        I: IntoIterator,
        I::Item: Into<Message>,
    {
        let batch = self.checked_batch(messages, false)?;
        self.submit_checked(batch).await
    }

    /// Takes delayed message `id` out of the schedule before it is due. Returns `false` if it
    /// is not scheduled on this queue (it fell due already, was cancelled, or never was).
    ///
    /// Its idempotency key, if it had one, stays recorded until its window ends: a resend with
    /// that key is still a duplicate (of the cancelled message).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the cancel may or may not have happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// use rockq::{Message, Sent};
    /// let sent = queue.submit(Message::new("reminder").deliver_after(Duration::from_secs(3600))).await?;
    /// if let Sent::Scheduled(s) = sent {
    ///     assert!(queue.cancel(s.id).await?);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn cancel(&self, id: u64) -> Result<bool, Error> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Schedule(ScheduleRequest::Cancel { queue: self.state.clone(), id, reply });
        self.shared.ask(req, rx).await
    }

    /// Moves delayed message `id` to `due` (a time in the past delivers it at once; one more
    /// than 100 years ahead is clamped to now + 100 years). Returns its new place — the due
    /// time as stored — or `None` if it is not scheduled on this queue.
    ///
    /// # Errors
    ///
    /// As [`cancel`](Queue::cancel).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the move may or may not have happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::{Duration, SystemTime};
    /// use rockq::{Message, Sent};
    /// let sent = queue.submit(Message::new("reminder").deliver_after(Duration::from_secs(3600))).await?;
    /// if let Sent::Scheduled(s) = sent {
    ///     // Sooner: in ten minutes.
    ///     let moved = queue.reschedule(s.id, SystemTime::now() + Duration::from_secs(600)).await?;
    ///     assert!(moved.is_some());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reschedule(
        &self,
        id: u64,
        due: std::time::SystemTime,
    ) -> Result<Option<ScheduledMessage>, Error> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let due = due_micros(self.shared.clock(), Due::At(due));
        let req =
            Request::Schedule(ScheduleRequest::Reschedule { queue: self.state.clone(), id, due, reply });
        self.shared.ask(req, rx).await
    }

    /// Delayed messages waiting on this queue, in schedule-id order, at most `limit`.
    /// Blocking reads run on the blocking pool.
    ///
    /// # Errors
    ///
    /// [`Error`] if the store cannot be read or the broker is shut down.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// for m in queue.delayed(50).await? {
    ///     println!("#{}: {} bytes due at {:?}", m.id, m.payload_len, m.due);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delayed(&self, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        self.shared.scheduled(Some(self.state.name.to_string()), limit).await
    }

    /// The old name of [`delayed`](Queue::delayed), one letter from the recurring
    /// [`Broker::schedules`](crate::Broker::schedules).
    ///
    /// # Errors
    ///
    /// As [`delayed`](Queue::delayed).
    ///
    /// # Cancel safety
    ///
    /// As [`delayed`](Queue::delayed).
    #[deprecated(since = "0.2.0", note = "renamed `delayed` (recurring schedules are `Broker::schedules`)")]
    pub async fn scheduled(&self, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        self.delayed(limit).await
    }

    /// How long the queue remembers idempotency keys (default 5 minutes).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) {
    /// println!("keys remembered for {:?}", queue.dedup_window());
    /// # }
    /// ```
    pub fn dedup_window(&self) -> Duration {
        self.state.dedup_window()
    }

    /// Sets and persists how long the queue remembers idempotency keys. Applies to keys
    /// recorded from now on; the retention pass forgets expired ones in bulk.
    ///
    /// [`Duration::ZERO`] turns deduplication **off** for the queue: a key is remembered for
    /// no time, so every send with a key is appended. Windows are clamped to 100 years
    /// (`Duration::MAX` reads back from [`dedup_window`](Queue::dedup_window) as 100 years).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the window is either set or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// queue.set_dedup_window(Duration::from_secs(24 * 3600)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_dedup_window(&self, window: Duration) -> Result<(), Error> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let window = crate::clock::clamp_delay(window);
        let req = Request::Queue(QueueRequest::SetDedupWindow { queue: self.state.clone(), window, reply });
        self.shared.ask(req, rx).await
    }

    /// Stages checked messages in the writer's inbox as one send call.
    async fn stage(&self, messages: &[Message]) -> Result<SendReceipt, Error> {
        self.shared.check_send(messages)?;
        let staging = self.shared.stage(&self.state, messages).await?;
        if staging.nudge {
            self.shared.nudge_sends();
        }
        Ok(SendReceipt::new(staging.done, staging.index))
    }
}

/// A delivery time in wall-clock µs on `clock`, at most 100 years ahead (rockq's longest delay;
/// a time beyond what `u64` µs can hold would otherwise wrap around to "now").
fn due_micros(clock: &crate::clock::Clock, due: Due) -> u64 {
    let now = clock.wall_micros();
    let latest = now.saturating_add(crate::clock::MAX_DELAY.as_micros() as u64);
    match due {
        Due::After(delay) => now.saturating_add(delay.as_micros().min(u128::from(u64::MAX)) as u64),
        Due::At(at) => at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros().min(u128::from(u64::MAX)) as u64),
    }
    .min(latest)
}

/// A message of a flow's step, checked as a send to `state` is (the current trace context
/// written into it with the `otel` feature).
pub(crate) fn check_flow_message(
    shared: &Shared,
    state: &QueueState,
    index: usize,
    m: &mut Message,
) -> Result<(), Error> {
    check_message(shared, state, index, m, &Trace::current())
}

/// The one check of every message sent (`Queue::check`, a flow's steps).
fn check_message(
    shared: &Shared,
    state: &QueueState,
    index: usize,
    m: &mut Message,
    trace: &Trace,
) -> Result<(), Error> {
    if shared.is_closed() {
        return Err(Error::Shutdown);
    }
    if state.is_deleted() {
        return Err(Error::QueueDeleted { queue: state.name.to_string() });
    }
    #[cfg(feature = "otel")]
    trace.apply(&mut m.headers);
    #[cfg(not(feature = "otel"))]
    let _ = trace;
    let max = shared.options().max_message_bytes;
    let size = boundary::body_len(m);
    if size > max {
        return Err(Error::MessageTooLarge { index, size, max });
    }
    boundary::validate(m).map_err(|e| Error::InvalidHeader {
        index,
        reason: match e {
            EncodeError::HeaderKeyTooLong => "key longer than 65535 bytes",
            EncodeError::TooManyHeaders => "more than 65535 headers",
            EncodeError::HeaderValueTooLong => "value longer than 4 GiB",
            EncodeError::KeyEmpty | EncodeError::KeyTooLong => {
                return Error::InvalidKey {
                    index,
                    reason: if matches!(e, EncodeError::KeyEmpty) {
                        "empty"
                    } else {
                        "longer than MAX_KEY_LEN bytes"
                    },
                };
            }
        },
    })
}
