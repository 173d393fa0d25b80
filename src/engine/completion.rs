//! The completion of one staged writer round, shared by the round's
//! [`SendReceipt`](crate::SendReceipt)s: the writer resolves it once for the whole round (the first sequence of
//! each send, or the round's error) and wakes whoever waits. That is one allocation and one
//! wake-up list per round instead of a oneshot channel per message.

use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use crate::error::{Error, FailedError};
use crate::sent::{Original, Sent};

/// The outcome of one staged round: the first sequence of each send in it, in staging order
/// (or, for a send whose idempotency key was a duplicate, its original: see [`staged_sent`]).
type Outcome = Result<Box<[u64]>, Error>;

/// Flags a send's value in a round's outcome as a duplicate: the rest is the original's
/// sequence, or with [`OF_SCHEDULED`] its schedule id. Sequences and schedule ids stay far below
/// 2^62 (a queue appending a billion messages a second would take 146 years to get there).
const DUPLICATE: u64 = 1 << 63;
const OF_SCHEDULED: u64 = 1 << 62;

/// The value of a send to a queue deleted before its round was written (nothing of it was
/// written): the send resolves with `Error::QueueDeleted`. Never a sequence or a
/// duplicate's value (both stay below 2^62).
pub(crate) const DELETED_VALUE: u64 = u64::MAX;

/// The value a duplicate send resolves with.
pub(crate) fn duplicate_value(original: Original) -> u64 {
    match original {
        Original::Appended(seq) => DUPLICATE | seq,
        Original::Scheduled(id) => DUPLICATE | OF_SCHEDULED | id,
    }
}

/// What a staged send's value says happened to it.
pub(crate) fn staged_sent(value: u64) -> Sent {
    if value & DUPLICATE == 0 {
        Sent::Appended(value)
    } else if value & OF_SCHEDULED != 0 {
        Sent::Duplicate(Original::Scheduled(value & !(DUPLICATE | OF_SCHEDULED)))
    } else {
        Sent::Duplicate(Original::Appended(value & !DUPLICATE))
    }
}

/// Sends of a round refused for a deleted queue: `(index in the round, queue name)`.
pub(crate) type DeletedSends = Box<[(usize, Arc<str>)]>;

/// The shared completion of one staged round.
#[derive(Default)]
pub(crate) struct Completion {
    /// Set once, by [`Resolver`]. `OnceLock` publishes it with release/acquire ordering.
    outcome: OnceLock<Outcome>,
    /// Receipts waiting for the outcome. Taken (under the lock) right after the outcome is
    /// set, so a receipt that finds no outcome under the lock is sure to be woken.
    wakers: Mutex<Vec<Waker>>,
    /// The sends of the round refused because their queue was deleted, by index, with the
    /// queue's name (set by the writer before it resolves the round; empty almost always).
    deleted: OnceLock<DeletedSends>,
}

impl Completion {
    /// Receipts registered to be woken (tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.wakers.lock().map_or(0, |w| w.len())
    }

    /// Whether the round's outcome is known.
    pub(crate) fn is_resolved(&self) -> bool {
        self.outcome.get().is_some()
    }

    /// Records which sends of the round were refused for a deleted queue (before it resolves).
    pub(crate) fn note_deleted(&self, sends: DeletedSends) {
        let _ = self.deleted.set(sends);
    }

    fn deleted_queue(&self, index: usize) -> String {
        let sends = self.deleted.get().map_or(&[][..], |s| &s[..]);
        sends.iter().find(|(i, _)| *i == index).map_or_else(String::new, |(_, q)| q.to_string())
    }

    fn result(&self, index: usize) -> Option<Result<u64, Error>> {
        self.outcome.get().map(|o| match o {
            Ok(seqs) => match seqs.get(index).copied() {
                Some(DELETED_VALUE) => Err(Error::QueueDeleted { queue: self.deleted_queue(index) }),
                Some(v) => Ok(v),
                None => {
                    Err(Error::Failed(FailedError::internal(format!("no sequence for staged send {index}"))))
                }
            },
            Err(e) => Err(e.clone()),
        })
    }

    /// Ready with send `index`'s first sequence, or registers the task's waker. `slot`
    /// remembers where this receipt's waker sits, so repeated polls replace it instead of
    /// adding more.
    pub(crate) fn poll(
        &self,
        index: usize,
        slot: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<u64, Error>> {
        if let Some(r) = self.result(index) {
            return Poll::Ready(r);
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        // Checked again under the lock: `Resolver` sets the outcome before it takes the wakers.
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
/// [`Error::Shutdown`], so no receipt waits forever.
pub(crate) struct Resolver(Arc<Completion>);

impl Resolver {
    pub fn new() -> (Self, Arc<Completion>) {
        let c = Arc::new(Completion::default());
        (Resolver(c.clone()), c)
    }

    /// The completion the round's receipts wait on.
    pub fn completion(&self) -> Arc<Completion> {
        self.0.clone()
    }

    /// Resolves every receipt of the round: `Ok` with the first sequence of each send.
    pub fn resolve(self, outcome: Result<Box<[u64]>, Error>) {
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

impl Drop for Resolver {
    fn drop(&mut self) {
        if self.0.outcome.get().is_none() {
            self.set(Err(Error::Shutdown));
        }
    }
}
