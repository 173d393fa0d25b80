//! What a worker pool runs per job: the [`Handler`] trait, the closures and services that
//! become one ([`IntoHandler`]), and the handler's error ([`HandlerError`]).

mod error;
#[cfg(feature = "tower")]
mod service;
pub(crate) mod typed;

use std::future::Future;

pub(crate) use error::Action;
pub use error::{HandlerError, HandlerResultExt};

use crate::work::Task;

/// A job handler for a worker pool, with access to the pool's shared state `S` (see
/// [`Workers::state`](crate::Workers::state); `()` without one), lent to every call. `Ok` acks the job; `Err`
/// decides between retry and dead-letter (see [`HandlerError`]); a panic counts as a failed
/// attempt.
///
/// Closures are handlers too (see [`IntoHandler`]): `|task: Task| async { … }`, and with state
/// `|task: Task, state: S| async { … }` (a clone of the state per call).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use rockq::{Handler, HandlerError, Task};
///
/// struct Db { table: String }
/// struct Insert;
///
/// #[async_trait::async_trait]
/// impl Handler<Arc<Db>> for Insert {
///     async fn handle(&self, task: Task, db: &Arc<Db>) -> Result<(), HandlerError> {
///         println!("insert #{} into {}", task.seq(), db.table);
///         Ok(())
///     }
/// }
/// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
/// let db = Arc::new(Db { table: "orders".into() });
/// queue.work_group("inserts")?.workers(4).state(db).run(Insert).await?;
/// # Ok(()) }
/// ```
#[async_trait::async_trait]
pub trait Handler<S: Send + Sync + 'static = ()>: Send + Sync + 'static {
    /// Handles one job.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rockq::{Handler, HandlerError, Task};
    ///
    /// struct Log;
    ///
    /// #[async_trait::async_trait]
    /// impl Handler for Log {
    ///     async fn handle(&self, task: Task, _state: &()) -> Result<(), HandlerError> {
    ///         println!("{}#{}", task.queue(), task.seq());
    ///         Ok(())
    ///     }
    /// }
    /// # async fn demo(group: rockq::WorkGroup) -> Result<(), rockq::Error> {
    /// group.workers(4).run(Log).await?;
    /// # Ok(()) }
    /// ```
    async fn handle(&self, task: Task, state: &S) -> Result<(), HandlerError>;
}

/// Anything a worker pool can run: a [`Handler`], an `async` closure taking a [`Task`] (and,
/// optionally, a clone of the pool's state `S`), or with the `tower` feature a
/// `tower::Service<Task, Response = ()>`. `M` only tells the forms apart; it is inferred.
pub trait IntoHandler<S: Send + Sync + 'static, M>: Send + 'static {
    /// The handler it becomes.
    type Handler: Handler<S>;

    /// Makes the handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{IntoHandler, Task};
    /// // Pools call this; a closure becomes a `Handler` without any wrapping by hand.
    /// let handler = IntoHandler::<(), _>::into_handler(|task: Task| async move {
    ///     println!("{}", task.seq());
    ///     Ok(())
    /// });
    /// # drop(handler);
    /// ```
    fn into_handler(self) -> Self::Handler;
}

/// Tells the forms of [`IntoHandler`] apart (never named by users).
pub(crate) mod markers {
    /// A [`Handler`](super::Handler) itself.
    #[derive(Debug)]
    pub enum IsHandler {}
    /// `Fn(Task) -> Fut`.
    #[derive(Debug)]
    pub enum TaskFn {}
    /// `Fn(Task, S) -> Fut`.
    #[derive(Debug)]
    pub enum TaskStateFn {}
    /// `tower::Service<Task>`.
    #[cfg(feature = "tower")]
    #[derive(Debug)]
    pub enum Service {}
}

impl<S: Send + Sync + 'static, H: Handler<S>> IntoHandler<S, markers::IsHandler> for H {
    type Handler = H;

    fn into_handler(self) -> H {
        self
    }
}

/// A closure `Fn(Task) -> Fut` as a handler (it ignores the state).
pub struct FnHandler<F>(F);

impl<F> std::fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnHandler")
    }
}

#[async_trait::async_trait]
impl<S, F, Fut> Handler<S> for FnHandler<F>
where
    S: Send + Sync + 'static,
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, task: Task, _: &S) -> Result<(), HandlerError> {
        (self.0)(task).await
    }
}

impl<S, F, Fut> IntoHandler<S, markers::TaskFn> for F
where
    S: Send + Sync + 'static,
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Handler = FnHandler<F>;

    fn into_handler(self) -> FnHandler<F> {
        FnHandler(self)
    }
}

/// A closure `Fn(Task, S) -> Fut` as a handler: the pool hands it its state.
pub struct StateFnHandler<F>(F);

impl<F> std::fmt::Debug for StateFnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateFnHandler")
    }
}

#[async_trait::async_trait]
impl<S, F, Fut> Handler<S> for StateFnHandler<F>
where
    S: Clone + Send + Sync + 'static,
    F: Fn(Task, S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, task: Task, state: &S) -> Result<(), HandlerError> {
        (self.0)(task, state.clone()).await
    }
}

impl<S, F, Fut> IntoHandler<S, markers::TaskStateFn> for F
where
    S: Clone + Send + Sync + 'static,
    F: Fn(Task, S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Handler = StateFnHandler<F>;

    fn into_handler(self) -> StateFnHandler<F> {
        StateFnHandler(self)
    }
}
