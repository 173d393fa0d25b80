//! The schedule's timer: one task that sleeps on the broker's clock until the earliest entry of
//! the due index (a delayed message or a recurring firing), then asks the writer to fire what
//! is due. No polling: the writer tells the timer the new earliest time whenever it changes
//! (an earlier entry was written, or a firing took the head), and the timer sleeps again.
//!
//! The earliest time is the writer's knowledge, set on the writer thread as requests enter a
//! round, so it can never run behind what the writer wrote: the `Fire` request that follows
//! is applied after that round's batch is in the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use super::request::{Request, ScheduleRequest};
use super::shared::Shared;

/// No entry is due ever.
const NONE: u64 = u64::MAX;

/// The earliest due time, shared by the writer (which sets it) and the timer task.
#[derive(Debug)]
pub(crate) struct Timer {
    next: AtomicU64,
    changed: Notify,
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

/// Starts the timer task. It holds the broker only weakly (and only to send `Fire`), so
/// dropping every handle still closes it; shutdown stops it.
pub(crate) fn spawn(shared: &Arc<Shared>, timer: Arc<Timer>) {
    let weak = Arc::downgrade(shared);
    let clock = shared.clock().clone();
    let closing = shared.closing.clone();
    shared.runtime.spawn(async move {
        loop {
            // Registered before the look at `next`, so a change between the two still wakes us
            // (`notify_one` stores a permit if nobody waits yet).
            let changed = timer.changed.notified();
            let wait = match timer.next() {
                Some(due) if due <= clock.wall_micros() => {
                    let Some(shared) = weak.upgrade() else { return };
                    if shared.tx.send(Request::Schedule(ScheduleRequest::Fire)).await.is_err() {
                        return;
                    }
                    drop(shared);
                    // The writer sets the next time after the firing, which wakes us.
                    None
                }
                Some(due) => Some(clock.instant_at_wall(due)),
                None => None,
            };
            tokio::select! {
                _ = changed => {}
                _ = async {
                    match wait {
                        Some(at) => clock.sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
                _ = closing.cancelled() => return,
            }
        }
    });
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
