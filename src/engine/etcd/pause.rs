//! The writer's half of pausing and resuming a group on etcd: a compare-and-set on the
//! group's settings record, applied here at once (`settings.rs` teaches the other processes).

use super::settings::{apply, learn};
use super::side::retrying;
use super::writer::Writer;
use crate::engine::registry::QueueState;
use crate::engine::request::SettingsChange;
use crate::error::Error;
use crate::model::GroupSettings;
use crate::store::etcd::settings::SettingsRecord;
use crate::store::etcd::work::SettingsPut;

impl Writer {
    /// Changes group `group`'s settings record as `change` says, by a compare-and-set on the
    /// record as read (another process's change of another field is kept), then applies it
    /// here at once; other processes learn it through their watch.
    pub(super) async fn change_settings(
        &mut self,
        queue: &QueueState,
        group: &str,
        change: SettingsChange,
    ) -> Result<(), Error> {
        let (store, t) = (self.side.store.clone(), self.side.settings.request_timeout);
        let qname = &queue.name;
        // A group another process created is not registered here: etcd says whether it is.
        if !self.engine.registry.has_group(group, qname)
            && retrying(t, || store.offset(group, qname)).await?.is_none()
        {
            return Err(Error::NoSuchGroup { group: group.to_owned(), queue: qname.to_string() });
        }
        loop {
            let (current, rev) = retrying(t, || store.work_settings(group, qname)).await?;
            let mut next = current.clone().unwrap_or_default();
            match change {
                SettingsChange::Paused(p) => next.paused = p,
            }
            if current.as_ref().unwrap_or(&GroupSettings::default()) == &next {
                apply(&self.engine, group, qname, &next);
                return Ok(());
            }
            let seen = self.side.seen(group, qname);
            match retrying(t, || store.put_work_settings(group, qname, &next, rev, seen, false)).await? {
                SettingsPut::Written(rev) => {
                    let record = SettingsRecord {
                        group: group.to_owned(),
                        queue: qname.to_string(),
                        settings: next,
                        rev,
                    };
                    learn(&self.engine, &self.side, &record);
                    return Ok(());
                }
                SettingsPut::Changed => {}
                // Deleted meanwhile (by any process).
                SettingsPut::GroupGone => {
                    return Err(Error::NoSuchGroup { group: group.to_owned(), queue: qname.to_string() });
                }
            }
        }
    }
}
