//! A keyspace of application state (`Broker::kv`): its id in the store and how many keys it
//! holds. Entries themselves are never held in memory: reads go to the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One keyspace, shared by its handles and the writer.
#[derive(Debug)]
pub(crate) struct KeyspaceState {
    pub id: u32,
    pub name: Arc<str>,
    /// Keys it holds, as the writer last counted them (it counts while building a batch, so a
    /// figure may include a commit still being synced).
    keys: AtomicU64,
    /// Keys held by transactions of this process (`get_for_update`).
    pub locks: super::KeyLocks,
}

impl KeyspaceState {
    pub fn new(id: u32, name: &str, keys: u64) -> Arc<Self> {
        Arc::new(KeyspaceState {
            id,
            name: name.into(),
            keys: AtomicU64::new(keys),
            locks: Default::default(),
        })
    }

    pub fn keys(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Only the writer changes the count.
    pub fn set_keys(&self, keys: u64) {
        self.keys.store(keys, Ordering::Relaxed);
    }
}
