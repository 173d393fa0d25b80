//! [`Broker`]: the handle to an open database.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::engine::{Counters, Engine, Shared};
use crate::error::{NameKind, OpenError, QueueError, ShutdownError};
use crate::options::Options;
use crate::producer::Queue;
use crate::registry::{GroupState, QueueState, Registry};
use crate::store::{self, keys};
use crate::work::WorkGroupState;
use crate::writer::{self, Request};

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
            .field("path", &self.shared.engine.store.path)
            .field("closed", &self.shared.is_closed())
            .finish()
    }
}

/// Counters of the writer thread since open.
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

/// RocksDB's WAL counters (requires [`Options::statistics`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// WAL fsyncs performed.
    pub wal_syncs: u64,
    /// Bytes appended to the WAL.
    pub wal_bytes: u64,
    /// Write calls that went through the WAL.
    pub writes_with_wal: u64,
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
    /// [`OpenError::Locked`] if another process or broker has the database open,
    /// [`OpenError::NotRockq`] if the path is a file, a non-empty directory without a
    /// database, or a RocksDB database rockq did not create (it is left untouched),
    /// [`OpenError::IncompatibleVersion`], [`OpenError::Corrupt`] for an undecodable registry
    /// record, [`OpenError::Storage`] for other RocksDB errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the only wait is for RocksDB to open on a blocking thread. If the future is
    /// dropped meanwhile, that open still finishes (creating the database if it was missing)
    /// and the database is closed again at once, so an immediate retry may briefly get
    /// [`OpenError::Locked`]. No broker task is started.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::OpenError> {
    /// let broker = rockq::Broker::open("./data").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Broker, OpenError> {
        Options::default().open(path).await
    }

    /// Starts configuring a broker; same as [`Options::new`].
    pub fn options() -> Options {
        Options::new()
    }

    pub(crate) async fn open_with(path: &Path, options: Options) -> Result<Broker, OpenError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| OpenError::NoRuntime)?;
        let path = path.to_path_buf();
        let opts = options.clone();
        let (store, loaded) = runtime
            .spawn_blocking(move || store::open(&path, &opts))
            .await
            .map_err(|e| OpenError::InvalidOption(format!("open task failed: {e}")))??;
        let store::Loaded { queues, groups, claims, settings, deliveries } = loaded;

        let registry = Registry::default();
        for q in queues {
            let state =
                QueueState::new(q.record.id, &q.name, q.record.first_seq, q.last_seq, q.record.retention);
            registry.queues.insert(state.name.clone(), state);
        }
        for g in groups {
            // An offset for a queue that has no record cannot be produced by rockq.
            let Some(queue) = registry.queues.get(g.queue.as_str()).map(|q| q.clone()) else {
                return Err(crate::error::CorruptionError::new(
                    "offset",
                    &keys::offset_key(&g.group, &g.queue),
                    "names a queue that does not exist",
                )
                .into());
            };
            let key = keys::offset_key(&g.group, &g.queue);
            if g.shared {
                registry.work_groups.insert(key, WorkGroupState::new(&g.group, queue, g.committed));
            } else {
                registry.groups.insert(key.clone(), GroupState::new(&g.group, queue, key, g.committed));
            }
        }
        let mut by_group: std::collections::HashMap<Vec<u8>, Vec<_>> = std::collections::HashMap::new();
        for c in claims {
            let key = keys::offset_key(&c.group, &c.queue);
            if !registry.work_groups.contains_key(&key) {
                let ck = keys::claim_key(&keys::claim_prefix(&c.group, &c.queue), c.seq);
                return Err(crate::error::CorruptionError::new(
                    "claim",
                    &ck,
                    "names a group that does not exist",
                )
                .into());
            }
            by_group.entry(key).or_default().push((c.seq, c.record));
        }
        for g in registry.work_groups.iter() {
            g.restore(by_group.remove(&g.key).unwrap_or_default(), &options.clock);
        }
        // Ordered groups' delivery counts and dead letters above their offsets.
        let mut stale = Vec::new();
        for d in deliveries {
            let key = keys::offset_key(&d.group, &d.queue);
            let Some(g) = registry.groups.get(&key).map(|g| g.clone()) else {
                let k = keys::claim_key(&keys::ordered_prefix(&d.group, &d.queue), d.seq);
                return Err(crate::error::CorruptionError::new(
                    "delivery",
                    &k,
                    "names an ordered group that does not exist",
                )
                .into());
            };
            // At or below the offset, or of a trimmed message: moot, deleted by the writer's
            // next round (the group is marked dirty once, and handed to it below).
            let floor = g.records_moot_through(g.durable.load(Ordering::Relaxed));
            let mut rec = g.records();
            rec.stored.insert(d.seq);
            if d.seq <= floor {
                if g.mark() {
                    stale.push(g.clone());
                }
            } else {
                if d.record.dead_lettered {
                    rec.dead.insert(d.seq);
                } else {
                    rec.failed.insert(d.seq, (d.record.deliveries, d.record.not_before_micros));
                }
            }
        }
        // Settings of a group that no longer exists (a removed group) are ignored.
        for s in settings {
            let key = keys::offset_key(&s.group, &s.queue);
            if let Some(g) = registry.groups.get(&key) {
                g.paused.store(s.settings.paused, Ordering::Relaxed);
            }
            if let Some(g) = registry.work_groups.get(&key) {
                g.paused.store(s.settings.paused, Ordering::Relaxed);
                *g.recorded_dlq.lock().unwrap_or_else(|p| p.into_inner()) = s.settings.dead_letter_queue;
            }
        }

        let engine = Arc::new(Engine {
            store,
            inbox: crate::engine::Inbox::new(
                options.channel_capacity,
                options.max_batch_messages,
                options.max_batch_bytes,
            ),
            registry,
            options: options.clone(),
            dirty: Mutex::new(Vec::new()),
            dirty_work: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            counters: Counters::default(),
            events: tokio::sync::broadcast::channel(4096).0,
        });
        for g in stale {
            engine.mark_dirty(g);
        }
        tracing::info!(
            path = %engine.store.path.display(),
            queues = engine.registry.queues.len(),
            groups = engine.registry.groups.len(),
            durability = ?options.durability,
            "rockq: opened"
        );
        let (tx, rx) = mpsc::channel(options.channel_capacity);
        let handle = match writer::spawn(engine.clone(), rx, &runtime) {
            Ok(h) => h,
            Err(e) => {
                let path = engine.store.path.clone();
                let _ = engine.store.close();
                return Err(OpenError::Io { path, source: e });
            }
        };
        let broker = Broker {
            shared: Arc::new(Shared {
                engine,
                tx,
                closed: AtomicBool::new(false),
                runtime,
                writer: Mutex::new(Some(handle)),
                closing: tokio_util::sync::CancellationToken::new(),
                pools: tokio_util::task::TaskTracker::new(),
                shutdown: Mutex::new(None),
            }),
        };
        crate::retention::spawn_background(&broker.shared, options.retention_interval);
        crate::telemetry::spawn_gauges(&broker.shared, options.metrics_interval);
        Ok(broker)
    }

    /// Runs one retention pass now: trims every queue as far as its
    /// [`Retention`](crate::Retention) policy allows (one range tombstone per queue, the first
    /// sequence moved in the same write), then compacts the trimmed ranges so the space is
    /// returned. The background task does the same every
    /// [`retention_interval`](crate::Options::retention_interval), compacting after large trims.
    ///
    /// # Errors
    ///
    /// [`QueueError::Shutdown`], [`QueueError::Storage`], [`QueueError::Failed`].
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
    pub async fn trim(&self) -> Result<crate::TrimReport, QueueError> {
        crate::retention::pass(&self.shared, Some(true)).await
    }

    /// Returns a handle to the queue `name`, creating it (durably) if it does not exist.
    ///
    /// # Errors
    ///
    /// [`QueueError::InvalidName`] if `name` is empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) or has characters outside `[A-Za-z0-9._-]`;
    /// [`QueueError::Shutdown`] after shutdown; [`QueueError::Storage`] if the registry record
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
    pub async fn queue(&self, name: &str) -> Result<Queue, QueueError> {
        crate::name::validate(NameKind::Queue, name)?;
        if self.shared.is_closed() {
            return Err(QueueError::Shutdown);
        }
        if let Some(q) = self.shared.engine.registry.queues.get(name) {
            return Ok(Queue::new(self.shared.clone(), q.clone()));
        }
        let (reply, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Request::CreateQueue { name: name.to_owned(), reply })
            .await
            .map_err(|_| QueueError::Shutdown)?;
        let state = rx.await.map_err(|_| QueueError::Shutdown)??;
        Ok(Queue::new(self.shared.clone(), state))
    }

    /// Names of all queues, sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.shared.engine.registry.queues.iter().map(|q| q.name.to_string()).collect();
        names.sort();
        names
    }

    /// Counters of the writer thread (group commits, messages, offset commits).
    pub fn writer_stats(&self) -> WriterStats {
        self.shared.engine.counters.snapshot()
    }

    /// RocksDB WAL counters, if the broker was opened with [`Options::statistics`].
    pub fn storage_stats(&self) -> Option<StorageStats> {
        self.shared.engine.store.stats()
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
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<crate::Event> {
        self.shared.engine.events.subscribe()
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
    pub async fn dead_letters(&self, name: &str) -> Result<crate::DeadLetters, QueueError> {
        let q = self.queue(name).await?;
        Ok(crate::DeadLetters::new(self.shared.clone(), q.state().clone()))
    }

    /// Whether [`shutdown`](Broker::shutdown) has been called.
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
    /// [`AckError::Shutdown`](crate::AckError::Shutdown); those messages are redelivered
    /// after the next open.
    ///
    /// # Errors
    ///
    /// [`ShutdownError::Storage`] if the final commit or the WAL sync failed (the database is
    /// still closed); [`ShutdownError::WriterPanicked`] if the writer thread had panicked.
    ///
    /// [`ShutdownError::Internal`] if the shutdown task could not run to completion (the
    /// runtime was shutting down).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the shutdown runs as a task of its own once begun, so dropping this future
    /// does not interrupt it; calling `shutdown` again waits for that same shutdown.
    pub async fn shutdown(&self) -> Result<(), ShutdownError> {
        // Fault 7: a second concurrent call used to return `Ok` while the first was still
        // closing the database. Now every call awaits one shared task.
        let shutdown = {
            let mut slot = self.shared.shutdown.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| {
                use futures::FutureExt;
                let this = self.clone();
                let task = self.shared.runtime.spawn(async move { this.shutdown_once().await });
                async move {
                    task.await.unwrap_or_else(|e| Err(ShutdownError::Internal(format!("shutdown task: {e}"))))
                }
                .boxed()
                .shared()
            })
            .clone()
        };
        shutdown.await
    }

    /// The shutdown itself; run once, by the task [`shutdown`](Broker::shutdown) starts.
    async fn shutdown_once(&self) -> Result<(), ShutdownError> {
        if self.shared.is_closed() {
            return Ok(());
        }
        // Worker pools first: they stop claiming and drain (their acks still land).
        self.shared.closing.cancel();
        self.shared.pools.close();
        self.shared.pools.wait().await;
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        let flushed = match self.shared.tx.send(Request::Shutdown { reply }).await {
            Ok(()) => rx.await.unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        let handle = self.shared.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let engine = self.shared.engine.clone();
        let joined = self
            .shared
            .runtime
            .spawn_blocking(move || {
                let joined = handle.map(|h| h.join().is_ok()).unwrap_or(true);
                // Wake every subscriber so its stream observes the shutdown and ends.
                for q in engine.registry.queues.iter() {
                    q.last.send_modify(|_| {});
                }
                let closed = engine.store.close();
                (joined, closed)
            })
            .await;
        let (joined, closed) = joined.unwrap_or((false, Ok(())));
        flushed?;
        closed?;
        if !joined {
            return Err(ShutdownError::WriterPanicked);
        }
        tracing::info!(path = %self.shared.engine.store.path.display(), "rockq: shut down");
        Ok(())
    }
}
