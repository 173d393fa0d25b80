//! Connecting a broker to an etcd namespace (feature `etcd`): the etcd engine started
//! (`etcd/start.rs`), the handles' anchor built over `Backend::Etcd`, and the background tasks
//! (`tasks.rs`) started — the counterpart of `open.rs`.

use std::sync::Arc;

use super::backend::Backend;
use super::etcd::{EtcdSettings, start};
use super::shared::Shared;
use super::tasks;
use crate::error::Error;
use crate::options::Options;

/// Connects to the namespace and starts the engine on the current runtime.
pub(crate) async fn connect(
    endpoints: &[String],
    namespace: &str,
    options: Options,
    settings: EtcdSettings,
) -> Result<Arc<Shared>, Error> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let started = start::start(&runtime, endpoints, namespace, &options, settings).await?;
    let start::Started { engine, side, tx, stopped } = started;
    let timer = engine.timer.clone();
    let passive = side.settings.passive;
    let mover = side.clone();
    let shared = Shared::new(engine, Backend::Etcd(side), tx, runtime, None, stopped);
    // An inspection writes nothing of its own accord: the other processes fire and trim.
    if !passive {
        tasks::spawn_timer(&shared, timer);
        tasks::spawn_retention(&shared, options.retention_interval);
        // (An inspection publishes no gauges, as the embedded `Inspector` does not.)
        tasks::spawn_stats_gauges(&shared, options.metrics_interval);
        spawn_flow_mover(&shared, mover);
    }
    Ok(shared)
}

/// Starts the task that has the writer apply flow changes whenever the namespace watch brings
/// one (`etcd/flows.rs`), and once now: changes a stopped process left. It holds the broker
/// only weakly, so dropping every handle still closes it.
fn spawn_flow_mover(shared: &Arc<Shared>, side: Arc<super::etcd::EtcdSide>) {
    let weak = Arc::downgrade(shared);
    let closing = shared.closing.clone();
    side.flows_changed.notify_one();
    shared.runtime.spawn(async move {
        loop {
            tokio::select! {
                () = side.flows_changed.notified() => {}
                () = closing.cancelled() => return,
            }
            // One move waiting at a time: every change record put wakes this task (the
            // namespace watch, the writer's own rewrites of a continuation), and a move each
            // would pile up in the writer's channel, where a round takes them all before it
            // answers the others (a flush waited 150 ms behind 20 moves of one large flow).
            if side.move_queued.swap(true, std::sync::atomic::Ordering::AcqRel) {
                continue;
            }
            let Some(shared) = weak.upgrade() else { return };
            let tx = shared.tx.clone();
            drop(shared);
            let req = super::request::Request::Flow(super::request::FlowRequest::Move);
            if tx.send(req).await.is_err() {
                return;
            }
        }
    });
}
