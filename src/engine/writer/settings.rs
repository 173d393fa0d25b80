//! The writer's half of group settings, for either mode: pause flags, and a work group's
//! stored settings (lease, retry policy, dead-letter queue, key ordering). A change is applied
//! to the latest record (the writer's own copy, read from disk on first use), so concurrent
//! changes of different fields do not undo each other, and a pause never erases a lease.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::round::Round;
use crate::engine::request::{SettingsChange, SettingsMode, SettingsRequest, WorkSettingsRequest};
use crate::error::{Error, StorageError};
use crate::model::GroupSettings;
use crate::model::WorkSettings;
use crate::store::ReadError;

/// The latest settings record of `group` on `queue`: this writer's copy, else the disk's.
fn current(r: &Round<'_>, group: &str, queue: &str) -> Result<GroupSettings, StorageError> {
    if let Some(s) = r.written.settings.get(&(group.to_owned(), Arc::from(queue))) {
        return Ok(s.clone());
    }
    match r.batch.settings(group, queue) {
        Ok(s) => Ok(s.unwrap_or_default()),
        // A record we cannot read is replaced rather than left to block every later change;
        // the caller's change is the newest intent anyway.
        Err(ReadError::Corrupt(e)) => {
            tracing::warn!(error = %e, "rockq: replacing an undecodable group settings record");
            Ok(GroupSettings::default())
        }
        Err(ReadError::Storage(e)) => Err(e),
    }
}

pub(super) fn apply(r: &mut Round<'_>, req: SettingsRequest) {
    let SettingsRequest { queue, group, change, reply } = req;
    if queue.is_deleted() {
        // Its groups' records are gone: a settings record would outlive them.
        let _ = reply.send(Err(Error::NoSuchGroup { group, queue: queue.name.to_string() }));
        return;
    }
    let current = match current(r, &group, &queue.name) {
        Ok(s) => s,
        Err(e) => {
            let _ = reply.send(Err(Error::Storage(e)));
            return;
        }
    };
    let mut next = current.clone();
    match &change {
        SettingsChange::Paused(p) => next.paused = *p,
    }
    if next != current {
        r.batch.put_settings(&group, &queue.name, &next);
    }
    r.written.settings.insert((group.clone(), queue.name.clone()), next);
    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok() {
            let SettingsChange::Paused(p) = change;
            if let Some(g) = engine.registry.ordered(&group, &queue.name) {
                g.paused.store(p, Ordering::SeqCst);
            }
            if let Some(g) = engine.registry.work(&group, &queue.name) {
                g.paused.store(p, Ordering::SeqCst);
                g.changed.notify_waiters();
            }
            // Subscribers re-check the flag when the queue's watch changes.
            queue.poke();
        }
        let _ = reply.send(res.map_err(|e| Error::Storage(e.clone())));
    });
}

/// Resolves a work-group handle's explicit settings against the latest record (see
/// `work_settings.rs` for the rule) and stores the result if it changed. Resolving here, on
/// the one writer thread, is what makes "the first subscribe stores, later ones must match"
/// hold between handles racing each other.
pub(super) fn apply_work(r: &mut Round<'_>, req: WorkSettingsRequest) {
    let WorkSettingsRequest { group, requested, mode, reply } = req;
    let queue = group.queue.clone();
    if group.is_deleted() {
        // Written now, the record would outlive the group and be adopted by (or refuse) a
        // group created again under the name.
        let (q, g) = (queue.name.to_string(), group.name.to_string());
        let e = match queue.is_deleted() {
            true => Error::QueueDeleted { queue: q },
            false => Error::GroupDeleted { queue: q, group: g },
        };
        let _ = reply.send(Err(e));
        return;
    }
    let current = match current(r, &group.name, &queue.name) {
        Ok(s) => s,
        Err(e) => {
            let _ = reply.send(Err(Error::Storage(e)));
            return;
        }
    };
    let next = match (WorkSettings::stored(&current, &queue.name), mode) {
        (Some(stored), SettingsMode::Adopt) => match requested.mismatch(&stored) {
            Some(m) => {
                let _ = reply.send(Err(m.into_error(&group.name, &queue.name)));
                return;
            }
            None => stored,
        },
        (Some(stored), SettingsMode::Update) => requested.applied_to(&stored),
        (None, _) => requested.initial(&current, &queue.name),
    };
    if let Err(e) = next.check_key_setting(&group.name, &queue.name) {
        let _ = reply.send(Err(e));
        return;
    }
    // Only a default name can be too long: an explicit one was validated by the handle.
    if next.dead_letter_queue.len() > crate::name::MAX_NAME_LEN {
        let _ = reply.send(Err(Error::DeadLetterName { queue: queue.name.to_string() }));
        return;
    }
    let record = next.stored_in(&current);
    if record != current {
        r.batch.put_settings(&group.name, &queue.name, &record);
    }
    // A rate limit removed takes its bucket with it: a group without one writes what older
    // builds read (their exports know no `rate:` record).
    let had_rate = WorkSettings::stored(&current, &queue.name).is_some_and(|s| s.rate_limit.is_some());
    if had_rate && next.rate_limit.is_none() {
        r.batch.delete_rate(&group.name, &queue.name);
    }
    r.written.settings.insert((group.name.to_string(), queue.name.clone()), record);
    let next = Arc::new(next);
    r.on_done(move |res| {
        if res.is_ok() {
            group.set_settings(next.clone());
        }
        let _ = reply.send(res.map(|()| next).map_err(|e| Error::Storage(e.clone())));
    });
}
