//! The admin half of [`Broker`]: stats and inspection (computed from the disk, with the live
//! subscriptions' in-flight counts and leases), pause/resume and mode-agnostic resets.

use super::Broker;
use crate::error::{Error, NameKind};
use crate::ordered::Group;
use crate::retention::ResetTo;
use crate::stats::{PendingClaim, Stats, StoredMessage};
use crate::work::WorkGroup;

impl Broker {
    /// Every queue (first and last sequence, length, bytes on disk, age of the oldest
    /// message) and every group (committed offset, lag as a count and as the age of the
    /// oldest unfinished message, in flight, waiting for retry, dead-letter depth, paused).
    ///
    /// On the embedded engine the figures come from this process's memory, which mirrors the
    /// records on disk (a read-only [`Inspector`](crate::Inspector) computes the same figures
    /// from the records): ordered groups count the live subscription's unacknowledged
    /// deliveries as in flight, and work groups a job whose lease in this process has not run
    /// out (so a lease extended by [`Job::extend`](crate::Job::extend) or a pool's heartbeat
    /// counts). Costs a pass over the queues and groups and a few point reads per queue and
    /// group, however many jobs wait (under a millisecond with a million waiting retries); a
    /// queue with delayed messages adds a walk of the due index's head to its next due time.
    /// On etcd the figures are read from etcd.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread, which finishes on its own). If the
    /// future is dropped the figures are lost and the gauges are not refreshed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let stats = broker.stats().await?;
    /// for g in &stats.groups {
    ///     println!("{}/{} lag {} oldest {:?}", g.queue, g.group, g.lag, g.oldest_unacked_age);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.shared.stats().await
    }

    /// The claimed, unfinished messages of work-queue group `group` on `queue` (queue first,
    /// as in every admin call): who holds
    /// each (its [consumer name](crate::WorkGroup::consumer_name)), which attempt, until when;
    /// and those waiting for a retry. Empty for an ordered group. Lease deadlines held in this
    /// process are the live ones, extensions included (the records on disk keep the deadline
    /// set at claim time).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchGroup`], [`Error::InvalidName`],
    /// [`Error::Shutdown`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for p in broker.pending("emails", "mailer").await? {
    ///     println!("#{} attempt {} held by {:?} until {:?}", p.seq, p.attempt, p.holder, p.lease_deadline);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pending(&self, queue: &str, group: &str) -> Result<Vec<PendingClaim>, Error> {
        self.shared.pending(group, queue).await
    }

    /// Up to `limit` stored messages of `queue`, from sequence `from` (default: the first
    /// live one). Reading changes nothing: no group sees it.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchQueue`], [`Error::InvalidName`],
    /// [`Error::Shutdown`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for m in broker.peek("orders", None, 10).await? {
    ///     println!("#{} {:?}", m.seq, m.payload);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, Error> {
        self.shared.peek(queue, from, limit).await
    }

    /// Pauses group `group` on `queue` (ordered or work-queue), durably: its subscriptions
    /// and worker pools hand out nothing new until [`resume_group`](Broker::resume_group),
    /// across restarts too. Acks of what was already handed out still land, and jobs already
    /// claimed by a subscription are still handed out; leases run as usual.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchGroup`], [`Error::InvalidName`], [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the group is paused or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.pause_group("orders", "billing").await?;
    /// // ... fix the downstream system ...
    /// broker.resume_group("orders", "billing").await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause_group(&self, queue: &str, group: &str) -> Result<(), Error> {
        self.set_paused(queue, group, true).await
    }

    /// Resumes a group paused by [`pause_group`](Broker::pause_group); waiting subscriptions
    /// continue at once. Resuming a group that is not paused does nothing.
    ///
    /// # Errors
    ///
    /// As for [`pause_group`](Broker::pause_group).
    ///
    /// # Cancel safety
    ///
    /// As for [`pause_group`](Broker::pause_group): the group is resumed or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.pause_group("orders", "billing").await?;
    /// broker.resume_group("orders", "billing").await?;
    /// # Ok(()) }
    /// ```
    pub async fn resume_group(&self, queue: &str, group: &str) -> Result<(), Error> {
        self.set_paused(queue, group, false).await
    }

    async fn set_paused(&self, queue: &str, group: &str, paused: bool) -> Result<(), Error> {
        crate::name::validate(NameKind::Queue, queue)?;
        let Some(q) = self.shared.queue(queue) else {
            return Err(Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() });
        };
        self.shared.set_paused(&q, group, paused).await
    }

    /// Moves group `group` on `queue`, whichever its mode, as
    /// [`Group::reset_to`](crate::Group::reset_to) or
    /// [`WorkGroup::reset_to`](crate::WorkGroup::reset_to) would. Returns the sequence its
    /// next delivery starts at.
    ///
    /// # Errors
    ///
    /// As for those methods; [`Error::NoSuchGroup`] for an unknown queue or group.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: the offset is either moved or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// use std::time::{Duration, SystemTime};
    /// // Replay the last hour for `billing` (its subscriptions must be dropped first).
    /// let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    /// let next = broker.reset_group("orders", "billing", rockq::ResetTo::Time(an_hour_ago)).await?;
    /// println!("billing restarts at #{next}");
    /// # Ok(()) }
    /// ```
    pub async fn reset_group(&self, queue: &str, group: &str, to: ResetTo) -> Result<u64, Error> {
        let missing = || Error::NoSuchGroup { group: group.to_owned(), queue: queue.to_owned() };
        if crate::name::validate(NameKind::Queue, queue).is_err()
            || crate::name::validate(NameKind::Group, group).is_err()
        {
            return Err(missing());
        }
        let q = self.shared.queue(queue).ok_or_else(missing)?;
        if self.shared.work_group(group, queue).is_some() {
            WorkGroup::new(self.shared.clone(), q, group).reset_to(to).await
        } else {
            Group::new(self.shared.clone(), q, group).reset_to(to).await
        }
    }
}
