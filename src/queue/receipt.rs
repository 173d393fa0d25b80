//! [`SendReceipt`]: a message staged for the writer, resolving once it is durable.
//!
//! Every send staged in the same writer round shares one `Completion` (`engine/completion.rs`),
//! which the writer resolves once for the whole round.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::engine::boundary::{Completion, staged_sent};
use crate::error::Error;
use crate::sent::{Original, Sent};

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
    done: Arc<Completion>,
    index: usize,
    slot: Option<usize>,
}

impl std::fmt::Debug for SendReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendReceipt").field("resolved", &self.done.is_resolved()).finish_non_exhaustive()
    }
}

impl SendReceipt {
    pub(crate) fn new(done: Arc<Completion>, index: usize) -> Self {
        SendReceipt { done, index, slot: None }
    }
}

impl SendReceipt {
    /// What became of the send, once durable (for `Queue::submit`).
    pub(crate) async fn sent(mut self) -> Result<Sent, Error> {
        std::future::poll_fn(|cx| self.done.poll(self.index, &mut self.slot, cx)).await.map(staged_sent)
    }
}

impl Future for SendReceipt {
    /// The message's sequence; for a message whose idempotency key was a duplicate, its
    /// original's sequence (nothing was written).
    type Output = Result<u64, Error>;

    /// # Cancel safety
    ///
    /// Cancel safe: the message's fate does not depend on the receipt being polled.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.done.poll(this.index, &mut this.slot, cx).map(|r| {
            r.and_then(|v| match staged_sent(v) {
                Sent::Appended(seq) | Sent::Duplicate(Original::Appended(seq)) => Ok(seq),
                _ => Err(Error::NeedsSubmit { index: 0, reason: "duplicates a delayed message" }),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::boundary::Resolver;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::task::Waker;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_receipt_registers_once_and_is_woken_once_by_its_resolver() {
        let (settle, done) = Resolver::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut r = SendReceipt::new(done.clone(), 1);
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        assert_eq!(done.waiting(), 1, "a re-poll replaces, it does not add");
        settle.resolve(Ok(vec![7, 9].into_boxed_slice()));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(Pin::new(&mut r).poll(&mut cx), Poll::Ready(Ok(9))));
    }

    #[test]
    fn an_unsettled_round_fails_its_receipts_with_shutdown_when_dropped() {
        let (settle, done) = Resolver::new();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut r = SendReceipt::new(done, 0);
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        drop(settle);
        assert!(matches!(Pin::new(&mut r).poll(&mut cx), Poll::Ready(Err(Error::Shutdown))));
    }
}
