//! Broker configuration: [`Options`] and [`Durability`].

use crate::error::Error;

/// When a send is acknowledged relative to the disk.
///
/// Both modes write every message to RocksDB's write-ahead log (WAL) before the send resolves;
/// they differ in whether the WAL is fsynced first. A clean [`Broker::shutdown`](crate::Broker::shutdown) syncs the WAL in
/// both modes.
///
/// | mode | process crash (kill -9, panic, OOM) | power loss / kernel panic |
/// | --- | --- | --- |
/// | [`Fsync`](Durability::Fsync) | every resolved send survives | every resolved send survives |
/// | [`Buffered`](Durability::Buffered) | every resolved send survives | resolved sends since the last sync may be lost |
///
/// In both modes a send that returned an error, or whose future was dropped before resolving,
/// may or may not be present after a crash; it is never partially present (a `send_batch` is
/// one atomic WriteBatch). Sequences are never reused: a message that was lost in a power
/// failure under `Buffered` leaves no hole, because everything written after it was lost too
/// (the WAL is a prefix).
///
/// Offset commits (acks) follow the same mode: under `Buffered`, acknowledged progress since the
/// last sync may be lost in a power failure, which causes redelivery, never loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// A send resolves only after the WAL holding it has been fsynced. Group commit shares one
    /// fsync among every send that arrived while the previous one was in progress.
    #[default]
    Fsync,
    /// A send resolves after the WAL holding it has been written to the operating system, not
    /// fsynced. Survives a crash of the process, not of the machine.
    Buffered,
}

/// Options for opening a [`Broker`](crate::Broker).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), rockq::Error> {
/// use rockq::{Durability, Options};
///
/// let broker = Options::new()
///     .durability(Durability::Buffered)
///     .max_message_bytes(64 * 1024)
///     .open("/var/lib/myapp/queues")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) durability: Durability,
    pub(crate) create_if_missing: bool,
    pub(crate) max_message_bytes: usize,
    pub(crate) max_batch_messages: usize,
    pub(crate) max_batch_bytes: usize,
    pub(crate) channel_capacity: usize,
    pub(crate) writer_spin: std::time::Duration,
    pub(crate) statistics: bool,
    pub(crate) clock: crate::clock::Clock,
    pub(crate) retention_interval: std::time::Duration,
    pub(crate) metrics_interval: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Fsync,
            create_if_missing: true,
            max_message_bytes: 1 << 20,
            max_batch_messages: 4096,
            max_batch_bytes: 16 << 20,
            channel_capacity: 4096,
            writer_spin: std::time::Duration::from_micros(25),
            statistics: false,
            clock: crate::clock::Clock::default(),
            retention_interval: std::time::Duration::from_secs(10),
            metrics_interval: std::time::Duration::from_secs(10),
        }
    }
}

impl Options {
    /// The defaults: [`Durability::Fsync`], create if missing, 1 MiB messages.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new();
    /// # drop(options);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Durability of sends and offset commits. Default [`Durability::Fsync`].
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Durability, Options};
    /// // Survive a process crash, not a power loss; no fsync per group commit.
    /// let options = Options::new().durability(Durability::Buffered);
    /// # drop(options);
    /// ```
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Create the database if the path does not exist or is an empty directory. Default `true`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let refused = rockq::Options::new().create_if_missing(false).open(dir.path()).await;
    /// assert!(refused.is_err()); // nothing there yet
    /// # Ok(()) }
    /// ```
    pub fn create_if_missing(mut self, yes: bool) -> Self {
        self.create_if_missing = yes;
        self
    }

    /// Largest accepted message (payload plus headers), in bytes. Default 1 MiB; at most 64 MiB.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new().max_message_bytes(8 * 1024 * 1024);
    /// # drop(options);
    /// ```
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Most messages the writer puts in one WriteBatch (one group commit), and so the most one
    /// `send_batch` call may carry. Default 4096.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new().max_batch_messages(1024);
    /// # drop(options);
    /// ```
    pub fn max_batch_messages(mut self, n: usize) -> Self {
        self.max_batch_messages = n;
        self
    }

    /// Byte budget of one WriteBatch; the writer starts a new round once it is reached (a single
    /// larger request still goes through alone). Default 16 MiB.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new().max_batch_bytes(4 * 1024 * 1024);
    /// # drop(options);
    /// ```
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// Messages that may be staged for the writer before `send` and `enqueue` apply
    /// backpressure (they wait until the writer takes the staged messages into a group
    /// commit); it also bounds the writer's queue of other requests (claims, commits, group
    /// changes). Default 4096.
    ///
    /// Checked at open: 0, or more than Tokio's semaphore limit (`usize::MAX >> 3`), makes
    /// [`Broker::open`](crate::Broker::open) return [`Error::InvalidOption`].
    ///
    /// # Examples
    ///
    /// ```
    /// let options = rockq::Options::new().channel_capacity(16_384);
    /// # drop(options);
    /// ```
    pub fn channel_capacity(mut self, n: usize) -> Self {
        self.channel_capacity = n;
        self
    }

    /// How long the writer thread keeps looking for new sends, yielding its core between looks,
    /// before it sleeps — only right after a busy round (8 messages or more). Default 25 µs;
    /// `Duration::ZERO` makes it sleep at once; a spin over 100 years is clamped to 100 years.
    ///
    /// Why: producers that each await their send come back in waves, a few microseconds after
    /// their round completes. A writer that sleeps must then be woken by a system call and
    /// rescheduled, and by then the whole wave is waiting, so rounds alternate with idle time
    /// instead of overlapping; catching the wave early keeps both sides busy (measured on two
    /// cores: 64 producers awaiting each send, +40–60 % throughput). Quiet traffic — rounds of a
    /// few messages — never spins. RocksDB's own write thread does the same
    /// (`write_thread_max_yield_usec`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// // A mostly idle service: never spin, leave the core to others.
    /// let options = rockq::Options::new().writer_spin(Duration::ZERO);
    /// # drop(options);
    /// ```
    pub fn writer_spin(mut self, spin: std::time::Duration) -> Self {
        self.writer_spin = crate::clock::clamp_delay(spin);
        self
    }

    /// Collect RocksDB statistics, readable through [`Broker::storage_stats`](crate::Broker::storage_stats). Costs a few
    /// percent of write throughput. Default off.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let broker = rockq::Options::new().statistics(true).open(dir.path()).await?;
    /// assert!(broker.storage_stats().is_some());
    /// broker.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn statistics(mut self, yes: bool) -> Self {
        self.statistics = yes;
        self
    }

    /// The time source for everything rockq times: leases and heartbeats, retry backoff and
    /// nack delays, delayed messages (`deliver_at`, `deliver_after`, `reschedule`), recurring
    /// schedules (firings and their grace), idempotency-key dedup windows, retention by age,
    /// redrive pacing, and the pause before an ordered delivery whose transaction conflicted
    /// comes back. Default: Tokio's clock for durations and the system clock for wall times.
    /// Pass a [`ManualClock`](crate::ManualClock) in tests to move time explicitly.
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = rockq::ManualClock::new();
    /// let options = rockq::Options::new().clock(clock.clone());
    /// # drop(options);
    /// ```
    pub fn clock(mut self, clock: impl Into<crate::clock::Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// How often the background retention task trims queues by their
    /// [`Retention`](crate::Retention) policy (on the broker's clock). Default 10 s;
    /// `Duration::ZERO` turns it off ([`Broker::trim`](crate::Broker::trim) still works); an interval over 100 years
    /// is clamped to 100 years (effectively off).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = rockq::Options::new().retention_interval(Duration::from_secs(60));
    /// # drop(options);
    /// ```
    pub fn retention_interval(mut self, every: std::time::Duration) -> Self {
        self.retention_interval = crate::clock::clamp_delay(every);
        self
    }

    /// How often the gauges of the `metrics` facade (lag, oldest un-acked age, in flight,
    /// dead-letter depth, queue length and bytes) are refreshed, on the broker's clock.
    /// Default 10 s; `Duration::ZERO` turns the refresh off (each
    /// [`Broker::stats`](crate::Broker::stats) call still refreshes them). Counters and
    /// histograms are always recorded as things happen. An interval over 100 years is clamped
    /// to 100 years (effectively off). While no `metrics` recorder is installed (the facade's
    /// zero-sized no-op recorder is in place) the periodic refresh skips its work.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = rockq::Options::new().metrics_interval(Duration::from_secs(5));
    /// # drop(options);
    /// ```
    pub fn metrics_interval(mut self, every: std::time::Duration) -> Self {
        self.metrics_interval = crate::clock::clamp_delay(every);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::InvalidOption(m.to_string()));
        if self.max_message_bytes == 0 || self.max_message_bytes > 64 << 20 {
            return bad("max_message_bytes must be in 1..=64 MiB");
        }
        if self.max_batch_messages == 0 {
            return bad("max_batch_messages must be at least 1");
        }
        if self.max_batch_bytes == 0 {
            return bad("max_batch_bytes must be at least 1");
        }
        if self.channel_capacity == 0 {
            return bad("channel_capacity must be at least 1");
        }
        // The inbox's backpressure is a Tokio semaphore, which panics above this many permits.
        if self.channel_capacity > tokio::sync::Semaphore::MAX_PERMITS {
            return bad("channel_capacity must be at most usize::MAX >> 3");
        }
        Ok(())
    }
}
