//! [`SendReceipt`]: a message in the writer's queue, resolving once it is durable.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::SendError;
use crate::registry::QueueState;

/// A message accepted by the writer but not yet durable. Resolves to the message's sequence
/// once it is, exactly as [`Queue::send`](crate::Queue::send) would have.
///
/// Returned by [`Queue::enqueue`](crate::Queue::enqueue). Holding several receipts lets one
/// task keep many sends in flight: they share the writer's group commits, and the task is
/// woken once per commit rather than once per message.
///
/// Dropping a receipt does not withdraw the message: it is written all the same, and only its
/// sequence (or error) goes unobserved.
#[must_use = "a receipt resolves to the sequence once the message is durable"]
pub struct SendReceipt {
    rx: oneshot::Receiver<Result<u64, SendError>>,
    queue: Arc<QueueState>,
}

impl std::fmt::Debug for SendReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendReceipt").field("queue", &self.queue.name).finish_non_exhaustive()
    }
}

impl SendReceipt {
    pub(crate) fn new(rx: oneshot::Receiver<Result<u64, SendError>>, queue: Arc<QueueState>) -> Self {
        SendReceipt { rx, queue }
    }
}

impl Future for SendReceipt {
    type Output = Result<u64, SendError>;

    /// # Cancel safety
    ///
    /// Cancel safe: the message's fate does not depend on the receipt being polled.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            // The writer dropped the reply only when it stopped without writing the message.
            Poll::Ready(res) => res.unwrap_or(Err(SendError::Shutdown)),
        };
        if let Ok(seq) = res {
            // Per message, so TRACE only: INFO stays quiet on the hot path.
            tracing::trace!(queue = %self.queue.name, seq, "rockq: sent");
        }
        Poll::Ready(res)
    }
}
