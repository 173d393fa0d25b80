//! Group settings across processes: pause and resume of either group mode, and a work group's
//! stored settings, written by any process (a compare-and-set on the record, `pause.rs`) and
//! taught to every other by one watch over the namespace's settings records.
//!
//! A group registered here after the watch saw its record (created or loaded later) must not
//! miss it: the watch keeps the latest record of every group (`EtcdSide::group_settings`)
//! before it applies one, and a group registers before it [`adopt`]s the kept record, so each
//! change reaches a group through one path or the other.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::follow::{Followed, follow};
use super::side::EtcdSide;
use crate::engine::Engine;
use crate::model::{GroupSettings, WorkSettings};
use crate::store::etcd::settings::SettingsRecord;

/// Follows every settings record of the namespace until `stop`.
pub(super) async fn run(engine: Weak<Engine>, side: Arc<EtcdSide>, stop: CancellationToken) {
    loop {
        // Read every record, then watch from there: state is re-read, not replayed.
        let revision = loop {
            match side.store.all_settings().await {
                Ok((records, rev)) => {
                    let Some(engine) = engine.upgrade() else { return };
                    records.iter().for_each(|r| learn(&engine, &side, r));
                    break rev;
                }
                Err(_) => tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                },
            }
        };
        match side.store.watch_settings(revision).await {
            Ok(stream) => {
                let apply = |engine: Arc<Engine>, records: Vec<SettingsRecord>| {
                    records.iter().for_each(|r| learn(&engine, &side, r));
                    std::future::ready(())
                };
                if let Followed::Stopped = follow(stream, "settings", &engine, &stop, apply).await {
                    return;
                }
            }
            Err(e) => tracing::debug!(error = %e, "rockq: etcd settings watch did not start; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// A settings record as it now stands in etcd (from the watch, or this process's own write):
/// kept, then applied to the group if it is registered here. An older record than the one
/// kept changes nothing.
pub(super) fn learn(engine: &Engine, side: &EtcdSide, r: &SettingsRecord) {
    let id = crate::store::group_id(&r.group, &r.queue);
    // Of a group deleted since (this watch and the deletions' are two streams): a group of the
    // name made anew must not take it up.
    if side.group_deleted.get(&id).is_some_and(|d| *d > r.rev) {
        return;
    }
    {
        let mut kept = side.group_settings.entry(id).or_insert((GroupSettings::default(), 0));
        if kept.1 >= r.rev {
            return;
        }
        *kept = (r.settings.clone(), r.rev);
    }
    apply(engine, &r.group, &r.queue, &r.settings);
}

/// A group just registered here takes the record the watch kept for it, if any.
pub(super) fn adopt(engine: &Engine, side: &EtcdSide, group: &str, queue: &str) {
    let kept = side.group_settings.get(&crate::store::group_id(group, queue)).map(|k| k.0.clone());
    if let Some(s) = kept {
        apply(engine, group, queue, &s);
    }
}

pub(super) fn apply(engine: &Engine, group: &str, queue: &str, s: &GroupSettings) {
    if let Some(g) = engine.registry.ordered(group, queue) {
        g.paused.store(s.paused, Ordering::SeqCst);
        g.queue.poke();
    }
    if let Some(g) = engine.registry.work(group, queue) {
        g.paused.store(s.paused, Ordering::SeqCst);
        if let Some(w) = WorkSettings::stored(s, queue) {
            g.set_settings(Arc::new(w));
        }
        g.changed.notify_waiters();
        g.queue.poke();
    }
}
