//! [`Broker::connect_etcd`]: the same broker over an etcd namespace that several processes
//! share (feature `etcd`; design and limits in `docs/DISTRIBUTED.md`).

use std::sync::Arc;
use std::time::Duration;

use super::Broker;
use crate::error::Error;
use crate::options::Options;

/// How a broker connects to etcd ([`Broker::connect_etcd`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let opts = rockq::EtcdOptions::new().request_timeout(Duration::from_secs(10));
/// assert_eq!(opts.get_request_timeout(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    options: Options,
    request_timeout: Duration,
    attempt_timeout: Duration,
    owner_ttl: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            options: Options::default(),
            request_timeout: Duration::from_secs(30),
            attempt_timeout: Duration::from_millis(500),
            owner_ttl: Duration::from_secs(10),
        }
    }
}

impl EtcdOptions {
    /// Defaults: the default [`Options`], 30 s per request, 500 ms per attempt on one member,
    /// 10 s ownership leases.
    ///
    /// # Examples
    ///
    /// ```
    /// let opts = rockq::EtcdOptions::new();
    /// assert_eq!(opts.get_owner_ttl(), std::time::Duration::from_secs(10));
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The broker options (clock, batching, channel capacity…). Their
    /// [`durability`](Options::durability) must stay [`Fsync`](crate::Durability::Fsync): every
    /// etcd write is a quorum write.
    ///
    /// # Examples
    ///
    /// ```
    /// let opts = rockq::EtcdOptions::new().options(rockq::Options::new().max_batch_messages(512));
    /// # let _ = opts;
    /// ```
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// How long one etcd request may take. A write whose outcome stays unknown for this long
    /// (no quorum) fails its sends with [`Error::Storage`](crate::Error::Storage); such
    /// a send may still have been stored.
    ///
    /// # Examples
    ///
    /// ```
    /// let opts = rockq::EtcdOptions::new().request_timeout(std::time::Duration::from_secs(5));
    /// # let _ = opts;
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The configured request timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::EtcdOptions::new().get_request_timeout(), std::time::Duration::from_secs(30));
    /// ```
    pub fn get_request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How long one member has to answer one attempt of a request before it is set aside and
    /// the request goes to another member (a paused or partitioned member must not hold up
    /// the cluster's quorum). When every member failed in a row, the deadline doubles, up to
    /// four times this (never beyond the [request timeout](Self::request_timeout)): a slow
    /// cluster is not a dead one. Too
    /// short and a busy member is set aside needlessly (its requests then go elsewhere: no
    /// harm but a hop); too long and a hung member stalls this process that long. The default,
    /// 500 ms, is far above a healthy cluster's round trip.
    ///
    /// # Examples
    ///
    /// ```
    /// let opts = rockq::EtcdOptions::new().attempt_timeout(std::time::Duration::from_millis(250));
    /// assert_eq!(opts.get_attempt_timeout(), std::time::Duration::from_millis(250));
    /// ```
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The configured attempt deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::EtcdOptions::new().get_attempt_timeout(), std::time::Duration::from_millis(500));
    /// ```
    pub fn get_attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The TTL of the etcd lease that holds an ordered group's one active subscriber (rounded
    /// up to whole seconds). A process that stops renewing it (crashed, paused, cut off) loses
    /// the group after this long, and another process may subscribe.
    ///
    /// # Examples
    ///
    /// ```
    /// let opts = rockq::EtcdOptions::new().owner_ttl(std::time::Duration::from_secs(3));
    /// # let _ = opts;
    /// ```
    pub fn owner_ttl(mut self, ttl: Duration) -> Self {
        self.owner_ttl = ttl;
        self
    }

    /// The configured ownership lease TTL.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::EtcdOptions::new().get_owner_ttl(), std::time::Duration::from_secs(10));
    /// ```
    pub fn get_owner_ttl(&self) -> Duration {
        self.owner_ttl
    }

    /// The engine's settings from these options.
    fn settings(&self, passive: bool) -> crate::engine::boundary::EtcdSettings {
        crate::engine::boundary::EtcdSettings {
            request_timeout: self.request_timeout,
            attempt_timeout: self.attempt_timeout.max(Duration::from_millis(1)),
            owner_ttl: self.owner_ttl,
            passive,
        }
    }
}

impl Broker {
    /// Connects to the etcd cluster at `endpoints` and opens namespace `namespace` on it (a
    /// queue-name-like string; created if missing, unless the options'
    /// [`create_if_missing`](Options::create_if_missing) is off). Several processes connecting to the same
    /// namespace share its queues and groups: producers anywhere append to one sequence per
    /// queue, and an ordered group has one active subscriber across all of them.
    ///
    /// The returned broker is the same [`Broker`]: queues, `send`/`send_batch`, ordered groups
    /// with `ack`/`nack`, `max_deliveries` and dead letters work as with [`Broker::open`]. What
    /// this engine does not carry out yet is refused with [`Error::Unsupported`](crate::Error::Unsupported)
    /// (see `docs/DISTRIBUTED.md`), never done differently.
    ///
    /// The engine's tasks run on the runtime that calls this: once that runtime is dropped,
    /// every call on this broker and its handles, from any runtime, fails with
    /// [`Error::Shutdown`](crate::Error::Shutdown) (embedded brokers write on a thread of their
    /// own and go on).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if no member answered within the request timeout (one member down
    /// of several is not an error: the others are asked), [`Error::NotRockq`] if the
    /// namespace holds another format, [`Error::NoDatabase`] for a namespace that does not
    /// exist when [`create_if_missing`](Options::create_if_missing) is off, [`Error::Unsupported`] for
    /// [`Durability::Buffered`](crate::Durability::Buffered), [`Error::InvalidOption`] for
    /// a bad namespace, no endpoint or a malformed endpoint URL, [`Error::NoRuntime`] outside
    /// a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is started until the last step. The namespace's format record may
    /// have been created.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rockq::Error> {
    /// let broker = rockq::Broker::connect_etcd(["http://127.0.0.1:2379"], "shop", rockq::EtcdOptions::new()).await?;
    /// broker.queue("orders").await?.send("hello").await?;
    /// broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_etcd(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        namespace: &str,
        options: EtcdOptions,
    ) -> Result<Broker, Error> {
        Self::connect_etcd_as(endpoints, namespace, options, false).await
    }

    /// [`connect_etcd`](Self::connect_etcd), or with `passive` an inspection's connection
    /// (`Inspector::connect_etcd`): the namespace must exist, and nothing fires or trims.
    pub(crate) async fn connect_etcd_as(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        namespace: &str,
        options: EtcdOptions,
        passive: bool,
    ) -> Result<Broker, Error> {
        let endpoints: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        let settings = options.settings(passive);
        let shared =
            crate::engine::boundary::connect_etcd(&endpoints, namespace, options.options, settings).await?;
        Ok(Broker { shared: Arc::clone(&shared) })
    }

    /// Makes the etcd namespace `namespace` from the export read from `input` (written by
    /// [`Broker::export`] on either engine), and reports what it read; then
    /// [`connect_etcd`](Broker::connect_etcd) to it. The way from one machine to several
    /// instances: export the embedded database, import it into etcd.
    ///
    /// The namespace must be empty. The import takes it with a mark first (connecting to it
    /// is refused until the import ends), checks every line as [`Broker::import`] does, and
    /// writes them in transactions of up to 127 puts; a last transaction writes the format
    /// record and removes the mark, so the namespace appears whole. An import that fails
    /// deletes what it wrote; one stopped by a crash leaves its mark, which the next import
    /// into the namespace clears. Queue ids are handed out anew; sequences, offsets, claims
    /// with their attempts, redrive cursors and idempotency keys (each under an etcd lease
    /// running out with its window; expired ones are left out) are kept.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the line for a bad or cut-short file, or if the namespace is
    /// not empty; [`Error::Unsupported`] naming what etcd does not hold yet — keyspaces and
    /// work-group limits — with nothing left in the namespace; [`Error::IncompatibleVersion`], [`Error::InvalidOption`] for a bad
    /// endpoint or namespace, [`Error::Io`], [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropped midway, the import leaves its mark and what it wrote (the
    /// namespace refuses connections until the next import into it clears them).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let file = std::fs::File::open("rockq.jsonl")?;
    /// rockq::Broker::import_etcd(file, ["http://10.0.0.1:2379"], "orders", rockq::EtcdOptions::new()).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "json")]
    pub async fn import_etcd(
        input: impl std::io::Read + Send + 'static,
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        namespace: &str,
        options: EtcdOptions,
    ) -> Result<crate::export::TransferReport, Error> {
        let endpoints: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        let settings = options.settings(false);
        crate::engine::boundary::import_etcd(Box::new(input), &endpoints, namespace, &settings, None).await
    }
}
