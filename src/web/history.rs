//! The console's memory of the last minutes: each queue's last sequence and each group's lag and
//! committed offset in a bounded ring per series, from which the charts derive throughput
//! (sequences per second) and lag over time. Filled by the sampler (`sampler.rs`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::stats::Stats;

/// One observation of a queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueuePoint {
    pub at: Instant,
    pub wall: SystemTime,
    pub last_seq: u64,
    pub len: u64,
}

/// One observation of a group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupPoint {
    pub at: Instant,
    pub wall: SystemTime,
    pub lag: u64,
    pub lag_age: Option<Duration>,
    pub committed: u64,
}

/// The rings, per queue and per `(queue, group)`.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub queues: BTreeMap<String, VecDeque<QueuePoint>>,
    pub groups: BTreeMap<(String, String), VecDeque<GroupPoint>>,
}

impl History {
    /// Appends one snapshot, keeping at most `cap` points per series and dropping the series
    /// of queues and groups that no longer exist.
    pub(crate) fn record(&mut self, stats: &Stats, at: Instant, wall: SystemTime, cap: usize) {
        let cap = cap.max(2);
        self.queues.retain(|name, _| stats.queues.iter().any(|q| &q.name == name));
        self.groups.retain(|(q, g), _| stats.groups.iter().any(|s| &s.queue == q && &s.group == g));
        for q in &stats.queues {
            let ring = self.queues.entry(q.name.clone()).or_default();
            push(ring, QueuePoint { at, wall, last_seq: q.last_seq, len: q.len }, cap);
        }
        for g in &stats.groups {
            let ring = self.groups.entry((g.queue.clone(), g.group.clone())).or_default();
            let p =
                GroupPoint { at, wall, lag: g.lag, lag_age: g.oldest_unacked_age, committed: g.committed };
            push(ring, p, cap);
        }
    }
}

fn push<T>(ring: &mut VecDeque<T>, p: T, cap: usize) {
    while ring.len() >= cap {
        ring.pop_front();
    }
    ring.push_back(p);
}

/// Per-second rate between consecutive points: `(wall time of the later point, rate)`.
pub(crate) fn rates<T>(
    ring: &VecDeque<T>,
    f: impl Fn(&T) -> (Instant, SystemTime, u64),
) -> Vec<(SystemTime, f64)> {
    let mut out = Vec::with_capacity(ring.len());
    for (a, b) in ring.iter().zip(ring.iter().skip(1)) {
        let ((ta, _, va), (tb, wb, vb)) = (f(a), f(b));
        let dt = tb.saturating_duration_since(ta).as_secs_f64();
        // Sequences only grow, but a reset moves an offset back: a negative rate is shown as 0.
        let rate = if dt > 0.0 { vb.saturating_sub(va) as f64 / dt } else { 0.0 };
        out.push((wb, rate));
    }
    out
}

/// The latest per-second rate of a ring's counter (`None`: fewer than two samples).
pub(crate) fn last_rate<T>(ring: &VecDeque<T>, f: impl Fn(&T) -> (Instant, SystemTime, u64)) -> Option<f64> {
    let n = ring.len();
    if n < 2 {
        return None;
    }
    let slice: VecDeque<&T> = ring.iter().skip(n - 2).collect();
    rates(&slice, |p| f(p)).last().map(|p| p.1)
}

/// Whether a group's lag grew over the sampled window: the latest sample is the window's
/// highest and above the first. A steady lag (however large) is not growing.
pub(crate) fn lag_growing(ring: &VecDeque<GroupPoint>) -> bool {
    match (ring.front(), ring.back()) {
        (Some(first), Some(last)) if ring.len() >= 3 => {
            last.lag > first.lag && ring.iter().all(|p| p.lag <= last.lag)
        }
        _ => false,
    }
}

/// Shared ring store.
pub(crate) type SharedHistory = Mutex<History>;
