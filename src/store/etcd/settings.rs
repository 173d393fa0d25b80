//! Group settings records in etcd (`N g/group:<group>:<queue>`, the RocksDB codec: a work
//! group's lease, retry policy and dead-letter queue, and either mode's pause flag), read whole
//! and followed by a watch, so that every process learns a pause (or a work group's update)
//! made by another without polling.

use etcd_client::{GetOptions, WatchOptions};

use super::{EtcdStore, WatchedKind, corrupt};
use crate::error::StorageError;
use crate::model::GroupSettings;
use crate::store::{keys, records};

/// A group's settings record as stored: its group, queue, record and `mod_revision`.
#[derive(Debug, Clone)]
pub(crate) struct SettingsRecord {
    pub group: String,
    pub queue: String,
    pub settings: GroupSettings,
    pub rev: i64,
}

impl EtcdStore {
    fn settings_record(&self, kv: &etcd_client::KeyValue) -> Result<SettingsRecord, StorageError> {
        let plen = self.key(b"g/", b"").len();
        let key = kv.key().get(plen..).unwrap_or_default();
        let (group, queue) = keys::parse_group_key(key).map_err(corrupt)?;
        let settings = records::decode_settings(kv.key(), kv.value()).map_err(corrupt)?;
        Ok(SettingsRecord {
            group: group.to_owned(),
            queue: queue.to_owned(),
            settings,
            rev: kv.mod_revision(),
        })
    }

    /// Every group's settings record, and the revision they were read at (a watch starts
    /// after it).
    pub async fn all_settings(&self) -> Result<(Vec<SettingsRecord>, i64), StorageError> {
        let prefix = self.key(b"g/", b"");
        let got = self.kv().get_long(prefix, Some(GetOptions::new().with_prefix())).await?;
        let rev = got.header().map_or(0, |h| h.revision());
        let records = got.kvs().iter().map(|kv| self.settings_record(kv)).collect::<Result<_, _>>()?;
        Ok((records, rev))
    }

    /// A stream of settings records written after `revision`. Ends (with `Err`) when the watch
    /// breaks or its start was compacted: the caller reads every record again and watches on.
    pub async fn watch_settings(
        &self,
        revision: i64,
    ) -> Result<impl futures::Stream<Item = Result<Vec<SettingsRecord>, StorageError>> + use<>, StorageError>
    {
        let prefix = self.key(b"g/", b"");
        let opts = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let store = self.clone();
        let decode = move |kind, kv: &etcd_client::KeyValue| match kind {
            WatchedKind::Put => store.settings_record(kv).map(Some),
            // Deleted with their group: the group deletions' watch (`deletion.rs`) forgets them.
            WatchedKind::Delete { .. } => Ok(None),
        };
        self.watch_events(prefix, opts, decode).await
    }
}
