//! Wake-ups from other processes: a watch on every queue's tail key publishes the tails they
//! move to this process's `QueueState`s, so subscriptions here wake as for local sends. A watch
//! that breaks (its start revision was compacted, the member went away) is replaced after
//! re-reading every tail: state is re-read, not replayed, so no move is missed.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::EtcdSide;
use crate::engine::Engine;

pub(super) async fn run(
    engine: Weak<Engine>,
    side: Arc<EtcdSide>,
    mut revision: i64,
    stop: CancellationToken,
) {
    loop {
        match side.store.watch_tails(revision).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return,
                        next = stream.next() => next,
                    };
                    match next {
                        Some(Ok(moves)) => {
                            let Some(engine) = engine.upgrade() else { return };
                            if !publish(&engine, &moves) {
                                // A queue another process created: register it, so that
                                // `queue_names` and subscriptions here see it.
                                register_new(&engine, &side).await;
                                publish(&engine, &moves);
                            }
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "rockq: etcd watch broke; re-reading tails");
                            break;
                        }
                        None => break,
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "rockq: etcd watch did not start; retrying"),
        }
        // Re-read every tail, then watch from there.
        loop {
            match side.store.tails().await {
                Ok((tails, rev)) => {
                    let Some(engine) = engine.upgrade() else { return };
                    if !publish(&engine, &tails) {
                        register_new(&engine, &side).await;
                        publish(&engine, &tails);
                    }
                    revision = rev;
                    break;
                }
                Err(_) => {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }
}

/// Publishes each tail to its queue; false if some queue is not registered here.
fn publish(engine: &Engine, moves: &[(u32, u64)]) -> bool {
    let mut all = true;
    for &(qid, last) in moves {
        match engine.registry.queues.iter().find(|q| q.id == qid) {
            Some(q) => q.publish_max(last),
            None => all = false,
        }
    }
    all
}

/// Registers the namespace's queues this process does not know yet.
async fn register_new(engine: &Engine, side: &EtcdSide) {
    match side.store.load().await {
        Ok(loaded) => {
            for (name, meta, last) in &loaded.queues {
                super::register_queue(engine, name, meta, *last);
            }
        }
        Err(e) => tracing::debug!(error = %e, "rockq: could not read the namespace's queues"),
    }
}
