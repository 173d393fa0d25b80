//! The writer's half of group settings: pause flags and recorded dead-letter queues, for either
//! mode. A change is applied to the latest record (the writer's own copy, read from disk on
//! first use), so concurrent changes of different fields do not undo each other.

use std::sync::atomic::Ordering;

use super::round::Round;
use crate::engine::request::{SettingsChange, SettingsRequest, refuse};
use crate::error::{Closed, PauseError};
use crate::model::GroupSettings;
use crate::store::ReadError;

pub(super) fn apply(r: &mut Round<'_>, req: SettingsRequest) {
    let SettingsRequest { queue, group, change, reply } = req;
    if queue.is_deleted() {
        // Its groups' records are gone: a settings record would outlive them.
        let _ = reply.send(Err(PauseError::NoSuchGroup { group, queue: queue.name.to_string() }));
        return;
    }
    let id = (group.clone(), queue.name.clone());
    let current = match r.written.settings.get(&id) {
        Some(s) => s.clone(),
        None => match r.batch.settings(&group, &queue.name) {
            Ok(s) => s.unwrap_or_default(),
            // A record we cannot read is replaced rather than left to block every later change;
            // the caller's change is the newest intent anyway.
            Err(ReadError::Corrupt(e)) => {
                tracing::warn!(error = %e, "rockq: replacing an undecodable group settings record");
                GroupSettings::default()
            }
            Err(ReadError::Storage(e)) => {
                let _ = reply.send(Err(PauseError::Storage(e)));
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
        r.batch.put_settings(&group, &queue.name, &next);
    }
    r.written.settings.insert(id, next);
    let engine = r.engine.clone();
    r.on_done(move |res| {
        if res.is_ok()
            && let SettingsChange::Paused(p) = change
        {
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
        let _ = reply.send(res.map_err(|e| PauseError::Storage(e.clone())));
    });
}

pub(super) fn refuse_request(req: SettingsRequest, why: &Closed) {
    refuse(req.reply, why);
}
