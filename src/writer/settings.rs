//! The writer's half of group settings: pause flags and recorded dead-letter queues.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rocksdb::{DB, WriteBatch};
use tokio::sync::oneshot::Sender;

use super::{Round, SettingsChange, Writer};
use crate::error::{PauseError, StorageError};
use crate::registry::QueueState;
use crate::store::keys;
use crate::store::records::GroupSettings;

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_settings(
        &mut self,
        db: &DB,
        meta: &rocksdb::ColumnFamily,
        wb: &mut WriteBatch,
        r: &mut Round,
        queue: Arc<QueueState>,
        group: String,
        change: SettingsChange,
        reply: Sender<Result<(), PauseError>>,
    ) {
        let key = keys::group_key(&group, &queue.name);
        let current = match self.settings.get(&key) {
            Some(s) => s.clone(),
            None => match db.get_cf(meta, &key) {
                Ok(Some(v)) => match GroupSettings::decode(&key, &v) {
                    Ok(s) => s,
                    // A record we cannot read is replaced rather than left to block every
                    // later change; the caller's change is the newest intent anyway.
                    Err(e) => {
                        tracing::warn!(error = %e, "rockq: replacing an undecodable group settings record");
                        GroupSettings::default()
                    }
                },
                Ok(None) => GroupSettings::default(),
                Err(e) => {
                    let _ = reply.send(Err(PauseError::Storage(StorageError(e))));
                    return;
                }
            },
        };
        let mut next = current.clone();
        match &change {
            SettingsChange::Paused(p) => next.paused = *p,
            SettingsChange::DeadLetterQueue(n) => next.dead_letter_queue = n.clone(),
        }
        if next != current {
            wb.put_cf(meta, &key, next.encode());
        }
        self.settings.insert(key, next);
        let engine = self.engine.clone();
        r.on_done(move |res| {
            if res.is_ok()
                && let SettingsChange::Paused(p) = change
            {
                let offset_key = keys::offset_key(&group, &queue.name);
                if let Some(g) = engine.registry.groups.get(&offset_key) {
                    g.paused.store(p, Ordering::SeqCst);
                }
                if let Some(g) = engine.registry.work_groups.get(&offset_key) {
                    g.paused.store(p, Ordering::SeqCst);
                    g.changed.notify_waiters();
                }
                // Subscribers re-check the flag when the queue's watch changes.
                queue.last.send_modify(|_| {});
            }
            let _ = reply.send(res.map_err(|e| PauseError::Storage(e.clone())));
        });
    }
}
