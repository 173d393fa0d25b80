//! What the admin operations report: plain data, so tools can print or serialise it.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// A snapshot of every queue and group. See [`Broker::stats`](crate::Broker::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Every queue, sorted by name.
    pub queues: Vec<QueueStats>,
    /// Every group, sorted by queue then group.
    pub groups: Vec<GroupStats>,
    /// Bytes of the whole database: live SST files of every column family plus the
    /// memtables (which hold recent writes that per-queue figures do not count yet).
    pub bytes_on_disk: u64,
    /// Every keyspace ([`Broker::kv`](crate::Broker::kv)), sorted by name.
    pub keyspaces: Vec<KeyspaceStats>,
}

/// One keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyspaceStats {
    /// The keyspace's name.
    pub name: String,
    /// Keys it holds, as of the last durable write that changed the count.
    pub keys: u64,
}

/// One queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue's name.
    pub name: String,
    /// First live sequence (retention moves it forward).
    pub first_seq: u64,
    /// Last written sequence (`first_seq - 1` when empty).
    pub last_seq: u64,
    /// Messages stored: `last_seq - first_seq + 1`.
    pub len: u64,
    /// Approximate bytes of the queue's messages in SST files. Recent writes still in the
    /// memtable are not counted until RocksDB flushes them.
    pub bytes_on_disk: u64,
    /// Approximate bytes of the queue's stored messages (keys and values), recent writes still
    /// in memtables included: the larger of the SST estimate and the mean size of a sample of
    /// messages from the head times [`len`](Self::len). 0 on the etcd engine, which does not
    /// report sizes.
    pub bytes: u64,
    /// The queue's retention policy.
    pub retention: crate::retention::Retention,
    /// Age of the oldest stored message (`None` when empty).
    pub oldest_age: Option<Duration>,
    /// Delayed messages waiting to fall due ([`Message::deliver_after`](crate::Message::deliver_after)).
    pub scheduled: u64,
    /// When the earliest of them is due.
    pub next_due: Option<std::time::SystemTime>,
    /// How long the queue remembers idempotency keys (zero on the etcd engine, which does not
    /// keep them yet).
    pub dedup_window: Duration,
}

/// Which kind of consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupMode {
    /// An ordered group ([`Group`](crate::Group)).
    Ordered,
    /// A work-queue group ([`WorkGroup`](crate::WorkGroup)).
    WorkQueue,
}

impl GroupMode {
    /// `"ordered"` or `"work-queue"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::GroupMode::WorkQueue.as_str(), "work-queue");
    /// assert_eq!(rockq::GroupMode::Ordered.as_str(), "ordered");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            GroupMode::Ordered => "ordered",
            GroupMode::WorkQueue => "work-queue",
        }
    }
}

/// One group on one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// The group's name.
    pub group: String,
    /// The queue it consumes.
    pub queue: String,
    /// Ordered or work-queue.
    pub mode: GroupMode,
    /// Committed offset: everything up to it is acknowledged (or dead-lettered) durably.
    pub committed: u64,
    /// Messages stored after the offset that the group has not finished: the lag as a count.
    pub lag: u64,
    /// How long the oldest unfinished message has been in the queue: the lag as a time
    /// (`None` when nothing is pending).
    pub oldest_unacked_age: Option<Duration>,
    /// Messages handed out and not yet finished. Work-queue groups: unexpired leases.
    /// Ordered groups: unacknowledged deliveries of the live subscription (0 when read from
    /// an [`Inspector`](crate::Inspector), which sees only the disk).
    pub in_flight: u64,
    /// Work-queue messages waiting for a retry (0 for ordered groups).
    pub waiting_retry: u64,
    /// The dead-letter queue of a work-queue group, as stored with it (`None` for ordered
    /// groups).
    pub dead_letter_queue: Option<String>,
    /// Dead letters in that queue not yet redriven (0 if it does not exist).
    pub dlq_depth: u64,
    /// Whether the group is paused.
    pub paused: bool,
    /// The lease stored with a work-queue group ([`WorkGroup::lease`](crate::WorkGroup::lease)).
    /// `None` for ordered groups, and for a work group created by an older build that has not
    /// subscribed since (its first subscribe stores it).
    pub lease: Option<Duration>,
    /// The retry policy stored with a work-queue group
    /// ([`WorkGroup::retry_policy`](crate::WorkGroup::retry_policy)); `None` as for `lease`.
    pub retry_policy: Option<crate::retry::RetryPolicy>,
    /// Whether a work-queue group is stored as
    /// [ordered by key](crate::WorkGroup::ordered_by_key) (`false` when nothing is stored).
    pub ordered_by_key: bool,
    /// How long a work-queue group keeps job outcomes
    /// ([`WorkGroup::keep_outcomes`](crate::WorkGroup::keep_outcomes)); `None` when it keeps
    /// none or nothing is stored.
    pub keep_outcomes: Option<Duration>,
    /// A work-queue group's stored rate limit
    /// ([`WorkGroup::rate_limit`](crate::WorkGroup::rate_limit)).
    pub rate_limit: Option<crate::rate_limit::RateLimit>,
    /// A work-queue group's stored concurrency limit
    /// ([`WorkGroup::concurrency_limit`](crate::WorkGroup::concurrency_limit)).
    pub concurrency_limit: Option<u32>,
    /// A work-queue group's stored per-key limit
    /// ([`WorkGroup::per_key_limit`](crate::WorkGroup::per_key_limit)).
    pub per_key_limit: Option<u32>,
    /// Jobs held back by the group's limits now: the claimable ones while its rate or
    /// concurrency limit is reached, plus those waiting behind their key's first `n` under a
    /// per-key limit (0 when read from an [`Inspector`](crate::Inspector), which sees only the
    /// disk). In a group ordered by key or limited per key, never-claimed messages the group
    /// has not read yet are not counted (their keys are read as they are reached).
    pub limited: u64,
}

impl GroupStats {
    /// The most attempts per message of a work-queue group, as stored (`None` when no
    /// [`retry_policy`](GroupStats::retry_policy) is).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// for g in broker.stats().await?.groups {
    ///     if let Some(n) = g.max_attempts() {
    ///         println!("{}/{}: up to {n} attempts", g.queue, g.group);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn max_attempts(&self) -> Option<u32> {
        self.retry_policy.as_ref().map(|p| p.attempts())
    }
}

/// Where a pending work-queue message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PendingState {
    /// Held by a consumer whose lease has not expired.
    Leased,
    /// The lease ran out (or its holder's process stopped): claimable again.
    Expired,
    /// Failed; waiting for its retry time.
    Waiting,
}

impl PendingState {
    /// `"leased"`, `"expired"` or `"waiting"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::PendingState::Leased.as_str(), "leased");
    /// assert_eq!(rockq::PendingState::Waiting.as_str(), "waiting");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            PendingState::Leased => "leased",
            PendingState::Expired => "expired",
            PendingState::Waiting => "waiting",
        }
    }
}

/// A claimed, unfinished message of a work-queue group. See
/// [`Broker::pending`](crate::Broker::pending).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingClaim {
    /// The message's sequence.
    pub seq: u64,
    /// Leased, expired or waiting.
    pub state: PendingState,
    /// Attempts started, counting the current one.
    pub attempt: u32,
    /// The consumer holding it ([`WorkGroup::consumer_name`](crate::WorkGroup::consumer_name));
    /// `None` when waiting or unknown.
    pub holder: Option<String>,
    /// When the lease ends (leased and expired claims).
    pub lease_deadline: Option<SystemTime>,
    /// When it may be delivered again (waiting claims).
    pub retry_at: Option<SystemTime>,
    /// The last error recorded for it, if any.
    pub last_error: Option<String>,
}

/// Where one job of a work group stands. See [`Broker::job`](crate::Broker::job).
///
/// A job's id is its message's sequence in its queue (what a [`SendReceipt`](crate::SendReceipt)
/// resolves to, [`Sent::seq`](crate::Sent::seq), [`Job::seq`](crate::Job::seq) in a handler):
/// keep it to ask later. A delayed message gets its sequence when it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobStatus {
    /// The job's sequence.
    pub seq: u64,
    /// What the group does with it next.
    pub state: JobState,
    /// Attempts started so far, counting a running one (0: never claimed). Survives restarts,
    /// as the claim records do. 0 for a [`Finished`](JobState::Finished) or
    /// [`Removed`](JobState::Removed) job: its records are gone (a kept outcome names the
    /// attempt that ended it).
    pub attempt: u32,
    /// The error of its last failed attempt, if one failed.
    pub last_error: Option<String>,
    /// Who holds (or held, when [`Expired`](JobState::Expired)) its lease, as its claim record
    /// names it ([`WorkGroup::consumer_name`](crate::WorkGroup::consumer_name)). `None` in other
    /// states, and for a claim whose record the writer has not written yet (its next round).
    pub holder: Option<String>,
    /// How it ended, for a [`Finished`](JobState::Finished) job of a group that
    /// [keeps outcomes](crate::WorkGroup::keep_outcomes), until the outcome's retention ends.
    /// `None` otherwise (and for a job finished before the group kept outcomes, or by a reset).
    pub outcome: Option<JobOutcome>,
    /// The job's last progress report ([`Task::progress`](crate::Task::progress)), of this
    /// attempt or an earlier one, while it is not finished. Survives restarts.
    pub progress: Option<Bytes>,
    /// Its message's [priority](crate::Message::priority), while the message is retained (0
    /// once retention deleted it).
    pub priority: u8,
}

/// The largest job result ([`Task::set_result`](crate::Task::set_result)): 1 MiB. A result is
/// a small answer (an id, a URL, a summary); larger output belongs in a keyspace or a store.
pub const MAX_RESULT_BYTES: usize = 1 << 20;

/// The largest progress report ([`Task::progress`](crate::Task::progress)): 64 KiB. A report
/// is rewritten on every call (once per writer round at most): keep it a checkpoint, not a log.
pub const MAX_PROGRESS_BYTES: usize = 64 << 10;

/// How a job ended, as a group that [keeps outcomes](crate::WorkGroup::keep_outcomes) records
/// it in the same write that finishes the job. See [`JobStatus::outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobOutcome {
    /// Acked, deleted or dead-lettered.
    pub kind: OutcomeKind,
    /// When the writer recorded it (the broker's wall clock).
    pub finished_at: SystemTime,
    /// The attempt that ended it (0 for an operator's action on a job never claimed).
    pub attempt: u32,
    /// What the handler returned ([`Task::set_result`](crate::Task::set_result)), if it did.
    pub result: Option<Bytes>,
}

/// The kind of a [`JobOutcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutcomeKind {
    /// A handler acked it (alone, or as part of a transaction).
    Acked,
    /// An operator deleted it ([`Broker::delete_job`](crate::Broker::delete_job)).
    Deleted,
    /// It went to a dead-letter queue: its attempts ran out, a handler or an operator sent it.
    DeadLettered {
        /// Why, as the dead letter records it.
        reason: String,
        /// The dead-letter queue.
        dead_letter_queue: String,
        /// Its sequence there.
        dead_letter_seq: u64,
    },
}

impl OutcomeKind {
    /// `"acked"`, `"deleted"` or `"dead-lettered"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::OutcomeKind::Acked.as_str(), "acked");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeKind::Acked => "acked",
            OutcomeKind::Deleted => "deleted",
            OutcomeKind::DeadLettered { .. } => "dead-lettered",
        }
    }
}

/// The state in a [`JobStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Waits to be claimed: never claimed yet, released by its holder, its retry is due, or
    /// its lease was held when the process stopped (a restart voids every lease; the attempt
    /// stays counted).
    /// In a group [ordered by key](crate::WorkGroup::ordered_by_key), a job never claimed may
    /// still wait behind its key once the group reaches it.
    Queued,
    /// Waits to be claimed, and a limit holds it back: the group's
    /// [rate](crate::WorkGroup::rate_limit) or [concurrency](crate::WorkGroup::concurrency_limit)
    /// limit holds every claim back right now (it is claimed once a token or a place is
    /// free), or its key's first `n` unfinished jobs are ahead of it under a
    /// [per-key limit](crate::WorkGroup::per_key_limit).
    Limited,
    /// Waits for an earlier unfinished job with its ordering key
    /// ([`WorkGroup::ordered_by_key`](crate::WorkGroup::ordered_by_key)).
    Parked,
    /// Held under a lease, for `lease_remaining` more (on the broker's clock).
    Leased {
        /// Until the lease runs out, unless its holder extends it.
        lease_remaining: Duration,
    },
    /// Its holder's lease ran out before an outcome: claimable again, and the next claim
    /// starts a new attempt.
    Expired,
    /// An attempt failed; it runs again in `due_in` (on the broker's clock).
    RetryWaiting {
        /// Until it is claimable again.
        due_in: Duration,
    },
    /// An outcome (ack, retry, dead letter, an operator's action) is on its way to the
    /// writer: in a moment it is finished or waiting for a retry.
    Settling,
    /// The group is done with it: acked, deleted, or dead-lettered (which one, when, and the
    /// result or reason: [`JobStatus::outcome`], for a group that
    /// [keeps outcomes](crate::WorkGroup::keep_outcomes)), or a
    /// [`reset`](crate::Broker::reset_group) moved the group past it. The group never runs it
    /// again, short of a reset back. A kept outcome outlives the message: such a job stays
    /// `Finished` after retention deletes its message.
    Finished,
    /// The message is no longer stored: retention or a purge deleted it, after the group
    /// finished it or before (not told apart without a kept outcome). Either way the group
    /// never runs it.
    Removed,
}

impl JobState {
    /// `"queued"`, `"limited"`, `"parked"`, `"leased"`, `"expired"`, `"retry-waiting"`,
    /// `"settling"`, `"finished"` or `"removed"`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::JobState::Queued.as_str(), "queued");
    /// assert_eq!(rockq::JobState::Finished.as_str(), "finished");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Limited => "limited",
            JobState::Parked => "parked",
            JobState::Leased { .. } => "leased",
            JobState::Expired => "expired",
            JobState::RetryWaiting { .. } => "retry-waiting",
            JobState::Settling => "settling",
            JobState::Finished => "finished",
            JobState::Removed => "removed",
        }
    }

    /// Whether the group will not run it again: [`Finished`](JobState::Finished) or
    /// [`Removed`](JobState::Removed).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(rockq::JobState::Finished.is_final());
    /// assert!(!rockq::JobState::Expired.is_final());
    /// ```
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Finished | JobState::Removed)
    }
}

/// A stored message, as [`Broker::peek`](crate::Broker::peek) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredMessage {
    /// Its sequence.
    pub seq: u64,
    /// When it was sent.
    pub enqueued_at: SystemTime,
    /// Its ordering key ([`Message::key`](crate::Message::key)), if it has one.
    pub key: Option<String>,
    /// Its idempotency key ([`Message::idempotency_key`](crate::Message::idempotency_key)),
    /// if it has one.
    pub idempotency_key: Option<String>,
    /// Its priority ([`Message::priority`](crate::Message::priority)); 0 if none.
    pub priority: u8,
    /// Its headers.
    pub headers: Vec<(String, Bytes)>,
    /// Its payload.
    pub payload: Bytes,
}

/// Counters of the writer thread since open ([`Broker::writer_stats`](crate::Broker::writer_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// WriteBatches written (group commits).
    pub rounds: u64,
    /// Messages written.
    pub messages: u64,
    /// Offset records written.
    pub offset_commits: u64,
    /// Time spent inside RocksDB writes (including fsync).
    pub write_time: std::time::Duration,
}

/// RocksDB's WAL counters (requires [`Options::statistics`](crate::Options::statistics)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// WAL fsyncs performed.
    pub wal_syncs: u64,
    /// Bytes appended to the WAL.
    pub wal_bytes: u64,
    /// Write calls that went through the WAL.
    pub writes_with_wal: u64,
}
