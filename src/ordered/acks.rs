//! The acknowledgement window of one subscription.
//!
//! Deliveries may be acknowledged in any order (for example through `buffer_unordered`), but
//! the group's offset means "everything up to here is done", so it only moves over a contiguous
//! run of acknowledged sequences. The window remembers, for every delivered sequence above the
//! offset, whether it was acknowledged.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

use crate::engine::boundary::{self, LiveSubscription, OrderedGroupState, PendingRecord, RawMessage, Shared};

/// Longest wait [`Delivery::nack_after`](crate::Delivery::nack_after) takes; longer delays are
/// clamped to it (documented there).
/// How long an ordered delivery whose transaction conflicted waits before it is delivered
/// again: about one commit, so that the write it lost to is applied by then.
pub(crate) const CONFLICT_PAUSE: Duration = Duration::from_millis(5);

pub(crate) const MAX_NACK_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How a delivery came back without an ack.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Comeback {
    Dropped,
    Nacked,
    After(Duration),
}

impl Comeback {
    fn describe(self) -> String {
        match self {
            Comeback::Dropped => "dropped without an ack".into(),
            Comeback::Nacked => "nacked".into(),
            Comeback::After(d) => format!("nacked with a delay of {d:?}"),
        }
    }
}

/// Poison-message settings of a subscription (`Group::max_deliveries`).
#[derive(Debug, Clone)]
pub(crate) struct PoisonConfig {
    /// Deliveries after which a message that comes back is dead-lettered (`None`: never).
    pub max_deliveries: Option<u32>,
    /// Where it goes.
    pub dlq: Arc<str>,
}

/// State shared by a [`Subscription`](crate::Subscription) and its outstanding
/// [`Delivery`](crate::Delivery)s. The group's active-subscriber slot is released when the
/// last of them is dropped, so acks from deliveries that outlive the stream still count.
pub(crate) struct SubShared {
    pub shared: Arc<Shared>,
    pub group: Arc<OrderedGroupState>,
    window: Mutex<AckWindow>,
    /// Most sequences handed out beyond the offset (`Group::max_unacked`).
    pub max_unacked: usize,
    /// The subscription's task, woken when an ack frees window space or a delivery comes back.
    pub waker: AtomicWaker,
    pub poison: PoisonConfig,
    /// Cross-process ownership of the group (the etcd engine), released with this.
    _owner: boundary::OwnerHold,
}

pub(crate) struct AckWindow {
    /// Lowest sequence not yet acknowledged: the offset is `base - 1`.
    base: u64,
    /// Sequence the next hand-out must have.
    next: u64,
    /// The handed-out sequences above the offset, as runs of consecutive sequences, oldest
    /// first. Between two runs lies a range that retention deleted before it was handed out:
    /// it counts as done without taking an entry, so a trim of any size costs nothing here.
    /// When not empty, the first run starts at `base` with an unacknowledged sequence.
    runs: VecDeque<Run>,
    /// Entries in `runs`: sequences handed out beyond the offset (`max_unacked` bounds it).
    len: usize,
    /// Deliveries dropped or nacked without an ack, to be handed out again, with the number of
    /// times each was delivered so far.
    pub redeliver: BTreeMap<u64, (RawMessage, u32)>,
    /// Deliveries nacked with a delay, by due time: they join `redeliver` when due.
    pub delayed: BTreeMap<(Instant, u64), (RawMessage, u32)>,
    /// Counts from earlier subscriptions (and restarts) of messages not handed out yet:
    /// deliveries that came back, and the wall-clock time (µs) before which not to deliver.
    pub prior: BTreeMap<u64, (u32, u64)>,
    /// Messages above the offset already dead-lettered: done without being handed out.
    dead: BTreeSet<u64>,
}

/// Consecutive handed-out sequences from `start`: `acked[i]` is whether `start + i` was
/// acknowledged.
struct Run {
    start: u64,
    acked: VecDeque<bool>,
}

impl AckWindow {
    fn new(start: u64) -> Self {
        AckWindow {
            base: start,
            next: start,
            runs: VecDeque::new(),
            len: 0,
            redeliver: BTreeMap::new(),
            delayed: BTreeMap::new(),
            prior: BTreeMap::new(),
            dead: BTreeSet::new(),
        }
    }

    /// Whether `seq` (the next to hand out) was dead-lettered before: it is then pushed and
    /// acknowledged without being delivered.
    pub fn is_dead(&self, seq: u64) -> bool {
        !self.dead.is_empty() && self.dead.contains(&seq)
    }

    /// With nothing handed out beyond the offset, dead-lettered messages right after it are
    /// done: the offset passes them without handing them out (so it does not wait for the
    /// stream to reach them).
    fn absorb_dead(&mut self) {
        if self.dead.is_empty() {
            return;
        }
        while self.runs.is_empty() && self.dead.first() == Some(&self.next) {
            self.dead.pop_first();
            self.next += 1;
            self.base = self.next;
        }
        // Anything below is behind the offset already.
        while self.dead.first().is_some_and(|&s| s < self.next) {
            self.dead.pop_first();
        }
    }

    /// Moves delayed deliveries due at `now` to `redeliver`.
    pub fn release_due(&mut self, now: Instant) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, seq), v) = entry.remove_entry();
            self.redeliver.insert(seq, v);
        }
    }

    /// When the first delayed delivery is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.first_key_value().map(|((t, _), _)| *t)
    }

    /// Sequences handed out and not yet covered by the offset.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Records that the next sequence (`next()`) was handed out.
    pub fn push(&mut self, seq: u64) {
        debug_assert_eq!(seq, self.next);
        match self.runs.back_mut() {
            Some(run) if run.start + run.acked.len() as u64 == seq => run.acked.push_back(false),
            _ => self.runs.push_back(Run { start: seq, acked: VecDeque::from([false]) }),
        }
        self.next = seq + 1;
        self.len += 1;
    }

    /// Sequence the next hand-out must have.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Handed-out sequences not acknowledged (handed-back ones included).
    fn unacked(&self) -> usize {
        self.runs.iter().map(|r| r.acked.iter().filter(|a| !**a).count()).sum()
    }

    /// Retention deleted everything below `first` that was not handed out yet: count those as
    /// done (nobody can receive them), and drop handed-back ones below it too. Returns the new
    /// offset if the prefix grew. Costs O(handed-back entries below `first`), whatever the
    /// size of the trimmed range.
    pub fn skip_to(&mut self, first: u64) -> Option<u64> {
        let before = self.base;
        let keep = self.redeliver.split_off(&first);
        let mut gone: Vec<u64> = std::mem::replace(&mut self.redeliver, keep).into_keys().collect();
        if self.delayed.keys().any(|&(_, s)| s < first) {
            let (below, keep) =
                std::mem::take(&mut self.delayed).into_iter().partition(|((_, s), _)| *s < first);
            self.delayed = keep;
            gone.extend(below.into_keys().map(|(_, s)| s));
        }
        for s in gone {
            self.ack(s);
        }
        self.prior = self.prior.split_off(&first);
        if self.next < first {
            // The skipped range needs no entry: the next hand-out starts a new run at `first`.
            self.next = first;
            if self.runs.is_empty() {
                self.base = first;
            }
        }
        self.absorb_dead();
        (self.base > before).then(|| self.base - 1)
    }

    /// Marks `seq` acknowledged; returns the new offset if the contiguous prefix grew.
    pub fn ack(&mut self, seq: u64) -> Option<u64> {
        // Almost always the first run; there is one more run per trim that happened while
        // deliveries were out.
        let run = self.runs.iter_mut().find(|r| r.start <= seq && seq - r.start < r.acked.len() as u64)?;
        let slot = run.acked.get_mut(usize::try_from(seq - run.start).ok()?)?;
        if *slot {
            return None;
        }
        *slot = true;
        let before = self.base;
        while let Some(run) = self.runs.front_mut() {
            while run.acked.front() == Some(&true) {
                run.acked.pop_front();
                run.start += 1;
                self.len -= 1;
            }
            if !run.acked.is_empty() {
                self.base = run.start;
                break;
            }
            self.runs.pop_front();
            // Everything up to the next run (a trimmed range) or to `next` is done.
            self.base = self.runs.front().map_or(self.next, |r| r.start);
        }
        self.absorb_dead();
        (self.base > before).then(|| self.base - 1)
    }
}

impl SubShared {
    /// A subscription starting at `start`, with the counts and dead letters the group
    /// remembers above it.
    pub fn new(
        shared: Arc<Shared>,
        group: Arc<OrderedGroupState>,
        start: u64,
        max_unacked: usize,
        poison: PoisonConfig,
        owner: boundary::OwnerHold,
    ) -> Arc<Self> {
        let mut window = AckWindow::new(start);
        {
            let rec = group.records();
            window.prior = rec.failed.range(start..).map(|(&s, &v)| (s, v)).collect();
            window.dead = rec.dead.range(start..).copied().collect();
        }
        // Dead letters right after the offset are passed at once.
        let advanced = {
            window.absorb_dead();
            (window.base > start).then(|| window.base - 1)
        };
        let sub = Arc::new(SubShared {
            shared,
            group,
            window: Mutex::new(window),
            max_unacked,
            waker: AtomicWaker::new(),
            poison,
            _owner: owner,
        });
        sub.advanced(advanced);
        sub
    }

    /// Hands a grown offset to the writer.
    pub fn advanced(&self, offset: Option<u64>) {
        if let Some(offset) = offset
            && self.group.advance(offset)
        {
            self.shared.mark_dirty(self.group.clone());
            self.shared.nudge_writer();
        }
    }

    /// Hands the group's pending records to the writer.
    fn to_writer(&self) {
        if self.group.mark() {
            self.shared.mark_dirty(self.group.clone());
            self.shared.nudge_writer();
        }
    }

    /// Whether the window is full: no new sequence may be handed out until the offset moves.
    pub fn is_full(&self, w: &AckWindow) -> bool {
        w.len() >= self.max_unacked
    }

    /// Deliveries handed out and not acknowledged (handed-back ones wait, they are not out).
    pub fn in_flight(&self) -> u64 {
        let w = self.window();
        w.unacked().saturating_sub(w.redeliver.len() + w.delayed.len()) as u64
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
        // A purge asked for its range to go: only what retention deleted counts as skipped.
        let from = from.max(self.group.queue.purged_through.load(Ordering::Acquire).saturating_add(1));
        if first > from {
            let g = &self.group;
            g.skipped.fetch_add(first - from, Ordering::Relaxed);
            tracing::warn!(queue = %g.queue.name, group = %g.name, from, to = first - 1, "rockq: retention skipped messages a group had not received");
            self.shared.emit(|| crate::events::Event::Skipped {
                queue: g.queue.name.clone(),
                group: g.name.clone(),
                from,
                to: first - 1,
            });
        }
        self.advanced(advanced);
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
                self.shared.mark_dirty(self.group.clone());
                self.shared.nudge_writer();
            }
            // Only a stream stopped on a full window needs waking; waking on every ack would
            // re-poll a busy consumer for nothing.
            if was_full {
                self.waker.wake();
            }
        }
    }

    /// A delivery came back without an ack after being delivered `delivered` times: it is
    /// handed out again (at once, or after the delay), and its count is persisted in the
    /// writer's next round; or, if that was its last delivery, it is dead-lettered.
    pub fn give_back(self: &Arc<Self>, msg: RawMessage, delivered: u32, how: Comeback) {
        let seq = msg.seq;
        let exhausted = self.poison.max_deliveries.is_some_and(|max| delivered >= max);
        // After shutdown or a failed write nothing reaches the disk any more: the message is
        // simply delivered again after the next open.
        let writable = self.shared.is_writable();
        if exhausted && writable {
            let noun = if delivered == 1 { "delivery" } else { "deliveries" };
            let reason = format!("{delivered} {noun} used up; last: {}", how.describe());
            self.dead_letter(msg, delivered, reason);
            return;
        }
        let clock = self.shared.clock();
        let (due, not_before_micros) = match how {
            Comeback::After(d) if !d.is_zero() => {
                let d = d.min(MAX_NACK_DELAY);
                let now = clock.now();
                // `now + d` cannot overflow for d <= MAX_NACK_DELAY on any real clock; if it
                // did, the message is due at once rather than panicking.
                let due = now.checked_add(d).unwrap_or(now);
                let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                (Some(due), clock.wall_micros().saturating_add(micros))
            }
            _ => (None, 0),
        };
        if writable {
            {
                let mut rec = self.group.records();
                rec.failed.insert(seq, (delivered, not_before_micros));
                rec.pending.push(PendingRecord::Failed { seq, deliveries: delivered, not_before_micros });
            }
            self.to_writer();
        }
        {
            let mut w = self.window();
            match due {
                Some(due) => drop(w.delayed.insert((due, seq), (msg, delivered))),
                None => drop(w.redeliver.insert(seq, (msg, delivered))),
            }
        }
        self.waker.wake();
    }

    /// A transaction acking `msg` conflicted: someone wrote first; the message did not fail. It
    /// comes back after [`CONFLICT_PAUSE`] — so that a loop retrying against a busy key does
    /// not spin on redeliveries — with its delivery uncounted: the next delivery carries the
    /// same `delivery_count`, and conflicts never bring it nearer the poison limit. Nothing is
    /// recorded: a restart simply delivers it again.
    pub fn give_back_conflicted(self: &Arc<Self>, msg: RawMessage, delivered: u32) {
        let seq = msg.seq;
        let now = self.shared.clock().now();
        let due = now.checked_add(CONFLICT_PAUSE).unwrap_or(now);
        self.window().delayed.insert((due, seq), (msg, delivered.saturating_sub(1)));
        self.waker.wake();
    }

    /// A delivery gives up (the application's `Delivery::dead_letter`, or its last delivery
    /// came back): it moves to the group's dead-letter queue with `reason` in the writer's
    /// next round. `false` (and nothing recorded) once nothing reaches the disk any more.
    pub fn dead_letter(self: &Arc<Self>, msg: RawMessage, delivered: u32, reason: String) -> bool {
        if !self.shared.is_writable() {
            // Nothing reaches the disk any more: delivered again after the next open.
            return false;
        }
        let sub = self.clone();
        self.group.records().pending.push(PendingRecord::DeadLetter {
            msg,
            deliveries: delivered,
            reason,
            sub,
        });
        self.to_writer();
        true
    }

    /// Puts a delivery back to be handed out again at once, counting nothing (a dead letter
    /// that could not be written).
    pub fn redeliver(&self, msg: RawMessage, delivered: u32) {
        self.window().redeliver.insert(msg.seq, (msg, delivered));
        self.waker.wake();
    }
}

impl LiveSubscription for SubShared {
    fn in_flight(&self) -> u64 {
        SubShared::in_flight(self)
    }

    fn dead_letter_queue(&self) -> Arc<str> {
        self.poison.dlq.clone()
    }

    fn ack(&self, seq: u64) {
        SubShared::ack(self, seq)
    }

    fn redeliver(&self, msg: RawMessage, deliveries: u32) {
        SubShared::redeliver(self, msg, deliveries)
    }

    fn hand_back(self: Arc<Self>, msg: RawMessage, deliveries: u32, conflicted: bool) {
        match conflicted {
            true => SubShared::give_back_conflicted(&self, msg, deliveries),
            false => SubShared::give_back(&self, msg, deliveries, Comeback::Nacked),
        }
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
        AckWindow::new(base)
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
    fn a_huge_trim_takes_no_entry_per_trimmed_sequence() {
        // Fault (issue 13): `skip_to` pushed one entry per trimmed sequence, so a trim of a
        // billion messages behind one unacked delivery allocated a billion entries (and filled
        // the window, stopping the stream until that delivery was acked).
        let mut w = window(1);
        (1..=3).for_each(|s| w.push(s));
        let first = 1_000_000_001;
        assert_eq!(w.skip_to(first), None, "1..=3 still unacked hold the offset");
        assert_eq!(w.len(), 3, "only the handed-out sequences take entries");
        assert_eq!(w.next(), first);
        w.push(first);
        w.push(first + 1);
        assert_eq!(w.len(), 5);
        assert_eq!(w.ack(first), None);
        assert_eq!(w.ack(3), None);
        assert_eq!(w.ack(2), None);
        assert_eq!(w.ack(1), Some(first), "the trimmed range counts as done");
        assert_eq!(w.len(), 1);
        assert_eq!(w.ack(first + 1), Some(first + 1));
        assert_eq!(w.len(), 0);
        // Trims while deliveries are out, twice: each leaves one more run, no more.
        let mut w = window(1);
        w.push(1);
        w.skip_to(1 << 40);
        w.push(1 << 40);
        w.skip_to(1 << 50);
        w.push(1 << 50);
        assert_eq!(w.len(), 3);
        assert_eq!(w.ack(1 << 40), None);
        assert_eq!(w.ack(1), Some((1 << 50) - 1));
        assert_eq!(w.ack(1 << 50), Some(1 << 50));
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
