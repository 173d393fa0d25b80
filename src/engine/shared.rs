//! The handles' half of the engine: [`Shared`], what every public handle holds (the engine,
//! the writer's request channel, the shutdown state), and the periodic background tasks that
//! run on it (retention, gauges). The writer holds only the [`Engine`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::Engine;
use super::registry::QueueState;
use super::request::{Request, SettingsChange, SettingsRequest};
use crate::error::{NameKind, PauseError, ShutdownError};

/// The user-side half of the engine: what every public handle holds. Owns the writer's request
/// channel, so the writer stops when the last handle is dropped.
pub(crate) struct Shared {
    pub engine: Arc<Engine>,
    pub tx: mpsc::Sender<Request>,
    pub closed: AtomicBool,
    /// The runtime the broker was opened in: its blocking pool runs reads and the close.
    pub runtime: tokio::runtime::Handle,
    /// The writer thread, joined by shutdown.
    pub writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Cancelled when shutdown begins: work-queue subscriptions stop claiming and worker pools
    /// drain, while acks are still accepted.
    pub closing: tokio_util::sync::CancellationToken,
    /// Running worker pools; shutdown waits for them to drain.
    pub pools: tokio_util::task::TaskTracker,
    /// The one shutdown, once begun: every caller of [`Broker::shutdown`](crate::Broker::shutdown) awaits it.
    pub shutdown: Mutex<Option<ShutdownFuture>>,
}

/// The shared outcome of the shutdown task.
type ShutdownFuture = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), ShutdownError>>>;

impl Shared {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Wakes the writer to commit dirty groups. Never blocks: if the channel is full the writer
    /// has work queued and takes the dirty list in its next round anyway.
    pub fn nudge_writer(&self) {
        let _ = self.tx.try_send(Request::Commit);
    }

    /// Pauses or resumes `group` on `queue` (either mode), durably.
    pub async fn set_paused(
        &self,
        queue: &Arc<QueueState>,
        group: &str,
        paused: bool,
    ) -> Result<(), PauseError> {
        crate::name::validate(NameKind::Group, group)?;
        if self.is_closed() {
            return Err(PauseError::Shutdown);
        }
        if !self.engine.registry.has_group(group, &queue.name) {
            return Err(PauseError::NoSuchGroup { group: group.to_owned(), queue: queue.name.to_string() });
        }
        let (reply, rx) = oneshot::channel();
        let change = SettingsChange::Paused(paused);
        let req = SettingsRequest { queue: queue.clone(), group: group.to_owned(), change, reply };
        self.tx.send(Request::Settings(req)).await.map_err(|_| PauseError::Shutdown)?;
        rx.await.map_err(|_| PauseError::Shutdown)??;
        let what = if paused { "rockq: group paused" } else { "rockq: group resumed" };
        tracing::info!(%group, queue = %queue.name, "{what}");
        Ok(())
    }

    /// Whether `group` on `queue` is paused (false if it does not exist).
    pub fn is_paused(&self, queue: &QueueState, group: &str) -> bool {
        let r = &self.engine.registry;
        r.ordered(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
            || r.work(group, &queue.name).is_some_and(|g| g.paused.load(Ordering::Acquire))
    }

    /// Registers a running worker pool, unless shutdown has begun.
    pub fn pool_started(&self) -> Option<tokio_util::task::task_tracker::TaskTrackerToken> {
        if self.closing.is_cancelled() || self.is_closed() {
            return None;
        }
        Some(self.pools.token())
    }
}

/// Runs `tick` every `interval` on the broker's clock until shutdown, or until `tick` returns
/// false. Holds the broker only weakly between ticks, so dropping every handle still closes it.
pub(crate) fn spawn_periodic<F, Fut>(shared: &Arc<Shared>, interval: std::time::Duration, tick: F)
where
    F: Fn(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    if interval.is_zero() {
        return;
    }
    let weak = Arc::downgrade(shared);
    let clock = shared.engine.clock().clone();
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
