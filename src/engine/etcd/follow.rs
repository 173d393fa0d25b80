//! Following one etcd watch: what the namespace-wide watches (`watch.rs`, `settings.rs`,
//! `deletion.rs`) share. Each re-reads the state it follows when its watch breaks, then watches
//! again from there; this is the part in between.

use std::sync::{Arc, Weak};

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::error::StorageError;

/// How following a watch ended.
pub(super) enum Followed {
    /// The watch broke or ended: re-read and watch again.
    Broke,
    /// `stop` was cancelled, or the engine is gone: follow no more.
    Stopped,
}

/// Hands each batch of `stream` to `apply` until the watch breaks or ends, `stop` is
/// cancelled or the engine is gone. `what` names the watch in the log.
///
/// (`apply` returns its future rather than being an async closure: an async closure's future
/// borrows its arguments for any lifetime, which the spawned task's `Send` bound cannot prove.)
pub(super) async fn follow<T, F: Future<Output = ()>>(
    stream: impl Stream<Item = Result<Vec<T>, StorageError>>,
    what: &str,
    engine: &Weak<Engine>,
    stop: &CancellationToken,
    mut apply: impl FnMut(Arc<Engine>, Vec<T>) -> F,
) -> Followed {
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return Followed::Stopped,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(batch)) => {
                let Some(engine) = engine.upgrade() else { return Followed::Stopped };
                apply(engine, batch).await;
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "rockq: etcd {what} watch broke; re-reading");
                return Followed::Broke;
            }
            None => return Followed::Broke,
        }
    }
}
