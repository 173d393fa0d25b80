//! The etcd writer's half of keyspaces: creating them (registration and reads:
//! `keyspaces.rs`; transactions: `txn.rs`).

use std::sync::Arc;

use super::keyspaces::learn_keyspace;
use super::side::retrying;
use super::writer::Writer;
use crate::engine::registry::KeyspaceState;
use crate::error::Error;

impl Writer {
    /// `Broker::kv`: keyspace `name`, made unless it exists (an inspection makes nothing).
    pub(super) async fn create_keyspace(&mut self, name: &str) -> Result<Arc<KeyspaceState>, Error> {
        if let Some(k) = self.engine.registry.keyspace(name) {
            return Ok(k);
        }
        let store = self.side.store.clone();
        let t = self.side.settings.request_timeout;
        let id = if self.side.settings.passive {
            retrying(t, || store.keyspace(name))
                .await?
                .ok_or_else(|| Error::Invalid { reason: format!("no keyspace {name:?} in this namespace") })?
        } else {
            retrying(t, || store.create_keyspace(name)).await?
        };
        let k = learn_keyspace(&self.engine, &self.side, name, id).await?;
        tracing::debug!(keyspace = %name, id, "rockq: keyspace created or found in etcd");
        Ok(k)
    }
}
