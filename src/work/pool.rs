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
use super::job::{Job, PoolOutcome, Task};
use crate::error::Error;

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

    /// Retry after exactly `delay` (dead-letter once attempts are used up). A `delay` over 100
    /// years is clamped to 100 years.
    pub fn retry_after(message: impl std::fmt::Display, delay: Duration) -> Self {
        HandlerError {
            action: Action::RetryAfter(crate::clock::clamp_delay(delay)),
            message: message.to_string(),
        }
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
    /// Jobs whose handler returned `Ok` and whose ack was recorded (durable when `run` returns).
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

// Defined here, beside the pool it builds, so that the group builder need not import it.
impl WorkGroup {
    /// A worker pool of `concurrency` handlers on this group (at least 1).
    pub fn workers(&self, concurrency: usize) -> Workers {
        Workers::new(self.clone(), concurrency.max(1))
    }
}

/// A pool of concurrent handlers on one [`WorkGroup`]; see [`WorkGroup::workers`].
///
/// At most `concurrency` handlers run at once, and the pool holds at most
/// `concurrency + prefetch` jobs (running, or claimed and waiting for an idle handler; see
/// [`prefetch`](Workers::prefetch), default `concurrency`). Stopping — the [`shutdown_on`](Workers::shutdown_on) token, or
/// [`Broker::shutdown`](crate::Broker::shutdown), which waits for running pools — stops
/// claiming, lets running handlers finish until the [drain timeout](Workers::drain_timeout),
/// then stops the rest and releases their jobs **without** counting the attempt.
///
/// Run a pool in place with [`run`](Workers::run), or in the background with
/// [`spawn`](Workers::spawn), which returns a [`PoolHandle`] to stop it.
#[derive(Debug)]
pub struct Workers {
    pub(super) group: WorkGroup,
    concurrency: usize,
    prefetch: usize,
    heartbeat: bool,
    pub(super) token: CancellationToken,
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
            // Why `concurrency`: a prefetched job's lease runs while it waits, and with one job
            // waiting per handler it waits about one handler time, whatever the pool size (a
            // fixed 64 made a one-handler pool hold jobs for 64 handler times). Claims still
            // come in batches of `concurrency`.
            prefetch: concurrency,
            heartbeat: false,
            token: CancellationToken::new(),
            drain_timeout: Duration::from_secs(30),
        }
    }

    /// Jobs claimed ahead of free handlers, so that claiming (one write per batch) overlaps
    /// handling; the pool holds at most `concurrency + prefetch` jobs. Default `concurrency`
    /// (one job waiting per handler), at most [`MAX_POOL`](Workers::MAX_POOL). A prefetched
    /// job's lease runs while it waits; when a handler starts it the lease is renewed to a full
    /// term. So with slow handlers keep `prefetch / concurrency × handler time` well below the
    /// lease, or lower this (0 claims only for idle handlers, one job per claim write); raise
    /// it for short handlers, where bigger claim batches save writes.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
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

    /// How long running handlers may take to finish once the pool stops. Default 30 s; a
    /// timeout over 100 years is clamped to 100 years.
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = crate::clock::clamp_delay(d);
        self
    }

    /// The largest `concurrency` and [`prefetch`](Workers::prefetch) a pool accepts: each
    /// handler is a task with a slot in the pool's channel, and each prefetched job holds a
    /// lease.
    pub const MAX_POOL: usize = 1 << 16;

    /// Runs the pool until it is stopped, then drains it.
    ///
    /// # Errors
    ///
    /// [`SubscribeError::InvalidOption`](crate::error::SubscribeError::InvalidOption) if
    /// `concurrency` or `prefetch` exceeds [`MAX_POOL`](Workers::MAX_POOL) (nothing is
    /// claimed); another [`SubscribeError`](crate::SubscribeError) if the pool cannot
    /// subscribe, or the subscription's error if a claimed message cannot be read (the pool
    /// drains first).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (a `select!` branch losing, `JoinHandle::abort`) stops the pool at
    /// once without draining: it stops claiming, aborts running handlers and releases every job
    /// it holds **without** counting the attempt (as a drain timeout does), so the jobs come
    /// back with the same attempt number. Outcomes already recorded stay. To let running
    /// handlers finish, stop the pool with its token or use [`spawn`](Workers::spawn) and
    /// [`PoolHandle::shutdown`].
    pub async fn run<H: Handler>(self, handler: H) -> Result<PoolReport, Error> {
        for (what, n) in [("concurrency", self.concurrency), ("prefetch", self.prefetch)] {
            if n > Self::MAX_POOL {
                let msg = format!("worker pool {what} {n} exceeds the maximum of {}", Self::MAX_POOL);
                return Err(crate::error::SubscribeError::InvalidOption(msg).into());
            }
        }
        let shared = self.group.shared.clone();
        // Broker shutdown waits for this pool to drain.
        let Some(_running) = shared.pool_started() else {
            return Err(crate::error::SubscribeError::Shutdown.into());
        };
        let in_flight = self.concurrency + self.prefetch;
        let mut sub =
            self.group.clone().max_in_flight(in_flight).claim_batch(self.prefetch.max(1)).subscribe().await?;
        let handler = Arc::new(handler);
        let heartbeat = self.heartbeat.then(|| self.group.lease_duration());
        let clock = shared.clock().clone();
        let state = sub.state().clone();

        // `concurrency` long-lived worker tasks take jobs from a channel: one channel handoff
        // per job instead of a task spawn. A job is dispatched only with an idle-worker permit,
        // so at most `concurrency` handlers run and the rest wait, claimed, in the
        // subscription's buffer.
        let idle = Arc::new(tokio::sync::Semaphore::new(self.concurrency));
        let (job_tx, job_rx) =
            async_channel::bounded::<(Job, tokio::sync::OwnedSemaphorePermit)>(self.concurrency);
        // Every job the pool holds outside the subscription's buffer (queued for a worker or
        // running), by claim token. Registered by this dispatcher before the job is handed on,
        // so when this future is dropped the guard below sees every one of them.
        let held: Held = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let mut pool = PoolGuard { held: held.clone(), workers: JoinSet::new() };
        for _ in 0..self.concurrency {
            let (rx, handler, held, clock) = (job_rx.clone(), handler.clone(), held.clone(), clock.clone());
            pool.workers.spawn(async move {
                let mut report = PoolReport::default();
                while let Ok((job, _idle)) = rx.recv().await {
                    let token = job.inner().token;
                    match run_one(handler.clone(), job, heartbeat, clock.clone()).await {
                        Done::Acked => report.acked += 1,
                        Done::Failed => report.failed += 1,
                        Done::Panicked => report.panicked += 1,
                        Done::Unsettled => report.unsettled += 1,
                    }
                    lock(&held).remove(&token);
                }
                report
            });
        }

        // Saturation: every worker busy since `full_since` for longer than the group's
        // threshold; reported once per episode.
        let mut full_since: Option<std::time::Instant> = None;
        let mut reported = false;
        let result = loop {
            let permit = match idle.clone().try_acquire_owned() {
                Ok(p) => {
                    full_since = None;
                    reported = false;
                    p
                }
                Err(_) => {
                    let saturated_at = full_since
                        .filter(|_| !reported)
                        .map(|t| t.checked_add(self.group.saturation_threshold()).unwrap_or(t));
                    tokio::select! {
                        biased;
                        _ = self.token.cancelled() => break Ok(()),
                        _ = shared.closing.cancelled() => break Ok(()),
                        p = idle.clone().acquire_owned() => match p {
                            Ok(p) => {
                                full_since = None;
                                reported = false;
                                p
                            }
                            Err(_) => break Ok(()),
                        },
                        _ = async { match saturated_at { Some(t) => clock.sleep_until(t).await, None => futures::future::pending().await } } => {
                            reported = true;
                            state.report_saturation(shared.events(), self.concurrency);
                            continue;
                        }
                    }
                }
            };
            let job = tokio::select! {
                biased;
                _ = self.token.cancelled() => break Ok(()),
                _ = shared.closing.cancelled() => break Ok(()),
                item = sub.next() => match item {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(e),
                    Some(Ok(job)) => job,
                },
            };
            // Every worker now busy: the episode starts before the handler can observe it.
            if idle.available_permits() == 0 && full_since.is_none() {
                full_since = Some(clock.now());
            }
            // The handler gets a full lease, however long the job waited in the buffer. An
            // already-expired lease stays expired (the job then fails to settle and is
            // redelivered): fencing is never bypassed.
            let _ = job.extend(self.group.lease_duration());
            lock(&held).insert(job.inner().token, job.task());
            if job_tx.send((job, permit)).await.is_err() {
                break Ok(());
            }
        };
        // Stop claiming; jobs claimed but not started are released without counting.
        drop(sub);
        job_tx.close();
        while let Ok((job, _)) = job_rx.try_recv() {
            job.inner().uncounted.store(true, Ordering::Release);
            lock(&held).remove(&job.inner().token);
        }
        drop(job_rx);
        let mut report = PoolReport::default();
        let add = |report: &mut PoolReport, r: PoolReport| {
            report.acked += r.acked;
            report.failed += r.failed;
            report.panicked += r.panicked;
            report.unsettled += r.unsettled;
        };
        let deadline = clock.after(self.drain_timeout);
        while !pool.workers.is_empty() {
            tokio::select! {
                Some(res) = pool.workers.join_next() => if let Ok(r) = res { add(&mut report, r) },
                _ = clock.sleep_until(deadline) => {
                    let running: Vec<Task> = lock(&held).values().cloned().collect();
                    tracing::warn!(
                        group = %self.group.name(),
                        running = running.len(),
                        "rockq: worker pool drain timeout; releasing running jobs"
                    );
                    for task in &running {
                        task.inner().uncounted.store(true, Ordering::Release);
                    }
                    pool.workers.abort_all();
                    while let Some(res) = pool.workers.join_next().await {
                        if let Ok(r) = res { add(&mut report, r) }
                    }
                    report.released += running.len() as u64;
                }
            }
        }
        // Outcomes were queued without waiting; make them durable before reporting.
        let (reply, rx) = tokio::sync::oneshot::channel();
        if shared.tx.send(crate::engine::boundary::Request::Flush { reply }).await.is_ok() {
            let _ = rx.await;
        }
        tracing::debug!(group = %self.group.name(), ?report, "rockq: worker pool stopped");
        result.map(|()| report)
    }
}

/// The jobs a pool's workers hold, by claim token.
type Held = Arc<std::sync::Mutex<HashMap<u64, Task>>>;

/// Owns a running pool's worker tasks. Dropped with the `run` future — normally when they are
/// all joined, so it has nothing to do — or when that future is cancelled mid-run.
struct PoolGuard {
    held: Held,
    workers: JoinSet<PoolReport>,
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        // The pool was stopped from outside (its future dropped, its task aborted): nothing it
        // holds was given a fair try, so every held job goes back without counting the attempt
        // (pools used to count them, and with `max_attempts(1)` dead-letter them). Marked
        // before the workers are aborted, so whenever an aborted handler's job drops, it is
        // released uncounted; a job that was settled meanwhile ignores the mark.
        for task in lock(&self.held).values() {
            task.inner().uncounted.store(true, Ordering::Release);
        }
        self.workers.abort_all();
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn run_one<H: Handler>(
    handler: Arc<H>,
    job: Job,
    heartbeat: Option<Duration>,
    clock: crate::clock::Clock,
) -> Done {
    // The handler's own events carry the job's coordinates (at DEBUG, so INFO costs nothing).
    let span = tracing::debug_span!("rockq.job", queue = %job.queue(), group = %job.group(), seq = job.seq(), attempt = job.attempt());
    let work =
        AssertUnwindSafe(tracing::Instrument::instrument(handler.handle(job.task()), span)).catch_unwind();
    let result = match heartbeat {
        None => work.await,
        Some(lease) => {
            tokio::pin!(work);
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = clock.sleep_until(clock.after(lease / 3)) => {
                        if job.extend(lease).is_err() {
                            // Lost anyway; let the handler finish, its outcome will be refused.
                        }
                    }
                }
            }
        }
    };
    let (outcome, done) = match result {
        Ok(Ok(())) => (PoolOutcome::Ack, Done::Acked),
        Ok(Err(e)) => {
            let outcome = match e.action {
                Action::Retry => PoolOutcome::Retry { delay: None, error: e.message },
                Action::RetryAfter(d) => PoolOutcome::Retry { delay: Some(d), error: e.message },
                Action::DeadLetter => PoolOutcome::DeadLetter { reason: e.message },
            };
            (outcome, Done::Failed)
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            tracing::error!(queue = %job.queue(), group = %job.group(), seq = job.seq(), panic = %msg, "rockq: handler panicked");
            (PoolOutcome::Retry { delay: None, error: format!("handler panicked: {msg}") }, Done::Panicked)
        }
    };
    let settled = job.settle_queued(outcome).await;
    match settled {
        Ok(()) => done,
        Err(e) => {
            tracing::warn!(error = %e, "rockq: worker could not record an outcome");
            Done::Unsettled
        }
    }
}
