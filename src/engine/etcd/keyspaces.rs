//! Keyspaces this process knows on etcd: registering one (made here or seen elsewhere), the
//! counts `Broker::stats` reads, and the reads of entries. The writer's half (creating
//! keyspaces, transactions) is `kv.rs`; both over `store/etcd/kv.rs`.
//!
//! Key counts (`Keyspace::len`): etcd keeps none. A process reads a keyspace's count when it
//! registers it and in each `Broker::stats`, and adds its own writes' (exact: each write
//! reports whether it created or deleted a key); writes by other processes since show at the
//! next stats call.

use std::sync::Arc;

use super::side::{EtcdSide, retrying};
use crate::engine::Engine;
use crate::engine::registry::KeyspaceState;
use crate::error::{Error, StorageError};
use crate::stats::KeyspaceStats;
use crate::store::RawEntry;

/// Registers keyspace `name` (`id`) unless it is, with its count read from etcd: whoever
/// comes second (the writer creating it, the watch seeing another process's) gets the state
/// already there.
pub(super) async fn learn_keyspace(
    engine: &Engine,
    side: &EtcdSide,
    name: &str,
    id: u32,
) -> Result<Arc<KeyspaceState>, StorageError> {
    if let Some(k) = engine.registry.keyspace(name).filter(|k| k.id == id) {
        return Ok(k);
    }
    let t = side.settings.request_timeout;
    let keys = retrying(t, || side.store.kv_count(id)).await?;
    let entry = engine
        .registry
        .keyspaces
        .entry(Arc::from(name))
        .or_insert_with(|| KeyspaceState::new(id, name, keys));
    Ok(entry.value().clone())
}

/// Every keyspace of the namespace with its count, by name (`Broker::stats`), as etcd holds
/// them now; the counts of those registered here are set to what was read (other processes'
/// writes since they were last read).
pub(super) async fn counts(engine: &Engine, side: &EtcdSide) -> Result<Vec<KeyspaceStats>, StorageError> {
    let t = side.settings.request_timeout;
    let all = retrying(t, || side.store.keyspaces()).await?;
    let mut out = Vec::with_capacity(all.len());
    for (name, id) in all {
        let keys = retrying(t, || side.store.kv_count(id)).await?;
        if let Some(k) = engine.registry.keyspace(&name).filter(|k| k.id == id) {
            k.set_keys(keys);
        }
        out.push(KeyspaceStats { name, keys });
    }
    Ok(out)
}

impl EtcdSide {
    /// Entry `key` of keyspace `id`: (revision, value). Blocking (on the runtime `runtime`,
    /// from a blocking-pool thread), as [`read_range`](Self::read_range).
    pub fn kv_get(
        &self,
        runtime: &tokio::runtime::Handle,
        id: u32,
        key: &[u8],
    ) -> Result<Option<(u64, Vec<u8>)>, Error> {
        let t = self.settings.request_timeout;
        Ok(runtime.block_on(retrying(t, || self.store.kv_get(id, key)))?)
    }

    /// Up to `limit` entries of keyspace `id` in `[from, to)`, in key order. Blocking, as
    /// [`kv_get`](Self::kv_get).
    pub fn kv_scan(
        &self,
        runtime: &tokio::runtime::Handle,
        id: u32,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<RawEntry>, Error> {
        let t = self.settings.request_timeout;
        Ok(runtime.block_on(retrying(t, || self.store.kv_scan(id, from, to, limit)))?)
    }
}
