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
/// only weakly, so dropping every handle still closes it. It runs until the writer stops, not
/// only until a shutdown begins: while the worker pools drain, a large flow's submit in flight
/// still has its first steps sent (`flow_submit.rs`), and acks that finish steps move their
/// flows on.
fn spawn_flow_mover(shared: &Arc<Shared>, side: Arc<super::etcd::EtcdSide>) {
    let weak = Arc::downgrade(shared);
    let stopped = shared.stopped.clone();
    side.flows_changed.notify_one();
    shared.runtime.spawn(async move {
        let writer = || weak.upgrade().map(|s| s.tx.clone());
        ask_for_moves(&side.flows_changed, &side.move_queued, &stopped, writer).await;
    });
}

/// Sends the writer a flow `Move` each time `changed` is notified, unless one is waiting
/// already (`queued`, cleared by the writer as it starts a move, before it reads the change
/// records). Every change record put wakes this (the namespace watch, the writer's own
/// rewrites of a continuation), and a move each would pile up in the writer's channel, where
/// a round takes them all before it answers the others (a flush waited 150 ms behind 20 moves
/// of one large flow). Ends when `stopped` is cancelled or `writer` gives no channel (the
/// broker is gone) or a closed one.
async fn ask_for_moves(
    changed: &tokio::sync::Notify,
    queued: &std::sync::atomic::AtomicBool,
    stopped: &tokio_util::sync::CancellationToken,
    writer: impl Fn() -> Option<tokio::sync::mpsc::Sender<super::request::Request>>,
) {
    loop {
        tokio::select! {
            () = changed.notified() => {}
            () = stopped.cancelled() => return,
        }
        if queued.swap(true, std::sync::atomic::Ordering::AcqRel) {
            continue;
        }
        let Some(tx) = writer() else { return };
        let req = super::request::Request::Flow(super::request::FlowRequest::Move);
        if tx.send(req).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::{Notify, mpsc};
    use tokio_util::sync::CancellationToken;

    use crate::engine::request::{FlowRequest, Request};
    use super::ask_for_moves;

    /// Lets the spawned loop run until it waits again (a current-thread runtime: it runs only
    /// while this task yields).
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn many_changes_while_a_move_waits_ask_for_no_more_moves() {
        let changed = std::sync::Arc::new(Notify::new());
        let queued = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel::<Request>(1024);
        let task = tokio::spawn({
            let (changed, queued, stopped) = (changed.clone(), queued.clone(), stopped.clone());
            async move { ask_for_moves(&changed, &queued, &stopped, || Some(tx.clone())).await }
        });
        let moves = |rx: &mut mpsc::Receiver<Request>| {
            let mut n = 0;
            while let Ok(r) = rx.try_recv() {
                assert!(matches!(r, Request::Flow(FlowRequest::Move)), "only moves are asked for");
                n += 1;
            }
            n
        };
        // Fifty change records put while the writer has not taken the first move.
        for _ in 0..50 {
            changed.notify_one();
            settle().await;
        }
        assert_eq!(moves(&mut rx), 1, "one move waits for all of them");
        assert!(queued.load(Ordering::Acquire));
        // The writer starts that move (it reads every change there is now); a change put after
        // it asks for one more, and only one.
        queued.store(false, Ordering::Release);
        settle().await;
        assert_eq!(moves(&mut rx), 0, "nothing changed since the move started");
        for _ in 0..10 {
            changed.notify_one();
            settle().await;
        }
        assert_eq!(moves(&mut rx), 1);
        stopped.cancel();
        task.await.unwrap();
    }
}
