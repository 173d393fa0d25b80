//! [`Job`]: a leased message of a work-queue group, and its outcomes. [`Task`]: the read-only
//! view a worker-pool handler gets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::limits::HandleLimits;
use crate::engine::boundary::{
    Claimed, HeldLease, Outcome, QueuedAck, RawMessage, Request, SettlingGuard, Shared, WorkGroupState,
    WorkRequest,
};
use crate::error::Error;
use crate::model::Claim;

pub(crate) struct JobInner {
    pub shared: Arc<Shared>,
    pub group: Arc<WorkGroupState>,
    pub config: Arc<HandleLimits>,
    pub msg: RawMessage,
    pub attempt: u32,
    pub token: u64,
    /// The group's reset epoch when it was claimed.
    pub epoch: u64,
    /// This holder's lease. Shared with the etcd writer: an extension that did not reach etcd
    /// puts the deadline back (see `WorkGroupState::cap_lease`).
    lease: Arc<Mutex<HeldLease>>,
    /// Dropping the job gives the attempt back (set while the job sits unseen in a
    /// subscription's buffer, and by a worker pool stopping handlers at shutdown).
    pub uncounted: AtomicBool,
    /// What a pool handler wrote into its transaction (`Task::tx`), made on first use.
    pub tx: std::sync::OnceLock<crate::txn::task::TaskTx>,
    /// How many times in a row its pool handler's transaction conflicted (see the pool's
    /// `commit_with_ack`).
    pub conflicts: std::sync::atomic::AtomicU32,
    /// The handler's result (`set_result`), written with the ack's outcome.
    result: Mutex<Option<bytes::Bytes>>,
}

impl JobInner {
    /// The job of `msg`, held under the claim `c`.
    pub fn new(
        shared: Arc<Shared>,
        group: Arc<WorkGroupState>,
        config: Arc<HandleLimits>,
        msg: RawMessage,
        c: &Claimed,
    ) -> Arc<Self> {
        Arc::new(JobInner {
            shared,
            group,
            config,
            msg,
            attempt: c.attempt,
            token: c.token,
            epoch: c.epoch,
            lease: Arc::new(Mutex::new(HeldLease::new(c.deadline))),
            uncounted: AtomicBool::new(true),
            tx: std::sync::OnceLock::new(),
            conflicts: Default::default(),
            result: Mutex::new(None),
        })
    }

    /// Forgets the result set so far: the handler runs again (a conflicted transaction's
    /// rerun), and what the discarded run set must not go with the rerun's ack.
    pub(crate) fn clear_result(&self) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The result set so far (cloned: a refused transaction leaves it for the next ack).
    pub(crate) fn result(&self) -> Option<bytes::Bytes> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn report_progress(&self, report: bytes::Bytes) -> Result<(), Error> {
        let shared = &self.shared;
        shared.check(crate::engine::boundary::Capability::JobProgress)?;
        at_most("a progress report", report.len(), crate::stats::MAX_PROGRESS_BYTES, "MAX_PROGRESS_BYTES")?;
        if shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if self.group.is_deleted() {
            return Err(deleted(&self.group));
        }
        let (seq, now) = (self.msg.seq, shared.clock().now());
        let first = self
            .group
            .report_progress(seq, self.token, now, report)
            .map_err(|_| self.group.lease_lost(seq, self.attempt))?;
        if first {
            shared.mark_work_dirty(self.group.clone());
            shared.nudge_writer();
        }
        Ok(())
    }

    fn set_result(&self, value: bytes::Bytes) -> Result<(), Error> {
        let (queue, group) = (&self.group.queue.name, &self.group.name);
        // A flow step's result goes to its flow's record (`FlowStatus`), kept or not here.
        let step = self.msg.headers.iter().any(|(k, _)| k == crate::flow_state::FLOW_HEADER);
        if self.config.settings(&self.group).keep_outcomes.is_zero() && !step {
            return Err(Error::Invalid {
                reason: format!(
                    "work group {group} on queue {queue} keeps no outcomes (WorkGroup::keep_outcomes): a result would be dropped"
                ),
            });
        }
        at_most("a job result", value.len(), crate::stats::MAX_RESULT_BYTES, "MAX_RESULT_BYTES")?;
        if step {
            let (most, name) = self.shared.max_step_result();
            at_most("a flow step's result", value.len(), most, name)?;
        }
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
        Ok(())
    }

    /// When this holder's lease ends, on the broker's clock.
    pub(crate) fn deadline(&self) -> Instant {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).deadline
    }

    fn extend(&self, by: Duration) -> Result<(), Error> {
        let clock = self.shared.clock();
        let now = clock.now();
        let lost = self.group.lease_lost(self.msg.seq, self.attempt);
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if self.group.is_deleted() {
            return Err(deleted(&self.group));
        }
        // `by` is clamped to 100 years (`Duration::MAX` would overflow `Instant`).
        let until = clock.after(by);
        self.group.extend(self.msg.seq, self.token, now, until).map_err(|_| lost)?;
        let number = {
            let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
            lease.deadline = until;
            lease.requested = until;
            lease.extensions += 1;
            lease.extensions
        };
        // On etcd, other processes read the deadline from the claim record: it is rewritten
        // (compared with this holder's claim) as soon as the writer gets to it. If that write
        // fails, the deadline goes back to the one others read, so that this holder never
        // believes it holds the job past the deadline another process reads.
        self.shared.persist_extension(
            &self.group,
            self.msg.seq,
            (self.attempt, self.token),
            number,
            &self.lease,
            &self.config.consumer,
        );
        Ok(())
    }
}

/// `Error::Invalid` for `what` of `len` bytes over `max` (the constant named `name`).
fn at_most(what: &str, len: usize, max: usize, name: &str) -> Result<(), Error> {
    if len > max {
        return Err(Error::Invalid {
            reason: format!("{what} of {len} bytes is over the maximum of {max} ({name})"),
        });
    }
    Ok(())
}

/// Read accessors shared by [`Job`] and [`Task`].
macro_rules! accessors {
    ($var:literal, $ty:literal) => {
        crate::message::message_accessors!($var, $ty);

        /// The flow steps this job runs after, with their states and results (a parent's
        /// children, the step before in a chain, a batch's jobs): read from its flow's records,
        /// which its dependencies finished in before this job was sent. Empty for a job that
        /// is no flow step, or a step that runs after nothing.
        ///
        /// # Errors
        ///
        /// [`Error::NoSuchFlow`] if the flow was deleted; [`Error::Shutdown`],
        /// [`Error::Storage`], [`Error::Corrupt`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("# async fn demo(", $var, ": rockq::", $ty, ") -> Result<(), rockq::Error> {")]
        #[doc = concat!("for child in ", $var, ".flow_dependencies().await? {")]
        ///     println!("step {} returned {:?}", child.step, child.state.result());
        /// }
        /// # Ok(()) }
        /// ```
        pub async fn flow_dependencies(&self) -> Result<Vec<crate::flow_state::StepStatus>, Error> {
            let Some(at) = self.flow_step() else { return Ok(Vec::new()) };
            let status = self.inner.shared.flow_status(at.flow).await?;
            Ok(status.dependencies(at.step).into_iter().cloned().collect())
        }

        /// Its message.
        fn raw(&self) -> Option<&RawMessage> {
            Some(&self.inner.msg)
        }

        /// Its queue and group.
        fn names(&self) -> (&str, &str) {
            (&self.inner.group.queue.name, &self.inner.group.name)
        }

        /// This attempt's number, from 1. Counted durably: attempts made before a crash count.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(task: rockq::Task) {
        /// if task.attempt() > 1 {
        ///     eprintln!("{}#{}: attempt {}", task.queue(), task.seq(), task.attempt());
        /// }
        /// # }
        /// ```
        pub fn attempt(&self) -> u32 {
            self.inner.attempt
        }

        /// How long this holder's lease still runs (zero once it has expired), measured on
        /// the broker's [`Clock`](crate::Clock). Extending the lease ([`extend`](Self::extend),
        /// a pool's heartbeat) renews it.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
        /// use std::time::Duration;
        /// if job.lease_remaining() < Duration::from_secs(5) {
        ///     job.extend(Duration::from_secs(30))?;
        /// }
        /// # job.ack()?;
        /// # Ok(()) }
        /// ```
        pub fn lease_remaining(&self) -> Duration {
            let deadline = self.inner.deadline();
            deadline.saturating_duration_since(self.inner.shared.clock().now())
        }

        /// When the lease ends, as an `Instant` on the broker's [`Clock`](crate::Clock) (which
        /// is not `Instant::now()`'s clock under a `ManualClock`).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(task: rockq::Task) {
        /// #[allow(deprecated)]
        /// let deadline = task.lease_deadline();
        /// let remaining = task.lease_remaining(); // prefer this
        /// # }
        /// ```
        #[deprecated(
            since = "0.2.0",
            note = "use lease_remaining(): an Instant on the broker's clock is easy to misuse"
        )]
        pub fn lease_deadline(&self) -> Instant {
            self.inner.deadline()
        }

        /// Extends the lease to `by` from now, so that a long handler keeps the message. `by` is
        /// clamped to 100 years (so `Duration::MAX` means "until settled or dropped").
        ///
        /// # Errors
        ///
        /// [`Error::LeaseLost`] if the lease already expired (the message may be with
        /// another consumer now); [`Error::Shutdown`].
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
        /// use std::time::Duration;
        /// // A long step: keep the message for another 5 minutes.
        /// job.extend(Duration::from_secs(300))?;
        /// job.ack()?;
        /// # Ok(()) }
        /// ```
        pub fn extend(&self, by: Duration) -> Result<(), Error> {
            self.inner.extend(by)
        }

        /// Sets the job's result: kept with its outcome when the job is acked (by a pool when
        /// the handler returns `Ok`, or by [`Job::ack`] and its twins), for as long as the group
        /// [keeps outcomes](crate::WorkGroup::keep_outcomes); read back with
        /// [`Broker::job`](crate::Broker::job) or [`Broker::wait_job`](crate::Broker::wait_job)
        /// ([`JobOutcome::result`](crate::JobOutcome::result)). A flow step's result is also
        /// kept in its flow's record, for the steps after it
        /// ([`flow_dependencies`](Self::flow_dependencies)), whether the group keeps outcomes
        /// or not. A later call replaces it; a failed attempt drops it. Nothing is written
        /// until the ack.
        ///
        /// # Errors
        ///
        /// [`Error::Invalid`] if the group keeps no outcomes and the job is no flow step (the
        /// result would be dropped) or
        /// the value is over [`MAX_RESULT_BYTES`](crate::stats::MAX_RESULT_BYTES) (a flow step's,
        /// on the etcd engine, over [`MAX_ETCD_STEP_RESULT_BYTES`](crate::MAX_ETCD_STEP_RESULT_BYTES)).
        /// Nothing changes.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        /// use std::time::Duration;
        /// let group = queue.work_group("thumbnails")?.keep_outcomes(Duration::from_secs(24 * 3600));
        /// group.workers(4).run(|task: rockq::Task| async move {
        ///     let url = format!("https://cdn.example/{}.webp", task.seq());
        ///     task.set_result(url)?;
        ///     Ok(())
        /// }).await?;
        /// # Ok(()) }
        /// ```
        pub fn set_result(&self, value: impl Into<bytes::Bytes>) -> Result<(), Error> {
            self.inner.set_result(value.into())
        }

        /// Reports progress: `report` (a percentage, a cursor, a checkpoint — your encoding)
        /// becomes the job's last progress report at once, for [`Broker::job`](crate::Broker::job)
        /// ([`JobStatus::progress`](crate::JobStatus::progress)) and for
        /// [`last_progress`](Self::last_progress) in this or a later attempt, and is written
        /// in the writer's next round: reports made faster than rounds are coalesced, the
        /// last one is written. Returns without waiting for the write; a crash before it keeps
        /// the report written before. The report goes when the job is finished (it lives as
        /// long as the job runs or waits for a retry), and with a reset or a retention trim
        /// past it.
        ///
        /// # Errors
        ///
        /// [`Error::LeaseLost`] if this holder's lease ran out (the report is not kept);
        /// [`Error::Invalid`] for a report over [`MAX_PROGRESS_BYTES`](crate::stats::MAX_PROGRESS_BYTES);
        /// [`Error::GroupDeleted`], [`Error::Shutdown`]. Nothing changes on an error. On the etcd
        /// engine a report is written only while this holder's claim is still its own there.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
        /// group.workers(2).run(|task: rockq::Task| async move {
        ///     // Resume after the last checkpoint of an earlier attempt (a crash, a retry).
        ///     let start: usize = task
        ///         .last_progress()
        ///         .and_then(|p| std::str::from_utf8(&p).ok()?.parse().ok())
        ///         .unwrap_or(0);
        ///     for row in start..10_000 {
        ///         // ... import row ...
        ///         if row % 500 == 0 {
        ///             task.progress(row.to_string())?;
        ///         }
        ///     }
        ///     Ok(())
        /// }).await?;
        /// # Ok(()) }
        /// ```
        pub fn progress(&self, report: impl Into<bytes::Bytes>) -> Result<(), Error> {
            self.inner.report_progress(report.into())
        }

        /// The job's last progress report ([`progress`](Self::progress)): this attempt's, or
        /// an earlier attempt's (before a retry, an expired lease or a restart), so that a
        /// handler can resume from it. `None` if none was made.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(task: rockq::Task) {
        /// if let Some(p) = task.last_progress() {
        ///     println!("attempt {} resumes after {:?}", task.attempt(), p);
        /// }
        /// # }
        /// ```
        pub fn last_progress(&self) -> Option<bytes::Bytes> {
            self.inner.group.last_progress(self.inner.msg.seq)
        }
    };
}

/// A message leased to this consumer by a work-queue group. Settle it with one of
/// [`ack`](Job::ack), [`nack`](Job::nack), [`fail`](Job::fail),
/// [`retry_after`](Job::retry_after) or [`dead_letter`](Job::dead_letter).
///
/// **The ack contract** (the same on ordered groups' [`Delivery`](crate::Delivery)): each
/// outcome is checked against the lease and **queued** when the method returns — `ack()` at
/// once, the others once the writer's queue took them — and written in the writer's next
/// round; a crash before that write only means a redelivery. Each has a `_durable` twin
/// ([`ack_durable`](Job::ack_durable), [`nack_durable`](Job::nack_durable), …) that returns
/// once the outcome is durable.
///
/// Only the current holder can settle or extend: once the lease has expired (see
/// [`WorkGroup::lease`](crate::WorkGroup::lease)) every one of them returns
/// [`Error::LeaseLost`] and changes nothing, even if nobody has claimed the message since.
///
/// **Dropping a job without an outcome** releases the lease at once: the message can be
/// claimed again right away, and the attempt **counts** (it was persisted before the job was
/// handed out), so a consumer that keeps dropping a message still ends in the dead-letter
/// queue. Jobs a subscription claimed but never handed out do not count — unless the process
/// stops before they are claimed again: their claim (and attempt) was already written.
#[must_use = "a job dropped without an outcome is released and its attempt counts"]
pub struct Job {
    inner: Arc<JobInner>,
    permit: Option<OwnedSemaphorePermit>,
    settled: bool,
}

/// A read-only view of a [`Job`] that a [`Handler`](crate::Handler) receives: the pool settles
/// the job from the handler's result. Cheap to clone.
#[derive(Clone)]
pub struct Task {
    inner: Arc<JobInner>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("queue", &self.queue())
            .field("group", &self.group())
            .field("seq", &self.seq())
            .field("attempt", &self.attempt())
            .finish()
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").field("queue", &self.queue()).field("seq", &self.seq()).finish()
    }
}

impl Task {
    accessors!("task", "Task");

    pub(crate) fn inner(&self) -> &Arc<JobInner> {
        &self.inner
    }
}

/// A worker pool's decision for a job.
pub(crate) enum PoolOutcome {
    Ack,
    Retry { delay: Option<Duration>, error: String },
    DeadLetter { reason: String },
}

enum Kind {
    Ack,
    Retry { delay: Option<Duration>, error: String },
    DeadLetter { reason: String },
}

impl Job {
    pub(crate) fn new(inner: Arc<JobInner>, permit: OwnedSemaphorePermit) -> Self {
        Job { inner, permit: Some(permit), settled: false }
    }

    pub(crate) fn inner(&self) -> &Arc<JobInner> {
        &self.inner
    }

    /// Whether a job claimed ahead must not be handed out: its lease ran out while it waited
    /// (in a subscription's buffer or a pool's feed: any outcome would be refused), or a
    /// purge or trim moved its group past it.
    pub(crate) fn is_stale(&self) -> bool {
        self.lease_remaining().is_zero()
            || self.seq() < self.inner.group.queue.first_seq.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The group's stored lease now (a worker pool extends by it).
    pub(crate) fn group_lease(&self) -> Duration {
        self.inner.config.settings(&self.inner.group).lease
    }

    accessors!("job", "Job");

    /// A read-only handle on this job (for a handler, or for logging after a move).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// let task = job.task();
    /// job.ack()?;
    /// println!("acked {}#{}", task.queue(), task.seq()); // still readable after the move
    /// # Ok(()) }
    /// ```
    pub fn task(&self) -> Task {
        Task { inner: self.inner.clone() }
    }

    /// The message is done, and this returns at once: the ack is **queued**, fenced by the
    /// lease now (a lost lease is refused here, and nothing changes). The writer records it in
    /// its next round, coalesced with other acks; the group's offset moves past the message
    /// once every earlier message is done too. A crash before that write delivers the message
    /// again (at-least-once). To wait until the ack is durable use
    /// [`ack_durable`](Job::ack_durable).
    ///
    /// The same contract as [`Delivery::ack`](crate::Delivery::ack) on ordered groups.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease expired first (or the message was purged): nothing
    /// changes, and the message is (or will be) delivered again. [`Error::GroupDeleted`] if the
    /// group or its queue was deleted. [`Error::Shutdown`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use futures::StreamExt;
    /// let mut jobs = queue.work_group("mailer")?.subscribe().await?;
    /// while let Some(job) = jobs.next().await {
    ///     let job = job?;
    ///     // ... send the mail ...
    ///     job.ack()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn ack(mut self) -> Result<(), Error> {
        self.settled = true;
        let inner = &self.inner;
        let (seq, attempt) = (inner.msg.seq, inner.attempt);
        let shared = &inner.shared;
        if shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let group = &inner.group;
        if group.is_deleted() {
            return Err(deleted(group));
        }
        group
            .begin_settle(seq, inner.token, shared.clock().now())
            .map_err(|_| group.lease_lost(seq, attempt))?;
        // Coalesced: the writer picks up every queued ack of the group in its next round.
        let flow = crate::flow_state::FlowStep::in_headers(&inner.msg.headers);
        let ack = QueuedAck { seq, attempt, epoch: inner.epoch, result: inner.result(), flow };
        if group.queue_ack(ack) {
            shared.mark_work_dirty(group.clone());
            shared.nudge_writer();
        }
        drop(self.permit.take());
        Ok(())
    }

    /// The message is done; returns once the ack is **durable** (in the broker's
    /// [`Durability`](crate::Durability) sense). The same contract as
    /// [`Delivery::ack_durable`](crate::Delivery::ack_durable), except that a work group's
    /// ack does not wait for earlier messages.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease expired first: nothing changes, and the message
    /// is (or will be) delivered again; also if the message was purged meanwhile
    /// ([`Broker::purge_queue`](crate::Broker::purge_queue)). [`Error::GroupDeleted`] if the
    /// group or its queue was deleted (nothing is written). [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the outcome was queued, the message is released (and
    /// the attempt counts); after that, the ack completes regardless.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// // ... charge the card ...
    /// job.ack_durable().await?; // a crash from here on does not charge twice
    /// # Ok(()) }
    /// ```
    pub async fn ack_durable(self) -> Result<(), Error> {
        self.settle(true, Kind::Ack).await
    }

    /// This attempt failed: retry after the group's backoff, or dead-letter the message if it
    /// has used up its attempts. Same as [`fail`](Job::fail) without an error text. Returns
    /// once the outcome is **queued** to the writer (fenced by the lease now, applied in
    /// order); use [`nack_durable`](Job::nack_durable) to wait until it is durable.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] (nothing changes), [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the outcome was queued, the message is released (and
    /// the attempt counts); after that, the outcome is applied regardless.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// job.nack().await?;
    /// # Ok(()) }
    /// ```
    pub async fn nack(self) -> Result<(), Error> {
        self.settle(false, Kind::Retry { delay: None, error: "nacked".into() }).await
    }

    /// [`nack`](Job::nack), returning once the outcome is durable.
    ///
    /// # Errors
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Cancel safety
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// job.nack_durable().await?; // durably released for another attempt
    /// # Ok(()) }
    /// ```
    pub async fn nack_durable(self) -> Result<(), Error> {
        self.settle(true, Kind::Retry { delay: None, error: "nacked".into() }).await
    }

    /// This attempt failed with `error` (kept in the claim record and, eventually, the dead
    /// letter): retry after the group's backoff, or dead-letter if attempts are used up.
    /// Queued like [`nack`](Job::nack).
    ///
    /// # Errors
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Cancel safety
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// match std::str::from_utf8(job.payload()) {
    ///     Ok(_) => job.ack()?,
    ///     Err(e) => job.fail(e).await?, // retried after the group's backoff
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fail(self, error: impl std::fmt::Display) -> Result<(), Error> {
        self.settle(false, Kind::Retry { delay: None, error: error.to_string() }).await
    }

    /// [`fail`](Job::fail), returning once the outcome is durable.
    ///
    /// # Errors
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Cancel safety
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// job.fail_durable("upstream returned 503").await?;
    /// # Ok(()) }
    /// ```
    pub async fn fail_durable(self, error: impl std::fmt::Display) -> Result<(), Error> {
        self.settle(true, Kind::Retry { delay: None, error: error.to_string() }).await
    }

    /// This attempt failed: retry after exactly `delay` (overriding the backoff), or
    /// dead-letter if attempts are used up. While it waits the message holds no in-flight
    /// slot and does not hold back later messages. A `delay` over 100 years is clamped to 100
    /// years. Queued like [`nack`](Job::nack).
    ///
    /// # Errors
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Cancel safety
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// // Rate-limited upstream: try again in a minute.
    /// job.retry_after(Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn retry_after(self, delay: Duration) -> Result<(), Error> {
        let error = format!("retry requested after {delay:?}");
        self.settle(false, Kind::Retry { delay: Some(delay), error }).await
    }

    /// [`retry_after`](Job::retry_after), returning once the outcome is durable.
    ///
    /// # Errors
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Cancel safety
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// job.retry_after_durable(Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn retry_after_durable(self, delay: Duration) -> Result<(), Error> {
        let error = format!("retry requested after {delay:?}");
        self.settle(true, Kind::Retry { delay: Some(delay), error }).await
    }

    /// For worker pools: records the handler's outcome and returns once it is queued to the
    /// writer (fenced like any outcome), without waiting for the write. The pool flushes before
    /// it returns; a crash before the write only means a redelivery.
    pub(crate) async fn settle_queued(self, outcome: PoolOutcome) -> Result<(), Error> {
        let kind = match outcome {
            PoolOutcome::Ack => return self.ack(),
            PoolOutcome::Retry { delay, error } => Kind::Retry { delay, error },
            PoolOutcome::DeadLetter { reason } => Kind::DeadLetter { reason },
        };
        self.settle(false, kind).await
    }

    /// Gives up on the message now: it moves to the group's dead-letter queue with `reason`,
    /// in the same atomic write that finishes it here. Queued like [`nack`](Job::nack).
    ///
    /// # Errors
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Cancel safety
    ///
    /// As [`nack`](Job::nack).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// if job.payload().is_empty() {
    ///     job.dead_letter("empty payload").await?; // no point retrying
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn dead_letter(self, reason: impl Into<String>) -> Result<(), Error> {
        self.settle(false, Kind::DeadLetter { reason: reason.into() }).await
    }

    /// [`dead_letter`](Job::dead_letter), returning once the message is durably in the
    /// dead-letter queue.
    ///
    /// # Errors
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Cancel safety
    ///
    /// As [`ack_durable`](Job::ack_durable).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(job: rockq::Job) -> Result<(), rockq::Error> {
    /// job.dead_letter_durable("unknown schema version").await?;
    /// # Ok(()) }
    /// ```
    pub async fn dead_letter_durable(self, reason: impl Into<String>) -> Result<(), Error> {
        self.settle(true, Kind::DeadLetter { reason: reason.into() }).await
    }

    async fn settle(mut self, wait: bool, kind: Kind) -> Result<(), Error> {
        self.settled = true;
        let inner = self.inner.clone();
        let (seq, attempt) = (inner.msg.seq, inner.attempt);
        let shared = &inner.shared;
        if shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let clock = shared.clock();
        let now = clock.now();
        let group = &inner.group;
        if group.is_deleted() {
            return Err(deleted(group));
        }
        group.begin_settle(seq, inner.token, now).map_err(|_| group.lease_lost(seq, attempt))?;
        let mut revert = SettlingGuard { group, seq, armed: true };
        // The group's settings now: an update applies to outcomes decided after it.
        let cfg = inner.config.settings(group);
        let mut waiting = None;
        let outcome = match kind {
            Kind::Ack => Outcome::Ack {
                result: inner.result(),
                flow: crate::flow_state::FlowStep::in_headers(&inner.msg.headers),
            },
            Kind::Retry { delay, error } if attempt < cfg.policy.attempts() => {
                // Clamped to 100 years: `Duration::MAX` would overflow `Instant` arithmetic.
                let delay =
                    crate::clock::clamp_delay(delay.unwrap_or_else(|| cfg.policy.jittered_delay(attempt)));
                let due = clock.after(delay);
                let claim = Claim::Waiting {
                    attempt,
                    token: inner.token,
                    not_before_micros: clock.wall_micros_at(due),
                    last_error: error.clone(),
                };
                waiting = Some((due, error));
                Outcome::Retry { claim, delay }
            }
            Kind::Retry { error, .. } => Outcome::DeadLetter {
                reason: format!("{attempt} attempts used up; last error: {error}"),
                dlq: cfg.dead_letter_queue.clone(),
            },
            Kind::DeadLetter { reason } => Outcome::DeadLetter { reason, dlq: cfg.dead_letter_queue.clone() },
        };
        let (reply, rx) = oneshot::channel();
        let req = Request::Work(WorkRequest::Outcome {
            group: group.clone(),
            seq,
            attempt,
            epoch: inner.epoch,
            outcome,
            taken_from: None,
            reply,
        });
        shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
        // Queued: from here on the writer applies it after every earlier write for `seq`, so
        // the message may become claimable again (a retry) without reordering records.
        revert.armed = false;
        if let Some((due, error)) = waiting {
            group.to_waiting(seq, due, error);
        }
        drop(self.permit.take());
        if !wait {
            // The writer still answers; nobody listens. A failed write fails the broker closed.
            return Ok(());
        }
        // A refused outcome was reverted by the writer itself (reverting here could undo a
        // newer holder's settle of the same message).
        match rx.await {
            Ok(res) => res,
            Err(_) => Err(Error::Shutdown),
        }
    }
}

/// A transaction's view of a job (see `Transaction::commit`).
impl Job {
    /// The broker this job belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// Fences the lease now and moves the job to settling, for a transaction: nobody else can
    /// settle it until the writer applies or refuses the transaction (which leases it to this
    /// holder again).
    pub(crate) fn begin_tx(&self) -> Result<crate::engine::boundary::TxJob, crate::error::Error> {
        let inner = &self.inner;
        let group = &inner.group;
        let seq = inner.msg.seq;
        if inner.shared.is_closed() {
            return Err(crate::error::Error::Shutdown);
        }
        if group.is_deleted() {
            return Err(crate::error::Error::GroupDeleted {
                queue: group.queue.name.to_string(),
                group: group.name.to_string(),
            });
        }
        let lost = || group.lease_lost(seq, inner.attempt);
        let lease = inner.lease.clone();
        group.begin_settle(seq, inner.token, inner.shared.clock().now()).map_err(|_| lost())?;
        Ok(crate::engine::boundary::TxJob {
            group: group.clone(),
            seq,
            attempt: inner.attempt,
            token: inner.token,
            epoch: inner.epoch,
            lease,
            result: inner.result(),
            flow: crate::flow_state::FlowStep::in_headers(&inner.msg.headers),
        })
    }

    /// A transaction that fenced this job was refused before reaching the writer: the lease is
    /// this holder's again.
    pub(crate) fn end_tx(&self) {
        let inner = &self.inner;
        inner.group.unsettle(inner.msg.seq, inner.token, inner.deadline(), inner.epoch);
    }

    /// The transaction that acked this job was applied.
    pub(crate) fn tx_committed(mut self) {
        self.settled = true;
        drop(self.permit.take());
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.settled {
            let counted = !self.inner.uncounted.load(Ordering::Acquire);
            self.inner.group.release(self.inner.msg.seq, self.inner.token, counted);
        }
    }
}

/// The refusal of a settle or extension once the job's group (or queue) was deleted.
fn deleted(g: &WorkGroupState) -> Error {
    Error::GroupDeleted { queue: g.queue.name.to_string(), group: g.name.to_string() }
}
