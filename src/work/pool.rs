//! Worker pools: `group.workers(n).run(handler)`.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::group::WorkGroup;
use super::job::{Job, Task};
use crate::Error;

/// What a handler wants done with a failed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Retry,
    RetryAfter(Duration),
    DeadLetter,
}

/// A handler's failure, and what to do about it: retry with the group's backoff (the default,
/// and what `?` on any `std::error::Error` gives), retry after a given delay, or dead-letter
/// now.
///
/// Like `anyhow::Error`, this type does not implement `std::error::Error`, so that every error
/// type converts into it with `?`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rockq::{HandlerError, Task};
///
/// async fn handle(task: Task) -> Result<(), HandlerError> {
///     let text = std::str::from_utf8(task.payload())
///         .map_err(|e| HandlerError::dead_letter(format!("not UTF-8: {e}")))?;
///     if text == "later" {
///         return Err(HandlerError::retry_after("upstream busy", Duration::from_secs(5)));
///     }
///     let _n: u32 = text.parse()?; // a parse error retries with backoff
///     Ok(())
/// }
/// ```
pub struct HandlerError {
    action: Action,
    message: String,
}

impl HandlerError {
    /// Retry with the group's backoff (dead-letter once attempts are used up).
    pub fn retry(message: impl std::fmt::Display) -> Self {
        HandlerError { action: Action::Retry, message: message.to_string() }
    }

    /// Retry after exactly `delay` (dead-letter once attempts are used up).
    pub fn retry_after(message: impl std::fmt::Display, delay: Duration) -> Self {
        HandlerError { action: Action::RetryAfter(delay), message: message.to_string() }
    }

    /// Do not retry: dead-letter now.
    pub fn dead_letter(message: impl std::fmt::Display) -> Self {
        HandlerError { action: Action::DeadLetter, message: message.to_string() }
    }

    /// The error text.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandlerError({:?}, {:?})", self.action, self.message)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry(e)
    }
}

/// A job handler for a worker pool: an `async fn(Task) -> Result<(), HandlerError>` closure
/// or a type implementing this trait. `Ok` acks the job; `Err` decides between retry and
/// dead-letter (see [`HandlerError`]); a panic counts as a failed attempt.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one job.
    async fn handle(&self, task: Task) -> Result<(), HandlerError>;
}

#[async_trait::async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, task: Task) -> Result<(), HandlerError> {
        (self)(task).await
    }
}

/// What a worker pool did, returned when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolReport {
    /// Jobs whose handler returned `Ok` and whose ack was recorded.
    pub acked: u64,
    /// Jobs whose handler returned `Err` (retried or dead-lettered as the error said).
    pub failed: u64,
    /// Jobs whose handler panicked (counted as failed attempts).
    pub panicked: u64,
    /// Jobs still running at the drain deadline: stopped and released without counting.
    pub released: u64,
    /// Outcomes that could not be recorded (the lease was lost, or the broker shut down).
    pub unsettled: u64,
}

/// A pool of concurrent handlers on one [`WorkGroup`]; see [`WorkGroup::workers`].
///
/// At most `concurrency` handlers run at once (the pool's subscription holds at most that many
/// jobs). Stopping — the [`shutdown_on`](Workers::shutdown_on) token, or
/// [`Broker::shutdown`](crate::Broker::shutdown), which waits for running pools — stops
/// claiming, lets running handlers finish until the [drain timeout](Workers::drain_timeout),
/// then stops the rest and releases their jobs **without** counting the attempt.
#[derive(Debug)]
pub struct Workers {
    group: WorkGroup,
    concurrency: usize,
    heartbeat: bool,
    token: CancellationToken,
    drain_timeout: Duration,
}

enum Done {
    Acked,
    Failed,
    Panicked,
    Unsettled,
}

impl Workers {
    pub(crate) fn new(group: WorkGroup, concurrency: usize) -> Self {
        Workers {
            group,
            concurrency,
            heartbeat: false,
            token: CancellationToken::new(),
            drain_timeout: Duration::from_secs(30),
        }
    }

    /// Extend each job's lease automatically (every third of the lease) while its handler
    /// runs. Default off.
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// Stop when `token` is cancelled.
    pub fn shutdown_on(mut self, token: CancellationToken) -> Self {
        self.token = token;
        self
    }

    /// How long running handlers may take to finish once the pool stops. Default 30 s.
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Runs the pool until it is stopped, then drains it.
    ///
    /// # Errors
    ///
    /// A [`SubscribeError`](crate::SubscribeError) if the pool cannot subscribe, or the
    /// subscription's error if a claimed message cannot be read (the pool drains first).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future aborts running handlers, whose jobs are then
    /// released with the attempt counted. Stop a pool with its token instead.
    pub async fn run<H: Handler>(self, handler: H) -> Result<PoolReport, Error> {
        let shared = self.group.shared.clone();
        // Broker shutdown waits for this pool to drain.
        let Some(_running) = shared.pool_started() else {
            return Err(crate::SubscribeError::Shutdown.into());
        };
        let mut sub = self.group.clone().max_in_flight(self.concurrency).subscribe().await?;
        let handler = Arc::new(handler);
        let heartbeat = self.heartbeat.then(|| self.group.lease_duration());
        let clock = shared.engine.clock().clone();
        let mut set: JoinSet<Done> = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, Task> = HashMap::new();
        let mut report = PoolReport::default();
        let record = |report: &mut PoolReport,
                      running: &mut HashMap<_, _>,
                      res: Result<(tokio::task::Id, Done), tokio::task::JoinError>| {
            match res {
                Ok((id, done)) => {
                    running.remove(&id);
                    match done {
                        Done::Acked => report.acked += 1,
                        Done::Failed => report.failed += 1,
                        Done::Panicked => report.panicked += 1,
                        Done::Unsettled => report.unsettled += 1,
                    }
                }
                Err(e) => {
                    running.remove(&e.id());
                    report.released += 1;
                }
            }
        };
        let result = loop {
            tokio::select! {
                biased;
                _ = self.token.cancelled() => break Ok(()),
                _ = shared.closing.cancelled() => break Ok(()),
                Some(res) = set.join_next_with_id(), if !set.is_empty() => record(&mut report, &mut running, res),
                item = sub.next() => match item {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(e),
                    Some(Ok(job)) => {
                        let task = job.task();
                        let h = set.spawn(run_one(handler.clone(), job, heartbeat, clock.clone()));
                        running.insert(h.id(), task);
                    }
                },
            }
        };
        // Stop claiming; jobs claimed but not handed out are released without counting.
        drop(sub);
        let deadline = clock.now() + self.drain_timeout;
        while !set.is_empty() {
            tokio::select! {
                Some(res) = set.join_next_with_id() => record(&mut report, &mut running, res),
                _ = clock.sleep_until(deadline) => {
                    tracing::warn!(
                        group = %self.group.name(),
                        running = set.len(),
                        "rockq: worker pool drain timeout; releasing running jobs"
                    );
                    for task in running.values() {
                        task.inner().uncounted.store(true, Ordering::Release);
                    }
                    set.abort_all();
                    while let Some(res) = set.join_next_with_id().await {
                        record(&mut report, &mut running, res);
                    }
                }
            }
        }
        tracing::debug!(group = %self.group.name(), ?report, "rockq: worker pool stopped");
        result.map(|()| report)
    }
}

async fn run_one<H: Handler>(
    handler: Arc<H>,
    job: Job,
    heartbeat: Option<Duration>,
    clock: crate::Clock,
) -> Done {
    let work = AssertUnwindSafe(handler.handle(job.task())).catch_unwind();
    let result = match heartbeat {
        None => work.await,
        Some(lease) => {
            tokio::pin!(work);
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = clock.sleep_until(clock.now() + lease / 3) => {
                        if job.extend(lease).is_err() {
                            // Lost anyway; let the handler finish, its outcome will be refused.
                        }
                    }
                }
            }
        }
    };
    let (settled, done) = match result {
        Ok(Ok(())) => (job.ack().await, Done::Acked),
        Ok(Err(e)) => {
            let settled = match e.action {
                Action::Retry => job.retry_with(None, e.message).await,
                Action::RetryAfter(d) => job.retry_with(Some(d), e.message).await,
                Action::DeadLetter => job.dead_letter(e.message).await,
            };
            (settled, Done::Failed)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            tracing::error!(queue = %job.queue(), group = %job.group(), seq = job.seq(), panic = %msg, "rockq: handler panicked");
            (job.retry_with(None, format!("handler panicked: {msg}")).await, Done::Panicked)
        }
    };
    match settled {
        Ok(()) => done,
        Err(e) => {
            tracing::warn!(error = %e, "rockq: worker could not record an outcome");
            Done::Unsettled
        }
    }
}
