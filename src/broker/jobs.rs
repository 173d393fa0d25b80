//! An operator's actions on one job of a work group: retry it now, delete it, dead-letter it
//! (what the console's per-job buttons call).

use crate::error::{Error, NameKind};
use crate::stats::JobStatus;
use crate::work::operator::{self, JobAction};

use super::Broker;

impl Broker {
    /// Makes job `seq` of work group `group` on `queue`, waiting for a retry, claimable now.
    /// Its attempt count and last error stay as they are; the new due time is durable (a
    /// restart does not bring the old one back).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`] if the group finished it, retention deleted it, or it was never
    /// sent; [`Error::JobState`] if it is not waiting for a retry (leased, being settled, or
    /// claimable already); [`Error::NoSuchGroup`], [`Error::InvalidName`],
    /// [`Error::GroupDeleted`], [`Error::Shutdown`], [`Error::Storage`]. On the etcd engine the
    /// action is decided on what this process knows of the job and compared with it in etcd:
    /// [`Error::JobState`] (`"changed meanwhile"`) if another process claimed or settled it
    /// since, and nothing changed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: cancelled before the writer has it, nothing changes; after, the
    /// action is applied.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// // The downstream service is back: run job 42 at once instead of in an hour.
    /// broker.retry_job_now("emails", "mailer", 42).await?;
    /// # Ok(()) }
    /// ```
    pub async fn retry_job_now(&self, queue: &str, group: &str, seq: u64) -> Result<(), Error> {
        self.job_action(queue, group, seq, JobAction::RetryNow).await
    }

    /// Finishes job `seq` of work group `group` on `queue` without running it: the group moves
    /// past it as if a handler had acked it. The message stays in the queue for other groups
    /// (retention decides when it goes). Works on a job never claimed, waiting for a retry, or
    /// whose lease ran out; a job held by a live lease is refused, not taken from its holder.
    ///
    /// # Errors
    ///
    /// As for [`retry_job_now`](Broker::retry_job_now); [`Error::JobState`] if it is leased or
    /// being settled.
    ///
    /// # Cancel safety
    ///
    /// As for [`retry_job_now`](Broker::retry_job_now).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.delete_job("emails", "mailer", 42).await?;
    /// # Ok(()) }
    /// ```
    pub async fn delete_job(&self, queue: &str, group: &str, seq: u64) -> Result<(), Error> {
        self.job_action(queue, group, seq, JobAction::Delete).await
    }

    /// Moves job `seq` of work group `group` on `queue` to the group's dead-letter queue now,
    /// with `reason`, as a handler's [`Job::dead_letter`](crate::Job::dead_letter) would (the
    /// copy, the claim's removal and the offset move in one write). Refused for a job held by a
    /// live lease.
    ///
    /// # Errors
    ///
    /// As for [`delete_job`](Broker::delete_job).
    ///
    /// # Cancel safety
    ///
    /// As for [`retry_job_now`](Broker::retry_job_now).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.dead_letter_job("emails", "mailer", 42, "bounced address, parked by ops").await?;
    /// # Ok(()) }
    /// ```
    pub async fn dead_letter_job(
        &self,
        queue: &str,
        group: &str,
        seq: u64,
        reason: impl Into<String>,
    ) -> Result<(), Error> {
        self.job_action(queue, group, seq, JobAction::DeadLetter(reason.into())).await
    }

    /// Where job `seq` of work group `group` on `queue` stands: queued, parked behind its key,
    /// leased (for how long, by whom), expired, waiting for a retry (when, after which error),
    /// settling, finished, or removed by retention before it ran — with its attempts so far.
    /// Read from the group's claim index in memory (what claims and outcomes decide, before
    /// the writer has written it), so it is current, not as of the last write; a lease's
    /// holder comes from its claim record (one point read). Changes nothing.
    ///
    /// A job's id is its message's sequence: what [`Queue::send`](crate::Queue::send)'s
    /// receipt resolves to. A finished job's outcome (acked with its result, deleted, or
    /// dead-lettered with the reason) is in [`JobStatus::outcome`] when the group
    /// [keeps outcomes](crate::WorkGroup::keep_outcomes) (one more point read for a final job);
    /// otherwise only that it finished is known. A running job's last progress report is in
    /// [`JobStatus::progress`]. On etcd the view is this
    /// process's, kept current by the watch on the group's claim records: another process's
    /// claim shows once its record is written and watched (milliseconds).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`] if `seq` was never sent to `queue`; [`Error::NoSuchGroup`] if
    /// there is no work group `group` on `queue` (an ordered group has no jobs; on etcd, a group
    /// another process created after this one connected is not known yet);
    /// [`Error::GroupDeleted`], [`Error::InvalidName`], [`Error::Shutdown`]; [`Error::Storage`]
    /// if the holder's record cannot be read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use rockq::JobState;
    /// let id = queue.send("resize image 7").await?;
    /// // … later, perhaps from an HTTP handler:
    /// let status = broker.job("images", "resizers", id).await?;
    /// match status.state {
    ///     JobState::Leased { lease_remaining } => {
    ///         println!("attempt {} running on {:?}, {lease_remaining:?} left", status.attempt, status.holder)
    ///     }
    ///     JobState::RetryWaiting { due_in } => {
    ///         println!("failed ({:?}), again in {due_in:?}", status.last_error)
    ///     }
    ///     state => println!("{}", state.as_str()),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn job(&self, queue: &str, group: &str, seq: u64) -> Result<JobStatus, Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        crate::name::validate(NameKind::Group, group)?;
        self.shared.job(group, queue, seq).await
    }

    /// Waits until job `seq` of work group `group` on `queue` is final — finished (acked,
    /// deleted or dead-lettered) or removed by retention — and returns its [`JobStatus`]. Woken
    /// when the group's durable offset moves or a finished job is forgotten (once per writer
    /// round), never polling; a job already final returns at once. "Finished" here means
    /// durable: the outcome's write has completed, and a kept outcome (with the handler's
    /// result) is in the status returned. [`WorkGroup::wait_job`](crate::WorkGroup::wait_job)
    /// is the same from a group's handle.
    ///
    /// To wait with a deadline, wrap it in `tokio::time::timeout`. On etcd, another process's
    /// outcome is seen once the watch delivers it.
    ///
    /// # Errors
    ///
    /// As for [`job`](Broker::job) (on etcd, a group this process has not loaded is
    /// [`Error::NoSuchGroup`]); [`Error::GroupDeleted`] if the group is deleted while it waits;
    /// [`Error::Shutdown`] as soon as the broker starts shutting down (it does not wait for the
    /// pools' drain); [`Error::Failed`] if it failed closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits and reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let id = queue.send("build report 7").await?;
    /// let done = broker.wait_job("reports", "builders", id).await?;
    /// println!("job {id}: {}", done.state.as_str()); // "finished" (or "removed")
    /// # Ok(()) }
    /// ```
    pub async fn wait_job(&self, queue: &str, group: &str, seq: u64) -> Result<JobStatus, Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        crate::name::validate(NameKind::Group, group)?;
        self.shared.wait_job(group, queue, seq).await
    }

    async fn job_action(&self, queue: &str, group: &str, seq: u64, action: JobAction) -> Result<(), Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        crate::name::validate(NameKind::Group, group)?;
        operator::check(&self.shared)?;
        let missing = || Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() };
        let g = self.shared.find_work_group(group, queue).await?.ok_or_else(missing)?;
        operator::act(&self.shared, &g, seq, action).await
    }
}
