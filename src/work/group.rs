//! [`WorkGroup`]: a work-queue (shared) consumer group and its settings.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use super::config::WorkConfig;
use super::policy::RetryPolicy;
use super::subscription::WorkSubscription;
use crate::engine::boundary::{
    self, QueueState, Request, SettingsChange, SettingsRequest, Shared, WorkGroupState, WorkRequest,
};
use crate::error::{NameKind, PauseError, QueueError, ResetError, SubscribeError};
use crate::model::StartFrom;
use crate::name::{self, MAX_NAME_LEN};
use crate::retention::ResetTo;

/// Numbers the subscriptions of this process, for default consumer names.
static NEXT_CONSUMER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A work-queue consumer group on one queue: competing consumers, each message held by one of
/// them at a time under a lease, retried with backoff, dead-lettered when it keeps failing.
///
/// Any number of subscriptions and [worker pools](WorkGroup::workers) may run in one group.
/// The group's offset (`consumer:<group>:<queue>`) means "everything up to here is acked or
/// dead-lettered"; claim records cover the in-flight window above it and hold each message's
/// attempt count, which is written **before** the message is handed out, so attempts survive
/// crashes. A queue can have ordered [`Group`](crate::Group)s and work groups at the same
/// time; a group name is either one or the other on a queue.
///
/// Settings below apply to the subscriptions made from this handle; they are not stored.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
/// use std::time::Duration;
/// let group = queue
///     .work_group("thumbnails")?
///     .lease(Duration::from_secs(60))
///     .retry_policy(rockq::RetryPolicy::default().max_attempts(3));
/// group.workers(8).run(|task: rockq::Task| async move {
///     println!("resizing {}", task.seq());
///     Ok(())
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct WorkGroup {
    pub(crate) shared: Arc<Shared>,
    queue: Arc<QueueState>,
    name: Arc<str>,
    start: StartFrom,
    lease: Duration,
    policy: RetryPolicy,
    dlq: Option<String>,
    max_in_flight: usize,
    claim_batch: usize,
    saturation_after: Duration,
    consumer: Option<Arc<str>>,
    ordered_by_key: bool,
}

impl std::fmt::Debug for WorkGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkGroup").field("name", &self.name).field("queue", &self.queue.name).finish()
    }
}

impl WorkGroup {
    pub(crate) fn new(shared: Arc<Shared>, queue: Arc<QueueState>, name: &str) -> Self {
        WorkGroup {
            shared,
            queue,
            name: Arc::from(name),
            start: StartFrom::Earliest,
            lease: Duration::from_secs(30),
            policy: RetryPolicy::default(),
            dlq: None,
            max_in_flight: 256,
            claim_batch: 64,
            saturation_after: Duration::from_secs(1),
            consumer: None,
            ordered_by_key: false,
        }
    }

    /// The largest [`claim_batch`](WorkGroup::claim_batch): a claim takes one in-flight permit
    /// per message and one claim record per message in a single write, so a batch this size
    /// already amortises the write; larger ones would only hold leases longer.
    pub const MAX_CLAIM_BATCH: usize = 4096;

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the group starts if it does not exist yet. Default [`StartFrom::Earliest`].
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Visibility timeout: how long a consumer holds a message before it may be delivered to
    /// another one (with the attempt counted). Default 30 s, at least 1 ms; a lease over 100
    /// years is clamped to 100 years (`Duration::MAX` means "until settled or dropped").
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = crate::clock::clamp_delay(lease.max(Duration::from_millis(1)));
        self
    }

    /// Attempts and backoff. Default [`RetryPolicy::default`] (5 attempts).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The dead-letter queue. Default `<queue>.dlq`. The name is validated at subscribe, which
    /// refuses the group's own queue ([`SubscribeError::InvalidOption`]): its dead letters
    /// would come back to it.
    pub fn dead_letter_queue(mut self, name: impl Into<String>) -> Self {
        self.dlq = Some(name.into());
        self
    }

    /// Most jobs one subscription holds at once (handed out and not settled). Default 256, at
    /// least 1. A job waiting for a retry does not count. Values above `usize::MAX >> 3` (the
    /// most permits a Tokio semaphore holds) are clamped to it: effectively unbounded.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self
    }

    /// Most messages claimed in one write. Default 64, at least 1, at most
    /// [`MAX_CLAIM_BATCH`](WorkGroup::MAX_CLAIM_BATCH) (larger values are clamped to it).
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = n.clamp(1, Self::MAX_CLAIM_BATCH);
        self
    }

    /// How long a subscription may wait on a full in-flight bound before it reports
    /// saturation (a `warn` event, [`Event::Saturated`](crate::Event::Saturated) and
    /// [`WorkGroup::saturations`]). Default 1 s; over 100 years is clamped to 100 years
    /// (effectively never).
    pub fn saturation_after(mut self, d: Duration) -> Self {
        self.saturation_after = crate::clock::clamp_delay(d);
        self
    }

    /// The name recorded as the holder of this handle's claims, shown by
    /// [`Broker::pending`](crate::Broker::pending) and `rockq pending`. Default
    /// `<pid>-<n>`, with `n` numbering the subscriptions of this process. Cut to 255 bytes.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(Arc::from(name.into()));
        self
    }

    /// Per-key ordering: a message with an ordering key ([`Message::key`](crate::Message::key))
    /// is not handed out while an earlier message with the same key is leased, waiting for a
    /// retry or being settled; messages with different keys (and messages without a key) run
    /// in parallel. So the handlers of one key run one at a time, in sequence order — as long
    /// as each finishes within its lease (a worker pool's heartbeat extends it): a lease that
    /// runs out hands the message to another consumer while the first may still be running,
    /// as without keys. A dead-lettered message releases its key: the next one goes.
    ///
    /// Applies to the whole group in this process once any subscription asks for it (set it on
    /// every subscription of the group). Claims stay O(log n) however many messages wait behind
    /// busy keys; at most 65 536 messages read ahead and not handed out are held in memory,
    /// after which reading ahead waits for them to go (a hot key can then hold back other keys
    /// behind it in the queue). A retention trim (`MaxLen`, `MaxAge`) that deletes a message
    /// while it is leased keeps its key's place until that lease runs out.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// queue.send(rockq::Message::new("debit 10").key("account-7")).await?;
    /// let group = queue.work_group("ledger")?.ordered_by_key(true);
    /// group.workers(16).run(|task: rockq::Task| async move {
    ///     println!("{:?}: {}", task.key(), task.seq()); // one at a time per account
    ///     Ok(())
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn ordered_by_key(mut self, on: bool) -> Self {
        self.ordered_by_key = on;
        self
    }

    pub(crate) fn saturation_threshold(&self) -> Duration {
        self.saturation_after
    }

    pub(crate) fn lease_duration(&self) -> Duration {
        self.lease
    }

    fn state(&self) -> Option<Arc<WorkGroupState>> {
        self.shared.work_group(&self.name, &self.queue.name)
    }

    /// The committed offset: everything up to it is acked or dead-lettered, durably. `None` if
    /// the group was never subscribed.
    pub fn committed(&self) -> Option<u64> {
        self.state().map(|g| g.durable.load(Ordering::Acquire))
    }

    /// Messages currently leased to consumers of this group (in this process).
    pub fn in_flight(&self) -> usize {
        self.state().map_or(0, |g| g.leased())
    }

    /// Messages waiting for a retry.
    pub fn waiting(&self) -> usize {
        self.state().map_or(0, |g| g.waiting())
    }

    /// Pauses this group durably (see [`Broker::pause_group`](crate::Broker::pause_group)).
    ///
    /// # Errors
    ///
    /// [`PauseError::NoSuchGroup`](crate::PauseError::NoSuchGroup) if it never subscribed,
    /// [`PauseError::Shutdown`](crate::PauseError::Shutdown),
    /// [`PauseError::Storage`](crate::PauseError::Storage).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the group is paused or not.
    pub async fn pause(&self) -> Result<(), PauseError> {
        self.shared.set_paused(&self.queue, &self.name, true).await
    }

    /// Resumes this group (see [`Broker::resume_group`](crate::Broker::resume_group)).
    ///
    /// # Errors
    ///
    /// As for `pause`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect.
    pub async fn resume(&self) -> Result<(), PauseError> {
        self.shared.set_paused(&self.queue, &self.name, false).await
    }

    /// Whether this group is paused.
    pub fn is_paused(&self) -> bool {
        self.shared.is_paused(&self.queue, &self.name)
    }

    /// Messages this group never finished because retention deleted them first (since open).
    pub fn skipped(&self) -> u64 {
        self.state().map_or(0, |g| g.skipped.load(Ordering::Relaxed))
    }

    /// Times a subscription of this group waited on a full in-flight bound for longer than
    /// [`saturation_after`](WorkGroup::saturation_after).
    pub fn saturations(&self) -> u64 {
        self.state().map_or(0, |g| g.saturations.load(Ordering::Relaxed))
    }

    /// Deletes this group with everything of it, as
    /// [`Broker::delete_group`](crate::Broker::delete_group) does; `false` if it does not
    /// exist (or its queue was deleted since this handle was made: a queue created again
    /// under the name is another queue, and its group of this name is left alone).
    ///
    /// # Errors
    ///
    /// [`QueueError::Shutdown`], [`QueueError::Storage`], [`QueueError::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once the request reached the writer, the group is deleted
    /// whether or not the future is still awaited.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// queue.work_group("retired")?.delete().await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete(&self) -> Result<bool, QueueError> {
        if self.queue.is_deleted() {
            return Ok(false);
        }
        self.shared.delete_group(&self.queue.name, &self.name).await
    }

    /// Replays: moves the group's offset so that claiming restarts at the given sequence, or
    /// at the first message enqueued at or after the given time; every claim (attempt counts,
    /// retry times, finished-above-the-offset marks) is dropped. The target must be retained.
    /// Returns the sequence claiming restarts at.
    ///
    /// # Errors
    ///
    /// [`ResetError::Active`] while a subscription or pool of the group runs in this process
    /// or one of its jobs is held under a lease not yet run out, [`ResetError::NoSuchGroup`],
    /// [`ResetError::OutOfRetention`], [`ResetError::Shutdown`], [`ResetError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the offset is either moved or not.
    pub async fn reset_to(&self, to: ResetTo) -> Result<u64, ResetError> {
        if self.shared.is_closed() {
            return Err(ResetError::Shutdown);
        }
        let names = || (self.name.to_string(), self.queue.name.to_string());
        let Some(state) = self.state() else {
            let (group, queue) = names();
            return Err(ResetError::NoSuchGroup { group, queue });
        };
        if state.subscriptions.load(Ordering::Acquire) > 0 || state.held(self.shared.clock().now()) {
            let (group, queue) = names();
            return Err(ResetError::Active { group, queue });
        }
        let seq = boundary::reset_target(&self.shared, &self.queue, to).await?;
        let (reply, rx) = oneshot::channel();
        let req = Request::Work(WorkRequest::Reset { group: state, offset: seq - 1, reply });
        self.shared.tx.send(req).await.map_err(|_| ResetError::Shutdown)?;
        rx.await.map_err(|_| ResetError::Shutdown)??;
        tracing::info!(group = %self.name, queue = %self.queue.name, seq, "rockq: work-queue group reset");
        Ok(seq)
    }

    /// Starts receiving jobs. The group is created (durably) on first use.
    ///
    /// # Errors
    ///
    /// [`SubscribeError::WrongMode`] if the name is an ordered group on this queue,
    /// [`SubscribeError::InvalidName`] for a bad dead-letter queue name,
    /// [`SubscribeError::DeadLetterName`] if the default one would be too long,
    /// [`SubscribeError::SequenceOutOfRange`], [`SubscribeError::Shutdown`],
    /// [`SubscribeError::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped future holds no claims (the group may have been created).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut jobs = queue.work_group("mailer")?.subscribe().await?;
    /// if let Some(job) = jobs.next().await {
    ///     job?.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(&self) -> Result<WorkSubscription, SubscribeError> {
        if self.shared.is_closed() {
            return Err(SubscribeError::Shutdown);
        }
        if self.queue.is_deleted() {
            return Err(SubscribeError::QueueDeleted { queue: self.queue.name.to_string() });
        }
        let dlq = match &self.dlq {
            Some(n) => {
                name::validate(NameKind::Queue, n)?;
                crate::model::check_dead_letter_queue(&self.queue.name, &self.name, n)
                    .map_err(SubscribeError::InvalidOption)?;
                n.clone()
            }
            None => {
                let n = crate::model::default_dead_letter_queue(&self.queue.name);
                if n.len() > MAX_NAME_LEN {
                    return Err(SubscribeError::DeadLetterName { queue: self.queue.name.to_string() });
                }
                n
            }
        };
        let state = match self.state() {
            Some(g) => g,
            None => {
                if self.shared.ordered_group(&self.name, &self.queue.name).is_some() {
                    return Err(SubscribeError::WrongMode {
                        group: self.name.to_string(),
                        queue: self.queue.name.to_string(),
                        existing: "ordered",
                    });
                }
                let (reply, rx) = oneshot::channel();
                let req = Request::Work(WorkRequest::Create {
                    queue: self.queue.clone(),
                    group: self.name.to_string(),
                    start: self.start,
                    reply,
                });
                self.shared.tx.send(req).await.map_err(|_| SubscribeError::Shutdown)?;
                rx.await.map_err(|_| SubscribeError::Shutdown)??
            }
        };
        // Record the dead-letter queue, so stats and tools know where this group's go.
        let recorded = state.recorded_dlq.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if recorded != dlq {
            let (reply, rx) = oneshot::channel();
            let change = SettingsChange::DeadLetterQueue(dlq.clone());
            let req = Request::Settings(SettingsRequest {
                queue: self.queue.clone(),
                group: self.name.to_string(),
                change,
                reply,
            });
            self.shared.tx.send(req).await.map_err(|_| SubscribeError::Shutdown)?;
            match rx.await.map_err(|_| SubscribeError::Shutdown)? {
                Ok(()) => *state.recorded_dlq.lock().unwrap_or_else(|p| p.into_inner()) = dlq.clone(),
                Err(PauseError::Storage(e)) => return Err(SubscribeError::Storage(e)),
                Err(PauseError::Shutdown) => return Err(SubscribeError::Shutdown),
                Err(e) => return Err(SubscribeError::Failed(e.to_string())),
            }
        }
        let config = Arc::new(WorkConfig {
            lease: self.lease,
            policy: self.policy.clone(),
            dlq: Arc::from(dlq),
            max_in_flight: self.max_in_flight,
            claim_batch: self.claim_batch,
            saturation_after: self.saturation_after,
            consumer: self.consumer.clone().unwrap_or_else(|| {
                let n = NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed);
                Arc::from(format!("{}-{n}", std::process::id()))
            }),
        });
        if self.ordered_by_key {
            state.set_keyed();
        }
        tracing::debug!(group = %self.name, queue = %self.queue.name, "rockq: work-queue subscription");
        Ok(WorkSubscription::new(self.shared.clone(), state, config))
    }
}
