//! [`SendReceipt`]: a message staged for the writer, resolving once it is durable.
//!
//! Every send staged in the same writer round shares one [`Completion`]: the writer settles it
//! once for the whole round (the first sequence of each send, or the round's error) and wakes
//! whoever waits. That is one allocation and one wake-up list per round instead of a oneshot
//! channel per message.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use crate::error::SendError;

/// The outcome of one staged round: the first sequence of each send in it, in staging order.
type Outcome = Result<Box<[u64]>, SendError>;

/// The shared completion of one staged round.
#[derive(Default)]
pub(crate) struct Completion {
    /// Set once, by [`Settle`]. `OnceLock` publishes it with release/acquire ordering.
    outcome: OnceLock<Outcome>,
    /// Receipts waiting for the outcome. Taken (under the lock) right after the outcome is
    /// set, so a receipt that finds no outcome under the lock is sure to be woken.
    wakers: Mutex<Vec<Waker>>,
}

impl Completion {
    fn result(&self, index: usize) -> Option<Result<u64, SendError>> {
        self.outcome.get().map(|o| match o {
            Ok(seqs) => seqs
                .get(index)
                .copied()
                .ok_or_else(|| SendError::Failed(format!("no sequence for staged send {index}"))),
            Err(e) => Err(e.clone()),
        })
    }

    /// Ready with send `index`'s first sequence, or registers the task's waker. `slot`
    /// remembers where this receipt's waker sits, so repeated polls replace it instead of
    /// adding more.
    fn poll(
        &self,
        index: usize,
        slot: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<u64, SendError>> {
        if let Some(r) = self.result(index) {
            return Poll::Ready(r);
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        // Checked again under the lock: `Settle` sets the outcome before it takes the wakers.
        if let Some(r) = self.result(index) {
            return Poll::Ready(r);
        }
        match slot.and_then(|i| wakers.get_mut(i)) {
            Some(w) => {
                if !w.will_wake(cx.waker()) {
                    w.clone_from(cx.waker());
                }
            }
            None => {
                wakers.push(cx.waker().clone());
                *slot = Some(wakers.len() - 1);
            }
        }
        Poll::Pending
    }
}

/// The writer's side of a [`Completion`]: settles it exactly once. Dropped unsettled (the
/// writer stopped or panicked with the round in hand), it fails the round with
/// [`SendError::Shutdown`], so no receipt waits forever.
pub(crate) struct Settle(Arc<Completion>);

impl Settle {
    pub fn new() -> (Self, Arc<Completion>) {
        let c = Arc::new(Completion::default());
        (Settle(c.clone()), c)
    }

    /// The completion the round's receipts wait on.
    pub fn completion(&self) -> Arc<Completion> {
        self.0.clone()
    }

    /// Resolves every receipt of the round: `Ok` with the first sequence of each send.
    pub fn finish(self, outcome: Result<Box<[u64]>, SendError>) {
        self.set(outcome);
    }

    fn set(&self, outcome: Outcome) {
        if self.0.outcome.set(outcome).is_err() {
            return;
        }
        let wakers = std::mem::take(&mut *self.0.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.0.outcome.get().is_none() {
            self.set(Err(SendError::Shutdown));
        }
    }
}

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
        f.debug_struct("SendReceipt")
            .field("resolved", &self.done.outcome.get().is_some())
            .finish_non_exhaustive()
    }
}

impl SendReceipt {
    pub(crate) fn new(done: Arc<Completion>, index: usize) -> Self {
        SendReceipt { done, index, slot: None }
    }
}

impl Future for SendReceipt {
    type Output = Result<u64, SendError>;

    /// # Cancel safety
    ///
    /// Cancel safe: the message's fate does not depend on the receipt being polled.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.done.poll(this.index, &mut this.slot, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_receipt_registers_once_and_is_woken_once_by_settle() {
        let (settle, done) = Settle::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut r = SendReceipt::new(done.clone(), 1);
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        assert_eq!(done.wakers.lock().unwrap().len(), 1, "a re-poll replaces, it does not add");
        settle.finish(Ok(vec![7, 9].into_boxed_slice()));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(Pin::new(&mut r).poll(&mut cx), Poll::Ready(Ok(9))));
    }

    #[test]
    fn an_unsettled_round_fails_its_receipts_with_shutdown_when_dropped() {
        let (settle, done) = Settle::new();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut r = SendReceipt::new(done, 0);
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        drop(settle);
        assert!(matches!(Pin::new(&mut r).poll(&mut cx), Poll::Ready(Err(SendError::Shutdown))));
    }
}
