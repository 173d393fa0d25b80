//! `tower` feature: a `tower::Service<Task, Response = ()>` as a worker-pool handler, so that
//! timeout, concurrency-limit, rate-limit, load-shed and tracing layers apply to jobs as they
//! do to requests in axum or tonic.

use tokio::sync::Mutex;
use tower::Service;

use super::{Handler, HandlerError, IntoHandler, markers};
use crate::codec::BoxError;
use crate::work::Task;

/// A `tower::Service` run by a worker pool. Workers take turns at `poll_ready` + `call` (under
/// one lock, as `tower::buffer` does, so services that are not `Clone` — a rate limit — work
/// and their readiness is respected); the calls' futures then run concurrently, each in its
/// worker. A service's error retries the job with the group's backoff, unless it is a
/// [`HandlerError::into_boxed`] error, which keeps its action (e.g. dead-letter).
pub struct ServiceHandler<Svc> {
    svc: Mutex<Svc>,
}

impl<Svc> std::fmt::Debug for ServiceHandler<Svc> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceHandler")
    }
}

#[async_trait::async_trait]
impl<S, Svc> Handler<S> for ServiceHandler<Svc>
where
    S: Send + Sync + 'static,
    Svc: Service<Task, Response = ()> + Send + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send + 'static,
{
    async fn handle(&self, task: Task, _: &S) -> Result<(), HandlerError> {
        let call = {
            let mut svc = self.svc.lock().await;
            match futures::future::poll_fn(|cx| svc.poll_ready(cx)).await {
                Ok(()) => svc.call(task),
                Err(e) => return Err(HandlerError::from_error(e)),
            }
        };
        call.await.map_err(HandlerError::from_error)
    }
}

impl<S, Svc> IntoHandler<S, markers::Service> for Svc
where
    S: Send + Sync + 'static,
    Svc: Service<Task, Response = ()> + Send + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send + 'static,
{
    type Handler = ServiceHandler<Svc>;

    fn into_handler(self) -> ServiceHandler<Svc> {
        ServiceHandler { svc: Mutex::new(self) }
    }
}
