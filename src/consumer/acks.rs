//! The acknowledgement window of one subscription.
//!
//! Deliveries may be acknowledged in any order (for example through `buffer_unordered`), but
//! the group's offset means "everything up to here is done", so it only moves over a contiguous
//! run of acknowledged sequences. The window remembers, for every delivered sequence above the
//! offset, whether it was acknowledged.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::task::AtomicWaker;

use crate::broker::Shared;
use crate::registry::GroupState;
use crate::store::RawMessage;

/// State shared by a [`Subscription`](crate::Subscription) and its outstanding
/// [`Delivery`](crate::Delivery)s. The group's active-subscriber slot is released when the
/// last of them is dropped, so acks from deliveries that outlive the stream still count.
pub(crate) struct SubShared {
    pub shared: Arc<Shared>,
    pub group: Arc<GroupState>,
    window: Mutex<AckWindow>,
    /// Most sequences handed out beyond the offset (`Group::max_unacked`).
    pub max_unacked: usize,
    /// The subscription's task, woken when an ack frees window space or a delivery comes back.
    pub waker: AtomicWaker,
}

pub(crate) struct AckWindow {
    /// Lowest sequence not yet acknowledged: the offset is `base - 1`.
    base: u64,
    /// `acked[i]`: whether `base + i` was acknowledged. Covers every sequence handed out.
    acked: VecDeque<bool>,
    /// Deliveries dropped or nacked without an ack, to be handed out again, with the number of
    /// times each was delivered so far.
    pub redeliver: BTreeMap<u64, (RawMessage, u32)>,
}

impl AckWindow {
    /// Sequences handed out and not yet covered by the offset.
    pub fn len(&self) -> usize {
        self.acked.len()
    }

    /// Records that the next sequence (`base + len`) was handed out.
    pub fn push(&mut self, seq: u64) {
        debug_assert_eq!(seq, self.base + self.acked.len() as u64);
        self.acked.push_back(false);
    }

    /// Sequence the next hand-out must have.
    pub fn next(&self) -> u64 {
        self.base + self.acked.len() as u64
    }

    /// Retention deleted everything below `first` that was not handed out yet: count those as
    /// done (nobody can receive them), and drop handed-back ones below it too. Returns the new
    /// offset if the prefix grew.
    pub fn skip_to(&mut self, first: u64) -> Option<u64> {
        let gone: Vec<u64> = self.redeliver.range(..first).map(|(&s, _)| s).collect();
        for s in gone {
            self.redeliver.remove(&s);
            self.ack(s);
        }
        let before = self.base;
        if self.acked.is_empty() {
            self.base = self.base.max(first);
        } else {
            while self.next() < first {
                self.acked.push_back(true);
            }
            while self.acked.front() == Some(&true) {
                self.acked.pop_front();
                self.base += 1;
            }
        }
        (self.base > before).then(|| self.base - 1)
    }

    /// Marks `seq` acknowledged; returns the new offset if the contiguous prefix grew.
    pub fn ack(&mut self, seq: u64) -> Option<u64> {
        let idx = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        *self.acked.get_mut(idx)? = true;
        let before = self.base;
        while self.acked.front() == Some(&true) {
            self.acked.pop_front();
            self.base += 1;
        }
        (self.base > before).then(|| self.base - 1)
    }
}

impl SubShared {
    pub fn new(shared: Arc<Shared>, group: Arc<GroupState>, start: u64, max_unacked: usize) -> Arc<Self> {
        Arc::new(SubShared {
            shared,
            group,
            window: Mutex::new(AckWindow { base: start, acked: VecDeque::new(), redeliver: BTreeMap::new() }),
            max_unacked,
            waker: AtomicWaker::new(),
        })
    }

    /// Whether the window is full: no new sequence may be handed out until the offset moves.
    pub fn is_full(&self, w: &AckWindow) -> bool {
        w.len() >= self.max_unacked
    }

    /// Deliveries handed out and not acknowledged (handed-back ones wait, they are not out).
    pub fn in_flight(&self) -> u64 {
        let w = self.window();
        w.acked.iter().filter(|a| !**a).count().saturating_sub(w.redeliver.len()) as u64
    }

    pub fn window(&self) -> MutexGuard<'_, AckWindow> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Retention deleted everything below `first` before it was handed out: skip it.
    pub fn skip_to(&self, first: u64) {
        let (from, advanced) = {
            let mut w = self.window();
            let from = w.next();
            (from, w.skip_to(first))
        };
        if first > from {
            let g = &self.group;
            g.skipped.fetch_add(first - from, Ordering::Relaxed);
            tracing::warn!(queue = %g.queue.name, group = %g.name, from, to = first - 1, "rockq: retention skipped messages a group had not received");
            self.shared.engine.emit(|| crate::Event::Skipped {
                queue: g.queue.name.clone(),
                group: g.name.clone(),
                from,
                to: first - 1,
            });
        }
        if let Some(offset) = advanced
            && self.group.advance(offset)
        {
            self.shared.engine.mark_dirty(self.group.clone());
            self.shared.nudge_writer();
        }
    }

    /// Records an acknowledgement and, if the offset moved, hands the group to the writer.
    pub fn ack(&self, seq: u64) {
        let (advanced, was_full) = {
            let mut w = self.window();
            let full = self.is_full(&w);
            (w.ack(seq), full)
        };
        if let Some(offset) = advanced {
            if self.group.advance(offset) {
                self.shared.engine.mark_dirty(self.group.clone());
                self.shared.nudge_writer();
            }
            // Only a stream stopped on a full window needs waking; waking on every ack would
            // re-poll a busy consumer for nothing.
            if was_full {
                self.waker.wake();
            }
        }
    }

    /// Puts an unacknowledged delivery back to be handed out again.
    pub fn give_back(&self, msg: RawMessage, delivered: u32) {
        self.window().redeliver.insert(msg.seq, (msg, delivered));
        self.waker.wake();
    }
}

impl Drop for SubShared {
    fn drop(&mut self) {
        self.group.active.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(base: u64) -> AckWindow {
        AckWindow { base, acked: VecDeque::new(), redeliver: BTreeMap::new() }
    }

    #[test]
    fn offset_moves_only_over_the_contiguous_prefix() {
        let mut w = window(10);
        (10..15).for_each(|s| w.push(s));
        assert_eq!(w.ack(12), None);
        assert_eq!(w.ack(11), None);
        assert_eq!(w.ack(14), None);
        assert_eq!(w.ack(10), Some(12));
        assert_eq!(w.len(), 2);
        assert_eq!(w.ack(13), Some(14));
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn offset_is_always_the_longest_acknowledged_prefix_under_random_orders() {
        // A small deterministic generator: no dependency, reproducible failures.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for round in 0..200 {
            let n = 1 + rand(64);
            let base = 1 + rand(1000) as u64;
            let mut w = window(base);
            (0..n as u64).for_each(|i| w.push(base + i));
            let mut order: Vec<u64> = (0..n as u64).map(|i| base + i).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rand(i + 1));
            }
            let mut acked = std::collections::BTreeSet::new();
            let mut offset = base - 1;
            for seq in order {
                acked.insert(seq);
                let expected = (base..).take_while(|s| acked.contains(s)).last().unwrap_or(base - 1);
                if let Some(o) = w.ack(seq) {
                    assert!(o > offset, "round {round}: offset went back");
                    offset = o;
                }
                assert_eq!(offset, expected, "round {round}");
                assert_eq!(w.len() as u64, base + n as u64 - 1 - offset);
            }
        }
    }

    #[test]
    fn skipping_a_trimmed_head_counts_as_done_but_keeps_unacked_deliveries() {
        let mut w = window(1);
        (1..=3).for_each(|s| w.push(s)); // 1..=3 handed out, none acked
        assert_eq!(w.skip_to(10), None, "1..=3 still unacked hold the offset");
        assert_eq!(w.next(), 10);
        assert_eq!(w.ack(2), None);
        assert_eq!(w.ack(3), None);
        assert_eq!(w.ack(1), Some(9), "the skipped 4..=9 count as done");
        let mut empty = window(5);
        assert_eq!(empty.skip_to(8), Some(7));
        assert_eq!(empty.skip_to(6), None, "never backwards");
    }

    #[test]
    fn stale_or_unknown_acks_change_nothing() {
        let mut w = window(5);
        w.push(5);
        assert_eq!(w.ack(4), None);
        assert_eq!(w.ack(6), None);
        assert_eq!(w.len(), 1);
        assert_eq!(w.ack(5), Some(5));
        assert_eq!(w.ack(5), None);
    }
}
