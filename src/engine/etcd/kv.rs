//! The etcd writer's half of keyspaces: creating them, and transactions of keyspace writes
//! and conditions (the store's half: `store/etcd/kv.rs`; registration and reads:
//! `keyspaces.rs`).
//!
//! A keyspace transaction is one etcd transaction, so every process's writes are fenced by
//! the same compares: `get_for_update` + `commit` is optimistic concurrency across processes,
//! as it is across tasks embedded. Transactions that also ack or send are refused
//! (`Capability::Transactions`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::keyspaces::learn_keyspace;
use super::side::retrying;
use super::writer::Writer;
use crate::engine::capability::{self, Capability, Flavour};
use crate::engine::registry::KeyspaceState;
use crate::engine::request::{TxApplied, TxRequest, give_back};
use crate::error::Error;
use crate::store::etcd::kv::{KvApplied, KvOp, txn_size};
use crate::store::etcd::{MAX_TXN_BYTES, MAX_TXN_OPS};

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

    /// A transaction of keyspace writes and conditions only: one etcd transaction, answered
    /// once a quorum has it (or refused with what failed, nothing written).
    pub(super) async fn kv_transaction(&mut self, tx: TxRequest) {
        let TxRequest { writes, sends, jobs, deliveries, reply } = tx;
        // (The caller sends only transactions without sends, jobs or deliveries here.)
        debug_assert!(sends.is_empty());
        give_back(jobs, deliveries, false);
        let ops: Vec<KvOp> = writes
            .iter()
            .map(|w| KvOp {
                keyspace: w.keyspace.id,
                key: w.key.clone(),
                value: w.value.clone(),
                expect: w.expect,
                condition_only: w.condition_only,
            })
            .collect();
        let (compares, puts, bytes) = txn_size(&ops);
        if compares > MAX_TXN_OPS || puts > MAX_TXN_OPS || bytes > MAX_TXN_BYTES {
            let _ = reply.send(Err(capability::refusal(Flavour::Etcd, Capability::HugeMessage)));
            return;
        }
        if self.side.settings.passive {
            let _ = reply.send(Err(Error::Invalid { reason: "an inspection writes nothing".into() }));
            return;
        }
        let t = self.side.settings.request_timeout;
        let deadline = Instant::now() + t;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let marker = match self.marker_lease(left()).await {
            Ok(m) => m,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return;
            }
        };
        // Tried again with the same nonce until the deadline: the marker tells a try applied
        // before its answer was lost (see `EtcdStore::kv_txn`).
        let nonce = self.nonce();
        let store = self.side.store.clone();
        let answer = match retrying(left(), || store.kv_txn(&ops, nonce, marker)).await {
            Ok(KvApplied::Applied { revision, added }) => {
                match added {
                    Some(added) => {
                        for (id, delta) in added {
                            if let Some(k) = writes.iter().find(|w| w.keyspace.id == id) {
                                let keys = k.keyspace.keys();
                                k.keyspace.set_keys(keys.saturating_add_signed(delta));
                            }
                        }
                    }
                    // Applied by a try whose answer was lost: counted again from etcd.
                    None => {
                        for w in &writes {
                            if let Ok(keys) = retrying(left(), || store.kv_count(w.keyspace.id)).await {
                                w.keyspace.set_keys(keys);
                            }
                        }
                    }
                }
                Ok(TxApplied { revision, sent: Vec::new() })
            }
            Ok(KvApplied::Conflict { index, found }) => {
                let w = &writes[index];
                Err(Error::Conflict {
                    keyspace: w.keyspace.name.to_string(),
                    key: w.key.clone(),
                    expected: w.expect.unwrap_or(crate::entry::Expect::Present),
                    found,
                })
            }
            Err(e) => Err(e.into()),
        };
        let _ = reply.send(answer);
    }
}
