//! Error types, one enum per operation family plus the umbrella [`Error`].
//!
//! Every fallible public operation returns the narrowest enum that describes what can go wrong
//! with it; all of them convert into [`Error`] with `?`.

use std::path::PathBuf;

/// What kind of name failed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameKind {
    /// A queue name.
    Queue,
    /// A consumer-group name.
    Group,
    /// A keyspace name ([`Broker::kv`](crate::Broker::kv)).
    Keyspace,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Queue => "queue",
            NameKind::Group => "group",
            NameKind::Keyspace => "keyspace",
        })
    }
}

/// A queue or group name was rejected. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} name is empty")]
    Empty {
        /// Queue or group.
        kind: NameKind,
    },
    /// The name is longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    #[error("{kind} name is {len} bytes; the maximum is {max}")]
    TooLong {
        /// Queue or group.
        kind: NameKind,
        /// Length of the rejected name in bytes.
        len: usize,
        /// The maximum length.
        max: usize,
    },
    /// The name contains a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} name contains {ch:?} at byte {index}; allowed are A-Z a-z 0-9 . _ -")]
    InvalidChar {
        /// Queue or group.
        kind: NameKind,
        /// The offending character.
        ch: char,
        /// Its byte offset in the name.
        index: usize,
    },
}

/// An error reported by the storage engine (RocksDB). The message is RocksDB's own.
///
/// It carries the message only: no RocksDB type appears in rockq's public API, so the storage
/// engine can be upgraded (or another engine added) without breaking callers.
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage error: {message}")]
pub struct StorageError {
    message: std::sync::Arc<str>,
}

impl StorageError {
    /// Made by the store from RocksDB's error (and by failpoints in tests).
    pub(crate) fn new(message: impl Into<std::sync::Arc<str>>) -> Self {
        StorageError { message: message.into() }
    }

    /// RocksDB's message for this error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::SendError::Storage(e)) = queue.send("x").await {
    ///     eprintln!("RocksDB: {}", e.message());
    /// }
    /// # }
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Why a write-path operation was not carried out, whatever the operation: the broker is
/// shutting down, or an earlier write failed and it failed closed. One kind for every family;
/// each family's error converts from it (`Shutdown` → its `Shutdown`, `Failed` → its `Failed`),
/// so the engine refuses every request the same way.
#[derive(Debug, Clone)]
pub(crate) enum Closed {
    /// Shutdown has begun, or every handle is gone: nothing new is accepted.
    Shutdown,
    /// The writer failed closed; nothing is written until the database is reopened.
    Failed(Failure),
    /// The broker's engine does not carry out this operation (yet).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Unsupported(UnsupportedError),
}

/// The operation is not supported by this broker's engine (the etcd engine carries out a
/// subset of what the embedded one does; see `docs/DISTRIBUTED.md`). Nothing was changed: an
/// engine refuses an operation rather than carry it out differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation} is not supported by the {engine} engine")]
pub struct UnsupportedError {
    operation: &'static str,
    engine: &'static str,
}

impl UnsupportedError {
    /// Made by an engine that refuses `operation`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn new(operation: &'static str, engine: &'static str) -> Self {
        UnsupportedError { operation, engine }
    }

    /// What was refused, e.g. `"delayed messages"`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::SendError::Unsupported(e)) = queue.send("x").await {
    ///     eprintln!("{} needs the embedded engine", e.operation());
    /// }
    /// # }
    /// ```
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The engine that refused it, e.g. `"etcd"`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::SendError::Unsupported(e)) = queue.send("x").await {
    ///     assert_eq!(e.engine(), "etcd");
    /// }
    /// # }
    /// ```
    pub fn engine(&self) -> &'static str {
        self.engine
    }
}

/// The broker stopped accepting writes after an earlier error (it **fails closed**: nothing
/// more is written until the database is reopened, so no later write can land out of order
/// after a lost one). The same kind in every operation family's `Failed` variant; it keeps the
/// original cause — [`storage_error`](FailedError::storage_error) is RocksDB's error when a
/// write or WAL sync failed — and reports it as its `source()`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("broker stopped accepting writes after an earlier error")]
pub struct FailedError {
    #[source]
    cause: Failure,
}

impl FailedError {
    /// A failure outside the storage engine (a broken invariant, a task that died), with
    /// what happened.
    pub(crate) fn internal(what: impl Into<String>) -> Self {
        FailedError { cause: Failure::Other(what.into()) }
    }

    /// The storage error that made the broker fail closed, if that is what happened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::SendError::Failed(failed)) = queue.send("x").await {
    ///     if let Some(cause) = failed.storage_error() {
    ///         eprintln!("failed closed after a RocksDB error: {}", cause.message());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn storage_error(&self) -> Option<&StorageError> {
        match &self.cause {
            Failure::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Failure> for FailedError {
    fn from(cause: Failure) -> Self {
        FailedError { cause }
    }
}

impl From<StorageError> for FailedError {
    fn from(e: StorageError) -> Self {
        FailedError { cause: Failure::Storage(e) }
    }
}

/// What made the writer fail closed, kept as it happened (not as a string), so that every later
/// refusal can report the original cause.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Failure {
    /// A write or WAL sync failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A writer-side thread ended without a clean stop (it panicked).
    #[error("the {0} thread stopped unexpectedly")]
    ThreadStopped(&'static str),
    /// A request the writer cannot make sense of (a bug, not a user error).
    #[error("{0}")]
    Internal(&'static str),
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
}

macro_rules! refused_as {
    ($($family:ident),*) => {$(
        impl From<Closed> for $family {
            fn from(c: Closed) -> Self {
                match c {
                    Closed::Shutdown => $family::Shutdown,
                    Closed::Failed(f) => $family::Failed(f.into()),
                    Closed::Unsupported(u) => $family::Unsupported(u),
                }
            }
        }
    )*};
}
refused_as!(
    QueueError,
    SendError,
    SubscribeError,
    AckError,
    ResetError,
    RedriveError,
    CommitError,
    PauseError,
    ScheduleError,
    KvError,
    TxError
);

/// A record in the database could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupted {what} record at key {key:02x?}: {reason}")]
pub struct CorruptionError {
    pub(crate) what: &'static str,
    pub(crate) key: Vec<u8>,
    pub(crate) reason: String,
}

impl CorruptionError {
    pub(crate) fn new(what: &'static str, key: &[u8], reason: impl Into<String>) -> Self {
        CorruptionError { what, key: key.to_vec(), reason: reason.into() }
    }

    /// The kind of record (`"message"`, `"queue"`, `"offset"`, …).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() {
    /// if let Err(rockq::OpenError::Corrupt(e)) = rockq::Broker::open("./data").await {
    ///     eprintln!("corrupt {} record at {:02x?}", e.record_kind(), e.key());
    /// }
    /// # }
    /// ```
    pub fn record_kind(&self) -> &'static str {
        self.what
    }

    /// The raw key of the corrupted record.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() {
    /// if let Err(rockq::OpenError::Corrupt(e)) = rockq::Broker::open("./data").await {
    ///     eprintln!("corrupt {} record at {:02x?}", e.record_kind(), e.key());
    /// }
    /// # }
    /// ```
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

/// [`Broker::open`](crate::Broker::open) failed. Nothing was created or modified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another process, or another broker in this process, holds the database open.
    #[error("database at {path} is locked by another process or broker: {message}")]
    Locked {
        /// The database directory.
        path: PathBuf,
        /// RocksDB's message.
        message: String,
    },
    /// The path exists but is not a rockq database (a file, a foreign directory or a RocksDB
    /// database that rockq did not create).
    #[error("{path} is not a rockq database: {reason}")]
    NotRockq {
        /// The path that was given.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// The path does not exist and [`Options::create_if_missing`](crate::Options::create_if_missing)
    /// is off.
    #[error("no database at {path} and create_if_missing is off")]
    NotFound {
        /// The path that was given.
        path: PathBuf,
    },
    /// The database was written by an incompatible version of rockq.
    #[error("database format version {found} is not supported (this build reads version {supported})")]
    IncompatibleVersion {
        /// Version found on disk.
        found: u8,
        /// Version this build understands.
        supported: u8,
    },
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The engine does not support a requested option (e.g. `Durability::Buffered` on etcd).
    #[error(transparent)]
    Unsupported(UnsupportedError),
    /// Called outside a Tokio runtime: rockq runs its blocking work on the runtime's pool.
    #[error("rockq must be opened from within a Tokio runtime")]
    NoRuntime,
    /// A stored record could not be decoded.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// RocksDB failed to open the database.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A filesystem error while inspecting the path.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// The path that was inspected.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Getting a [`Queue`](crate::Queue) handle failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The queue name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// The queue registry is full (2³² − 2 queues).
    #[error("no queue ids left")]
    TooManyQueues,
    /// A stored record (e.g. a dedup record the retention pass reads) does not decode.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// The queue was deleted ([`Broker::delete_queue`](crate::Broker::delete_queue)) after
    /// this handle was made. Get a new handle with [`Broker::queue`](crate::Broker::queue),
    /// which creates it afresh.
    #[error("queue {queue:?} was deleted")]
    Deleted {
        /// The queue.
        queue: String,
    },
    /// Writing the queue's registry record failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Why a recurring schedule was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression does not parse, or never fires.
    #[error("invalid cron expression {expr:?}: {reason}")]
    InvalidCron {
        /// The expression given.
        expr: String,
        /// What the parser said.
        reason: String,
    },
    /// The interval is zero.
    #[error("a schedule's interval must be longer than zero")]
    ZeroInterval,
    /// The schedule or queue name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The message cannot be sent (too large, bad header or key, or delayed).
    #[error(transparent)]
    Message(#[from] SendError),
    /// No schedule has this name.
    #[error("no schedule named {0:?}")]
    NotFound(String),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Writing the schedule failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A stored record does not decode.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// A send was rejected or failed. When this is returned, none of the messages of the call were
/// made visible to consumers.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The broker was shut down before the messages were written.
    #[error("broker is shut down")]
    Shutdown,
    /// A message (payload plus headers) is larger than
    /// [`Options::max_message_bytes`](crate::Options::max_message_bytes).
    #[error("message {index} is {size} bytes; the maximum is {max}")]
    MessageTooLarge {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// Encoded size of the payload and headers.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A header cannot be encoded (key over 65 535 bytes, value over 4 GiB, or more than
    /// 65 535 headers).
    #[error("message {index} has an invalid header: {reason}")]
    InvalidHeader {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// `send_batch` was called with no messages.
    #[error("send_batch needs at least one message")]
    EmptyBatch,
    /// The queue was deleted ([`Broker::delete_queue`](crate::Broker::delete_queue)) before
    /// the messages were written: nothing of this call was written. A send that resolved
    /// before the deletion was written, and deleted with the queue.
    #[error("queue {queue:?} was deleted")]
    QueueDeleted {
        /// The queue.
        queue: String,
    },
    /// `send_batch` was called with more messages than one atomic write may hold.
    #[error("batch of {len} messages exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Messages in the call.
        len: usize,
        /// The configured maximum ([`Options::max_batch_messages`](crate::Options::max_batch_messages)).
        max: usize,
    },
    /// An ordering or idempotency key is empty or longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("message {index} has an invalid key: {reason}")]
    InvalidKey {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The message needs [`Queue::submit`](crate::Queue::submit): it is delayed (it has no
    /// sequence until it is due) or has an idempotency key (a duplicate has no new sequence,
    /// nor a place in a contiguous range).
    #[error("message {index} {reason}: send it with Queue::submit")]
    NeedsSubmit {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// Why.
        reason: &'static str,
    },
    /// A typed send's codec could not encode a value (nothing was sent).
    #[error("message {index} does not encode with codec {codec:?}: {source}")]
    Encode {
        /// Position of the value within the call (0 for `send`).
        index: usize,
        /// The codec's [name](crate::Codec::NAME).
        codec: &'static str,
        /// The codec's error.
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    /// Reading the queue's dedup records failed while checking an idempotency key (nothing
    /// was written).
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// The write failed. The broker fails closed after a write error: later sends return
    /// [`SendError::Failed`] until it is reopened.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// An earlier write failed and the broker stopped accepting writes.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// [`Group::subscribe`](crate::Group::subscribe), [`WorkGroup::subscribe`](crate::WorkGroup::subscribe)
/// or [`WorkGroup::update`](crate::WorkGroup::update) failed. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The group name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Another subscription of this group on this queue is still active (its stream or some of
    /// its deliveries are alive). Ordered groups have one active subscriber at a time.
    #[error("group {group:?} already has an active subscription on queue {queue:?}")]
    AlreadySubscribed {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
    },
    /// The queue was deleted after this handle was made; get a new one with
    /// [`Broker::queue`](crate::Broker::queue).
    #[error("queue {queue:?} was deleted")]
    QueueDeleted {
        /// The queue.
        queue: String,
    },
    /// The group was deleted ([`Broker::delete_group`](crate::Broker::delete_group)) while
    /// this call was on its way: nothing was written. Subscribing again creates it afresh.
    #[error("group {group:?} on queue {queue:?} was deleted meanwhile")]
    GroupDeleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// [`StartFrom::Sequence`](crate::StartFrom::Sequence) names a sequence outside
    /// `first..=last + 1` of the queue.
    #[error("sequence {requested} is outside the queue's range {first}..={next}")]
    SequenceOutOfRange {
        /// The requested start.
        requested: u64,
        /// The first live sequence.
        first: u64,
        /// The next sequence to be written.
        next: u64,
    },
    /// The group exists in the other mode on this queue (ordered vs work-queue); a group's
    /// mode is fixed when it is first created.
    #[error("group {group:?} on queue {queue:?} is a {existing} group")]
    WrongMode {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
        /// `"ordered"` or `"work-queue"`: the mode it was created in.
        existing: &'static str,
    },
    /// The group's default dead-letter queue name (`<queue>.dlq`) would be too long; set one
    /// with [`WorkGroup::dead_letter_queue`](crate::WorkGroup::dead_letter_queue) (or
    /// [`Group::dead_letter_queue`](crate::Group::dead_letter_queue) for an ordered group with
    /// [`max_deliveries`](crate::Group::max_deliveries)).
    #[error("dead-letter queue name for queue {queue:?} is too long; set one explicitly")]
    DeadLetterName {
        /// The queue.
        queue: String,
    },
    /// Writing the group's initial offset failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// A setting is out of range (e.g. a worker pool's concurrency above
    /// [`Workers::MAX_POOL`](crate::Workers::MAX_POOL), or a
    /// [lease](crate::WorkGroup::lease) under 1 ms).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A setting this [`WorkGroup`](crate::WorkGroup) handle sets explicitly differs from the
    /// one stored with the group (by its first subscribe, or its last
    /// [`update`](crate::WorkGroup::update)). Nothing was written. Leave the setting unset to
    /// run with the stored value, or change the stored one with `update`.
    #[error(
        "work group {group:?} on queue {queue:?} is stored with {setting} = {stored}, but this \
         handle sets {requested}; leave it unset to use the stored value, or change it with \
         WorkGroup::update"
    )]
    SettingsMismatch {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// The setting that differs: `"lease"`, `"retry_policy.max_attempts"`,
        /// `"retry_policy.initial_backoff"`, `"retry_policy.max_backoff"`,
        /// `"retry_policy.multiplier"`, `"retry_policy.jitter"`, `"dead_letter_queue"` or
        /// `"ordered_by_key"`.
        setting: &'static str,
        /// The stored value, as text.
        stored: String,
        /// The value this handle sets, as text.
        requested: String,
    },
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// An outcome (ack, nack, retry, dead-letter) or a lease extension could not be recorded.
/// Nothing changed: the message is delivered again as the lease or restart rules say.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The broker was shut down; the message will be delivered again after reopening.
    #[error("broker is shut down; the message will be redelivered")]
    Shutdown,
    /// Work-queue groups: this holder's lease on the message expired (or the message was handed
    /// to another consumer since). Only the current holder may settle or extend it, so two
    /// holders never both win.
    #[error("lease on sequence {seq} (attempt {attempt}) was lost: it expired or was re-claimed")]
    LeaseLost {
        /// The message's sequence.
        seq: u64,
        /// The attempt this holder had.
        attempt: u32,
    },
    /// Writing the outcome failed (the broker then fails closed).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The group (or its queue) was deleted while the message was out: there is nothing
    /// left to settle, and nothing was written.
    #[error("group {group:?} on queue {queue:?} was deleted")]
    Deleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// [`Group::reset_to`](crate::Group::reset_to) failed. Nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError {
    /// The group has an active subscription; reset it while nobody consumes.
    #[error("group {group:?} has an active subscription on queue {queue:?}")]
    Active {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
    },
    /// The group has never subscribed (nothing to reset).
    #[error("group {group:?} does not exist on queue {queue:?}")]
    NoSuchGroup {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
    },
    /// The target is outside what the queue retains: before its first live message (or, for a
    /// timestamp, older than the oldest retained message), or past its end.
    #[error("reset target {requested} is outside the retained range {first}..={next}")]
    OutOfRetention {
        /// The requested sequence (for a timestamp: the first sequence at or after it, or 0).
        requested: u64,
        /// The first live sequence.
        first: u64,
        /// The next sequence to be written.
        next: u64,
    },
    /// Reading timestamps failed.
    #[error(transparent)]
    Receive(#[from] ReceiveError),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Writing the offset failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Redriving dead letters failed. Batches moved before the error stay moved (each batch is
/// atomic), and a later redrive resumes after the last one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The target queue name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Another redrive of the same dead-letter queue moved the cursor concurrently.
    #[error("dead-letter queue {dlq:?} is being redriven concurrently")]
    Conflict {
        /// The dead-letter queue.
        dlq: String,
    },
    /// The dead-letter queue was deleted after this handle was made.
    #[error("dead-letter queue {dlq:?} was deleted")]
    Deleted {
        /// The dead-letter queue.
        dlq: String,
    },
    /// A dead letter has no origin queue header and no target was given.
    #[error("dead letter {seq} has no origin queue; redrive it with an explicit target")]
    NoOrigin {
        /// Its sequence in the dead-letter queue.
        seq: u64,
    },
    /// A dead letter could not be read.
    #[error(transparent)]
    Receive(#[from] ReceiveError),
    /// Writing failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Waiting for acknowledgements to be committed failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Writing the offset record failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// An error yielded by a [`Subscription`](crate::Subscription) stream. The stream ends after
/// yielding one: an ordered group never skips a message it could not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// A message record could not be decoded.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// Reading failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A sequence the writer published is missing from storage.
    #[error("queue {queue:?}: expected sequence {expected}, found {found:?}")]
    Gap {
        /// The queue.
        queue: String,
        /// The sequence that should have been read next.
        expected: u64,
        /// What was found instead (`None`: nothing).
        found: Option<u64>,
    },
    /// The background read task failed unexpectedly.
    #[error("internal error: {0}")]
    Internal(String),
    /// Another process took this ordered group over (an etcd broker whose lease on the group
    /// lapsed: paused, partitioned): the stream ends after this. What it acknowledged and had
    /// not committed is delivered again to the new subscriber.
    #[error("another process took over group {group:?} on queue {queue:?}")]
    OwnershipLost {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// The group (or its queue) was deleted ([`Broker::delete_queue`](crate::Broker::delete_queue),
    /// [`Broker::delete_group`](crate::Broker::delete_group)): the stream (or worker pool) ends
    /// after this. Deliveries still out fail to settle with [`AckError::Deleted`].
    #[error("group {group:?} on queue {queue:?} was deleted")]
    Deleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Shutting down failed part-way. The database is closed regardless.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ShutdownError {
    /// Flushing pending offset commits or syncing the WAL failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The writer thread panicked.
    #[error("writer thread panicked")]
    WriterPanicked,
    /// The shutdown task did not run to completion (the runtime was shutting down).
    #[error("shutdown interrupted: {0}")]
    Internal(String),
}

/// Reading stats, pending claims, messages or dead letters for inspection failed. Nothing
/// changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// No queue by that name.
    #[error("queue {0:?} does not exist")]
    NoSuchQueue(String),
    /// No group by that name on that queue.
    #[error("group {group:?} does not exist on queue {queue:?}")]
    NoSuchGroup {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
    },
    /// A name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// A stored record could not be decoded.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// RocksDB failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker (or inspector) was shut down.
    #[error("database is closed")]
    Shutdown,
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Pausing or resuming a group failed. Nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PauseError {
    /// The group has never subscribed on that queue.
    #[error("group {group:?} does not exist on queue {queue:?}")]
    NoSuchGroup {
        /// The group.
        group: String,
        /// The queue.
        queue: String,
    },
    /// A name is invalid.
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// Writing the group's settings record failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier storage error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// Creating or reading a keyspace ([`Broker::kv`](crate::Broker::kv),
/// [`Keyspace::get`](crate::Keyspace::get), [`Keyspace::scan`](crate::Keyspace::scan)) failed.
/// Nothing was written.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// The keyspace name is invalid (the rules of queue names).
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// A key is empty or longer than [`MAX_KV_KEY_LEN`](crate::MAX_KV_KEY_LEN) bytes.
    #[error("invalid key: {reason}")]
    InvalidKey {
        /// What is wrong.
        reason: &'static str,
    },
    /// A stored entry does not decode.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// The storage engine failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

/// A transaction ([`Broker::transaction`](crate::Broker::transaction)) or a keyspace write
/// ([`Keyspace::put`](crate::Keyspace::put), [`Keyspace::compare_and_set`](crate::Keyspace::compare_and_set),
/// which are one-operation transactions) failed. **Nothing of it was applied**: no ack, no
/// send, no write. The jobs it held are released (their attempts count) and its ordered
/// deliveries handed back, so their messages are delivered again.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The broker was shut down.
    #[error("broker is shut down")]
    Shutdown,
    /// A condition on a key did not hold when the transaction was applied (optimistic
    /// concurrency: someone else changed it since it was read). Read again and retry.
    #[error("keyspace {keyspace:?}: key {key:02x?} expected {expected}, found {}", found.map_or("absent".to_string(), |r| format!("revision {r}")))]
    Conflict {
        /// The keyspace.
        keyspace: String,
        /// The key.
        key: Vec<u8>,
        /// What the transaction expected.
        expected: crate::entry::Expect,
        /// The key's revision when the transaction was applied (`None`: absent).
        found: Option<u64>,
    },
    /// A work-queue job's lease was lost before the commit (it expired, or the message was
    /// claimed again, purged or reset), or an ordered delivery's group moved past it (a purge
    /// or reset): the transaction cannot ack it, so it applies nothing.
    #[error("queue {queue:?} group {group:?}: sequence {seq} is no longer held by this transaction")]
    LeaseLost {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// The message's sequence.
        seq: u64,
    },
    /// A group the transaction acks on, or its queue, was deleted.
    #[error("group {group:?} on queue {queue:?} was deleted")]
    GroupDeleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// A queue the transaction sends to was deleted.
    #[error("queue {queue:?} was deleted")]
    QueueDeleted {
        /// The queue.
        queue: String,
    },
    /// A key is empty or too long, a value or message too large, a message's headers or keys
    /// invalid, or the transaction holds more than [`MAX_TX_OPS`](crate::MAX_TX_OPS)
    /// operations or [`MAX_TX_BYTES`](crate::MAX_TX_BYTES) bytes, or something of another
    /// broker. Refused before anything was sent to the
    /// writer.
    #[error("invalid transaction: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// A record the transaction had to read does not decode.
    #[error(transparent)]
    Corrupt(#[from] CorruptionError),
    /// The write failed (the broker then fails closed).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The broker stopped accepting writes after an earlier error.
    #[error(transparent)]
    Failed(FailedError),
    /// This broker's engine does not carry out the operation; nothing was changed.
    #[error(transparent)]
    Unsupported(UnsupportedError),
}

impl TxError {
    /// Whether this is a [`Conflict`](TxError::Conflict): retrying the whole read-modify-write
    /// may succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, TxError::Conflict { .. })
    }
}

impl From<KvError> for TxError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Shutdown => TxError::Shutdown,
            KvError::InvalidKey { reason } => TxError::Invalid { reason: reason.into() },
            KvError::InvalidName(n) => TxError::Invalid { reason: n.to_string() },
            KvError::Corrupt(c) => TxError::Corrupt(c),
            KvError::Storage(s) => TxError::Storage(s),
            KvError::Failed(f) => TxError::Failed(f),
            KvError::Unsupported(u) => TxError::Unsupported(u),
        }
    }
}

/// Any rockq error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// See [`OpenError`].
    #[error(transparent)]
    Open(#[from] OpenError),
    /// See [`QueueError`].
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// See [`SendError`].
    #[error(transparent)]
    Send(#[from] SendError),
    /// See [`SubscribeError`].
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// See [`AckError`].
    #[error(transparent)]
    Ack(#[from] AckError),
    /// See [`CommitError`].
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// See [`ReceiveError`].
    #[error(transparent)]
    Receive(#[from] ReceiveError),
    /// See [`ShutdownError`].
    #[error(transparent)]
    Shutdown(#[from] ShutdownError),
    /// See [`RedriveError`].
    #[error(transparent)]
    Redrive(#[from] RedriveError),
    /// See [`ResetError`].
    #[error(transparent)]
    Reset(#[from] ResetError),
    /// See [`NameError`].
    #[error(transparent)]
    Name(#[from] NameError),
    /// See [`InspectError`].
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// See [`PauseError`].
    #[error(transparent)]
    Pause(#[from] PauseError),
    /// See [`ScheduleError`].
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// See [`KvError`].
    #[error(transparent)]
    Kv(#[from] KvError),
    /// See [`TxError`].
    #[error(transparent)]
    Tx(#[from] TxError),
    /// See [`DecodeError`](crate::DecodeError).
    #[error(transparent)]
    Decode(#[from] crate::codec::DecodeError),
    /// An I/O error of the application's own (e.g. creating the directory for a broker), so
    /// that `?` works on it in a function returning `rockq::Error`.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Whether the broker (or inspector) was shut down: the operation was refused because
    /// shutdown has begun, and will not succeed until the database is opened again.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rockq::Error> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let q = broker.queue("q").await?;
    /// broker.shutdown().await?;
    /// let e = rockq::Error::from(q.send("late").await.unwrap_err());
    /// assert!(e.is_shutdown() && !e.is_retryable());
    /// # Ok(()) }
    /// ```
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            Error::Queue(QueueError::Shutdown)
                | Error::Send(SendError::Shutdown)
                | Error::Subscribe(SubscribeError::Shutdown)
                | Error::Ack(AckError::Shutdown)
                | Error::Commit(CommitError::Shutdown)
                | Error::Redrive(RedriveError::Shutdown)
                | Error::Reset(ResetError::Shutdown)
                | Error::Inspect(InspectError::Shutdown)
                | Error::Pause(PauseError::Shutdown)
                | Error::Schedule(ScheduleError::Shutdown)
                | Error::Kv(KvError::Shutdown)
                | Error::Tx(TxError::Shutdown)
        )
    }

    /// Whether trying the same operation again later, unchanged, may succeed: a conflict with
    /// something that ends on its own (another subscription of an ordered group still
    /// active, a reset while a subscription is active, a concurrent redrive). Not retryable:
    /// bad input, shutdown, a failed-closed broker (reopen it), corruption, decode errors, and
    /// a lost lease (settling that job again fails again; the message itself comes back to
    /// be handled anew).
    ///
    /// # Examples
    ///
    /// ```
    /// let lost = rockq::Error::from(rockq::AckError::LeaseLost { seq: 7, attempt: 1 });
    /// assert!(!lost.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Subscribe(SubscribeError::AlreadySubscribed { .. })
                | Error::Reset(ResetError::Active { .. })
                | Error::Redrive(RedriveError::Conflict { .. })
                | Error::Tx(TxError::Conflict { .. })
        )
    }

    /// The refusal, if this broker's engine does not support the operation (an etcd broker
    /// refuses what it does not carry out yet, with the family's `Unsupported` variant).
    ///
    /// # Examples
    ///
    /// ```
    /// let lost = rockq::Error::from(rockq::AckError::LeaseLost { seq: 7, attempt: 1 });
    /// assert!(lost.unsupported().is_none());
    /// ```
    pub fn unsupported(&self) -> Option<&UnsupportedError> {
        match self {
            Error::Queue(QueueError::Unsupported(u))
            | Error::Send(SendError::Unsupported(u))
            | Error::Subscribe(SubscribeError::Unsupported(u))
            | Error::Ack(AckError::Unsupported(u))
            | Error::Commit(CommitError::Unsupported(u))
            | Error::Receive(ReceiveError::Unsupported(u))
            | Error::Redrive(RedriveError::Unsupported(u))
            | Error::Reset(ResetError::Unsupported(u))
            | Error::Inspect(InspectError::Unsupported(u))
            | Error::Pause(PauseError::Unsupported(u))
            | Error::Schedule(ScheduleError::Unsupported(u))
            | Error::Kv(KvError::Unsupported(u))
            | Error::Tx(TxError::Unsupported(u)) => Some(u),
            _ => None,
        }
    }

    /// The storage error at the root of this error, if any: RocksDB's own, directly or as the
    /// cause a failed-closed broker keeps.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(e) = queue.send("x").await.map_err(rockq::Error::from) {
    ///     if let Some(storage) = e.storage_error() {
    ///         eprintln!("RocksDB: {}", storage.message());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn storage_error(&self) -> Option<&StorageError> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = next {
            if let Some(s) = e.downcast_ref::<StorageError>() {
                return Some(s);
            }
            next = e.source();
        }
        None
    }
}
