//! [`Broker`]: the handle to an open database. `admin.rs` holds its admin methods (stats,
//! inspection, pause/resume, resets); `lifecycle.rs` looking queues up, deleting and purging
//! queues and groups; `backup.rs` backups and restores.

mod admin;
mod backup;
pub(crate) mod events;
#[cfg(feature = "json")]
mod export;
mod flows;
mod jobs;
mod kv;
mod lifecycle;
mod schedules;
#[cfg(test)]
mod tests;

crate::engine::boundary::cfg_etcd! {
    pub(crate) mod etcd;
}

use std::path::Path;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::dead_letter::DeadLetters;
use crate::engine::boundary::{self, QueueRequest, Request, Shared};
use crate::error::{Error, NameKind};
use crate::events::Event;
use crate::options::Options;
use crate::queue::Queue;
use crate::retention::TrimReport;
use crate::stats::{StorageStats, WriterStats};

/// An open rockq database: the entry point for queues and groups.
///
/// `Broker` is a cheap handle (`Clone` shares it). Call [`shutdown`](Broker::shutdown) before
/// exiting for a clean close; dropping every handle also stops the writer and closes RocksDB,
/// but without a way to report errors.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), rockq::Error> {
/// use futures::StreamExt;
///
/// let broker = rockq::Broker::open("./data").await?;
/// let orders = broker.queue("orders").await?;
/// orders.send("hello").await?;
///
/// let mut sub = orders.group("billing")?.subscribe().await?;
/// let delivery = sub.next().await.expect("stream ended")?;
/// assert_eq!(delivery.payload().as_ref(), b"hello");
/// delivery.ack()?;
/// broker.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Broker {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("path", &self.shared.path())
            .field("closed", &self.shared.is_closed())
            .finish()
    }
}

impl Options {
    /// Opens (or creates) the database at `path` with these options.
    ///
    /// # Errors
    ///
    /// See [`Broker::open`].
    ///
    /// # Cancel safety
    ///
    /// As for [`Broker::open`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let broker = rockq::Options::new()
    ///     .durability(rockq::Durability::Buffered)
    ///     .open("./data")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(self, path: impl AsRef<Path>) -> Result<Broker, Error> {
        Broker::open_with(path.as_ref(), self).await
    }
}

impl Broker {
    /// Opens the database at `path` with default [`Options`], creating it if missing.
    ///
    /// RocksDB is opened on a blocking thread; the registry of queues and groups and each
    /// queue's last sequence are loaded before this returns.
    ///
    /// The broker belongs to the Tokio runtime it is opened in: consumer reads run on that
    /// runtime's blocking pool, and a task on it completes the writer's group commits
    /// (resolving sends, waking subscribers). Keep that runtime running while the broker is in
    /// use; handles may be used from other runtimes' tasks too. If that runtime shuts down
    /// first, the writer completes its commits itself.
    ///
    /// # Errors
    ///
    /// [`Error::Locked`] if another process or broker has the database open,
    /// [`Error::NotRockq`] if the path is a file, a non-empty directory without a
    /// database, or a RocksDB database rockq did not create (it is left untouched),
    /// [`Error::IncompatibleVersion`], [`Error::Corrupt`] for an undecodable registry
    /// record, [`Error::Storage`] for other RocksDB errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the only wait is for RocksDB to open on a blocking thread. If the future is
    /// dropped meanwhile, that open still finishes (creating the database if it was missing)
    /// and the database is closed again at once, so an immediate retry may briefly get
    /// [`Error::Locked`]. No broker task is started.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let broker = rockq::Broker::open("./data").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Broker, Error> {
        Options::default().open(path).await
    }

    /// Starts configuring a broker; same as [`Options::new`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let broker = rockq::Broker::options().statistics(true).open("./data").await?;
    /// # Ok(()) }
    /// ```
    pub fn options() -> Options {
        Options::new()
    }

    pub(crate) async fn open_with(path: &Path, options: Options) -> Result<Broker, Error> {
        Ok(Broker { shared: boundary::open(path, options).await? })
    }

    /// Runs one retention pass now: trims every queue as far as its
    /// [`Retention`](crate::Retention) policy allows (one range tombstone per queue, the first
    /// sequence moved in the same write), then compacts the trimmed ranges so the space is
    /// returned. The background task does the same every
    /// [`retention_interval`](crate::Options::retention_interval), compacting after large trims.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::Storage`], [`Error::Failed`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: queues are trimmed one at a time, each in one atomic write. If
    /// the future is dropped, the trims already handed to the writer land (a compaction
    /// already started runs to its end), the other queues are left for the next pass; the
    /// report is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let report = broker.trim().await?;
    /// println!("deleted {}, {} → {} bytes", report.deleted, report.bytes_before, report.bytes_after);
    /// # Ok(()) }
    /// ```
    pub async fn trim(&self) -> Result<TrimReport, Error> {
        self.shared.trim(Some(true)).await
    }

    /// Returns a handle to the queue `name`, creating it (durably) if it does not exist.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if `name` is empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) or has characters outside `[A-Za-z0-9._-]`;
    /// [`Error::Shutdown`] after shutdown; [`Error::Storage`] if the registry record
    /// could not be written.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: if the future is dropped, the queue may or may not have been
    /// created; calling again returns the same queue either way.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let orders = broker.queue("orders").await?;
    /// assert_eq!(orders.name(), "orders");
    /// # Ok(()) }
    /// ```
    pub async fn queue(&self, name: &str) -> Result<Queue, Error> {
        crate::name::validate(NameKind::Queue, name)?;
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        if let Some(q) = self.shared.queue(name) {
            return Ok(Queue::new(self.shared.clone(), q));
        }
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Request::Queue(QueueRequest::Create { name: name.to_owned(), reply }))
            .await
            .map_err(|_| Error::Shutdown)?;
        let state = rx.await.map_err(|_| Error::Shutdown)??;
        Ok(Queue::new(self.shared.clone(), state))
    }

    /// Names of all queues, sorted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// broker.queue("orders").await?;
    /// assert!(broker.queue_names().contains(&"orders".to_string()));
    /// # Ok(()) }
    /// ```
    pub fn queue_names(&self) -> Vec<String> {
        self.shared.queue_names()
    }

    /// Counters of the writer thread (group commits, messages, offset commits).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(broker: rockq::Broker) {
    /// let w = broker.writer_stats();
    /// println!("{} messages in {} group commits", w.messages, w.rounds);
    /// # }
    /// ```
    pub fn writer_stats(&self) -> WriterStats {
        self.shared.writer_stats()
    }

    /// RocksDB WAL counters, if the broker was opened with [`Options::statistics`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let broker = rockq::Options::new().statistics(true).open("./data").await?;
    /// if let Some(s) = broker.storage_stats() {
    ///     println!("{} WAL syncs, {} WAL bytes", s.wal_syncs, s.wal_bytes);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn storage_stats(&self) -> Option<StorageStats> {
        self.shared.storage_stats()
    }

    /// Work-queue lifecycle events (delivered, acked, retried, lease expired, dead-lettered,
    /// redriven, saturated), and ordered groups' dead letters and skips. Each receiver sees the events sent after it subscribed; see
    /// [`Event`](crate::Event).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) {
    /// let mut events = broker.events();
    /// while let Ok(event) = events.recv().await {
    ///     if let rockq::Event::DeadLettered { queue, seq, reason, .. } = event {
    ///         eprintln!("{queue}#{seq} dead-lettered: {reason}");
    ///     }
    /// }
    /// # }
    /// ```
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.shared.events().subscribe()
    }

    /// Waits until everything queued so far is durable: acks and other outcomes
    /// ([`Job::ack`](crate::Job::ack), [`Delivery::ack`](crate::Delivery::ack), …), offset
    /// commits and dead letters. The `_durable` methods wait for one outcome; this waits for
    /// all of them, e.g. before reporting a batch as done.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`](crate::Error::Shutdown) after shutdown;
    /// [`Error::Storage`](crate::Error::Storage) if the write failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future does not undo or delay anything.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker, jobs: Vec<rockq::Job>) -> Result<(), rockq::Error> {
    /// for job in jobs {
    ///     job.ack()?;
    /// }
    /// broker.flush().await?; // every ack above is durable now
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self) -> Result<(), crate::error::Error> {
        use crate::error::Error;
        if self.shared.is_closed() {
            return Err(Error::Shutdown);
        }
        let (reply, rx) = oneshot::channel();
        self.shared.tx.send(Request::Flush { reply }).await.map_err(|_| Error::Shutdown)?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// The dead-letter queue `name` (e.g. `"orders.dlq"`), created if missing: list, peek and
    /// redrive its messages.
    ///
    /// # Errors
    ///
    /// As for [`queue`](Broker::queue).
    ///
    /// # Cancel safety
    ///
    /// As for [`queue`](Broker::queue): the queue may or may not have been created.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// println!("{} dead letters", dlq.len().await?);
    /// # Ok(()) }
    /// ```
    pub async fn dead_letters(&self, name: &str) -> Result<DeadLetters, Error> {
        let q = self.queue(name).await?;
        Ok(DeadLetters::new(self.shared.clone(), q.state().clone()))
    }

    /// Whether [`shutdown`](Broker::shutdown) has been called — or, on the etcd engine, the
    /// runtime that connected the broker was dropped: either way every call is refused with
    /// [`Error::Shutdown`](crate::Error::Shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// assert!(!broker.is_shut_down());
    /// broker.shutdown().await?;
    /// assert!(broker.is_shut_down());
    /// # Ok(()) }
    /// ```
    pub fn is_shut_down(&self) -> bool {
        self.shared.is_closed()
    }

    /// Stops the broker. First, work-queue subscriptions stop claiming and running
    /// [worker pools](crate::Workers) drain (each up to its drain timeout; their outcomes still
    /// land). Then it refuses new sends and subscriptions, lets the writer finish every
    /// request queued before this call and commit every acknowledgement recorded so far, syncs
    /// the WAL (in both durability modes), joins the writer thread, ends all subscription
    /// streams and closes RocksDB on a blocking thread. Every call — concurrent or later —
    /// returns only once the database is closed, with the same result.
    ///
    /// Acknowledgements made after this returns fail with
    /// [`Error::Shutdown`](crate::Error::Shutdown); those messages are redelivered
    /// after the next open.
    ///
    /// Call it before the process exits. A broker whose last handle is dropped without it
    /// closes in the background: its writer thread commits what was queued and closes RocksDB.
    /// A process that exits meanwhile (returning from `main` right after the drop) ends as a
    /// crash would for what was not committed, and RocksDB may abort in its teardown.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if the final commit or the WAL sync failed (the database is
    /// still closed); [`Error::WriterPanicked`] if the writer thread had panicked.
    ///
    /// [`Error::Internal`] if the shutdown task could not run to completion (the
    /// runtime was shutting down).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the shutdown runs as a task of its own once begun, so dropping this future
    /// does not interrupt it; calling `shutdown` again waits for that same shutdown.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let orders = broker.queue("orders").await?;
    /// orders.send("last order").await?;
    /// broker.shutdown().await?; // everything above is durable and the database is closed
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) -> Result<(), Error> {
        if self.shared.tasks_gone() {
            // The etcd engine's runtime is gone: there is none to run a task on, and nothing
            // left to stop but this broker's waiters (at once).
            return self.shared.close().await;
        }
        // Issue 13 (one shutdown for every caller): a second concurrent call used to return `Ok` while the first was still
        // closing the database. Now every call awaits one shared task.
        let shutdown = {
            let mut slot = self.shared.shutdown.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| {
                use futures::FutureExt;
                let this = self.clone();
                let task = self.shared.runtime.spawn(async move { this.shared.close().await });
                async move {
                    task.await.unwrap_or_else(|e| Err(Error::Internal(format!("shutdown task: {e}"))))
                }
                .boxed()
                .shared()
            })
            .clone()
        };
        shutdown.await
    }
}
