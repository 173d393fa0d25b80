//! The scheduling half of [`Broker`]: recurring schedules (create, list, pause, resume,
//! delete) and listings of delayed messages. Delayed messages themselves are sent, cancelled and
//! rescheduled through their [`Queue`](crate::Queue).

use std::time::SystemTime;

use super::Broker;
use crate::engine::boundary::{self, Request, ScheduleRequest};
use crate::error::{Error, NameKind};
use crate::message::Message;
use crate::model::ScheduleRecord;
use crate::schedule::{DelayedInfo, Recurrence, RecurrenceKind, ScheduleInfo, time_of};

impl Broker {
    /// Creates (or replaces) the recurring schedule `name`: `message` is appended to `queue`
    /// at every firing of `recurrence`, a cron expression ([`Recurrence::cron`]) or a fixed
    /// interval (a [`Duration`](std::time::Duration)). Returns the first firing's time.
    ///
    /// Each firing happens exactly once across restarts and crashes: the writer appends the
    /// message and records the next firing in one batch. Firings that fall due while the broker
    /// is not running follow the recurrence's [`Missed`](crate::Missed) policy when it opens
    /// again. Replacing a schedule keeps its counters and paused state and restarts its
    /// recurrence from now. The queue is created at the first firing if it does not exist.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad schedule or queue name,
    /// [`Error::ZeroInterval`], the send errors for a message that cannot be
    /// sent (too large, bad header or key, or delayed itself); [`Error::Shutdown`],
    /// [`Error::Storage`], [`Error::Failed`]. Nothing is written on error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the schedule may or may not have been written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// use rockq::Recurrence;
    /// broker.schedule("nightly-report", Recurrence::cron("0 0 2 * * *")?, "reports", "build").await?;
    /// broker.schedule("heartbeat", Duration::from_secs(30), "pings", "ping").await?;
    /// # Ok(()) }
    /// ```
    pub async fn schedule(
        &self,
        name: &str,
        recurrence: impl Into<Recurrence>,
        queue: &str,
        message: impl Into<Message>,
    ) -> Result<Option<SystemTime>, Error> {
        crate::name::validate(NameKind::Queue, name)?;
        crate::name::validate(NameKind::Queue, queue)?;
        let recurrence = recurrence.into();
        if matches!(recurrence.kind, RecurrenceKind::Every(d) if d.is_zero()) {
            return Err(Error::ZeroInterval);
        }
        let message = message.into();
        if message.is_delayed() {
            return Err(Error::NeedsSubmit {
                index: 0,
                reason: "is delayed (a schedule's message is sent when it fires)",
            });
        }
        let max = self.shared.options().max_message_bytes;
        let size = boundary::body_len(&message);
        if size > max {
            return Err(Error::MessageTooLarge { index: 0, size, max });
        }
        boundary::validate(&message).map_err(|e| match e {
            boundary::EncodeError::KeyEmpty => Error::InvalidKey { index: 0, reason: "empty" },
            boundary::EncodeError::KeyTooLong => {
                Error::InvalidKey { index: 0, reason: "longer than MAX_KEY_LEN bytes" }
            }
            _ => Error::InvalidHeader { index: 0, reason: "cannot be encoded" },
        })?;
        let record = ScheduleRecord {
            id: 0,
            queue: queue.to_owned(),
            recurrence,
            anchor_micros: 0,
            paused: false,
            next_micros: 0,
            fired: 0,
            missed_firings: 0,
            last_micros: 0,
            last_seq: 0,
            envelope: boundary::encode(&message),
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Schedule(ScheduleRequest::Upsert { name: name.to_owned(), record, reply });
        let next = self.shared.ask(req, rx).await?;
        Ok(next.map(time_of))
    }

    /// Pauses recurring schedule `name`: it does not fire until resumed (firings while paused
    /// are not caught up).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`], and as [`schedule`](Broker::schedule).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the pause may or may not have happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.pause_schedule("nightly-report").await?;
    /// # Ok(()) }
    /// ```
    pub async fn pause_schedule(&self, name: &str) -> Result<(), Error> {
        self.set_schedule_paused(name, true).await
    }

    /// Resumes recurring schedule `name`: it fires next at its first firing after now.
    ///
    /// # Errors
    ///
    /// As [`pause_schedule`](Broker::pause_schedule).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the resume may or may not have happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.pause_schedule("nightly-report").await?;
    /// broker.resume_schedule("nightly-report").await?;
    /// # Ok(()) }
    /// ```
    pub async fn resume_schedule(&self, name: &str) -> Result<(), Error> {
        self.set_schedule_paused(name, false).await
    }

    async fn set_schedule_paused(&self, name: &str, paused: bool) -> Result<(), Error> {
        crate::name::validate(NameKind::Queue, name)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Schedule(ScheduleRequest::Pause { name: name.to_owned(), paused, reply });
        self.shared.ask(req, rx).await
    }

    /// Deletes recurring schedule `name`; `false` if there is none. Messages it already sent
    /// stay.
    ///
    /// # Errors
    ///
    /// As [`schedule`](Broker::schedule).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the delete may or may not have happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// if !broker.delete_schedule("heartbeat").await? {
    ///     println!("no schedule named heartbeat");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, Error> {
        crate::name::validate(NameKind::Queue, name)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Schedule(ScheduleRequest::Delete { name: name.to_owned(), reply });
        self.shared.ask(req, rx).await
    }

    /// Every recurring schedule, by name: its recurrence, next firing, paused state and counts.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for s in broker.schedules().await? {
    ///     println!("{} -> {}: {} (next {:?}, fired {})", s.name, s.queue, s.recurrence, s.next, s.fired);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        self.shared.schedules().await
    }

    /// Delayed messages waiting to fall due — of `queue`, or of every queue — in schedule-id
    /// order, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchQueue`], and as [`schedules`](Broker::schedules).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for m in broker.delayed(Some("reminders"), 100).await? {
    ///     println!("#{} due at {:?}", m.id, m.due);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delayed(&self, queue: Option<&str>, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        self.shared.scheduled(queue.map(str::to_owned), limit).await
    }

    /// The old name of [`delayed`](Broker::delayed), one letter from the recurring
    /// [`schedules`](Broker::schedules).
    ///
    /// # Errors
    ///
    /// As [`delayed`](Broker::delayed).
    ///
    /// # Cancel safety
    ///
    /// As [`delayed`](Broker::delayed).
    #[deprecated(since = "0.2.0", note = "renamed `delayed` (recurring schedules are `schedules`)")]
    pub async fn scheduled(&self, queue: Option<&str>, limit: usize) -> Result<Vec<DelayedInfo>, Error> {
        self.delayed(queue, limit).await
    }
}
