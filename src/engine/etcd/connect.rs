//! Connecting: the namespace's format checked, its queues and groups loaded into a registry,
//! the engine built with a detached RocksDB stand-in, and the writer and watch tasks started.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::{EtcdSettings, EtcdSide, owner, retrying, unsupported, watch, work, writer};
use crate::engine::Engine;
use crate::engine::registry::{OrderedGroupState, QueueState, Registry};
use crate::engine::shared::Shared;
use crate::engine::timer::Timer;
use crate::error::OpenError;
use crate::model::GroupMode;
use crate::options::{Durability, Options};
use crate::store::Store;
use crate::store::etcd::{ConnectFailure, EtcdStore};

/// Connects to the namespace and starts the engine on the current runtime.
pub(crate) async fn connect(
    endpoints: &[String],
    namespace: &str,
    options: Options,
    settings: EtcdSettings,
) -> Result<Arc<Shared>, OpenError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| OpenError::NoRuntime)?;
    if options.durability != Durability::Fsync {
        return Err(OpenError::Unsupported(unsupported(
            "Durability::Buffered (every etcd write is a quorum write)",
        )));
    }
    crate::name::validate(crate::error::NameKind::Queue, namespace)
        .map_err(|e| OpenError::InvalidOption(format!("etcd namespace: {e}")))?;
    if endpoints.is_empty() {
        return Err(OpenError::InvalidOption("no etcd endpoint given".into()));
    }
    let store =
        EtcdStore::connect(endpoints, namespace, settings.request_timeout).await.map_err(|e| match e {
            ConnectFailure::Storage(s) => OpenError::Storage(s),
            ConnectFailure::Foreign(reason) => {
                OpenError::NotRockq { path: format!("etcd namespace {namespace:?}").into(), reason }
            }
        })?;
    let loaded = retrying(settings.request_timeout, || store.load()).await?;
    let registry = Registry::default();
    for (name, meta, last) in &loaded.queues {
        let q = QueueState::new(meta.id, name, meta.first_seq, *last, meta.retention);
        q.set_dedup_window(meta.dedup_window);
        registry.queues.insert(q.name.clone(), q);
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
        owners: owner::Owners::default(),
        work: Default::default(),
        revisions: Default::default(),
    });
    let label = std::path::PathBuf::from(&store.label);
    let timer = Arc::new(Timer::new(None, 0));
    let stand_in = Store::detached(label);
    let engine = Arc::new(Engine {
        etcd: Some(side.clone()),
        ..Engine::new(stand_in, registry, options.clone(), timer, 4096)
    });
    tracing::info!(store = %store.label, queues = engine.registry.queues.len(), "rockq: connected to etcd");
    let (tx, rx) = mpsc::channel(options.channel_capacity);
    let shared = Arc::new(Shared {
        engine: engine.clone(),
        tx,
        closed: AtomicBool::new(false),
        runtime: runtime.clone(),
        writer: Mutex::new(None),
        closing: tokio_util::sync::CancellationToken::new(),
        stopped: tokio_util::sync::CancellationToken::new(),
        pools: tokio_util::task::TaskTracker::new(),
        shutdown: Mutex::new(None),
    });
    let stop = shared.stopped.clone();
    runtime.spawn(watch::run(Arc::downgrade(&engine), side.clone(), loaded.revision, stop.clone()));
    let nudge = shared.tx.downgrade();
    // Every work group, as embedded at open: its claims, settings and counts are known before
    // anything subscribes.
    for (group, queue, offset) in &loaded.groups {
        if offset.mode == GroupMode::WorkQueue
            && let Some(q) = engine.registry.queue(queue)
        {
            work::load(&engine, &side, q, group, &stop, &nudge).await?;
        }
    }
    runtime.spawn(writer::run(engine, side, rx, stop.clone(), nudge));
    crate::engine::retention::spawn_background(&shared, options.retention_interval);
    Ok(shared)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into())
}
