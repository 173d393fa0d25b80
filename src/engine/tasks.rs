//! The engine's background tasks, started by either engine's opening: retention passes
//! (whichever engine), the schedule's timer, and the metrics gauges (the embedded engine, from memory and a
//! few cached point reads of its store). Each holds the broker only weakly between ticks, so
//! dropping every handle still closes it.

use std::sync::Arc;
use std::time::Duration;

use super::gauges::{self, GaugeCache};
use super::request::{Request, ScheduleRequest};
use super::shared::Shared;
use super::timer::Timer;
use crate::error::Error;
use crate::store::Store;

/// Runs `tick` every `interval` on the broker's clock until shutdown, or until `tick` returns
/// false. Holds the broker only weakly between ticks, so dropping every handle still closes it.
pub(super) fn spawn_periodic<F, Fut>(shared: &Arc<Shared>, interval: Duration, tick: F)
where
    F: Fn(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    if interval.is_zero() {
        return;
    }
    let weak = Arc::downgrade(shared);
    let clock = shared.clock().clone();
    let closing = shared.closing.clone();
    shared.runtime.spawn(async move {
        loop {
            tokio::select! {
                _ = clock.sleep_until(clock.after(interval)) => {}
                _ = closing.cancelled() => return,
            }
            let Some(shared) = weak.upgrade() else { return };
            if !tick(shared).await {
                return;
            }
        }
    });
}

/// Runs a retention pass every `interval` on the broker's clock until shutdown.
pub(super) fn spawn_retention(shared: &Arc<Shared>, interval: Duration) {
    spawn_periodic(shared, interval, |shared| async move {
        match shared.trim(None).await {
            Ok(_) => true,
            Err(Error::Shutdown) => false,
            Err(e) => {
                tracing::warn!(error = %e, "rockq: retention pass failed");
                true
            }
        }
    });
}

/// Refreshes the metrics gauges every `interval` on the broker's clock until shutdown, from
/// memory and a few cached point reads of `store` (`gauges.rs`), on the blocking pool.
pub(super) fn spawn_gauges(shared: &Arc<Shared>, store: Arc<Store>, interval: Duration) {
    let cache = Arc::new(std::sync::Mutex::new(GaugeCache::default()));
    spawn_periodic(shared, interval, move |shared| {
        let (cache, store) = (cache.clone(), store.clone());
        async move {
            if !crate::telemetry::recorder_installed() {
                // With nothing to record into, skip the refresh. Checked every tick: a recorder
                // may be installed later.
                return true;
            }
            if shared.is_closed() {
                return false;
            }
            let engine = shared.engine.clone();
            let now = engine.clock().wall_micros();
            let refreshed = shared
                .runtime
                .spawn_blocking(move || {
                    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
                    gauges::snapshot(&engine, &store, &mut cache, now)
                })
                .await
                .map_err(|_| Error::Shutdown)
                .and_then(|r| r);
            match refreshed {
                Ok(stats) => {
                    crate::telemetry::publish(&stats);
                    true
                }
                Err(Error::Shutdown) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "rockq: computing metrics gauges failed");
                    true
                }
            }
        }
    });
}

/// The etcd engine's gauges: every `interval`, while a metrics recorder is installed, what
/// [`Broker::stats`](crate::Broker::stats) computes (the namespace as etcd holds it, with
/// this process's leases laid over it) is published, as `stats` itself publishes it. A
/// namespace's figures are the same from every process: each publishes them under its own
/// recorder.
#[allow(dead_code)] // the etcd engine's
pub(super) fn spawn_stats_gauges(shared: &Arc<Shared>, interval: Duration) {
    spawn_periodic(shared, interval, move |shared| async move {
        if !crate::telemetry::recorder_installed() {
            return true;
        }
        match shared.stats().await {
            // (`stats` published them.)
            Ok(_) => true,
            Err(Error::Shutdown) => false,
            Err(e) => {
                tracing::warn!(error = %e, "rockq: computing metrics gauges failed");
                true
            }
        }
    });
}

/// Starts the schedule's timer task (`timer.rs`). It holds the broker only weakly (and only to send `Fire`), so
/// dropping every handle still closes it; shutdown stops it.
pub(super) fn spawn_timer(shared: &Arc<Shared>, timer: Arc<Timer>) {
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
