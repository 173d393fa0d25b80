//! The console's sampler: every tick it records a snapshot of the stats into the history
//! (`history.rs`), from which the charts derive throughput and lag over time.
//!
//! The ticking task is spawned by [`Console::router`](super::Console::router) and ends when
//! the router (every clone of it) is dropped or the broker shuts down. It holds only a weak
//! reference to the console, so it never keeps a dropped router alive. Tests drive the ring
//! with [`Sampler::sample_now`] instead of waiting for ticks.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::error::WebError;
use super::state::State;

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
