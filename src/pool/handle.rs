//! [`PoolHandle`]: a worker pool running as a task of its own ([`Workers::spawn`]).

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::handler::IntoHandler;
use super::handler::typed::IntoTypedHandler;
use super::workers::{PoolReport, Workers};
use crate::error::Error;

impl<S: Clone + Send + Sync + 'static> Workers<S> {
    /// Starts the pool as a task on the broker's runtime and returns a handle to stop it.
    /// The pool runs exactly as [`run`](Workers::run) does (the
    /// [`shutdown_on`](Workers::shutdown_on) token and [`Broker::shutdown`](crate::Broker::shutdown)
    /// still stop it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let pool = queue.work_group("thumbnails")?.workers(4).spawn(|task: rockq::Task| async move {
    ///     println!("resizing {}", task.seq());
    ///     Ok(())
    /// });
    /// // ... later:
    /// let report = pool.shutdown().await?;
    /// println!("{} acked", report.acked);
    /// # Ok(()) }
    /// ```
    pub fn spawn<H, M>(self, handler: H) -> PoolHandle
    where
        H: IntoHandler<S, M>,
    {
        // A child token: stopping this pool leaves a caller's shared token alone, and
        // cancelling the caller's token still stops it.
        let stop = self.token.child_token();
        let runtime = self.group.shared.runtime.clone();
        let workers = self.shutdown_on(stop.clone());
        // Converted here: the pool's future must not hold `H` (a closure need not be `Sync`
        // until it is a handler).
        let handler = handler.into_handler();
        PoolHandle { stop, task: Some(runtime.spawn(workers.run(handler))) }
    }

    /// Starts the pool as a task, as [`spawn`](Workers::spawn), with a typed handler, as
    /// [`run_typed`](Workers::run_typed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
    /// let pool = queue.work_group("ids")?.workers(2).spawn_typed(|id: u64, _task: rockq::Task| async move {
    ///     println!("{id}");
    ///     Ok(())
    /// });
    /// pool.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn spawn_typed<T, H, M>(self, handler: H) -> PoolHandle
    where
        H: IntoTypedHandler<T, S, M>,
    {
        self.spawn(handler.into_typed_handler())
    }
}

/// A worker pool started with [`Workers::spawn`].
///
/// [`shutdown`](PoolHandle::shutdown) stops it gracefully (stop claiming, drain, flush) and
/// returns its [`PoolReport`]; [`abort`](PoolHandle::abort) stops it at once, releasing every
/// job it holds without counting the attempt. **Dropping the handle stops the pool
/// gracefully** in the background, like `shutdown` without waiting for the report
/// ([`Broker::shutdown`](crate::Broker::shutdown) still waits for its drain).
#[derive(Debug)]
#[must_use = "dropping a PoolHandle stops the pool"]
pub struct PoolHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<Result<PoolReport, Error>>>,
}

impl PoolHandle {
    /// Stops the pool: it stops claiming, lets running handlers finish until its
    /// [drain timeout](Workers::drain_timeout) (then releases the rest without counting),
    /// makes every recorded outcome durable and returns what it did. If the pool already
    /// stopped (its token, a broker shutdown, an error), returns how it ended.
    ///
    /// # Errors
    ///
    /// What [`Workers::run`] returns; [`Error::Internal`] if the pool's task panicked
    /// or was aborted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the pool stopping in the background (its drain
    /// still runs); only the report is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let pool = group.workers(8).spawn(|task: rockq::Task| async move {
    ///     println!("{}", task.seq());
    ///     Ok(())
    /// });
    /// // ... later, e.g. on SIGTERM:
    /// let report = pool.shutdown().await?; // running handlers finish first
    /// println!("{} acked, {} failed", report.acked, report.failed);
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(mut self) -> Result<PoolReport, Error> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => join(task).await,
            None => Err(Error::Internal("worker pool already stopped".into())),
        }
    }

    /// Stops the pool now without draining: claiming stops, running handlers are aborted and
    /// every job the pool holds is released **without** counting the attempt. Returns at once;
    /// the jobs are released as the aborted handlers unwind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) {
    /// let pool = group.workers(8).spawn(|task: rockq::Task| async move { Ok(()) });
    /// pool.abort(); // no drain: held jobs come back without counting the attempt
    /// # }
    /// ```
    pub fn abort(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Whether the pool has stopped (its report is ready).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// let pool = group.workers(8).spawn(|task: rockq::Task| async move { Ok(()) });
    /// if pool.is_finished() {
    ///     // It stopped on its own (an error, or the group was deleted): see why.
    ///     let report = pool.shutdown().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        // A graceful stop that nobody awaits; the task keeps running until its drain is done.
        self.stop.cancel();
    }
}

async fn join(task: JoinHandle<Result<PoolReport, Error>>) -> Result<PoolReport, Error> {
    match task.await {
        Ok(r) => r,
        Err(e) => Err(Error::Internal(format!("worker pool task: {e}"))),
    }
}
