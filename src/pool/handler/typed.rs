//! Typed handlers: closures that take the decoded payload (see
//! [`Workers::run_typed`](crate::Workers::run_typed)).

use std::future::Future;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;

use super::{Handler, HandlerError};
use crate::work::Task;

/// A closure a pool's [`run_typed`](crate::Workers::run_typed) runs: `Fn(T, Task) -> Fut`, or
/// `Fn(T, Task, S) -> Fut` with the pool's state. `M` only tells the forms apart; it is
/// inferred.
pub trait IntoTypedHandler<T, S: Send + Sync + 'static, M>: Send + 'static {
    /// The handler it becomes: it decodes the payload, dead-letters it at once if it does not
    /// decode, and calls the closure otherwise.
    type Handler: Handler<S>;

    /// Makes the handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{IntoTypedHandler, Task};
    /// // Pools call this from `run_typed`; the closure gets the decoded value.
    /// let handler = IntoTypedHandler::<Vec<u64>, (), _>::into_typed_handler(|ids: Vec<u64>, task: Task| async move {
    ///     println!("{} ids in #{}", ids.len(), task.seq());
    ///     Ok(())
    /// });
    /// # drop(handler);
    /// ```
    fn into_typed_handler(self) -> Self::Handler;
}

/// Tells the forms of [`IntoTypedHandler`] apart.
pub(crate) mod markers {
    /// `Fn(T, Task) -> Fut`.
    #[derive(Debug)]
    pub enum ValueFn {}
    /// `Fn(T, Task, S) -> Fut`.
    #[derive(Debug)]
    pub enum ValueStateFn {}
}

/// A typed closure as a handler.
pub struct TypedHandler<T, F, M> {
    f: F,
    _t: PhantomData<fn() -> (T, M)>,
}

impl<T, F, M> std::fmt::Debug for TypedHandler<T, F, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedHandler").field("type", &std::any::type_name::<T>()).finish()
    }
}

/// The payload as a `T`, or the decision: a payload that does not decode now will not decode
/// on a retry either, so retrying would only burn attempts — dead-letter it. A codec this
/// build lacks is a deployment problem, not the message's: retry (with backoff), so that a
/// fixed consumer gets it, rather than dead-letter every message on a misbuilt one.
fn decode<T: DeserializeOwned>(task: &Task) -> Result<T, HandlerError> {
    task.decode::<T>().map_err(|e| match e.is_unknown_codec() {
        true => HandlerError::from_error(e),
        false => HandlerError::from_error(e).into_dead_letter(),
    })
}

#[async_trait::async_trait]
impl<T, S, F, Fut> Handler<S> for TypedHandler<T, F, markers::ValueFn>
where
    T: DeserializeOwned + Send + 'static,
    S: Send + Sync + 'static,
    F: Fn(T, Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, task: Task, _: &S) -> Result<(), HandlerError> {
        let value = decode::<T>(&task)?;
        (self.f)(value, task).await
    }
}

impl<T, S, F, Fut> IntoTypedHandler<T, S, markers::ValueFn> for F
where
    T: DeserializeOwned + Send + 'static,
    S: Send + Sync + 'static,
    F: Fn(T, Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Handler = TypedHandler<T, F, markers::ValueFn>;

    fn into_typed_handler(self) -> Self::Handler {
        TypedHandler { f: self, _t: PhantomData }
    }
}

#[async_trait::async_trait]
impl<T, S, F, Fut> Handler<S> for TypedHandler<T, F, markers::ValueStateFn>
where
    T: DeserializeOwned + Send + 'static,
    S: Clone + Send + Sync + 'static,
    F: Fn(T, Task, S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn handle(&self, task: Task, state: &S) -> Result<(), HandlerError> {
        let value = decode::<T>(&task)?;
        (self.f)(value, task, state.clone()).await
    }
}

impl<T, S, F, Fut> IntoTypedHandler<T, S, markers::ValueStateFn> for F
where
    T: DeserializeOwned + Send + 'static,
    S: Clone + Send + Sync + 'static,
    F: Fn(T, Task, S) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    type Handler = TypedHandler<T, F, markers::ValueStateFn>;

    fn into_typed_handler(self) -> Self::Handler {
        TypedHandler { f: self, _t: PhantomData }
    }
}
