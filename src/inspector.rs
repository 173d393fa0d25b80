//! [`Inspector`]: read-only access for tools, alongside a running service.

use std::path::Path;
use std::sync::Arc;

use crate::clock::Clock;
use crate::dead_letter::DeadLetter;
use crate::engine::boundary::ReadOnly;
use crate::error::Error;
use crate::flow_state::FlowStatus;
use crate::stats::{JobStatus, PendingClaim, Stats, StoredMessage};

/// A read-only view of a rockq database, for inspection tools such as `rockq stats`.
///
/// It opens RocksDB read-only, which takes no lock: it works while another process (the
/// service) has the database open, and it never writes. It sees the database as it was when
/// opened (SST files and the WAL at that moment); open a new one to see later writes.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), rockq::Error> {
/// let inspector = rockq::Inspector::open("./data").await?;
/// for g in inspector.stats().await?.groups {
///     println!("{}/{}: lag {} ({:?})", g.queue, g.group, g.lag, g.oldest_unacked_age);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Inspector {
    source: Source,
}

/// What an inspector reads: a RocksDB database opened read-only, or an etcd namespace through
/// a passive connection (one that fires and trims nothing; `Broker::connect_etcd_as`).
#[derive(Clone)]
enum Source {
    File(Arc<ReadOnly>),
    #[cfg(feature = "etcd")]
    Etcd(crate::broker::Broker),
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::File(db) => f.debug_struct("Inspector").field("path", &db.path()).finish(),
            #[cfg(feature = "etcd")]
            Source::Etcd(b) => f.debug_struct("Inspector").field("etcd", b).finish(),
        }
    }
}

impl Inspector {
    /// Opens the database at `path` read-only.
    ///
    /// # Errors
    ///
    /// [`Error::NoDatabase`] if there is no database, [`Error::NotRockq`] for a path
    /// rockq did not create, [`Error::IncompatibleVersion`], [`Error::Corrupt`],
    /// [`Error::Storage`]. Never [`Error::Locked`]: no lock is taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the read-only open finishes on a blocking
    /// thread and is closed again; nothing is written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// // Works while a broker in another process has the database open.
    /// let inspector = rockq::Inspector::open("./data").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Inspector, Error> {
        let path = path.as_ref().to_path_buf();
        let db = tokio::task::spawn_blocking(move || ReadOnly::open(&path))
            .await
            .map_err(|e| Error::InvalidOption(format!("open task failed: {e}")))??;
        Ok(Inspector { source: Source::File(Arc::new(db)) })
    }

    /// Connects to the etcd namespace `namespace` at `endpoints` for inspection (feature
    /// `etcd`): the same reads as over a database, of the namespace several processes share.
    ///
    /// Unlike a database opened read-only, the view is live: every call reads the namespace
    /// as it is then (the connection learns other processes' writes through its watch). The
    /// connection writes nothing: the namespace is not created if missing, no queue or group
    /// it is asked about is made, and it neither fires delayed messages or schedules, nor
    /// trims, nor moves a work group's offset over what it sees finished — the brokers do. The options' broker
    /// [`Options`](crate::Options) apply as for [`Broker::connect_etcd`](crate::Broker::connect_etcd) (the
    /// clock, say); drop the inspector to disconnect.
    ///
    /// # Errors
    ///
    /// [`Error::NoDatabase`] if the namespace does not exist, [`Error::NotRockq`] if it holds
    /// another format, [`Error::InvalidOption`] for a bad namespace, no endpoint or a
    /// malformed endpoint URL, [`Error::Storage`] if no member answered within the request
    /// timeout, [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is written, and nothing is started until the last step.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let inspector =
    ///     rockq::Inspector::connect_etcd(["http://127.0.0.1:2379"], "shop", rockq::EtcdOptions::new()).await?;
    /// for q in inspector.stats().await?.queues {
    ///     println!("{}: {} messages", q.name, q.len);
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub async fn connect_etcd(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        namespace: &str,
        options: crate::broker::etcd::EtcdOptions,
    ) -> Result<Inspector, Error> {
        let broker = crate::broker::Broker::connect_etcd_as(endpoints, namespace, options, true).await?;
        Ok(Inspector { source: Source::Etcd(broker) })
    }

    /// The broker of an etcd inspection (`None`: a database read-only).
    fn broker(&self) -> Option<&crate::broker::Broker> {
        match &self.source {
            Source::File(_) => None,
            #[cfg(feature = "etcd")]
            Source::Etcd(b) => Some(b),
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ReadOnly) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let db = match &self.source {
            Source::File(db) => db.clone(),
            #[cfg(feature = "etcd")]
            Source::Etcd(_) => return Err(Error::Internal("an etcd inspection has no database file".into())),
        };
        tokio::task::spawn_blocking(move || f(&db)).await.map_err(|_| Error::Shutdown)?
    }

    /// Every queue and group; see [`Broker::stats`](crate::Broker::stats).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// let stats = inspector.stats().await?;
    /// for q in &stats.queues {
    ///     println!("{}: {} messages", q.name, q.len);
    /// }
    /// for g in &stats.groups {
    ///     println!("{}/{}: lag {}", g.queue, g.group, g.lag);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stats(&self) -> Result<Stats, Error> {
        if let Some(b) = self.broker() {
            return b.stats().await;
        }
        let now = Clock::tokio().wall_micros();
        self.run(move |s| s.stats(now)).await
    }

    /// Claimed, unfinished messages of a work-queue group; see
    /// [`Broker::pending`](crate::Broker::pending).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchGroup`], [`Error::InvalidName`], [`Error::Corrupt`],
    /// [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for claim in inspector.pending("thumbnails", "resizer").await? {
    ///     println!("#{} {} (attempt {})", claim.seq, claim.state.as_str(), claim.attempt);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pending(&self, queue: &str, group: &str) -> Result<Vec<PendingClaim>, Error> {
        if let Some(b) = self.broker() {
            return b.pending(queue, group).await;
        }
        let (g, q) = (group.to_owned(), queue.to_owned());
        let now = Clock::tokio().wall_micros();
        self.run(move |s| s.pending(&g, &q, now)).await
    }

    /// Where job `seq` of work group `group` on `queue` stands, as the database's records say;
    /// see [`Broker::job`](crate::Broker::job). Read from the records alone, not from the
    /// running service's memory: a lease shows the deadline its claim record was written with
    /// (an extension since is not seen), a job never claimed shows as
    /// [`Queued`](crate::JobState::Queued) even when it waits behind its key, and what the
    /// service decided but its writer has not written yet shows at its next round. The last
    /// error is known only while a job waits for its retry.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`] if `seq` was never sent; [`Error::NoSuchGroup`] (also for an
    /// ordered group), [`Error::InvalidName`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// let job = inspector.job("thumbnails", "resizer", 42).await?;
    /// println!("#42 {} (attempt {})", job.state.as_str(), job.attempt);
    /// # Ok(()) }
    /// ```
    pub async fn job(&self, queue: &str, group: &str, seq: u64) -> Result<JobStatus, Error> {
        if let Some(b) = self.broker() {
            return b.job(queue, group, seq).await;
        }
        let (g, q) = (group.to_owned(), queue.to_owned());
        let now = Clock::tokio().wall_micros();
        self.run(move |s| s.job(&g, &q, seq, now)).await
    }

    /// Flow `id` with every step, as stored; see [`Broker::flow_status`](crate::Broker::flow_status).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchFlow`], [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// let flow = inspector.flow(1).await?;
    /// println!("flow 1 {}: {} steps", flow.state.as_str(), flow.steps.len());
    /// # Ok(()) }
    /// ```
    pub async fn flow(&self, id: u64) -> Result<FlowStatus, Error> {
        if let Some(b) = self.broker() {
            return b.flow_status(id).await;
        }
        self.run(move |s| s.flow(id)).await?.ok_or(Error::NoSuchFlow { flow: id })
    }

    /// Up to `limit` flow ids from `from` (inclusive), in id order; see
    /// [`Broker::flows`](crate::Broker::flows).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for id in inspector.flows(0, 20).await? {
    ///     println!("flow {id}: {}", inspector.flow(id).await?.state.as_str());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn flows(&self, from: u64, limit: usize) -> Result<Vec<u64>, Error> {
        if let Some(b) = self.broker() {
            return b.flows(from, limit).await;
        }
        self.run(move |s| s.flow_ids(from, limit)).await
    }

    /// Up to `limit` messages of `queue` from `from`; see [`Broker::peek`](crate::Broker::peek).
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchQueue`], [`Error::InvalidName`], [`Error::Corrupt`],
    /// [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for m in inspector.peek("orders", None, 10).await? {
    ///     println!("#{}: {:?}", m.seq, m.payload);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(
        &self,
        queue: &str,
        from: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, Error> {
        if let Some(b) = self.broker() {
            return b.peek(queue, from, limit).await;
        }
        let q = queue.to_owned();
        self.run(move |s| s.peek(&q, from, limit)).await
    }

    /// Up to `limit` dead letters of the queue `dlq` that were not redriven yet.
    ///
    /// # Errors
    ///
    /// As for [`peek`](Inspector::peek).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for d in inspector.dead_letters("orders.dlq", 20).await? {
    ///     println!("#{}: {} after {} attempts", d.dlq_seq, d.reason, d.attempts);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn dead_letters(&self, dlq: &str, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        if let Some(b) = self.broker() {
            // `Broker::dead_letters` creates the queue: an inspection must not.
            crate::name::validate(crate::error::NameKind::Queue, dlq)?;
            if !b.queue_names().iter().any(|q| q == dlq) {
                return Err(Error::NoSuchQueue { queue: dlq.to_owned() });
            }
            return b.dead_letters(dlq).await?.list(limit).await;
        }
        let q = dlq.to_owned();
        let raw = self.run(move |s| s.dead_letters(&q, limit)).await?;
        Ok(raw.into_iter().map(DeadLetter::from_raw).collect())
    }

    /// Delayed messages waiting to fall due; see [`Broker::scheduled`](crate::Broker::scheduled).
    ///
    /// # Errors
    ///
    /// As for [`peek`](Inspector::peek).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for m in inspector.delayed(None, 100).await? {
    ///     println!("{} #{} due at {:?}", m.queue, m.id, m.due);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delayed(
        &self,
        queue: Option<&str>,
        limit: usize,
    ) -> Result<Vec<crate::schedule::DelayedInfo>, Error> {
        if let Some(b) = self.broker() {
            return b.delayed(queue, limit).await;
        }
        let q = queue.map(str::to_owned);
        self.run(move |s| s.scheduled(q.as_deref(), limit)).await
    }

    /// The old name of [`delayed`](Inspector::delayed).
    ///
    /// # Errors
    ///
    /// As [`delayed`](Inspector::delayed).
    ///
    /// # Cancel safety
    ///
    /// As [`delayed`](Inspector::delayed).
    #[deprecated(since = "0.2.0", note = "renamed `delayed` (recurring schedules are `schedules`)")]
    pub async fn scheduled(
        &self,
        queue: Option<&str>,
        limit: usize,
    ) -> Result<Vec<crate::schedule::DelayedInfo>, Error> {
        self.delayed(queue, limit).await
    }

    /// Every recurring schedule; see [`Broker::schedules`](crate::Broker::schedules).
    ///
    /// # Errors
    ///
    /// As for [`peek`](Inspector::peek).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(inspector: rockq::Inspector) -> Result<(), rockq::Error> {
    /// for s in inspector.schedules().await? {
    ///     println!("{}: {} (paused: {})", s.name, s.recurrence, s.paused);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn schedules(&self) -> Result<Vec<crate::schedule::ScheduleInfo>, Error> {
        if let Some(b) = self.broker() {
            return b.schedules().await;
        }
        self.run(|s| s.schedules()).await
    }
}
