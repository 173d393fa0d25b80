//! Rebuilding the registry from what the embedded store loaded at open: queues, groups, claims,
//! ordered groups' marks and stored settings, every cross-reference checked (a record that
//! names something that does not exist is corruption, not a silent skip).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{KeyspaceState, OrderedGroupState, QueueState, Registry, WorkGroupState};
use crate::error::{CorruptionError, Error};
use crate::model::GroupMode;
use crate::model::WorkSettings;
use crate::options::Options;
use crate::store::{GroupKeys, Loaded, group_id};

impl Registry {
    /// The registry as the store loaded it, and the ordered groups whose marks found at open
    /// are moot (the writer's first round deletes them).
    pub(crate) fn restore(
        loaded: Loaded,
        options: &Options,
    ) -> Result<(Registry, Vec<Arc<OrderedGroupState>>), Error> {
        let Loaded {
            queues,
            groups,
            claims,
            progress,
            buckets,
            settings,
            marks,
            scheduled,
            keyspaces,
            kv_revision,
            priorities,
            flows,
            ..
        } = loaded;
        let registry = Registry::default();
        *registry.flows_at_open.lock().unwrap_or_else(|p| p.into_inner()) = Some(flows);
        for k in keyspaces {
            let state = KeyspaceState::new(k.id, &k.name, k.keys);
            registry.keyspaces.insert(state.name.clone(), state);
        }
        registry.kv_revision.store(kv_revision, std::sync::atomic::Ordering::Relaxed);
        for q in queues {
            let state = QueueState::new(q.meta.id, &q.name, q.meta.first_seq, q.last_seq, q.meta.retention);
            state.set_dedup_window(q.meta.dedup_window);
            let waiting = scheduled.get(&q.meta.id).map_or(0, |s| s.0);
            state.scheduled.store(waiting, std::sync::atomic::Ordering::Relaxed);
            registry.queues.insert(state.name.clone(), state);
        }
        // The priority index, before the groups' claims: a restore tells a prioritised claim
        // (which may lie ahead of the group's frontier) from a plain one.
        let by_id: std::collections::HashMap<u32, Arc<QueueState>> =
            registry.queues.iter().map(|q| (q.id, q.value().clone())).collect();
        for (qid, seq, priority) in priorities {
            // An entry of no queue, or below its head, is a leftover a range delete covers.
            if let Some(q) = by_id.get(&qid).filter(|q| seq >= q.first_seq.load(Ordering::Relaxed)) {
                q.index_priority(seq, priority);
            }
        }
        for g in groups {
            // An offset for a queue that has no record cannot be produced by rockq.
            let Some(queue) = registry.queue(&g.queue) else {
                return Err(CorruptionError::new(
                    "offset",
                    &group_id(&g.group, &g.queue),
                    "names a queue that does not exist",
                )
                .into());
            };
            let id = group_id(&g.group, &g.queue);
            match g.offset.mode {
                GroupMode::WorkQueue => {
                    registry.work.insert(id, WorkGroupState::new(&g.group, queue, g.offset.committed));
                }
                GroupMode::Ordered => {
                    registry.ordered.insert(id, OrderedGroupState::new(&g.group, queue, g.offset.committed));
                }
            }
        }
        // Settings of a group that no longer exists (a removed group) are ignored. Before the
        // claims: a work group's restore depends on whether it is ordered by key.
        for s in settings {
            if let Some(g) = registry.ordered(&s.group, &s.queue) {
                g.paused.store(s.settings.paused, Ordering::Relaxed);
            }
            if let Some(g) = registry.work(&s.group, &s.queue) {
                g.paused.store(s.settings.paused, Ordering::Relaxed);
                // Stored terms are what every subscription runs with; a record without them (an
                // older build's) only names a dead-letter queue, adopted by the next subscribe.
                match WorkSettings::stored(&s.settings, &s.queue) {
                    Some(w) => g.set_settings(Arc::new(w)),
                    None => g.set_recorded_dlq(s.settings.dead_letter_queue),
                }
            }
        }
        let mut by_group: std::collections::HashMap<Vec<u8>, Vec<_>> = std::collections::HashMap::new();
        for c in claims {
            let id = group_id(&c.group, &c.queue);
            if !registry.work.contains_key(&id) {
                let key = GroupKeys::work(&c.group, &c.queue).record(c.seq);
                return Err(CorruptionError::new("claim", &key, "names a group that does not exist").into());
            }
            by_group.entry(id).or_default().push((c.seq, c.claim));
        }
        for g in registry.work.iter() {
            g.restore(by_group.remove(g.keys.id()).unwrap_or_default(), &options.clock);
        }
        // Progress reports of running jobs (one of a job finished since is deleted with it; one
        // left below the offset by an older trim goes with the group's next trim or reset).
        for (group, queue, seq, report) in progress {
            if let Some(g) = registry.work.get(&group_id(&group, &queue)) {
                g.restore_progress(seq, report);
            }
        }
        // Rate buckets as the last claims left them: a restart does not refill one into a
        // burst (a bucket of a removed group is ignored; the group's deletion deleted it).
        for (group, queue, micros) in buckets {
            if let Some(g) = registry.work.get(&group_id(&group, &queue)) {
                g.restore_bucket(options.clock.instant_at_wall(micros), micros, options.clock.now());
            }
        }
        // Ordered groups' delivery counts and dead letters above their offsets.
        let mut stale = Vec::new();
        for m in marks {
            let Some(g) = registry.ordered(&m.group, &m.queue) else {
                let key = GroupKeys::ordered(&m.group, &m.queue).record(m.seq);
                return Err(CorruptionError::new(
                    "delivery",
                    &key,
                    "names an ordered group that does not exist",
                )
                .into());
            };
            // At or below the offset, or of a trimmed message: moot, deleted by the writer's next
            // round (the group is marked dirty once, and handed to it).
            let floor = g.records_moot_through(g.durable.load(Ordering::Relaxed));
            let mut rec = g.records();
            rec.stored.insert(m.seq);
            if m.seq <= floor {
                if g.mark() {
                    stale.push(g.clone());
                }
            } else {
                match m.mark {
                    crate::model::OrderedMark::DeadLettered { .. } | crate::model::OrderedMark::Acked => {
                        rec.dead.insert(m.seq);
                    }
                    crate::model::OrderedMark::CameBack { deliveries, not_before_micros } => {
                        rec.failed.insert(m.seq, (deliveries, not_before_micros));
                    }
                }
            }
        }
        Ok((registry, stale))
    }
}
