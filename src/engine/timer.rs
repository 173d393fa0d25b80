//! The schedule's timer (its task is in `tasks.rs`): one task that sleeps on the broker's clock until the earliest entry of
//! the due index (a delayed message or a recurring firing), then asks the writer to fire what
//! is due. No polling: the writer tells the timer the new earliest time whenever it changes
//! (an earlier entry was written, or a firing took the head), and the timer sleeps again.
//!
//! The earliest time is the writer's knowledge, set on the writer thread as requests enter a
//! round, so it can never run behind what the writer wrote: the `Fire` request that follows
//! is applied after that round's batch is in the store.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// No entry is due ever.
const NONE: u64 = u64::MAX;

/// The earliest due time, shared by the writer (which sets it) and the timer task.
#[derive(Debug)]
pub(crate) struct Timer {
    next: AtomicU64,
    pub(super) changed: Notify,
    /// The next schedule id as loaded at open (the writer counts on from it).
    pub first_id: u64,
}

impl Timer {
    pub fn new(first_due: Option<u64>, first_id: u64) -> Self {
        Timer { next: AtomicU64::new(first_due.unwrap_or(NONE)), changed: Notify::new(), first_id }
    }

    /// The earliest due time (µs since the epoch), if anything is scheduled.
    pub fn next(&self) -> Option<u64> {
        Some(self.next.load(Ordering::Acquire)).filter(|&n| n != NONE)
    }

    /// Writer: an entry due at `due` was written; wake the timer if it is the earliest.
    pub fn offer(&self, due: u64) {
        if self.next.fetch_min(due, Ordering::AcqRel) > due {
            self.changed.notify_one();
        }
    }

    /// Writer: after a firing, `next` is the earliest entry left (`None`: nothing).
    pub fn set(&self, next: Option<u64>) {
        self.next.store(next.unwrap_or(NONE), Ordering::Release);
        self.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_keep_the_earliest_and_set_replaces_it() {
        let t = Timer::new(None, 1);
        assert_eq!(t.next(), None);
        t.offer(50);
        t.offer(70);
        assert_eq!(t.next(), Some(50));
        t.offer(20);
        assert_eq!(t.next(), Some(20));
        t.set(Some(90));
        assert_eq!(t.next(), Some(90));
        t.set(None);
        assert_eq!(t.next(), None);
    }
}
