//! [`WorkGroup`]: a work-queue (shared) consumer group and its settings.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use super::limits::HandleLimits;
use super::subscription::WorkSubscription;
use crate::engine::boundary::{
    Capability, QueueState, Request, SettingsMode, Shared, WorkGroupState, WorkRequest, WorkSettingsRequest,
};
use crate::error::{Error, NameKind};
use crate::model::StartFrom;
use crate::model::{MIN_LEASE, RequestedWork, WorkSettings};
use crate::name::{self, MAX_NAME_LEN};
use crate::rate_limit::RateLimit;
use crate::retention::ResetTo;
use crate::retry::RetryPolicy;

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
/// **Stored settings.** The [lease](WorkGroup::lease), [retry policy](WorkGroup::retry_policy),
/// [dead-letter queue](WorkGroup::dead_letter_queue), [key ordering](WorkGroup::ordered_by_key)
/// and [outcome retention](WorkGroup::keep_outcomes)
/// are stored with the group (its `group:<group>:<queue>` record), like a JetStream consumer's
/// config, so every process sharing the database over time runs the group the same way:
///
/// - the group's first [`subscribe`](WorkGroup::subscribe) stores them, defaults for the ones
///   not set;
/// - a later subscribe (in this or another process, after a restart) runs with the stored
///   values for every setting it leaves unset: `queue.work_group("mailer")?.subscribe()` is
///   enough to join a group configured elsewhere;
/// - a setting set explicitly must equal the stored one, or the subscribe fails with
///   [`Error::SettingsMismatch`] naming it and both values, and writes nothing;
/// - [`update`](WorkGroup::update) changes the stored values explicitly, and every
///   subscription and worker pool of the group in this process follows from then on.
///
/// The other settings ([`max_in_flight`](WorkGroup::max_in_flight),
/// [`claim_batch`](WorkGroup::claim_batch), [`saturation_after`](WorkGroup::saturation_after),
/// [`consumer_name`](WorkGroup::consumer_name)) are per handle and not stored;
/// [`start_from`](WorkGroup::start_from) applies only when the group is created.
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
    /// The stored settings this handle sets explicitly (`None`: adopt the stored value).
    lease: Option<Duration>,
    policy: Option<RetryPolicy>,
    dlq: Option<String>,
    ordered_by_key: Option<bool>,
    keep_outcomes: Option<Duration>,
    rate_limit: Option<Option<RateLimit>>,
    concurrency_limit: Option<Option<u32>>,
    per_key_limit: Option<Option<u32>>,
    max_in_flight: usize,
    claim_batch: usize,
    saturation_after: Duration,
    consumer: Option<Arc<str>>,
    priority_share: u32,
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
            lease: None,
            policy: None,
            dlq: None,
            ordered_by_key: None,
            keep_outcomes: None,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
            max_in_flight: 256,
            claim_batch: 64,
            saturation_after: Duration::from_secs(1),
            consumer: None,
            priority_share: 0,
        }
    }

    /// The largest [`claim_batch`](WorkGroup::claim_batch): a claim takes one in-flight permit
    /// per message and one claim record per message in a single write, so a batch this size
    /// already amortises the write; larger ones would only hold leases longer.
    pub const MAX_CLAIM_BATCH: usize = 4096;

    crate::group_admin::group_admin!("work_group", "mailer");

    /// Where the group starts if it does not exist yet. Default [`StartFrom::Earliest`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::StartFrom;
    /// // A new group: skip the backlog, only work on messages sent from now on.
    /// let jobs = queue.work_group("mailer")?.start_from(StartFrom::Latest).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Visibility timeout: how long a consumer holds a message before it may be delivered to
    /// another one (with the attempt counted). **Stored with the group** (see
    /// [`WorkGroup`]): unset, a subscribe uses the stored lease (30 s for a new group); set,
    /// it must equal the stored one unless applied with [`update`](WorkGroup::update). At
    /// least 1 ms: a shorter lease is refused at subscribe and update
    /// ([`Error::InvalidOption`]); one over 100 years is clamped to 100 years
    /// (`Duration::MAX` means "until settled or dropped").
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// // Transcoding takes minutes: hold each job for 10 minutes before another consumer may take it.
    /// let jobs = queue.work_group("transcode")?.lease(Duration::from_secs(600)).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(crate::clock::clamp_delay(lease));
        self
    }

    /// Attempts and backoff, as one setting: **stored with the group** like the
    /// [lease](WorkGroup::lease) (a set policy must equal the stored one field by field).
    /// Default for a new group [`RetryPolicy::default`] (5 attempts).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// let policy = rockq::RetryPolicy::default()
    ///     .max_attempts(8)
    ///     .backoff(Duration::from_millis(500), Duration::from_secs(60));
    /// let jobs = queue.work_group("webhooks")?.retry_policy(policy).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The dead-letter queue, **stored with the group** like the [lease](WorkGroup::lease).
    /// Default for a new group `<queue>.dlq` (or the one an older build recorded). The name is
    /// validated at subscribe, which refuses the group's own queue
    /// ([`Error::InvalidOption`]): its dead letters would come back to it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let jobs = queue.work_group("webhooks")?.dead_letter_queue("webhooks.failed").subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn dead_letter_queue(mut self, name: impl Into<String>) -> Self {
        self.dlq = Some(name.into());
        self
    }

    /// Most jobs one subscription holds at once (handed out and not settled). Default 256, at
    /// least 1. The same knob as [`Group::max_in_flight`](crate::Group::max_in_flight). A job waiting for a retry does not count. Values above `usize::MAX >> 3` (the
    /// most permits a Tokio semaphore holds) are clamped to it: effectively unbounded.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// // At most 4 jobs at a time from this subscription (a slow external API).
    /// let jobs = queue.work_group("geocode")?.max_in_flight(4).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self
    }

    /// Most messages read and claimed in one write. Default 64, at least 1, at most
    /// [`MAX_CLAIM_BATCH`](WorkGroup::MAX_CLAIM_BATCH) (larger values are clamped to it). The
    /// same knob as [`Group::read_batch`](crate::Group::read_batch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let jobs = queue.work_group("mailer")?.max_in_flight(32).read_batch(16).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_batch(mut self, n: usize) -> Self {
        self.claim_batch = n.clamp(1, Self::MAX_CLAIM_BATCH);
        self
    }

    /// Starvation protection for [prioritised](crate::Message::priority) messages: one claim
    /// in `n` takes the oldest claimable job, whatever its priority; the others take the
    /// highest priority first. Default 0: strictly by priority, so a steady stream of urgent
    /// jobs holds the others back for as long as it lasts. `1` ignores priorities.
    ///
    /// The share is this handle's (a pool's or a subscription's claims): the count of claims
    /// since the oldest was last taken is the group's, in this process. It changes nothing
    /// stored.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// // Urgent mail first, but every tenth claim goes to the oldest newsletter.
    /// let jobs = queue.work_group("mailer")?.priority_share(10).subscribe().await?;
    /// # Ok(()) }
    /// ```
    pub fn priority_share(mut self, n: u32) -> Self {
        self.priority_share = n;
        self
    }

    /// Renamed [`read_batch`](WorkGroup::read_batch), the name ordered groups use too.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// #[allow(deprecated)]
    /// let group = queue.work_group("mailer")?.claim_batch(16);
    /// let group = queue.work_group("mailer")?.read_batch(16); // the new name
    /// # Ok(()) }
    /// ```
    #[deprecated(since = "0.2.0", note = "renamed read_batch, as on Group")]
    pub fn claim_batch(self, n: usize) -> Self {
        self.read_batch(n)
    }

    /// How long a subscription may wait on a full in-flight bound before it reports
    /// saturation (a `warn` event, [`Event::Saturated`](crate::Event::Saturated) and
    /// [`WorkGroup::saturations`]). Default 1 s; over 100 years is clamped to 100 years
    /// (effectively never).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// let group = queue.work_group("mailer")?.saturation_after(Duration::from_secs(10));
    /// let jobs = group.subscribe().await?;
    /// if group.saturations() > 0 {
    ///     eprintln!("mailer is at its in-flight bound");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn saturation_after(mut self, d: Duration) -> Self {
        self.saturation_after = crate::clock::clamp_delay(d);
        self
    }

    /// The name recorded as the holder of this handle's claims, shown by
    /// [`Broker::pending`](crate::Broker::pending) and `rockq pending`. Default
    /// `<pid>-<n>`, with `n` numbering the subscriptions of this process. Cut to 255 bytes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let jobs = queue.work_group("mailer")?.consumer_name("mailer-host-3").subscribe().await?;
    /// # Ok(()) }
    /// ```
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
    /// **Stored with the group** like the [lease](WorkGroup::lease) (default for a new group:
    /// off), so it applies to every subscription of the group. Turned off by an
    /// [`update`](WorkGroup::update), messages already waiting behind their key's earlier
    /// message still wait for it; nothing waits after that. Claims stay O(log n) however many messages wait behind
    /// busy keys; at most 65 536 messages read ahead and not handed out are held in memory,
    /// after which reading ahead waits for them to go (a hot key can then hold back other keys
    /// behind it in the queue). A retention trim (`MaxLen`, `MaxAge`) that deletes a message
    /// while it is leased keeps its key's place until that lease runs out.
    ///
    /// On the etcd engine the order holds across every process of the group: each reads the
    /// keys of what it may claim and learns the others' claims and outcomes from etcd, and a
    /// message is claimable only once every earlier one of its key is finished there (a
    /// finished job stays finished until a [reset](WorkGroup::reset_to), which every claim
    /// compares in etcd, so a process that learns late only waits longer). One difference
    /// (`docs/etcd.md`): a trim keeps the key's place only in the process holding the lease.
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
        self.ordered_by_key = Some(on);
        self
    }

    /// Keeps each finished job's outcome for `retention`: how it ended (acked, deleted, or
    /// dead-lettered with the reason and where the letter went), when, after which attempt,
    /// and the handler's result ([`Task::set_result`](crate::Task::set_result)).
    /// [`Broker::job`](crate::Broker::job) and [`Broker::wait_job`](crate::Broker::wait_job)
    /// return it in [`JobStatus::outcome`](crate::JobStatus::outcome), and it outlives the
    /// message: a job whose message retention deleted still reads as finished, with its
    /// outcome. `Duration::ZERO` keeps none (the default for a new group).
    ///
    /// **Stored with the group** like the [lease](WorkGroup::lease). The outcome is written
    /// in the write that finishes the job (one record per job, with the ack: what it costs),
    /// so a job is never finished without it, and survives what that write survives (see
    /// [`Durability`](crate::Durability)). A retention pass ([`Broker::trim`](crate::Broker::trim),
    /// or the background one) deletes outcomes older than `retention`, oldest sequences first:
    /// one is kept **at least** `retention`, and longer when it sits behind unexpired ones
    /// (outcomes finished out of order: a pass reads past at most 1,024 unexpired outcomes
    /// before it stops). An [`update`](WorkGroup::update) changes the retention of the
    /// outcomes kept already too; turning it off (`Duration::ZERO`) stops new ones and the
    /// next retention pass deletes the kept ones. Deleting the group deletes them.
    ///
    /// On the etcd engine the outcome is written with the transaction that finishes the job,
    /// and any process's lookups, waits and retention passes see it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// let queue = broker.queue("invoices").await?;
    /// let seq = queue.send("render invoice 7").await?;
    /// let group = queue.work_group("render")?.keep_outcomes(Duration::from_secs(7 * 24 * 3600));
    /// let pool = group.workers(4).spawn(|task: rockq::Task| async move {
    ///     task.set_result(format!("invoice-{}.pdf", task.seq()))?;
    ///     Ok(())
    /// });
    /// let done = broker.wait_job("invoices", "render", seq).await?;
    /// println!("{:?}", done.outcome.and_then(|o| o.result)); // Some(b"invoice-1.pdf")
    /// pool.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_outcomes(mut self, retention: Duration) -> Self {
        self.keep_outcomes = Some(retention);
        self
    }

    /// Limits how many jobs of the group start per interval, across every pool and
    /// subscription of the group and across restarts: stored with the group, as its lease is
    /// (the first subscribe stores it; a later handle that sets another is refused until an
    /// [`update`](WorkGroup::update)). `None` removes a stored limit (with `update`).
    ///
    /// What is limited is claims: a job held back is not claimed, so no lease runs out while
    /// it waits, and [`GroupStats::limited`](crate::GroupStats::limited) counts it; a worker
    /// pool on a limited group claims only for idle handlers (unless its
    /// [`prefetch`](crate::Workers::prefetch) is set), so its claims are its starts. The
    /// bucket's state is written with the claims it admitted, so a restart does not refill it
    /// into a burst (under `Durability::Buffered`, a power loss can lose the last claims with
    /// their token). The exact guarantee and the burst: [`RateLimit`]. Retries take a token
    /// each; a job whose attempts are used up is dead-lettered without one.
    ///
    /// On the etcd engine the bucket is shared by every process of the group (each claim is
    /// compared with it in etcd); it keeps wall-clock time, so processes whose clocks
    /// disagree by `s` may together start up to `s`'s worth of rate more in one window.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// // At most 10 calls a second to the payment provider, however many pools run.
    /// let queue = broker.queue("charges").await?;
    /// let group = queue.work_group("charge")?.rate_limit(rockq::RateLimit::per_second(10));
    /// let pool = group.workers(8).spawn(|task: rockq::Task| async move {
    ///     println!("charging {}", task.seq());
    ///     Ok(())
    /// });
    /// # pool.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn rate_limit(mut self, limit: impl Into<Option<RateLimit>>) -> Self {
        self.rate_limit = Some(limit.into());
        self
    }

    /// Limits how many jobs of the group are held at once — leased, or with their outcome on
    /// its way to the disk — across every pool and subscription of the group: stored with the
    /// group, as [`rate_limit`](WorkGroup::rate_limit) is. `None` removes a stored limit (with
    /// [`update`](WorkGroup::update)); 0 is refused ([`Error::InvalidOption`]).
    ///
    /// A job held back is not claimed (no lease runs out while it waits). A worker pool's
    /// prefetched jobs are leased, so they count: a pool with more handlers than the limit
    /// simply leaves the extra ones idle, and one whose prefetch reaches past the limit holds
    /// places its handlers are not using yet (set [`prefetch(0)`](crate::Workers::prefetch)
    /// where several pools share a small limit). A restart voids every lease, as it does for
    /// any claim: the jobs held are claimable at once, within the limit.
    ///
    /// On the etcd engine the limit holds across every process of the group (each claim is
    /// compared in etcd with the claims before it). The leases of a process that stopped
    /// without finishing its jobs hold their places until they run out there (other processes
    /// cannot tell it stopped), and a lease counts as run out on each process's clock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// // Three exports at once, whatever the number of workers.
    /// let group = queue.work_group("export")?.concurrency_limit(3);
    /// # let _ = group;
    /// # Ok(()) }
    /// ```
    pub fn concurrency_limit(mut self, n: impl Into<Option<u32>>) -> Self {
        self.concurrency_limit = Some(n.into());
        self
    }

    /// Limits how many jobs with the same [`Message::key`](crate::Message::key) are held at
    /// once — "at most 3 jobs at once per tenant" — across every pool and subscription of the
    /// group: stored with the group, as [`rate_limit`](WorkGroup::rate_limit) is. A key's
    /// first `n` unfinished jobs may run; the later ones wait (`JobState::Limited`) until one
    /// of those finishes, so a key's jobs are also *claimed* in order (with `n > 1`, jobs
    /// claimed together may start in any order). A job waiting for its retry keeps its place
    /// among the `n`. Jobs without a key are not limited by it. Removing the limit makes what
    /// it held back claimable at once.
    ///
    /// [`ordered_by_key`](WorkGroup::ordered_by_key) is the case `n = 1`; a group has one or
    /// the other ([`Error::InvalidOption`] for both). `n` is 1 to 1,024; `None` removes a
    /// stored limit (with [`update`](WorkGroup::update)). Keys are read from the messages as
    /// the group reaches them, as for `ordered_by_key` (its costs apply). On the etcd engine
    /// the limit holds across every process of the group, as `ordered_by_key` does.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::Message;
    /// queue.send(Message::new("export 1").key("tenant-7")).await?;
    /// // Two exports at once per tenant, however many workers the pool has.
    /// let group = queue.work_group("exports")?.per_key_limit(2);
    /// # let _ = group;
    /// # Ok(()) }
    /// ```
    pub fn per_key_limit(mut self, n: impl Into<Option<u32>>) -> Self {
        self.per_key_limit = Some(n.into());
        self
    }

    /// Where job `seq` of this group stands: [`Broker::job`](crate::Broker::job) for this
    /// group's queue and name.
    ///
    /// # Errors
    ///
    /// As [`Broker::job`](crate::Broker::job).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let seq = queue.send("resize 7.png").await?;
    /// let status = queue.work_group("thumbnails")?.job(seq).await?;
    /// println!("{}: {}", seq, status.state.as_str());
    /// # Ok(()) }
    /// ```
    pub async fn job(&self, seq: u64) -> Result<crate::stats::JobStatus, Error> {
        self.shared.job(&self.name, &self.queue.name, seq).await
    }

    /// Waits until job `seq` of this group is final and returns its status, with its kept
    /// outcome: [`Broker::wait_job`](crate::Broker::wait_job) for this group's queue and name.
    /// What a producer awaits after a send to learn that (and how) its job finished.
    ///
    /// # Errors
    ///
    /// As [`Broker::wait_job`](crate::Broker::wait_job).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads and waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// let group = queue.work_group("render")?.keep_outcomes(Duration::from_secs(3600));
    /// let seq = queue.send("invoice 7").await?;
    /// let done = group.wait_job(seq).await?;
    /// if let Some(outcome) = done.outcome {
    ///     println!("{} after {} attempts: {:?}", outcome.kind.as_str(), outcome.attempt, outcome.result);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait_job(&self, seq: u64) -> Result<crate::stats::JobStatus, Error> {
        self.shared.wait_job(&self.name, &self.queue.name, seq).await
    }

    /// Whether the group claims under a rate limit: set by this handle, or stored with the
    /// group when this process last saw its settings. A worker pool then claims only for idle
    /// handlers (see `Workers::prefetch`).
    /// The group's queue (a flow step is sent to it).
    pub(crate) fn queue_state(&self) -> &Arc<QueueState> {
        &self.queue
    }

    pub(crate) fn has_rate_limit(&self) -> bool {
        let set = self.rate_limit.is_some_and(|r| r.is_some());
        set || self.state().and_then(|g| g.settings()).is_some_and(|s| s.rate_limit.is_some())
    }

    pub(crate) fn saturation_threshold(&self) -> Duration {
        self.saturation_after
    }

    fn state(&self) -> Option<Arc<WorkGroupState>> {
        // Only this handle's queue: after a delete, a queue created again under the name is
        // another queue, and a stale handle must not move or reconfigure its groups.
        self.shared.work_group(&self.name, &self.queue.name).filter(|g| Arc::ptr_eq(&g.queue, &self.queue))
    }

    /// Messages currently leased to consumers of this group (in this process).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let group = queue.work_group("mailer")?;
    /// println!("{} leased, {} waiting for a retry", group.in_flight(), group.waiting());
    /// # Ok(()) }
    /// ```
    pub fn in_flight(&self) -> usize {
        self.state().map_or(0, |g| g.leased())
    }

    /// Messages waiting for a retry.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let group = queue.work_group("mailer")?;
    /// println!("{} leased, {} waiting for a retry", group.in_flight(), group.waiting());
    /// # Ok(()) }
    /// ```
    pub fn waiting(&self) -> usize {
        self.state().map_or(0, |g| g.waiting())
    }

    /// Times a subscription of this group waited on a full in-flight bound for longer than
    /// [`saturation_after`](WorkGroup::saturation_after).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let group = queue.work_group("mailer")?;
    /// println!("saturated {} times since open", group.saturations());
    /// # Ok(()) }
    /// ```
    pub fn saturations(&self) -> u64 {
        self.state().map_or(0, |g| g.saturations.load(Ordering::Relaxed))
    }

    /// Replays: moves the group's offset so that claiming restarts at the given sequence, or
    /// at the first message enqueued at or after the given time; every claim (attempt counts,
    /// retry times, finished-above-the-offset marks) is dropped. The target must be retained.
    /// Returns the sequence claiming restarts at.
    ///
    /// # Errors
    ///
    /// [`Error::Active`] while a subscription or pool of the group runs in this process
    /// or one of its jobs is held under a lease not yet run out, [`Error::NoSuchGroup`],
    /// [`Error::OutOfRange`], [`Error::Shutdown`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the offset is either moved or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::ResetTo;
    /// // Reprocess from #1000 (no subscription of the group may be running).
    /// let next = queue.work_group("indexer")?.reset_to(ResetTo::Sequence(1000)).await?;
    /// assert_eq!(next, 1000);
    /// # Ok(()) }
    /// ```
    pub async fn reset_to(&self, to: ResetTo) -> Result<u64, Error> {
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        self.shared.check(Capability::ResetGroup)?;
        let names = || (self.name.to_string(), self.queue.name.to_string());
        let Some(state) = self.state() else {
            let (group, queue) = names();
            return Err(Error::NoSuchGroup { group, queue });
        };
        if state.subscriptions.load(Ordering::Acquire) > 0 || state.held(self.shared.clock().now()) {
            let (group, queue) = names();
            return Err(Error::Active { group, queue });
        }
        let seq = self.shared.reset_target(&self.queue, to).await?;
        let (reply, rx) = oneshot::channel();
        let req = Request::Work(WorkRequest::Reset { group: state, offset: seq - 1, reply });
        self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)??;
        tracing::info!(group = %self.name, queue = %self.queue.name, seq, "rockq: work-queue group reset");
        Ok(seq)
    }

    /// Starts receiving jobs. The group is created (durably) on first use, and its settings
    /// are stored with it then (see [`WorkGroup`]): settings this handle leaves unset take the
    /// stored values, settings it sets must equal them.
    ///
    /// # Errors
    ///
    /// [`Error::SettingsMismatch`] if a setting this handle sets explicitly differs
    /// from the stored one (nothing is written; use [`update`](WorkGroup::update) to change
    /// it), [`Error::InvalidOption`] for a lease under 1 ms or the group's own queue
    /// as its dead-letter queue, [`Error::WrongMode`] if the name is an ordered group
    /// on this queue, [`Error::InvalidName`] for a bad dead-letter queue name,
    /// [`Error::DeadLetterName`] if the default one would be too long,
    /// [`Error::OutOfRange`], [`Error::Shutdown`],
    /// [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped future holds no claims (the group, and its settings, may have
    /// been stored).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// // Runs with the lease, retry policy and dead-letter queue stored with the group.
    /// let mut jobs = queue.work_group("mailer")?.subscribe().await?;
    /// if let Some(job) = jobs.next().await {
    ///     job?.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(&self) -> Result<WorkSubscription, Error> {
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if self.queue.is_deleted() {
            return Err(Error::QueueDeleted { queue: self.queue.name.to_string() });
        }
        let requested = self.requested()?;
        let state = self.create().await?;
        // Known in memory once stored (read at open, or installed by the writer): checked here
        // without a write. Otherwise the writer stores them, or finds a racing handle did.
        let settings = match state.settings() {
            Some(stored) => match requested.mismatch(&stored) {
                Some(m) => return Err(m.into_error(&self.name, &self.queue.name)),
                None => stored,
            },
            None => self.store(&state, requested, SettingsMode::Adopt).await?,
        };
        let config = Arc::new(HandleLimits {
            resolved: settings,
            max_in_flight: self.max_in_flight,
            claim_batch: self.claim_batch,
            saturation_after: self.saturation_after,
            priority_share: self.priority_share,
            consumer: self.consumer.clone().unwrap_or_else(|| {
                let n = NEXT_CONSUMER.fetch_add(1, Ordering::Relaxed);
                Arc::from(format!("{}-{n}", std::process::id()))
            }),
        });
        tracing::debug!(group = %self.name, queue = %self.queue.name, "rockq: work-queue subscription");
        Ok(WorkSubscription::new(self.shared.clone(), state, config))
    }

    /// Stores the settings this handle sets explicitly ([`lease`](WorkGroup::lease),
    /// [`retry_policy`](WorkGroup::retry_policy), [`dead_letter_queue`](WorkGroup::dead_letter_queue),
    /// [`ordered_by_key`](WorkGroup::ordered_by_key)) as the group's, in one atomic write; the
    /// ones it leaves unset keep their stored values. Creates the group (from
    /// [`start_from`](WorkGroup::start_from)) if it does not exist, with defaults for the
    /// unset ones.
    ///
    /// Once it returns, the new values are durable and every subscription and worker pool of
    /// the group in this process uses them for what it decides from then on: claims take the
    /// new lease, a pool's heartbeat and the lease a worker gives a job it starts follow it,
    /// outcomes use the new retry policy (delay and attempt limit) and dead-letter queue, and
    /// key ordering turns on or off. Jobs already handed out keep the lease they were claimed
    /// with until extended. Another process sees the new values when it opens the database
    /// (a database is held by one process at a time).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOption`] for a lease under 1 ms or the group's own queue as
    /// its dead-letter queue, [`Error::InvalidName`] for a bad dead-letter queue
    /// name, [`Error::DeadLetterName`] if the default one would be too long,
    /// [`Error::WrongMode`] if the name is an ordered group on this queue,
    /// [`Error::OutOfRange`] (creating it), [`Error::Shutdown`],
    /// [`Error::Storage`]. Nothing is changed when it fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the settings are either stored or not (a dropped future may
    /// still have them stored, and installed, once the write lands).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// // Lengthen the stored lease; the stored retry policy and dead-letter queue stay.
    /// queue.work_group("mailer")?.lease(Duration::from_secs(120)).update().await?;
    /// # Ok(()) }
    /// ```
    pub async fn update(&self) -> Result<(), Error> {
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let requested = self.requested()?;
        let state = self.create().await?;
        let s = self.store(&state, requested, SettingsMode::Update).await?;
        tracing::info!(group = %self.name, queue = %self.queue.name, lease = ?s.lease,
            max_attempts = s.policy.attempts(), dlq = %s.dead_letter_queue, ordered_by_key = s.ordered_by_key,
            "rockq: work-queue group settings updated");
        Ok(())
    }

    /// The stored settings this handle sets, checked.
    fn requested(&self) -> Result<RequestedWork, Error> {
        if self.keep_outcomes.is_some_and(|k| !k.is_zero()) {
            self.shared.check(Capability::KeepOutcomes)?;
        }
        if let Some(Some(n)) = self.per_key_limit {
            if !(1..=crate::model::MAX_PER_KEY_LIMIT).contains(&n) {
                return Err(Error::InvalidOption(format!(
                    "work group {} on queue {}: a per-key limit must be 1 to {}, not {n}",
                    self.name,
                    self.queue.name,
                    crate::model::MAX_PER_KEY_LIMIT
                )));
            }
            if self.ordered_by_key == Some(true) {
                return Err(Error::InvalidOption(format!(
                    "work group {} on queue {}: ordered_by_key is a per-key limit of 1; set one or the other",
                    self.name, self.queue.name
                )));
            }
        }
        if let Some(Some(r)) = self.rate_limit
            && let Some(why) = r.invalid()
        {
            return Err(Error::InvalidOption(format!(
                "work group {} on queue {}: {why}",
                self.name, self.queue.name
            )));
        }
        if self.concurrency_limit == Some(Some(0)) {
            return Err(Error::InvalidOption(format!(
                "work group {} on queue {}: a concurrency limit of 0 would claim nothing, ever (pause the group instead)",
                self.name, self.queue.name
            )));
        }
        if let Some(l) = self.lease
            && l < MIN_LEASE
        {
            return Err(Error::InvalidOption(format!(
                "work group {} on queue {}: lease {l:?} is shorter than the minimum of {MIN_LEASE:?}",
                self.name, self.queue.name
            )));
        }
        if let Some(n) = &self.dlq {
            name::validate(NameKind::Queue, n)?;
            crate::model::check_dead_letter_queue(&self.queue.name, &self.name, n)
                .map_err(Error::InvalidOption)?;
        }
        Ok(RequestedWork {
            lease: self.lease,
            policy: self.policy.clone(),
            dead_letter_queue: self.dlq.clone(),
            ordered_by_key: self.ordered_by_key,
            keep_outcomes: self.keep_outcomes.map(crate::clock::clamp_delay),
            rate_limit: self.rate_limit,
            concurrency_limit: self.concurrency_limit,
            per_key_limit: self.per_key_limit,
        })
    }

    /// The group's state, creating the group (durably) if it does not exist.
    async fn create(&self) -> Result<Arc<WorkGroupState>, Error> {
        if let Some(g) = self.state() {
            return Ok(g);
        }
        if self.shared.ordered_group(&self.name, &self.queue.name).is_some() {
            return Err(Error::WrongMode {
                group: self.name.to_string(),
                queue: self.queue.name.to_string(),
                existing: "ordered",
            });
        }
        // Refused before anything is written: a new group would need the default name.
        let default_dlq = crate::model::default_dead_letter_queue(&self.queue.name);
        if self.dlq.is_none() && default_dlq.len() > MAX_NAME_LEN {
            return Err(Error::DeadLetterName { queue: self.queue.name.to_string() });
        }
        let (reply, rx) = oneshot::channel();
        let req = Request::Work(WorkRequest::Create {
            queue: self.queue.clone(),
            group: self.name.to_string(),
            start: self.start,
            reply,
        });
        self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// Has the writer resolve `requested` against the group's latest record and store the
    /// result; returns the settings the group runs with, installed once durable.
    async fn store(
        &self,
        state: &Arc<WorkGroupState>,
        requested: RequestedWork,
        mode: SettingsMode,
    ) -> Result<Arc<WorkSettings>, Error> {
        let (reply, rx) = oneshot::channel();
        let req = Request::WorkSettings(WorkSettingsRequest { group: state.clone(), requested, mode, reply });
        self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }
}
