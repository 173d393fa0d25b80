//! The console's memory of the last minutes: every tick it records each queue's last sequence
//! and each group's lag and committed offset in a bounded ring, from which the charts derive
//! throughput (sequences per second) and lag over time.
//!
//! The ticking task is spawned by [`Console::router`](super::Console::router) and ends when
//! the router (every clone of it) is dropped or the broker shuts down. It holds only a weak
//! reference to the console, so it never keeps a dropped router alive. Tests drive the ring
//! with [`Sampler::sample_now`] instead of waiting for ticks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::State;
use super::WebError;
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

/// A handle on the console's sampler: take a sample now, whatever the tick.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(broker: rockq::Broker) -> Result<(), rockq::web::WebError> {
/// let (app, sampler) = rockq::web::Console::new(broker).manual_sampling().build();
/// sampler.sample_now().await?; // the charts now have one more point
/// # drop(app);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Sampler {
    pub(crate) state: Weak<State>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("alive", &(self.state.strong_count() > 0)).finish()
    }
}

impl Sampler {
    /// Records the current stats of every queue and group in the console's history.
    ///
    /// # Errors
    ///
    /// [`WebError::Stopped`] when the console (its router) was dropped or the broker shut
    /// down; [`WebError::Read`] when the stats cannot be read.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(sampler: rockq::web::Sampler) -> Result<(), rockq::web::WebError> {
    /// sampler.sample_now().await?;
    /// # Ok(()) }
    /// ```
    pub async fn sample_now(&self) -> Result<(), WebError> {
        let state = self.state.upgrade().ok_or(WebError::Stopped)?;
        sample(&state).await
    }
}

/// One sample into `state`'s history.
pub(crate) async fn sample(state: &State) -> Result<(), WebError> {
    if state.source.is_closed() {
        return Err(WebError::Stopped);
    }
    let stats = state.source.stats().await.map_err(|f| WebError::Read(f.message))?;
    let mut h = state.history.lock().unwrap_or_else(|p| p.into_inner());
    h.record(&stats, Instant::now(), SystemTime::now(), state.config.history);
    Ok(())
}

/// The ticking task: one sample every `every`, until the console is dropped or the broker
/// shuts down. A failed sample is logged and skipped (the chart shows a gap, not a stop).
pub(crate) fn spawn(state: &Arc<State>, every: Duration) {
    let weak = Arc::downgrade(state);
    // Outside a runtime there is nothing to run the task on: the console still works, its
    // charts only get the points `Sampler::sample_now` adds (`tokio::spawn` would panic).
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("rockq console built outside a Tokio runtime: no sampler task, the charts stay empty");
        return;
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else { return };
            if state.source.is_closed() {
                return;
            }
            if let Err(e) = sample(&state).await {
                tracing::debug!(error = %e, "rockq console: sample failed");
            }
        }
    });
}

/// Shared ring store.
pub(crate) type SharedHistory = Mutex<History>;
