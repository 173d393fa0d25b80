//! Starting the etcd engine: the namespace's format checked, its queues and groups loaded into
//! a registry, the engine state built, and the writer and watch tasks started. The handles'
//! anchor over it is built by `engine/connect.rs`.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::owners::Owners;
use super::side::{EtcdSettings, EtcdSide, retrying};
use super::{appender, claims, deletion, settings, watch, writer};
use crate::engine::Engine;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::{OrderedGroupState, QueueState, Registry};
use crate::engine::request::Request;
use crate::engine::timer::Timer;
use crate::error::Error;
use crate::model::GroupMode;
use crate::options::{Durability, Options};
use crate::store::etcd::{ConnectFailure, EtcdStore};

/// A started etcd engine: its state, its side, the writer's request channel and the token that
/// stops its tasks (the writer, the watches) once shutdown is complete.
pub(crate) struct Started {
    pub engine: Arc<Engine>,
    pub side: Arc<EtcdSide>,
    pub tx: mpsc::Sender<Request>,
    pub stopped: CancellationToken,
}

/// Connects to the namespace and starts the engine's tasks on `runtime`.
pub(crate) async fn start(
    runtime: &tokio::runtime::Handle,
    endpoints: &[String],
    namespace: &str,
    options: &Options,
    settings: EtcdSettings,
) -> Result<Started, Error> {
    if options.durability != Durability::Fsync {
        return Err(capability::refusal(Flavour::Etcd, Capability::BufferedDurability));
    }
    crate::name::validate(crate::error::NameKind::Queue, namespace)
        .map_err(|e| Error::InvalidOption(format!("etcd namespace: {e}")))?;
    if endpoints.is_empty() {
        return Err(Error::InvalidOption("no etcd endpoint given".into()));
    }
    let create = options.create_if_missing && !settings.passive;
    let store =
        EtcdStore::connect(endpoints, namespace, settings.attempt_timeout, settings.request_timeout, create)
            .await
            .map_err(|e| match e {
                ConnectFailure::Storage(s) => Error::from(s),
                ConnectFailure::Missing => {
                    Error::NoDatabase { path: format!("etcd namespace {namespace:?}").into() }
                }
                ConnectFailure::Invalid(why) => Error::InvalidOption(why),
                ConnectFailure::Foreign(reason) => {
                    Error::NotRockq { path: format!("etcd namespace {namespace:?}").into(), reason }
                }
            })?;
    let loaded = retrying(settings.request_timeout, || store.load()).await?;
    let latest_stamp = latest_stamp(&store, &loaded.queues, settings.request_timeout).await?;
    let registry = Registry::default();
    for (name, meta, last) in &loaded.queues {
        let q = QueueState::new(meta.id, name, meta.first_seq, *last, meta.retention);
        q.set_dedup_window(meta.dedup_window);
        registry.queues.insert(q.name.clone(), q);
    }
    // Before any work group's claims are read: the restore puts prioritised claims ahead of
    // the frontier, the others move it.
    let by_id: std::collections::HashMap<u32, Arc<QueueState>> =
        registry.queues.iter().map(|q| (q.id, q.clone())).collect();
    for &(qid, seq, priority) in &loaded.priorities {
        if let Some(q) = by_id.get(&qid) {
            q.index_priority(seq, priority);
        }
    }
    // (After this, queues are registered through `register_queue` only: by the writer when
    // asked, by the watch when another process creates one.)
    for (group, queue, offset) in &loaded.groups {
        let Some(q) = registry.queue(queue) else { continue };
        let id = crate::store::group_id(group, queue);
        match offset.mode {
            GroupMode::Ordered => {
                registry.ordered.insert(id, OrderedGroupState::new(group, q, offset.committed));
            }
            // Loaded below with their claim records and a watch, once the engine exists.
            GroupMode::WorkQueue => {}
        }
    }
    let owner_id = format!("{}-{}-{:016x}", hostname(), std::process::id(), fastrand::u64(..)).into_bytes();
    let side = Arc::new(EtcdSide {
        store: store.clone(),
        settings,
        owner_id,
        owners: Arc::new(Owners::default()),
        work: Default::default(),
        revisions: Default::default(),
        group_settings: Default::default(),
        due_offers: std::sync::atomic::AtomicU64::new(u64::MAX),
        group_seen: loaded
            .groups
            .iter()
            .map(|(group, queue, _)| (crate::store::group_id(group, queue), loaded.revision))
            .collect(),
        group_deleted: Default::default(),
        sends_wake: tokio::sync::Notify::new(),
        flows_changed: tokio::sync::Notify::new(),
        move_queued: std::sync::atomic::AtomicBool::new(false),
    });
    // The earliest delayed message in the namespace: the timer fires it, whoever wrote it.
    let first_due = retrying(side.settings.request_timeout, || store.first_due()).await?;
    let timer = Arc::new(Timer::new(first_due, 0));
    let engine = Arc::new(Engine::new(registry, options.clone(), timer, 4096));
    tracing::info!(store = %store.label, queues = engine.registry.queues.len(), "rockq: connected to etcd");
    let (tx, rx) = mpsc::channel(options.channel_capacity);
    let stopped = CancellationToken::new();
    runtime.spawn(watch::run(Arc::downgrade(&engine), side.clone(), loaded.revision, stopped.clone()));
    runtime.spawn(settings::run(Arc::downgrade(&engine), side.clone(), stopped.clone()));
    runtime.spawn(deletion::run(Arc::downgrade(&engine), side.clone(), loaded.revision, stopped.clone()));
    let nudge = tx.downgrade();
    // Every keyspace, with its count (made later elsewhere: the namespace watch brings it).
    let keyspaces = match retrying(side.settings.request_timeout, || store.keyspaces()).await {
        Ok(k) => k,
        Err(e) => {
            stopped.cancel();
            return Err(e.into());
        }
    };
    for (name, id) in keyspaces {
        if let Err(e) = super::keyspaces::learn_keyspace(&engine, &side, &name, id).await {
            stopped.cancel();
            return Err(e.into());
        }
    }
    // Every work group, as embedded at open: its claims, settings and counts are known before
    // anything subscribes.
    for (group, queue, offset) in &loaded.groups {
        if offset.mode == GroupMode::WorkQueue
            && let Some(q) = engine.registry.queue(queue)
            // (A group deleted since the namespace was read: `Ok(None)`, skipped.)
            && let Err(e) = claims::load(&engine, &side, q, group, &stopped, &nudge).await
        {
            stopped.cancel();
            return Err(e.into());
        }
    }
    // Staged sends go through an appender task of their own, so that an append transaction is
    // out while the writer's claims, acks and commits are (`appender.rs`); the two share the
    // enqueue-time stamp, so that enqueue times never go back within this process.
    let stamps = Arc::new(std::sync::atomic::AtomicU64::new(latest_stamp));
    let new_writer =
        || writer::Writer::new(engine.clone(), side.clone(), stopped.clone(), nudge.clone(), stamps.clone());
    let (barriers, from_writer) = mpsc::channel(16);
    let task = runtime.spawn(appender::run(new_writer(), from_writer));
    runtime.spawn(writer::run(new_writer(), rx, writer::Appender { barriers, task }));
    Ok(Started { engine, side, tx, stopped })
}

/// The latest enqueue time of the queues' last messages (wall µs; 0: none): this process
/// stamps nothing earlier, so enqueue times never go back across its restart, even with its
/// clock set back (as embedded, which resumes from its last stamp). One point read per queue
/// with messages, 32 at a time.
async fn latest_stamp(
    store: &EtcdStore,
    queues: &[(String, crate::model::QueueMeta, u64)],
    timeout: std::time::Duration,
) -> Result<u64, crate::error::StorageError> {
    use futures::{StreamExt, TryStreamExt};
    let reads =
        queues.iter().filter(|(_, meta, last)| *last >= meta.first_seq).map(|(_, meta, last)| async move {
            let got = retrying(timeout, || store.read_range(meta.id, *last, *last, 1)).await?;
            // (Trimmed meanwhile: nothing to go by.)
            Ok(got
                .first()
                .and_then(|(seq, v)| crate::store::etcd::decode_envelope(meta.id, *seq, v).ok())
                .map_or(0, |e| e.enqueued_at_micros))
        });
    futures::stream::iter(reads).buffer_unordered(32).try_fold(0, |m, s| async move { Ok(m.max(s)) }).await
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into())
}
