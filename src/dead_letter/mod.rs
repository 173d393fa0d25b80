//! Dead-letter queues: listing, peeking and redriving (one letter on its own: `letter.rs`).
//!
//! A dead-letter queue is an ordinary queue (default name `<queue>.dlq`), so any group can
//! consume it. A dead letter is the original payload and headers plus `rockq-dlq-*` headers
//! recording where it came from and why. Redrive moves dead letters to a queue in atomic
//! batches and keeps a cursor (`redrive:<dlq>`) in the same batch, so an interrupted redrive
//! resumes where it stopped, without duplicates.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::engine::boundary::{
    self, QueueState, RawMessage, ReadOutcome, RedriveItem, Request, Shared, WorkRequest,
};
use crate::error::{Error, NameKind};
use crate::message::Message;
use crate::model::dlq;

mod letter;

/// One message in a dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its sequence in the dead-letter queue.
    pub dlq_seq: u64,
    /// The queue it came from (`None` if it was sent to the dead-letter queue directly).
    pub queue: Option<String>,
    /// Its sequence there.
    pub seq: Option<u64>,
    /// The group that gave up on it (work-queue, or ordered with `max_deliveries`).
    pub group: Option<String>,
    /// Attempts made (deliveries, for an ordered group).
    pub attempts: u32,
    /// Why it was dead-lettered (the last error, or the reason given).
    pub reason: String,
    /// When the producer first sent it.
    pub enqueued_at: SystemTime,
    /// When it was dead-lettered.
    pub dead_lettered_at: SystemTime,
    /// The original payload.
    pub payload: Bytes,
    /// The original headers (without the `rockq-dlq-*` ones).
    pub headers: Vec<(String, Bytes)>,
    /// The original ordering key ([`Message::key`](crate::Message::key)), kept by a redrive.
    pub key: Option<String>,
    /// The original priority ([`Message::priority`](crate::Message::priority)), kept by a
    /// redrive.
    pub priority: u8,
}

/// The JSON shape of a dead letter (see `json.rs`): the console's and the CLI's.
impl serde::Serialize for DeadLetter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use crate::json::{Blob, Headers, micros};
        use serde::ser::SerializeStruct;
        let mut d = s.serialize_struct("DeadLetter", 12)?;
        d.serialize_field("dlq_seq", &self.dlq_seq)?;
        d.serialize_field("queue", &self.queue)?;
        d.serialize_field("seq", &self.seq)?;
        d.serialize_field("group", &self.group)?;
        d.serialize_field("attempts", &self.attempts)?;
        d.serialize_field("reason", &self.reason)?;
        d.serialize_field("enqueued_at_micros", &micros(self.enqueued_at))?;
        d.serialize_field("dead_lettered_at_micros", &micros(self.dead_lettered_at))?;
        d.serialize_field("headers", &Headers(&self.headers))?;
        d.serialize_field("payload", &Blob(&self.payload))?;
        d.serialize_field("key", &self.key)?;
        d.serialize_field("priority", &self.priority)?;
        d.end()
    }
}

fn micros(m: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(m)
}

impl DeadLetter {
    pub(crate) fn from_raw(msg: RawMessage) -> Self {
        let mut d = DeadLetter {
            dlq_seq: msg.seq,
            queue: None,
            seq: None,
            group: None,
            attempts: 0,
            reason: String::new(),
            enqueued_at: micros(msg.enqueued_at_micros),
            dead_lettered_at: micros(msg.enqueued_at_micros),
            payload: msg.payload,
            headers: Vec::new(),
            key: msg.key,
            priority: msg.priority,
        };
        for (k, v) in msg.headers {
            let text = || String::from_utf8_lossy(&v).into_owned();
            match k.as_str() {
                dlq::QUEUE => d.queue = Some(text()),
                dlq::SEQ => d.seq = text().parse().ok(),
                dlq::GROUP => d.group = Some(text()),
                dlq::ATTEMPTS => d.attempts = text().parse().unwrap_or(0),
                dlq::REASON => d.reason = text(),
                dlq::ENQUEUED => d.enqueued_at = micros(text().parse().unwrap_or(0)),
                _ if k.starts_with(dlq::PREFIX) => {}
                _ => d.headers.push((k, v)),
            }
        }
        d
    }
}

/// How to redrive: where to, how many, how fast. Default: every dead letter back to its origin
/// queue, in batches of 256, unthrottled.
#[derive(Debug, Clone)]
pub struct Redrive {
    to: Option<String>,
    limit: Option<u64>,
    batch: usize,
    rate: Option<f64>,
}

impl Default for Redrive {
    fn default() -> Self {
        Redrive { to: None, limit: None, batch: 256, rate: None }
    }
}

impl Redrive {
    /// Every dead letter, back to its origin queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// let moved = dlq.redrive(rockq::Redrive::new()).await?; // all of them, back to their queues
    /// # Ok(()) }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Send them to this queue instead (created if missing).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// // Park them in a quarantine queue for manual inspection.
    /// dlq.redrive(rockq::Redrive::new().to("orders.quarantine")).await?;
    /// # Ok(()) }
    /// ```
    pub fn to(mut self, queue: impl Into<String>) -> Self {
        self.to = Some(queue.into());
        self
    }

    /// Move at most `n`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// // Try a few first, to see whether the fix works.
    /// let moved = dlq.redrive(rockq::Redrive::new().limit(10)).await?;
    /// assert!(moved <= 10);
    /// # Ok(()) }
    /// ```
    pub fn limit(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// Dead letters per atomic batch (at least 1). Default 256.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// dlq.redrive(rockq::Redrive::new().batch(32)).await?; // large messages: smaller batches
    /// # Ok(()) }
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// At most this many messages per second (on the broker's clock). Zero, negative, NaN and
    /// infinite rates mean unthrottled; a rate so small that the wait before a batch would
    /// exceed 100 years waits 100 years.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// // Don't flood the consumers that just recovered: 50 messages a second.
    /// dlq.redrive(rockq::Redrive::new().rate(50.0)).await?;
    /// # Ok(()) }
    /// ```
    pub fn rate(mut self, per_second: f64) -> Self {
        self.rate = (per_second.is_finite() && per_second > 0.0).then_some(per_second);
        self
    }
}

/// A dead-letter queue: list, peek and redrive. Get one with
/// [`Broker::dead_letters`](crate::Broker::dead_letters).
///
/// The dead letters "in" the queue are those after its redrive cursor; consuming the
/// dead-letter queue with a group is independent of redriving it.
#[derive(Clone)]
pub struct DeadLetters {
    shared: Arc<Shared>,
    queue: Arc<QueueState>,
}

impl std::fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetters").field("queue", &self.queue.name).finish()
    }
}

impl DeadLetters {
    pub(crate) fn new(shared: Arc<Shared>, queue: Arc<QueueState>) -> Self {
        DeadLetters { shared, queue }
    }

    /// The dead-letter queue's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// assert_eq!(dlq.name(), "orders.dlq");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.queue.name
    }

    async fn cursor(&self) -> Result<u64, Error> {
        let shared = self.shared.clone();
        let name = self.queue.name.clone();
        let c = self
            .shared
            .runtime
            .spawn_blocking(move || shared.read_cursor(&name))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??;
        Ok(c.unwrap_or(0)
            .max(self.queue.first_seq.load(std::sync::atomic::Ordering::Acquire).saturating_sub(1)))
    }

    /// Dead letters not yet redriven.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] if the cursor cannot be read, [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(dlq: rockq::DeadLetters) -> Result<(), rockq::Error> {
    /// let n = dlq.len().await?;
    /// if n > 0 {
    ///     eprintln!("{n} dead letters in {}", dlq.name());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn len(&self) -> Result<u64, Error> {
        let (cursor, marks) = self.cursor_and_marks().await?;
        let settled = marks.range(cursor + 1..).count() as u64;
        Ok(self.queue.last_seq().saturating_sub(cursor).saturating_sub(settled))
    }

    /// The cursor, and the letters above it settled on their own ([`delete`](Self::delete),
    /// [`redrive_one`](Self::redrive_one)).
    pub(crate) async fn cursor_and_marks(&self) -> Result<(u64, std::collections::BTreeSet<u64>), Error> {
        // Marks first: the cursor only grows, and a mark it swept meanwhile is below it. Read
        // the other way round, a mark swept between the reads would be missing above an old
        // cursor, and its letter listed again.
        let shared = self.shared.clone();
        let name = self.queue.name.clone();
        let marks = self
            .shared
            .runtime
            .spawn_blocking(move || shared.read_letter_marks(&name))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??;
        let cursor = self.cursor().await?;
        Ok((cursor, marks))
    }

    /// Whether every dead letter has been redriven.
    ///
    /// # Errors
    ///
    /// As for [`len`](DeadLetters::len).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(dlq: rockq::DeadLetters) -> Result<(), rockq::Error> {
    /// if !dlq.is_empty().await? {
    ///     dlq.redrive(rockq::Redrive::new()).await?;
    /// }
    /// assert!(dlq.is_empty().await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// Up to `limit` dead letters not yet redriven, oldest first. Reads only.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] or [`Error::Storage`] if one cannot be read, [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// for d in dlq.list(10).await? {
    ///     println!("{:?}#{:?} after {} attempts: {}", d.queue, d.seq, d.attempts, d.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let (cursor, marks) = self.cursor_and_marks().await?;
        // Letters settled on their own are skipped: read that many more.
        let skipped = marks.range(cursor + 1..).count();
        let raw = self.read(cursor + 1, limit.saturating_add(skipped)).await?;
        Ok(raw
            .into_iter()
            .filter(|m| !marks.contains(&m.seq))
            .take(limit)
            .map(DeadLetter::from_raw)
            .collect())
    }

    /// The oldest dead letter not yet redriven.
    ///
    /// # Errors
    ///
    /// As for [`list`](DeadLetters::list).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (on a blocking thread); dropping the future loses the result.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(dlq: rockq::DeadLetters) -> Result<(), rockq::Error> {
    /// if let Some(d) = dlq.peek().await? {
    ///     println!("oldest: {:?}#{:?}: {}", d.queue, d.seq, d.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self) -> Result<Option<DeadLetter>, Error> {
        Ok(self.list(1).await?.into_iter().next())
    }

    async fn read(&self, from: u64, limit: usize) -> Result<Vec<RawMessage>, Error> {
        let last = self.queue.last_seq();
        if limit == 0 || from > last {
            return Ok(Vec::new());
        }
        let to = last.min(from.saturating_add(limit as u64 - 1));
        let shared = self.shared.clone();
        let q = self.queue.clone();
        let out = self
            .shared
            .runtime
            .spawn_blocking(move || shared.read_range(&q, from, to, 16 << 20))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??;
        match out {
            ReadOutcome::Messages(m) => Ok(m),
            ReadOutcome::Closed => Err(Error::Shutdown),
        }
    }

    /// Moves dead letters to their origin queue (or [`Redrive::to`]) with new sequences, in
    /// atomic batches: each batch's messages and the advanced cursor are one write, so after a
    /// crash a new redrive continues after the last whole batch. Returns how many moved.
    ///
    /// # Errors
    ///
    /// [`Error::NoOrigin`] for a dead letter without an origin and no target,
    /// [`Error::RedriveConflict`] if another redrive of this queue runs concurrently,
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Storage`].
    /// Batches moved before an error stay moved.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe at batch granularity: a dropped future leaves whole batches moved and the
    /// cursor after the last of them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::Error> {
    /// let dlq = broker.dead_letters("orders.dlq").await?;
    /// let moved = dlq.redrive(rockq::Redrive::new().rate(100.0)).await?;
    /// println!("redrove {moved}");
    /// # Ok(()) }
    /// ```
    pub async fn redrive(&self, opts: Redrive) -> Result<u64, Error> {
        if let Some(t) = &opts.to {
            crate::name::validate(NameKind::Queue, t)?;
        }
        let clock = self.shared.clock().clone();
        let started = clock.now();
        let mut moved = 0u64;
        loop {
            if self.shared.is_closed() {
                return Err(Error::Shutdown);
            }
            let want = match opts.limit {
                Some(l) if moved >= l => break,
                Some(l) => (l - moved).min(opts.batch as u64) as usize,
                None => opts.batch,
            };
            let (cursor, marks) = self.cursor_and_marks().await?;
            let skipped = marks.range(cursor + 1..).count();
            let mut msgs = self.read(cursor + 1, want.saturating_add(skipped)).await?;
            // Letters settled on their own are passed over (the cursor moves past them).
            msgs.retain(|m| !marks.contains(&m.seq));
            msgs.truncate(want);
            let Some(last) = msgs.last().map(|m| m.seq) else {
                break;
            };
            if let Some(rate) = opts.rate {
                // Paced before each batch after the first, so the last batch does not wait.
                // A tiny rate (say 1e-300/s) makes this quotient overflow `Duration`: such a
                // pace is clamped to 100 years per batch rather than panicking.
                let pace =
                    Duration::try_from_secs_f64(moved as f64 / rate).unwrap_or(crate::clock::MAX_DELAY);
                let due =
                    started.checked_add(crate::clock::clamp_delay(pace)).unwrap_or_else(|| clock.after(pace));
                clock.sleep_until(due).await;
            }
            let now = clock.wall_micros();
            let mut items = Vec::with_capacity(msgs.len());
            for raw in msgs {
                items.push(redrive_item(DeadLetter::from_raw(raw), opts.to.as_deref(), now)?);
            }
            let (reply, rx) = oneshot::channel();
            let req = Request::Work(WorkRequest::Redrive {
                dlq: self.queue.clone(),
                expected: cursor,
                last,
                items,
                reply,
            });
            self.shared.tx.send(req).await.map_err(|_| Error::Shutdown)?;
            // What the writer moved (a letter settled on its own meanwhile is not).
            moved += rx.await.map_err(|_| Error::Shutdown)??.len() as u64;
            tracing::info!(dlq = %self.queue.name, moved, "rockq: redrive batch");
        }
        Ok(moved)
    }
}

/// A dead letter on its way back: to `to`, or its origin queue.
pub(crate) fn redrive_item(d: DeadLetter, to: Option<&str>, now_micros: u64) -> Result<RedriveItem, Error> {
    let target = match (to, &d.queue) {
        (Some(t), _) => t.to_owned(),
        (None, Some(q)) => q.clone(),
        (None, None) => return Err(Error::NoOrigin { seq: d.dlq_seq }),
    };
    crate::name::validate(NameKind::Queue, &target)?;
    // The ordering key goes back with it; the idempotency key does not (a redrive is
    // deliberate, and it would be a duplicate of the original within its window).
    let message = Message {
        payload: d.payload,
        headers: d.headers,
        key: d.key,
        priority: d.priority,
        ..Message::default()
    };
    boundary::validate(&message).map_err(|e| {
        Error::Failed(crate::error::FailedError::internal(format!(
            "cannot re-encode dead letter {}: {e:?}",
            d.dlq_seq
        )))
    })?;
    Ok(RedriveItem { dlq_seq: d.dlq_seq, target: Arc::from(target), message, enqueued_at_micros: now_micros })
}
