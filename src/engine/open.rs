//! Opening the embedded engine: the store on a blocking thread, the registry rebuilt from what
//! it loaded (`registry/restore.rs`), the writer thread and the background tasks.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::backend::Backend;
use super::registry::Registry;
use super::shared::Shared;
use super::timer::Timer;
use super::{Engine, tasks, writer};
use crate::error::Error;
use crate::options::Options;
use crate::store;

/// Opens the database at `path` and starts the engine on the current Tokio runtime.
pub(crate) async fn open(path: &Path, options: Options) -> Result<Arc<Shared>, Error> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let path = path.to_path_buf();
    let opts = options.clone();
    let (store, loaded) = runtime
        .spawn_blocking(move || store::open(&path, &opts))
        .await
        .map_err(|e| Error::InvalidOption(format!("open task failed: {e}")))??;
    let timer = Arc::new(Timer::new(loaded.first_due, loaded.next_scheduled_id));
    let (registry, stale) = match Registry::restore(loaded, &options) {
        Ok(r) => r,
        Err(e) => {
            let _ = store.close();
            return Err(e);
        }
    };

    let store = Arc::new(store);
    let engine = Arc::new(Engine::new(registry, options.clone(), timer.clone(), 4096));
    for g in stale {
        engine.mark_dirty(g);
    }
    tracing::info!(
        path = %store.path.display(),
        queues = engine.registry.queues.len(),
        groups = engine.registry.ordered.len() + engine.registry.work.len(),
        durability = ?options.durability,
        "rockq: opened"
    );
    let (tx, rx) = mpsc::channel(options.channel_capacity);
    let handle = match writer::spawn(engine.clone(), store.clone(), rx, &runtime) {
        Ok(h) => h,
        Err(e) => {
            let _ = store.close();
            return Err(Error::Io { path: Some(store.path.clone()), source: Arc::new(e) });
        }
    };
    let stopped = tokio_util::sync::CancellationToken::new();
    let shared = Shared::new(engine, Backend::Embedded(store.clone()), tx, runtime, Some(handle), stopped);
    tasks::spawn_retention(&shared, options.retention_interval);
    tasks::spawn_timer(&shared, timer);
    tasks::spawn_gauges(&shared, store, options.metrics_interval);
    Ok(shared)
}

/// Copies the backup `from` into the new database directory `to` (`Broker::restore`), on the
/// blocking pool.
pub(crate) async fn restore(from: &Path, to: &Path) -> Result<crate::backup::BackupReport, Error> {
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    tokio::task::spawn_blocking(move || crate::store::restore(&from, &to))
        .await
        .map_err(|e| Error::Internal(format!("restore task failed: {e}")))?
}
