//! Worker pools: `group.workers(n).run(handler)`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::adapt::{Adapt, MAX_AUTO_PREFETCH};
use super::feed::Feed;
use super::handler::typed::IntoTypedHandler;
use super::handler::{Action, Handler, IntoHandler};
use crate::error::Error;
use crate::telemetry;
use crate::txn::task::TaskTx;
use crate::work::WorkGroup;
use crate::work::{Job, PoolOutcome};

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
    /// Handler runs whose transaction ([`Task::tx`](crate::Task::tx)) conflicted — a condition
    /// did not hold at commit — and that ran again at once, holding the job. Not failed
    /// attempts, and not in `failed` (see [`Task::tx`](crate::Task::tx)).
    pub conflicts: u64,
}

// Defined here, beside the pool it builds, so that the group builder need not import it.
impl WorkGroup {
    /// A worker pool of `concurrency` handlers on this group (at least 1).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let report = queue.work_group("mailer")?.workers(8).run(|task: rockq::Task| async move {
    ///     println!("sending #{}", task.seq());
    ///     Ok(())
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn workers(&self, concurrency: usize) -> Workers {
        Workers::new(self.clone(), concurrency.max(1))
    }
}

/// A pool of concurrent handlers on one [`WorkGroup`]; see [`WorkGroup::workers`].
///
/// At most `concurrency` handlers run at once, and the pool holds at most
/// `concurrency + prefetch` jobs (running, or claimed and waiting for an idle handler; see
/// [`prefetch`](Workers::prefetch), adaptive by default). Idle handlers take the next job
/// from a shared feed, so a slow job never holds up others. Stopping — the [`shutdown_on`](Workers::shutdown_on) token, or
/// [`Broker::shutdown`](crate::Broker::shutdown), which waits for running pools — stops
/// claiming, lets running handlers finish until the [drain timeout](Workers::drain_timeout),
/// then stops the rest and releases their jobs **without** counting the attempt.
///
/// Run a pool in place with [`run`](Workers::run), or in the background with
/// [`spawn`](Workers::spawn), which returns a [`PoolHandle`](crate::PoolHandle) to stop it.
///
/// `S` is the state every handler shares ([`state`](Workers::state)); `()` without one.
pub struct Workers<S = ()> {
    pub(super) group: WorkGroup,
    state: S,
    concurrency: usize,
    /// Fixed by the application; `None`: adaptive (see `adapt.rs`).
    prefetch: Option<usize>,
    heartbeat: bool,
    pub(super) token: CancellationToken,
    drain_timeout: Duration,
    /// How handler spans relate to the producers' (feature `otel`).
    trace: Trace,
}

/// How a handler's span relates to its producer's: [`TraceRelation`](crate::otel::TraceRelation)
/// with the `otel` feature, nothing without.
#[cfg(feature = "otel")]
type Trace = crate::otel::TraceRelation;
#[cfg(not(feature = "otel"))]
type Trace = ();

/// Waiting jobs a pool's feed holds per worker (see `drive`).
const FEED_PER_WORKER: usize = 16;

enum Done {
    Acked,
    Failed,
    Panicked,
    Unsettled,
    /// Its transaction conflicted: the job went back to the feed to run again.
    Conflicted,
}

/// What running a handler left to do: nothing, or its transaction to commit with the ack.
enum Ran {
    Done(Done),
    Commit(crate::txn::Transaction, Job),
}

impl PoolReport {
    fn count(&mut self, done: Done) {
        match done {
            Done::Acked => self.acked += 1,
            Done::Failed => self.failed += 1,
            Done::Panicked => self.panicked += 1,
            Done::Unsettled => self.unsettled += 1,
            Done::Conflicted => self.conflicts += 1,
        }
    }
}

impl<S> std::fmt::Debug for Workers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("group", &self.group)
            .field("concurrency", &self.concurrency)
            .field("prefetch", &self.prefetch)
            .field("heartbeat", &self.heartbeat)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

impl Workers {
    /// The largest `concurrency` and [`prefetch`](Workers::prefetch) a pool accepts: each
    /// handler is a task with a slot in the pool's feed, and each prefetched job holds a
    /// lease.
    pub const MAX_POOL: usize = 1 << 16;

    pub(crate) fn new(group: WorkGroup, concurrency: usize) -> Self {
        Workers {
            group,
            state: (),
            concurrency,
            prefetch: None,
            heartbeat: false,
            token: CancellationToken::new(),
            drain_timeout: Duration::from_secs(30),
            trace: Trace::default(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> Workers<S> {
    /// Shares `state` with every handler, as axum's `State` does: [`Handler`]s get it as
    /// `handle(&self, task, &S)`, closures a clone as their last argument
    /// (`|task: Task, db: Db| async move { … }`). Each worker holds one clone; a closure gets
    /// a clone per job, so make `S` cheap to clone — an `Arc<…>`, or a handle that is one
    /// inside (a connection pool, a channel sender).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// use std::sync::{Arc, atomic::{AtomicU64, Ordering}};
    /// struct Counters { seen: AtomicU64 }
    ///
    /// let counters = Arc::new(Counters { seen: AtomicU64::new(0) });
    /// queue.work_group("count")?
    ///     .workers(4)
    ///     .state(counters.clone())
    ///     .run(|_task: rockq::Task, c: Arc<Counters>| async move {
    ///         c.seen.fetch_add(1, Ordering::Relaxed);
    ///         Ok(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn state<S2: Clone + Send + Sync + 'static>(self, state: S2) -> Workers<S2> {
        Workers {
            group: self.group,
            state,
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            heartbeat: self.heartbeat,
            token: self.token,
            drain_timeout: self.drain_timeout,
            trace: self.trace,
        }
    }

    /// Jobs claimed ahead of free handlers, so that claiming (one write and one read per
    /// batch) overlaps handling; the pool holds at most `concurrency + prefetch` jobs, at most
    /// [`MAX_POOL`](Workers::MAX_POOL) ahead.
    ///
    /// **Default: adaptive.** The pool starts with `concurrency` jobs ahead (one waiting per
    /// handler) and keeps about 2 ms of work ahead at the rate its handlers finish jobs — or
    /// twice what a claim takes, if that is longer (up to 100 ms): on etcd a claim waits for a
    /// round of transactions — between `concurrency` and 1024 (or exactly `concurrency` if
    /// that is more): handlers that take milliseconds get `concurrency`, handlers that take
    /// microseconds get big claim batches (an 8-worker pool of no-op handlers drains about
    /// twice as fast with 1024 ahead as with 64, and on etcd eight times as fast as with 2 ms
    /// ahead). When handlers slow down, the prefetch halves every 10 ms down to
    /// `concurrency`, as far as unclaimed room allows: jobs already claimed stay with the pool.
    /// A pool stuck from the start holds at most `2 × concurrency` jobs.
    ///
    /// Setting a number fixes it. A prefetched job's lease runs while it waits, and is
    /// renewed to a full term when a handler starts it (to within a hundredth of it); so with
    /// slow handlers keep
    /// `prefetch / concurrency × handler time` well below the lease. `0` claims only for idle
    /// handlers (one claim write for the handlers free at that moment; about 45k jobs/s for
    /// 8 no-op handlers here): the default for a group with a [rate limit](WorkGroup::rate_limit), which counts
    /// claims — so that a claim is a start (a pool started before the limit was stored keeps
    /// its prefetch until it is started again).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// // Slow handlers and a short lease: claim only for idle handlers.
    /// group.workers(4).prefetch(0).run(|task: rockq::Task| async move { Ok(()) }).await?;
    /// # Ok(()) }
    /// ```
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Extend each job's lease automatically (every third of the lease) while its handler
    /// runs. Default off.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// // Handlers that may outlive the lease keep their jobs.
    /// group.workers(4).heartbeat(true).run(|task: rockq::Task| async move { Ok(()) }).await?;
    /// # Ok(()) }
    /// ```
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// How each handler's `rockq.job` span relates to the span that sent its message (feature
    /// `otel`, see [`rockq::otel`](crate::otel)): its child (the default), a new trace linked
    /// to it, or neither.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// use rockq::otel::TraceRelation;
    /// // A nightly batch consumer: a trace of its own per job, linked to the producer's.
    /// group.workers(4).trace(TraceRelation::Link).run(|task: rockq::Task| async move { Ok(()) }).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "otel")]
    pub fn trace(mut self, relation: crate::otel::TraceRelation) -> Self {
        self.trace = relation;
        self
    }

    /// Stop when `token` is cancelled.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let stop = rockq::CancellationToken::new();
    /// let on_signal = stop.clone();
    /// tokio::spawn(async move {
    ///     let _ = tokio::signal::ctrl_c().await;
    ///     on_signal.cancel();
    /// });
    /// let report = group.workers(8).shutdown_on(stop).run(|task: rockq::Task| async move { Ok(()) }).await?;
    /// # Ok(()) }
    /// ```
    pub fn shutdown_on(mut self, token: CancellationToken) -> Self {
        self.token = token;
        self
    }

    /// How long running handlers may take to finish once the pool stops. Default 30 s; a
    /// timeout over 100 years is clamped to 100 years.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// use std::time::Duration;
    /// let pool = group
    ///     .workers(8)
    ///     .drain_timeout(Duration::from_secs(5))
    ///     .spawn(|task: rockq::Task| async move { Ok(()) });
    /// let report = pool.shutdown().await?; // waits at most 5 s for running handlers
    /// # Ok(()) }
    /// ```
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = crate::clock::clamp_delay(d);
        self
    }

    /// Runs the pool until it is stopped, then drains it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOption`](crate::error::Error::InvalidOption) if
    /// `concurrency` or `prefetch` exceeds [`MAX_POOL`](Workers::MAX_POOL) (nothing is
    /// claimed); another [`Error`](crate::Error) if the pool cannot
    /// subscribe, or the subscription's error if a claimed message cannot be read (the pool
    /// drains first); [`Error::GroupDeleted`](crate::Error::GroupDeleted) once the group
    /// or its queue is deleted (running handlers are aborted at once: none of their outcomes
    /// could be recorded).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (a `select!` branch losing, `JoinHandle::abort`) stops the pool at
    /// once without draining: it stops claiming, aborts running handlers and releases every job
    /// it holds **without** counting the attempt (as a drain timeout does), so the jobs come
    /// back with the same attempt number. Outcomes already recorded stay. To let running
    /// handlers finish, stop the pool with its token or use [`spawn`](Workers::spawn) and
    /// [`PoolHandle::shutdown`](crate::PoolHandle::shutdown).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let report = queue
    ///     .work_group("mailer")?
    ///     .workers(16)
    ///     .run(|task: rockq::Task| async move {
    ///         if task.payload().is_empty() {
    ///             return Err(rockq::HandlerError::dead_letter("empty message"));
    ///         }
    ///         Ok(())
    ///     })
    ///     .await?;
    /// println!("{} acked, {} failed", report.acked, report.failed);
    /// # Ok(()) }
    /// ```
    pub async fn run<H, M>(self, handler: H) -> Result<PoolReport, Error>
    where
        H: IntoHandler<S, M>,
    {
        for (what, n) in [("concurrency", self.concurrency), ("prefetch", self.prefetch.unwrap_or(0))] {
            if n > Workers::MAX_POOL {
                let msg = format!("worker pool {what} {n} exceeds the maximum of {}", Workers::MAX_POOL);
                return Err(crate::error::Error::InvalidOption(msg));
            }
        }
        // The dispatcher runs as a task of its own on the broker's runtime, not in the caller's
        // future: an application awaits `run` in its main task, which `#[tokio::main]` polls on
        // the thread that called `block_on`, not on a runtime worker. There every hand-over
        // between the dispatcher and the workers crossed threads, and a default pool drained at
        // two thirds of a spawned one (benches/user_style.rs). Dropping `run` aborts the task,
        // which drops the pool as dropping this future did.
        let runtime = self.group.shared.runtime.clone();
        let task = AbortOnDrop(runtime.spawn(self.drive(handler.into_handler())));
        task.join().await
    }

    /// The pool itself: subscribes, starts the workers, feeds them until the pool is stopped,
    /// then drains them and flushes their outcomes.
    async fn drive<Hd: Handler<S>>(self, handler: Hd) -> Result<PoolReport, Error> {
        let shared = self.group.shared.clone();
        // Broker shutdown waits for this pool to drain.
        let Some(_running) = shared.pool_started() else {
            return Err(crate::error::Error::Shutdown);
        };
        // A rate-limited group claims only for idle handlers unless the application fixed a
        // prefetch: the limit counts claims, and jobs claimed ahead would wait for handlers,
        // then start bunched (faster than the rate, for as long as the backlog lasts).
        let prefetch = match self.prefetch {
            None if self.group.has_rate_limit() => Some(0),
            p => p,
        };
        // Adaptive: room for the largest prefetch, the part above the current one held back.
        let (ahead, room) = match prefetch {
            Some(n) => (n, n),
            None => (self.concurrency, MAX_AUTO_PREFETCH.max(self.concurrency)),
        };
        let limit = self.concurrency + ahead;
        let in_flight = self.concurrency + room;
        // A claim takes at most what the pool has room for; without a prefetch that room is
        // its idle handlers, and one claim takes them all (not one claim write each).
        let batch = if ahead == 0 { self.concurrency } else { ahead }.clamp(1, WorkGroup::MAX_CLAIM_BATCH);
        // The pool reports saturation itself (every handler busy, below), with its concurrency;
        // its subscription, which waits for room whenever the pool holds all it may, does not.
        let mut sub = self
            .group
            .clone()
            .max_in_flight(in_flight)
            .read_batch(batch)
            .saturation_after(Duration::MAX)
            .subscribe()
            .await?;
        let mut adapt = prefetch.is_none().then(|| Adapt::new(sub.permits().clone(), ahead, room));
        sub.set_limit(limit, batch);
        let handler = Arc::new(handler);
        let (heartbeat, trace) = (self.heartbeat, self.trace);
        let clock = shared.clock().clone();
        let state = sub.state().clone();

        // `concurrency` long-lived worker tasks take jobs from a shared feed, which this
        // dispatcher fills with whatever the subscription has ready (see `feed.rs`). At most
        // `concurrency` handlers run; the rest wait, claimed, in the feed or the
        // subscription's buffer.
        // With fast handlers the dispatcher runs once per refill of the feed: a deep feed (16
        // jobs a worker, if the pool may hold that many) wakes it once per 8 jobs a worker
        // (benches/user_style.rs, `workers(8)`: +11 % with 16 against one job a worker). With
        // slow handlers the adaptive prefetch falls to one job a worker, and the feed holds no
        // more; a fixed prefetch fills it up to the depth (a job whose lease runs out there is
        // given back unrun: `Job::is_stale`).
        let depth = (FEED_PER_WORKER * self.concurrency).min(in_flight);
        let feed = Arc::new(Feed::new(self.concurrency, depth));
        let mut pool = PoolGuard { feed: feed.clone(), workers: JoinSet::new() };
        for w in 0..self.concurrency {
            let (feed, handler, clock, app) =
                (feed.clone(), handler.clone(), clock.clone(), self.state.clone());
            pool.workers.spawn(async move {
                let mut report = PoolReport::default();
                // Transactions of this worker's handlers on their way to the disk: the worker
                // takes its next job meanwhile, so that many commits share the writer's rounds
                // (each job still holds its permit, and so its place in `max_in_flight`, until
                // its transaction is answered). Aborted with the worker.
                let mut committing: JoinSet<Done> = JoinSet::new();
                while let Some(job) = feed.take(w, &clock).await {
                    if job.is_stale() {
                        // As the subscription's buffer does: dropped unseen, released without
                        // counting (unless already claimed again), not a completion.
                        job.inner().uncounted.store(true, Ordering::Release);
                        drop(job);
                        feed.skipped(w);
                        continue;
                    }
                    refresh_lease(&job);
                    match run_one(handler.as_ref(), &app, job, heartbeat, trace, clock.clone()).await {
                        Ran::Done(done) => report.count(done),
                        Ran::Commit(tx, job) => {
                            drop(committing.spawn(commit_with_ack(tx, job, feed.clone())))
                        }
                    }
                    while let Some(done) = committing.try_join_next() {
                        report.count(done.unwrap_or(Done::Unsettled));
                    }
                    feed.done(w);
                }
                while let Some(done) = committing.join_next().await {
                    report.count(done.unwrap_or(Done::Unsettled));
                }
                report
            });
        }

        // Saturation: every worker busy since the feed's `full_since` for longer than the
        // group's threshold; reported once per episode.
        let mut reported = None;
        let mut ready = Vec::new();
        let result = loop {
            if let Some(p) = adapt
                .as_mut()
                .and_then(|a| a.tick(feed.completed(), std::time::Instant::now(), sub.claim_latency()))
            {
                sub.set_limit(self.concurrency + p, p.clamp(1, WorkGroup::MAX_CLAIM_BATCH));
            }
            let full_since = feed.full_since();
            let has_room = feed.has_room();
            let saturated_at = full_since
                .filter(|&(episode, _)| reported != Some(episode))
                .map(|(_, t)| t.checked_add(self.group.saturation_threshold()).unwrap_or(t));
            tokio::select! {
                biased;
                _ = self.token.cancelled() => break Ok(()),
                _ = shared.closing.cancelled() => break Ok(()),
                // With every worker busy the subscription is not polled: its end is seen here.
                _ = state.wait_deleted() => {
                    let (queue, group) = (state.queue.name.to_string(), state.name.to_string());
                    break Err(crate::error::Error::GroupDeleted { queue, group });
                }
                _ = feed.room(), if !has_room => continue,
                item = sub.next(), if has_room => match item {
                    None => break Ok(()),
                    Some(Err(e)) => break Err(e),
                    Some(Ok(job)) => ready.push(job),
                },
                _ = feed.saturation_changed() => continue,
                _ = async { match saturated_at { Some(t) => clock.sleep_until(t).await, None => futures::future::pending().await } } => {
                    // Only if that episode is still going (ends do not wake this loop).
                    let now = feed.full_since();
                    if now.is_some() && now.map(|(e, _)| e) == full_since.map(|(e, _)| e) {
                        reported = now.map(|(episode, _)| episode);
                        state.report_saturation(shared.events(), self.concurrency);
                    }
                    continue;
                }
            }
            // Everything else the subscription has ready goes in the same push.
            let mut failed = None;
            while ready.len() < feed.depth()
                && let Some(item) = sub.next().now_or_never()
            {
                match item {
                    Some(Ok(job)) => ready.push(job),
                    Some(Err(e)) => failed = Some(Err(e)),
                    None => failed = Some(Ok(())),
                }
                if failed.is_some() {
                    break;
                }
            }
            feed.push(std::mem::take(&mut ready));
            if let Some(end) = failed {
                break end;
            }
        };
        // Stop claiming; jobs claimed but not started are released without counting.
        drop(sub);
        for job in feed.close() {
            job.inner().uncounted.store(true, Ordering::Release);
        }
        let mut report = PoolReport::default();
        let add = |report: &mut PoolReport, r: PoolReport| {
            report.acked += r.acked;
            report.failed += r.failed;
            report.panicked += r.panicked;
            report.unsettled += r.unsettled;
            report.conflicts += r.conflicts;
        };
        // A deleted group's handlers are not waited for: no outcome of theirs can be recorded.
        let deadline = if state.is_deleted() { clock.now() } else { clock.after(self.drain_timeout) };
        while !pool.workers.is_empty() {
            tokio::select! {
                Some(res) = pool.workers.join_next() => if let Ok(r) = res { add(&mut report, r) },
                _ = clock.sleep_until(deadline) => {
                    let running = feed.held();
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

    /// Runs the pool with a handler that takes the payload decoded as a `T` (with the codec
    /// its [`CODEC_HEADER`](crate::CODEC_HEADER) names, as [`Task::decode`](crate::Task::decode)):
    /// `|order: Order, task: Task| async { … }`, or with [state](Workers::state)
    /// `|order: Order, task: Task, state: Arc<S>| async { … }`.
    ///
    /// A payload that does not decode is **dead-lettered at once**, with the
    /// [`DecodeError`](crate::DecodeError) as the reason: no attempt could ever decode it, so
    /// no retries are spent on it. Everything else is as [`run`](Workers::run).
    ///
    /// # Errors
    ///
    /// As [`run`](Workers::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Workers::run).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: u64, total_cents: u64 }
    ///
    /// queue.work_group("billing")?.workers(4).run_typed(|order: Order, _task: rockq::Task| async move {
    ///     println!("charging {} for order {}", order.total_cents, order.id);
    ///     Ok(())
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_typed<T, H, M>(self, handler: H) -> Result<PoolReport, Error>
    where
        H: IntoTypedHandler<T, S, M>,
    {
        self.run(handler.into_typed_handler()).await
    }
}

/// The pool's task, aborted if the `run` future that awaits it is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<PoolReport, Error>>);

impl AbortOnDrop {
    async fn join(mut self) -> Result<PoolReport, Error> {
        match (&mut self.0).await {
            Ok(result) => result,
            // A panic in the pool's own code (handlers' panics are caught per job) reaches the
            // caller, as it did when the pool ran in the caller's future.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Aborted from outside: only the runtime shutting down does that.
            Err(_) => Err(Error::Shutdown),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Owns a running pool's worker tasks. Dropped with the `run` future — normally when they are
/// all joined, so it has nothing to do — or when that future is cancelled mid-run.
struct PoolGuard {
    feed: Arc<Feed>,
    workers: JoinSet<PoolReport>,
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        // The pool was stopped from outside (its future dropped, its task aborted): nothing it
        // holds was given a fair try, so every held job goes back without counting the attempt
        // (pools used to count them, and with `max_attempts(1)` dead-letter them). Marked
        // before the workers are aborted, so whenever an aborted handler's job drops, it is
        // released uncounted; a job that was settled meanwhile ignores the mark.
        for task in self.feed.held() {
            task.inner().uncounted.store(true, Ordering::Release);
        }
        for job in self.feed.close() {
            job.inner().uncounted.store(true, Ordering::Release);
        }
        self.workers.abort_all();
    }
}

/// The span a handler runs in. Its events carry the job's coordinates; at DEBUG, so INFO costs
/// nothing.
#[cfg(not(feature = "otel"))]
fn job_span(job: &Job, _: Trace) -> tracing::Span {
    tracing::debug_span!("rockq.job", queue = %job.queue(), group = %job.group(), seq = job.seq(), attempt = job.attempt())
}

/// The span a handler runs in, in (or linked to) its producer's trace. At INFO, because a span
/// an `info` filter disables cannot be the parent of the handler's own spans, and the trace
/// would break there; `otel.kind` and the `messaging.*` fields are OpenTelemetry's messaging
/// conventions for a consumer's span.
#[cfg(feature = "otel")]
fn job_span(job: &Job, trace: Trace) -> tracing::Span {
    let span = tracing::info_span!(
        "rockq.job",
        otel.kind = "consumer",
        messaging.system = "rockq",
        messaging.operation.type = "process",
        messaging.destination.name = %job.queue(),
        messaging.consumer.group.name = %job.group(),
        queue = %job.queue(),
        group = %job.group(),
        seq = job.seq(),
        attempt = job.attempt()
    );
    job.follow_trace(&span, trace);
    span
}

/// Gives a job about to start its handler the group's lease as it stands now (an update of
/// the group's settings applies to the next job started), however long the job waited in the
/// feed, to within a hundredth of it: renewed unless what is left differs from the lease by
/// less than that. A job handed out soon after its claim (the adaptive prefetch holds a few
/// milliseconds of work ahead) keeps its lease: on etcd each renewal is a write of its own
/// that other processes must see (one transaction per job, in the writer's sequence with the
/// claims and acks, which take dozens of jobs per transaction). An already-expired lease stays
/// expired (the job then fails to settle and is redelivered): fencing is never bypassed.
fn refresh_lease(job: &Job) {
    let lease = job.group_lease();
    if job.lease_remaining().abs_diff(lease) > lease / 100 {
        let _ = job.extend(lease);
    }
}

async fn run_one<S: Send + Sync + 'static, H: Handler<S>>(
    handler: &H,
    state: &S,
    job: Job,
    heartbeat: bool,
    trace: Trace,
    clock: crate::clock::Clock,
) -> Ran {
    let span = job_span(&job, trace);
    let work = AssertUnwindSafe(tracing::Instrument::instrument(handler.handle(job.task(), state), span))
        .catch_unwind();
    let result = match heartbeat {
        false => work.await,
        true => {
            tokio::pin!(work);
            // A beat a third of a lease after the last extension, counted from the extension
            // itself (its deadline), not from whenever this loop comes round again: a clock
            // that moves meanwhile must not push the beat past the lease's end.
            let beat = |lease: Duration| job.inner().deadline().checked_sub(lease - lease / 3);
            let mut next = beat(job.group_lease()).unwrap_or_else(|| clock.now());
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = clock.sleep_until(next) => {
                        // Read at each beat, so a settings update changes the beat of running jobs.
                        let lease = job.group_lease();
                        if job.extend(lease).is_err() {
                            // Lost anyway; let the handler finish, its outcome will be refused.
                            next = clock.after(lease / 3);
                            continue;
                        }
                        next = beat(lease).unwrap_or_else(|| clock.after(lease / 3));
                    }
                }
            }
        }
    };
    let (outcome, done) = match result {
        Ok(Ok(())) => (PoolOutcome::Ack, Done::Acked),
        Ok(Err(e)) => {
            // The whole source chain: it is what an operator reads in the claim's last error
            // and the dead letter's reason.
            tracing::debug!(queue = %job.queue(), group = %job.group(), seq = job.seq(), attempt = job.attempt(), error = %e, action = ?e.action, "rockq: handler failed");
            let error = e.message().to_owned();
            let outcome = match e.action {
                Action::Retry => PoolOutcome::Retry { delay: None, error },
                Action::RetryAfter(d) => PoolOutcome::Retry { delay: Some(d), error },
                Action::DeadLetter => PoolOutcome::DeadLetter { reason: error },
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
    // A handler that wrote into its transaction (`Task::tx`) and succeeded: the writes, the
    // sends and the ack are one atomic write. One that failed: what it wrote is dropped.
    let tx = job.inner().tx.get().map(TaskTx::take).filter(|tx| !tx.is_empty());
    if let (PoolOutcome::Ack, Some(tx)) = (&outcome, tx) {
        return Ran::Commit(tx, job);
    }
    let settled = job.settle_queued(outcome).await;
    Ran::Done(match settled {
        Ok(()) => done,
        Err(e) => {
            tracing::warn!(error = %e, "rockq: worker could not record an outcome");
            Done::Unsettled
        }
    })
}

/// Commits a handler's transaction together with its job's ack. A refused transaction
/// applied nothing. A conflict (a condition did not hold: someone wrote first) is not the job's
/// failure: the job goes back to the feed, still leased at the same attempt, and its handler
/// runs again and reads afresh — up to [`CONFLICT_RERUNS`] times in a row, after which it is a
/// failed attempt (a condition that can never hold must not loop). A bad operation is a failed
/// attempt (retried with the group's backoff, dead-lettered when attempts are used up); a lost
/// lease or a shutdown leaves the job to whoever holds it now (or to the next open).
async fn commit_with_ack(tx: crate::txn::Transaction, job: Job, feed: Arc<Feed>) -> Done {
    match tx.apply(1, || job.begin_tx().map(|fenced| vec![fenced])).await {
        Ok(_) => {
            job.tx_committed();
            Done::Acked
        }
        Err(
            e @ (Error::LeaseLost { .. }
            | Error::GroupDeleted { .. }
            | Error::Shutdown
            | Error::Failed(_)
            | Error::Storage(_)),
        ) => {
            tracing::warn!(queue = %job.queue(), group = %job.group(), seq = job.seq(), error = %e, "rockq: a job's transaction was not applied");
            Done::Unsettled
        }
        Err(e)
            if e.is_conflict() && job.inner().conflicts.fetch_add(1, Ordering::AcqRel) < CONFLICT_RERUNS =>
        {
            let (queue, group) = (job.inner().group.queue.name.clone(), job.inner().group.name.clone());
            telemetry::group_counter(telemetry::POOL_CONFLICTS, &queue, &group, 1);
            tracing::debug!(queue = %job.queue(), group = %job.group(), seq = job.seq(), error = %e, "rockq: a job's transaction conflicted; running it again");
            job.inner().clear_result();
            if let Err(job) = feed.requeue(job) {
                // The pool is stopping: give the job back without counting the attempt.
                job.inner().uncounted.store(true, Ordering::Release);
            }
            Done::Conflicted
        }
        Err(e) => {
            tracing::debug!(queue = %job.queue(), group = %job.group(), seq = job.seq(), error = %e, "rockq: a job's transaction was refused; retrying the job");
            let error = refused(&e, job.inner().conflicts.load(Ordering::Acquire));
            match job.settle_queued(PoolOutcome::Retry { delay: None, error }).await {
                Ok(()) => Done::Failed,
                Err(_) => Done::Unsettled,
            }
        }
    }
}

/// Conflicts in a row after which a job's conflict counts as a failed attempt.
const CONFLICT_RERUNS: u32 = 16;

/// The error recorded for a refused transaction.
fn refused(e: &Error, conflicts: u32) -> String {
    if e.is_conflict() {
        format!("transaction conflicted {conflicts} times in a row: {e}")
    } else {
        format!("transaction refused: {e}")
    }
}
