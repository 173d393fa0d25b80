//! rockq's errors: one [`Error`] for every operation, its [`ErrorKind`] for code that decides
//! what to do, and the few detail types its variants carry.
//!
//! Every fallible public operation returns [`Result<T>`](crate::Result), whose error is
//! [`Error`] (a name check that can only fail on the name, such as `Queue::group`, returns the
//! narrower [`NameError`], which `?` converts). Match on [`Error::kind`] to decide (retry, give up, report a 404 …), and on the
//! variant itself for the details (which message was too large, which sequence was lost). The
//! variants are grouped by kind below; each operation's docs list, under `# Errors`, the ones it
//! returns.
//!
//! Why one type rather than one per operation (0.1 had twenty): the same six refusals (shut
//! down, failed closed, storage, corruption, unsupported, invalid name) came back in every
//! family, so every caller — the console, the CLI, applications — matched the same kind many
//! times over, and disagreed. `redb` flattens its errors the same way into one `Error`; `fjall`
//! has one.

use std::path::PathBuf;
use std::sync::Arc;

/// `Result<T, rockq::Error>`: what every fallible rockq operation returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is: the one thing to match on to decide what to do next.
///
/// Every public error type has a `kind()`. New kinds may be added, so a `match` needs a
/// wildcard arm.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> rockq::Result<()> {
/// # let dir = tempfile::tempdir()?;
/// use rockq::ErrorKind;
///
/// let broker = rockq::Broker::open(dir.path()).await?;
/// let e = broker.queue("no spaces").await.unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::InvalidInput);
/// broker.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The broker (or inspector) was shut down, or shutdown has begun: nothing new is
    /// accepted until the database is opened again.
    Shutdown,
    /// The broker failed closed after an earlier write error: nothing more is written until
    /// the database is reopened.
    Failed,
    /// The storage engine (RocksDB or etcd) failed, or an I/O error of the application's own.
    Storage,
    /// A stored record does not decode, or a sequence that must be there is missing.
    Corrupt,
    /// This broker's engine does not carry out the operation; nothing changed.
    Unsupported,
    /// The caller's input was refused: a name, a size, a key, an option, a range. Nothing
    /// changed; the same call fails again.
    InvalidInput,
    /// No queue, group, schedule or database by that name.
    NotFound,
    /// The queue or group was deleted while the handle or call was in use.
    Deleted,
    /// A conflict with something that ends on its own (an active subscription, a concurrent
    /// redrive, a keyspace write since the read) or with the stored state (another group mode,
    /// other stored settings).
    Conflict,
    /// A lease or ownership was lost: the job went back to the queue (or the group to another
    /// process), so this holder's outcome does not count.
    LeaseLost,
    /// The database could not be opened: locked, not a rockq database, another format version,
    /// or no Tokio runtime.
    Open,
    /// A payload did not encode or decode with its codec.
    Codec,
    /// A job handler's own failure ([`HandlerError`](crate::HandlerError)).
    Handler,
    /// A bug or a task that died: not the caller's doing.
    Internal,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::Shutdown => "shut down",
            ErrorKind::Failed => "failed closed",
            ErrorKind::Storage => "storage error",
            ErrorKind::Corrupt => "corrupted data",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::NotFound => "not found",
            ErrorKind::Deleted => "deleted",
            ErrorKind::Conflict => "conflict",
            ErrorKind::LeaseLost => "lease lost",
            ErrorKind::Open => "cannot open",
            ErrorKind::Codec => "codec error",
            ErrorKind::Handler => "handler error",
            ErrorKind::Internal => "internal error",
        })
    }
}

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
    /// The name is made only of dots (`.`, `..`): path segments that browsers and HTTP clients
    /// resolve away, so such a queue could not be reached by URL (the console).
    #[error("{kind} name is made only of dots, which a URL cannot carry")]
    OnlyDots {
        /// Queue or group.
        kind: NameKind,
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

impl NameError {
    /// The kind of this error: always [`ErrorKind::InvalidInput`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> rockq::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let Err(rockq::Error::InvalidName(e)) = broker.queue("").await else { panic!() };
    /// assert_eq!(e.kind(), rockq::ErrorKind::InvalidInput);
    /// # broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

/// An error reported by the storage engine (RocksDB). The message is RocksDB's own.
///
/// It carries the message only: no RocksDB type appears in rockq's public API, so the storage
/// engine can be upgraded (or another engine added) without breaking callers.
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage error: {message}")]
pub struct StorageError {
    message: std::sync::Arc<str>,
    transient: bool,
    /// A record read from a store that reports through this type (etcd) did not decode: the
    /// error converts to [`Error::Corrupt`], as the embedded engine reports it.
    corrupt: Option<Box<CorruptionError>>,
}

impl StorageError {
    /// The kind of this error: always [`ErrorKind::Storage`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo(e: rockq::StorageError) {
    /// assert_eq!(e.kind(), rockq::ErrorKind::Storage);
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Storage
    }

    /// Made by the store from RocksDB's error (and by failpoints in tests).
    pub(crate) fn new(message: impl Into<std::sync::Arc<str>>) -> Self {
        StorageError { message: message.into(), transient: false, corrupt: None }
    }

    /// A record that did not decode, found by a store whose reads report `StorageError` (etcd).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn corrupt(e: CorruptionError) -> Self {
        StorageError { message: e.to_string().into(), transient: false, corrupt: Some(Box::new(e)) }
    }

    /// Whether a record did not decode: asking again reads the same bytes.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn is_corrupt(&self) -> bool {
        self.corrupt.is_some()
    }

    /// The store could not be reached (on etcd: no member answered in time, no quorum, no
    /// leader): the same request may well succeed later.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn unreachable(message: impl Into<std::sync::Arc<str>>) -> Self {
        StorageError { message: message.into(), transient: true, corrupt: None }
    }

    /// Whether the store could not be reached, rather than refusing or failing the request:
    /// on etcd, no member answered in time (no quorum, no leader, every member cut off). Such
    /// an error says nothing about the data; trying again later may succeed, and worker pools
    /// and subscriptions do so by themselves (see [`Event::StoreUnavailable`](crate::Event::StoreUnavailable)).
    /// The embedded engine's errors (RocksDB's I/O errors) are never transient.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::Error::Storage(e)) = queue.send("x").await
    ///     && e.is_transient()
    /// {
    ///     // etcd was unreachable for the whole request timeout: the send may be stored or not.
    /// }
    /// # }
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// RocksDB's message for this error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::Error::Storage(e)) = queue.send("x").await {
    ///     eprintln!("RocksDB: {}", e.message());
    /// }
    /// # }
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Why the engine did not carry out a request, whatever the request: the broker is shutting
/// down, an earlier write failed and it failed closed, or the engine does not support it. The
/// engine refuses every request the same way, and [`Error`] converts from it.
#[derive(Debug, Clone)]
pub(crate) enum Closed {
    /// Shutdown has begun, or every handle is gone: nothing new is accepted.
    Shutdown,
    /// The writer failed closed; nothing is written until the database is reopened.
    Failed(Failure),
    /// The broker's engine does not carry out this operation (yet).
    #[allow(dead_code)] // refused only by the etcd writer (feature `etcd`)
    Unsupported(UnsupportedError),
}

/// The operation is not supported by this broker's engine (the etcd engine carries out a
/// subset of what the embedded one does; see `docs/DISTRIBUTED.md`). Nothing was changed: an
/// engine refuses an operation rather than carry it out differently. Kind
/// [`Unsupported`](ErrorKind::Unsupported).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation} is not supported by the {engine} engine")]
pub struct UnsupportedError {
    operation: &'static str,
    engine: &'static str,
}

impl UnsupportedError {
    /// The kind of this error: always [`ErrorKind::Unsupported`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo(e: rockq::UnsupportedError) {
    /// assert_eq!(e.kind(), rockq::ErrorKind::Unsupported);
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Unsupported
    }

    /// Made by an engine that refuses `operation`.
    pub(crate) fn new(operation: &'static str, engine: &'static str) -> Self {
        UnsupportedError { operation, engine }
    }

    /// What was refused, e.g. `"delayed messages"`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(rockq::Error::Unsupported(e)) = queue.send("x").await {
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
    /// if let Err(rockq::Error::Unsupported(e)) = queue.send("x").await {
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
/// after a lost one). Carried by [`Error::Failed`], kind [`Failed`](ErrorKind::Failed); it keeps the
/// original cause — [`storage_error`](FailedError::storage_error) is RocksDB's error when a
/// write or WAL sync failed — and reports it as its `source()`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("broker stopped accepting writes after an earlier error")]
pub struct FailedError {
    #[source]
    cause: Failure,
}

impl FailedError {
    /// The kind of this error: always [`ErrorKind::Failed`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo(e: rockq::FailedError) {
    /// assert_eq!(e.kind(), rockq::ErrorKind::Failed);
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Failed
    }

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
    /// if let Err(rockq::Error::Failed(failed)) = queue.send("x").await {
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

/// A record in the database could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupted {what} record at key {key:02x?}: {reason}")]
pub struct CorruptionError {
    pub(crate) what: &'static str,
    pub(crate) key: Vec<u8>,
    pub(crate) reason: String,
}

impl CorruptionError {
    /// The kind of this error: always [`ErrorKind::Corrupt`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo(e: rockq::CorruptionError) {
    /// assert_eq!(e.kind(), rockq::ErrorKind::Corrupt);
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Corrupt
    }

    pub(crate) fn new(what: &'static str, key: &[u8], reason: impl Into<String>) -> Self {
        CorruptionError { what, key: key.to_vec(), reason: reason.into() }
    }

    /// The kind of record (`"message"`, `"queue"`, `"offset"`, …).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() {
    /// if let Err(rockq::Error::Corrupt(e)) = rockq::Broker::open("./data").await {
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
    /// if let Err(rockq::Error::Corrupt(e)) = rockq::Broker::open("./data").await {
    ///     eprintln!("corrupt {} record at {:02x?}", e.record_kind(), e.key());
    /// }
    /// # }
    /// ```
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

/// Any rockq error. [`kind`](Error::kind) says what kind of failure it is; the variant says
/// exactly what happened. **Whatever the variant, a refused call changed nothing** unless its
/// docs say otherwise (a redrive keeps the batches it moved).
///
/// New variants may be added in a minor release: match with a wildcard arm, or on
/// [`kind`](Error::kind).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> rockq::Result<()> {
/// # let dir = tempfile::tempdir()?;
/// use rockq::{Error, ErrorKind};
///
/// let broker = rockq::Broker::open(dir.path()).await?;
/// let q = broker.queue("q").await?;
/// match q.send_batch(Vec::<&str>::new()).await {
///     Err(Error::EmptyBatch) => {}
///     other => panic!("{other:?}"),
/// }
/// broker.shutdown().await?;
/// let late = q.send("late").await.unwrap_err();
/// assert_eq!(late.kind(), ErrorKind::Shutdown);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- The broker's state (kinds Shutdown, Failed, Storage, Corrupt, Unsupported, Internal).
    /// The broker (or inspector) was shut down, or shutdown has begun. Kind
    /// [`Shutdown`](ErrorKind::Shutdown).
    #[error("broker is shut down")]
    Shutdown,
    /// The broker stopped accepting writes after an earlier error; reopen the database. Kind
    /// [`Failed`](ErrorKind::Failed).
    #[error(transparent)]
    Failed(FailedError),
    /// The storage engine failed. A failed write makes the broker fail closed: later writes
    /// return [`Failed`](Error::Failed). Kind [`Storage`](ErrorKind::Storage).
    #[error(transparent)]
    Storage(StorageError),
    /// A stored record could not be decoded. Kind [`Corrupt`](ErrorKind::Corrupt).
    #[error(transparent)]
    Corrupt(CorruptionError),
    /// A sequence the writer published is missing from storage: an ordered stream never skips
    /// what it could not read, so it ends here. Kind [`Corrupt`](ErrorKind::Corrupt).
    #[error("queue {queue:?}: expected sequence {expected}, found {found:?}")]
    Gap {
        /// The queue.
        queue: String,
        /// The sequence that should have been read next.
        expected: u64,
        /// What was found instead (`None`: nothing).
        found: Option<u64>,
    },
    /// This broker's engine does not carry out the operation; nothing was changed. Kind
    /// [`Unsupported`](ErrorKind::Unsupported).
    #[error(transparent)]
    Unsupported(UnsupportedError),
    /// An I/O error: of the application's own (so that `?` works on it in a function returning
    /// `rockq::Result`; `path` is `None`), or of opening a database (`path` names it). Kind
    /// [`Storage`](ErrorKind::Storage).
    #[error("{}{source}", path.as_ref().map(|p| format!("i/o error on {}: ", p.display())).unwrap_or_default())]
    Io {
        /// The path rockq was working on, if the error is rockq's.
        path: Option<PathBuf>,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// The writer thread panicked (shutdown reports it; the database is closed regardless).
    /// Kind [`Internal`](ErrorKind::Internal).
    #[error("writer thread panicked")]
    WriterPanicked,
    /// A background task failed unexpectedly. Kind [`Internal`](ErrorKind::Internal).
    #[error("internal error: {0}")]
    Internal(String),

    // ---- Opening (kind Open, or NotFound / InvalidInput / Unsupported as noted).
    /// Another process, or another broker in this process, holds the database open. Kind
    /// [`Open`](ErrorKind::Open).
    #[error("database at {path} is locked by another process or broker: {message}")]
    Locked {
        /// The database directory.
        path: PathBuf,
        /// RocksDB's message.
        message: String,
    },
    /// The path exists but is not a rockq database (a file, a foreign directory, a RocksDB
    /// database rockq did not create, an etcd namespace with foreign keys). Kind
    /// [`Open`](ErrorKind::Open).
    #[error("{path} is not a rockq database: {reason}")]
    NotRockq {
        /// The path (or namespace) that was given.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// There is no database at the path and
    /// [`Options::create_if_missing`](crate::Options::create_if_missing) is off. Kind
    /// [`NotFound`](ErrorKind::NotFound).
    #[error("no database at {path} and create_if_missing is off")]
    NoDatabase {
        /// The path that was given.
        path: PathBuf,
    },
    /// The database was written by an incompatible version of rockq. Kind
    /// [`Open`](ErrorKind::Open).
    #[error("database format version {found} is not supported (this build reads version {supported})")]
    IncompatibleVersion {
        /// Version found on disk.
        found: u8,
        /// Version this build understands.
        supported: u8,
    },
    /// Called outside a Tokio runtime: rockq runs its blocking work on the runtime's pool.
    /// Kind [`Open`](ErrorKind::Open).
    #[error("rockq must be opened from within a Tokio runtime")]
    NoRuntime,

    // ---- Bad input (kind InvalidInput, or Codec as noted). Nothing was written.
    /// A queue, group, keyspace or schedule name is invalid. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error(transparent)]
    InvalidName(NameError),
    /// An option or setting is out of range (e.g. a worker pool's concurrency above
    /// [`Workers::MAX_POOL`](crate::Workers::MAX_POOL), a [lease](crate::WorkGroup::lease)
    /// under 1 ms, an etcd endpoint that does not parse). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A message (payload plus headers) is larger than
    /// [`Options::max_message_bytes`](crate::Options::max_message_bytes). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
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
    /// 65 535 headers). Kind [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("message {index} has an invalid header: {reason}")]
    InvalidHeader {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// An ordering or idempotency key is empty or longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("message {index} has an invalid key: {reason}")]
    InvalidKey {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// `send_batch` was called with no messages. Kind [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("send_batch needs at least one message")]
    EmptyBatch,
    /// `send_batch` was called with more messages than one atomic write may hold
    /// ([`Options::max_batch_messages`](crate::Options::max_batch_messages)). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("batch of {len} messages exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Messages in the call.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The message needs [`Queue::submit`](crate::Queue::submit): it is delayed (it has no
    /// sequence until it is due) or has an idempotency key (a duplicate has no new sequence,
    /// nor a place in a contiguous range). Kind [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("message {index} {reason}: send it with Queue::submit")]
    NeedsSubmit {
        /// Position of the message within the call (0 for `send`).
        index: usize,
        /// Why.
        reason: &'static str,
    },
    /// A keyspace key is empty or longer than [`MAX_KV_KEY_LEN`](crate::MAX_KV_KEY_LEN); a
    /// value or message in a transaction is too large; a transaction holds more than
    /// [`MAX_TX_OPS`](crate::MAX_TX_OPS) operations or [`MAX_TX_BYTES`](crate::MAX_TX_BYTES)
    /// bytes, or something of another broker. Refused before anything reached the writer. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("invalid input: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// A cron expression does not parse, or never fires. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("invalid cron expression {expr:?}: {reason}")]
    InvalidCron {
        /// The expression given.
        expr: String,
        /// What the parser said.
        reason: String,
    },
    /// A schedule's interval is zero (or rounds to zero). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("a schedule's interval must be at least one microsecond")]
    ZeroInterval,
    /// A sequence is outside what the queue retains: a
    /// [`StartFrom::Sequence`](crate::StartFrom::Sequence) outside `first..=last + 1`, or a
    /// [reset](crate::Group::reset_to) target before the first live message (or, for a
    /// timestamp, older than the oldest retained one) or past the end. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("sequence {requested} is outside the queue's retained range {first}..={next}")]
    OutOfRange {
        /// The requested sequence (for a timestamp: the first sequence at or after it, or 0).
        requested: u64,
        /// The first live sequence.
        first: u64,
        /// The next sequence to be written.
        next: u64,
    },
    /// The group's default dead-letter queue name (`<queue>.dlq`) would be too long; set one
    /// with [`WorkGroup::dead_letter_queue`](crate::WorkGroup::dead_letter_queue) (or
    /// [`Group::dead_letter_queue`](crate::Group::dead_letter_queue)). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("dead-letter queue name for queue {queue:?} is too long; set one explicitly")]
    DeadLetterName {
        /// The queue.
        queue: String,
    },
    /// A dead letter has no origin queue header and no redrive target was given. Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("dead letter {seq} has no origin queue; redrive it with an explicit target")]
    NoOrigin {
        /// Its sequence in the dead-letter queue.
        seq: u64,
    },
    /// The queue registry is full (2³² − 2 queues). Kind
    /// [`InvalidInput`](ErrorKind::InvalidInput).
    #[error("no queue ids left")]
    TooManyQueues,
    /// A typed send's codec could not encode a value (nothing was sent). Kind
    /// [`Codec`](ErrorKind::Codec).
    #[error("message {index} does not encode with codec {codec:?}: {source}")]
    Encode {
        /// Position of the value within the call (0 for `send`).
        index: usize,
        /// The codec's [name](crate::Codec::NAME).
        codec: &'static str,
        /// The codec's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A payload did not decode as the requested type. Kind [`Codec`](ErrorKind::Codec).
    #[error(transparent)]
    Decode(crate::codec::DecodeError),

    // ---- What does not exist, or no longer (kinds NotFound, Deleted).
    /// No queue by that name. Kind [`NotFound`](ErrorKind::NotFound).
    #[error("queue {queue:?} does not exist")]
    NoSuchQueue {
        /// The queue.
        queue: String,
    },
    /// No group by that name on that queue. Kind [`NotFound`](ErrorKind::NotFound).
    #[error("group {group:?} does not exist on queue {queue:?}")]
    NoSuchGroup {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// There is no flow `flow` ([`Broker::flow_status`](crate::Broker::flow_status)): never
    /// submitted, or deleted. Kind [`NotFound`](ErrorKind::NotFound).
    #[error("there is no flow {flow} (never submitted, or deleted)")]
    NoSuchFlow {
        /// The flow's id.
        flow: u64,
    },
    /// Message `seq` of `queue` is not an unfinished job of work group `group`: the group
    /// finished it (acked or dead-lettered), retention deleted it, or it was never sent. Kind
    /// [`NotFound`](ErrorKind::NotFound).
    #[error(
        "message {seq} of queue {queue:?} is not an unfinished job of group {group:?} (finished, deleted or never sent)"
    )]
    NoSuchJob {
        /// The queue.
        queue: String,
        /// The work group.
        group: String,
        /// The message's sequence.
        seq: u64,
    },
    /// An operator's action on one job ([`Broker::delete_job`](crate::Broker::delete_job) and
    /// its siblings) does not apply to it in its current state: it is held by a live lease or
    /// being settled (retry once the lease ends), not waiting for a retry (retry now), or
    /// too far beyond what the group has claimed. Nothing changed. Kind
    /// [`Conflict`](ErrorKind::Conflict).
    #[error("job {seq} of group {group:?} on queue {queue:?} is {state}: cannot {action} it")]
    JobState {
        /// The queue.
        queue: String,
        /// The work group.
        group: String,
        /// The message's sequence.
        seq: u64,
        /// Its state: `"leased"`, `"being settled"`, `"claimable now"`, ...
        state: &'static str,
        /// The refused action: `"retry now"`, `"delete"`, `"dead-letter"`.
        action: &'static str,
    },
    /// Dead-letter queue `dlq` has no letter `seq` left to settle: it was redriven or deleted
    /// already, trimmed, or never written. Kind [`NotFound`](ErrorKind::NotFound).
    #[error("dead-letter queue {dlq:?} has no letter {seq} left (redriven, deleted or never written)")]
    NoSuchLetter {
        /// The dead-letter queue.
        dlq: String,
        /// The letter's sequence in it.
        seq: u64,
    },
    /// No recurring schedule by that name. Kind [`NotFound`](ErrorKind::NotFound).
    #[error("no schedule named {name:?}")]
    NoSuchSchedule {
        /// The schedule.
        name: String,
    },
    /// The queue was deleted ([`Broker::delete_queue`](crate::Broker::delete_queue)) after the
    /// handle was made, or before the call's messages were written: nothing of the call was
    /// written. Get a new handle with [`Broker::queue`](crate::Broker::queue), which creates
    /// it afresh. Kind [`Deleted`](ErrorKind::Deleted).
    #[error("queue {queue:?} was deleted")]
    QueueDeleted {
        /// The queue.
        queue: String,
    },
    /// The group (or its queue) was deleted ([`Broker::delete_group`](crate::Broker::delete_group)):
    /// a stream or worker pool ends with it, deliveries still out cannot be settled, and a
    /// subscribe or transaction on its way wrote nothing. Subscribing again creates it afresh.
    /// Kind [`Deleted`](ErrorKind::Deleted).
    #[error("group {group:?} on queue {queue:?} was deleted")]
    GroupDeleted {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },

    // ---- Conflicts (kind Conflict): with something that ends on its own, or with stored state.
    /// The group has an active subscription on the queue (its stream or some of its
    /// deliveries are alive): an ordered group has one active subscriber at a time, and is
    /// reset only while nobody consumes. Retryable. Kind [`Conflict`](ErrorKind::Conflict).
    #[error("group {group:?} has an active subscription on queue {queue:?}")]
    Active {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// Another redrive of the same dead-letter queue moved its cursor concurrently. Retryable.
    /// Kind [`Conflict`](ErrorKind::Conflict).
    #[error("dead-letter queue {dlq:?} is being redriven concurrently")]
    RedriveConflict {
        /// The dead-letter queue.
        dlq: String,
    },
    /// A transaction's condition on a key did not hold when it was applied (optimistic
    /// concurrency: someone else changed it since it was read). Read again and retry. Kind
    /// [`Conflict`](ErrorKind::Conflict).
    #[error("keyspace {keyspace:?}: key {} expected {expected}, found {}", show_key(key), found.map_or("absent".to_string(), |r| format!("revision {r}")))]
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
    /// The group exists in the other mode on this queue (ordered vs work-queue); a group's
    /// mode is fixed when it is first created. Kind [`Conflict`](ErrorKind::Conflict).
    #[error("group {group:?} on queue {queue:?} is a {existing} group")]
    WrongMode {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// `"ordered"` or `"work-queue"`: the mode it was created in.
        existing: &'static str,
    },
    /// A setting this [`WorkGroup`](crate::WorkGroup) handle sets explicitly differs from the
    /// one stored with the group (by its first subscribe, or its last
    /// [`update`](crate::WorkGroup::update)). Leave it unset to run with the stored value, or
    /// change the stored one with `update`. Kind [`Conflict`](ErrorKind::Conflict).
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

    // ---- Leases (kind LeaseLost).
    /// This holder's lease on a work-queue job ran out, or the message was handed to another
    /// consumer, purged or reset since; or an ordered delivery's group moved past it (a purge
    /// or reset). Only the current holder may settle or extend a job, so two holders never
    /// both win; the message comes back to be handled anew. Kind
    /// [`LeaseLost`](ErrorKind::LeaseLost).
    #[error(
        "queue {queue:?} group {group:?}: the lease on sequence {seq} (attempt {attempt}) was lost: it expired or was re-claimed"
    )]
    LeaseLost {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
        /// The message's sequence.
        seq: u64,
        /// The attempt this holder had (0 for an ordered delivery).
        attempt: u32,
    },
    /// This process no longer owns the ordered group (an etcd broker whose ownership lease on
    /// the group lapsed): the stream ends after this. What it acknowledged and had not
    /// committed is delivered again to the next subscriber. Kind
    /// [`LeaseLost`](ErrorKind::LeaseLost).
    #[error("ownership of group {group:?} on queue {queue:?} was lost (its etcd lease lapsed)")]
    OwnershipLost {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
}

impl Error {
    /// What kind of failure this is.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Error, ErrorKind};
    ///
    /// assert_eq!(Error::EmptyBatch.kind(), ErrorKind::InvalidInput);
    /// assert_eq!(Error::Shutdown.kind(), ErrorKind::Shutdown);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Shutdown => ErrorKind::Shutdown,
            Error::Failed(_) => ErrorKind::Failed,
            Error::Storage(_) | Error::Io { .. } => ErrorKind::Storage,
            Error::Corrupt(_) | Error::Gap { .. } => ErrorKind::Corrupt,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::WriterPanicked | Error::Internal(_) => ErrorKind::Internal,
            Error::Locked { .. }
            | Error::NotRockq { .. }
            | Error::IncompatibleVersion { .. }
            | Error::NoRuntime => ErrorKind::Open,
            Error::InvalidName(_)
            | Error::InvalidOption(_)
            | Error::MessageTooLarge { .. }
            | Error::InvalidHeader { .. }
            | Error::InvalidKey { .. }
            | Error::EmptyBatch
            | Error::BatchTooLarge { .. }
            | Error::NeedsSubmit { .. }
            | Error::Invalid { .. }
            | Error::InvalidCron { .. }
            | Error::ZeroInterval
            | Error::OutOfRange { .. }
            | Error::DeadLetterName { .. }
            | Error::NoOrigin { .. }
            | Error::TooManyQueues => ErrorKind::InvalidInput,
            Error::Encode { .. } | Error::Decode(_) => ErrorKind::Codec,
            Error::NoDatabase { .. }
            | Error::NoSuchQueue { .. }
            | Error::NoSuchGroup { .. }
            | Error::NoSuchJob { .. }
            | Error::NoSuchFlow { .. }
            | Error::NoSuchLetter { .. }
            | Error::NoSuchSchedule { .. } => ErrorKind::NotFound,
            Error::QueueDeleted { .. } | Error::GroupDeleted { .. } => ErrorKind::Deleted,
            Error::Active { .. }
            | Error::RedriveConflict { .. }
            | Error::Conflict { .. }
            | Error::WrongMode { .. }
            | Error::JobState { .. }
            | Error::SettingsMismatch { .. } => ErrorKind::Conflict,
            Error::LeaseLost { .. } | Error::OwnershipLost { .. } => ErrorKind::LeaseLost,
        }
    }

    /// The queue this error names, if it names one (a dead-letter queue for a redrive
    /// conflict, the message's queue for a decode error).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::Error::NoSuchGroup { queue: "orders".into(), group: "billing".into() };
    /// assert_eq!((e.queue(), e.group()), (Some("orders"), Some("billing")));
    /// ```
    pub fn queue(&self) -> Option<&str> {
        match self {
            Error::Gap { queue, .. }
            | Error::DeadLetterName { queue }
            | Error::NoSuchQueue { queue }
            | Error::NoSuchGroup { queue, .. }
            | Error::NoSuchJob { queue, .. }
            | Error::JobState { queue, .. }
            | Error::QueueDeleted { queue }
            | Error::GroupDeleted { queue, .. }
            | Error::Active { queue, .. }
            | Error::WrongMode { queue, .. }
            | Error::SettingsMismatch { queue, .. }
            | Error::LeaseLost { queue, .. }
            | Error::OwnershipLost { queue, .. } => Some(queue),
            Error::RedriveConflict { dlq } | Error::NoSuchLetter { dlq, .. } => Some(dlq),
            Error::Decode(d) => Some(d.queue()),
            _ => None,
        }
    }

    /// The group this error names, if it names one.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::Error::QueueDeleted { queue: "orders".into() };
    /// assert_eq!(e.group(), None);
    /// ```
    pub fn group(&self) -> Option<&str> {
        match self {
            Error::NoSuchGroup { group, .. }
            | Error::NoSuchJob { group, .. }
            | Error::JobState { group, .. }
            | Error::GroupDeleted { group, .. }
            | Error::Active { group, .. }
            | Error::WrongMode { group, .. }
            | Error::SettingsMismatch { group, .. }
            | Error::LeaseLost { group, .. }
            | Error::OwnershipLost { group, .. } => Some(group),
            _ => None,
        }
    }

    /// The sequence this error names, if it names one: the lost lease's message, the sequence
    /// a gap expected, a dead letter without origin, a message that did not decode.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::Error::NoOrigin { seq: 7 };
    /// assert_eq!(e.seq(), Some(7));
    /// ```
    pub fn seq(&self) -> Option<u64> {
        match self {
            Error::LeaseLost { seq, .. }
            | Error::NoOrigin { seq }
            | Error::NoSuchJob { seq, .. }
            | Error::NoSuchLetter { seq, .. }
            | Error::JobState { seq, .. } => Some(*seq),
            Error::Gap { expected, .. } => Some(*expected),
            Error::Decode(d) => Some(d.seq()),
            _ => None,
        }
    }

    /// Whether the broker (or inspector) was shut down: the operation was refused because
    /// shutdown has begun, and will not succeed until the database is opened again.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> rockq::Result<()> {
    /// # let dir = tempfile::tempdir()?;
    /// let broker = rockq::Broker::open(dir.path()).await?;
    /// let q = broker.queue("q").await?;
    /// broker.shutdown().await?;
    /// let e = q.send("late").await.unwrap_err();
    /// assert!(e.is_shutdown() && !e.is_retryable());
    /// # Ok(()) }
    /// ```
    pub fn is_shutdown(&self) -> bool {
        self.kind() == ErrorKind::Shutdown
    }

    /// Whether trying the same operation again later, unchanged, may succeed: a conflict with
    /// something that ends on its own (another subscription of an ordered group still
    /// active, a reset while a subscription is active, a concurrent redrive, a keyspace
    /// condition). Not retryable: bad input, shutdown, a failed-closed broker (reopen it),
    /// corruption, codec errors, stored state that differs (another mode, other settings), and
    /// a lost lease (settling that job again fails again; the message itself comes back to be
    /// handled anew).
    ///
    /// # Examples
    ///
    /// ```
    /// let lost = rockq::Error::LeaseLost { queue: "q".into(), group: "g".into(), seq: 7, attempt: 1 };
    /// assert!(!lost.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Active { .. } | Error::RedriveConflict { .. } | Error::Conflict { .. })
    }

    /// Whether this is a transaction's [`Conflict`](Error::Conflict): retrying the whole
    /// read-modify-write may succeed.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!rockq::Error::Shutdown.is_conflict());
    /// ```
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    /// The refusal, if this broker's engine does not support the operation.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(rockq::Error::Shutdown.unsupported().is_none());
    /// ```
    pub fn unsupported(&self) -> Option<&UnsupportedError> {
        match self {
            Error::Unsupported(u) => Some(u),
            _ => None,
        }
    }

    /// The storage error at the root of this error, if any: the engine's own, directly or as
    /// the cause a failed-closed broker keeps.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) {
    /// if let Err(e) = queue.send("x").await {
    ///     if let Some(storage) = e.storage_error() {
    ///         eprintln!("RocksDB: {}", storage.message());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn storage_error(&self) -> Option<&StorageError> {
        // Both variants are `#[error(transparent)]`: their `source()` is the inner error's
        // source, which skips the inner error itself, so the chain below would not find it.
        match self {
            Error::Storage(e) => return Some(e),
            Error::Failed(f) => return f.storage_error(),
            _ => {}
        }
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

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io { path: None, source: Arc::new(e) }
    }
}

impl From<NameError> for Error {
    fn from(e: NameError) -> Self {
        Error::InvalidName(e)
    }
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        match e.corrupt {
            Some(c) => Error::Corrupt(*c),
            None => Error::Storage(e),
        }
    }
}

impl From<CorruptionError> for Error {
    fn from(e: CorruptionError) -> Self {
        Error::Corrupt(e)
    }
}

impl From<FailedError> for Error {
    fn from(e: FailedError) -> Self {
        Error::Failed(e)
    }
}

impl From<UnsupportedError> for Error {
    fn from(e: UnsupportedError) -> Self {
        Error::Unsupported(e)
    }
}

/// Defined here, beside the other kinds, so that the codec module needs nothing of this one.
impl crate::codec::DecodeError {
    /// The kind of this error: always [`ErrorKind::Codec`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn demo(e: rockq::DecodeError) {
    /// assert_eq!(e.kind(), rockq::ErrorKind::Codec);
    /// # }
    /// ```
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Codec
    }
}

impl From<crate::codec::DecodeError> for Error {
    fn from(e: crate::codec::DecodeError) -> Self {
        Error::Decode(e)
    }
}

/// The engine's refusals: shutdown, failed closed, unsupported.
impl From<Closed> for Error {
    fn from(c: Closed) -> Self {
        match c {
            Closed::Shutdown => Error::Shutdown,
            Closed::Failed(f) => Error::Failed(f.into()),
            Closed::Unsupported(u) => Error::Unsupported(u),
        }
    }
}

/// A keyspace key as an error shows it: quoted text if it is printable UTF-8, else hex.
fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.chars().any(char::is_control) => format!("{text:?}"),
        _ => {
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage error is found whether it is the error itself or the cause a failed-closed
    /// broker keeps, with its transient flag (a transparent variant hid it from the chain).
    #[test]
    fn the_storage_error_is_found_in_either_variant() {
        let e = Error::Storage(StorageError::unreachable("etcd: no leader"));
        assert!(e.storage_error().is_some_and(StorageError::is_transient));
        let e = Error::Failed(FailedError::from(StorageError::new("disk gone")));
        assert_eq!(e.storage_error().map(StorageError::message), Some("disk gone"));
        assert!(Error::Shutdown.storage_error().is_none());
    }
}
