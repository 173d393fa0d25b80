//! `Broker::stats` on etcd: queues and groups as the namespace holds them (every process's),
//! with this process's in-flight deliveries laid over them.

use std::sync::Arc;
use std::time::Duration;

use super::side::EtcdSide;
use crate::engine::Engine;
use crate::engine::figures::{live_leases, pending_claim};
use crate::error::Error;
use crate::model::GroupMode as StoredMode;
use crate::stats::{GroupMode, GroupStats, PendingState, QueueStats, Stats};

pub(crate) async fn stats(engine: &Arc<Engine>, side: &EtcdSide) -> Result<Stats, Error> {
    let loaded = side.store.load().await?;
    let now = engine.clock().wall_micros();
    // How long message `seq` of queue `qid` has waited, from its enqueue time (`None`: not
    // there, trimmed or deleted meanwhile).
    let age_of = |qid: u32, seq: u64| async move {
        let got = side.store.read_range(qid, seq, seq, 1).await?;
        Ok::<_, Error>(
            got.first()
                .and_then(|(s, v)| crate::store::etcd::decode_envelope(qid, *s, v).ok())
                .map(|e| Duration::from_micros(now.saturating_sub(e.enqueued_at_micros))),
        )
    };
    let delayed = side.store.delayed_counts().await?;
    let mut queues = Vec::with_capacity(loaded.queues.len());
    for (name, meta, last) in &loaded.queues {
        let oldest_age = match *last >= meta.first_seq {
            true => age_of(meta.id, meta.first_seq).await?,
            false => None,
        };
        queues.push(QueueStats {
            name: name.clone(),
            first_seq: meta.first_seq,
            last_seq: *last,
            len: (*last + 1).saturating_sub(meta.first_seq),
            bytes_on_disk: 0,
            bytes: 0,
            retention: meta.retention,
            oldest_age,
            scheduled: delayed.get(&meta.id).map_or(0, |d| d.0),
            next_due: delayed.get(&meta.id).map(|d| crate::schedule::time_of(d.1)),
            dedup_window: meta.dedup_window,
        });
    }
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    let live = live_leases(engine, None);
    let last_of =
        |name: &str| loaded.queues.iter().find(|(n, _, _)| n == name).map(|(_, m, l)| (m.first_seq, *l));
    let mut groups = Vec::with_capacity(loaded.groups.len());
    for (group, queue, offset) in &loaded.groups {
        let Some(q) = queues.iter().find(|q| &q.name == queue) else { continue };
        let Some(qid) = loaded.queues.iter().find(|(n, _, _)| n == queue).map(|(_, m, _)| m.id) else {
            continue;
        };
        let start = (offset.committed + 1).max(q.first_seq);
        let registry = &engine.registry;
        let mut g = GroupStats {
            group: group.clone(),
            queue: queue.clone(),
            mode: match offset.mode {
                StoredMode::Ordered => GroupMode::Ordered,
                StoredMode::WorkQueue => GroupMode::WorkQueue,
            },
            committed: offset.committed,
            lag: (q.last_seq + 1).saturating_sub(start),
            oldest_unacked_age: None,
            in_flight: registry.ordered(group, queue).map_or(0, |g| g.in_flight()),
            waiting_retry: 0,
            dead_letter_queue: None,
            dlq_depth: 0,
            // As the settings watch keeps it (every group's record, not only those loaded here).
            paused: side
                .group_settings
                .get(&crate::store::group_id(group, queue))
                .is_some_and(|k| k.0.paused),
            lease: None,
            retry_policy: None,
            ordered_by_key: false,
            keep_outcomes: None,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
            limited: 0,
        };
        if offset.mode == StoredMode::WorkQueue {
            // Claim counts from every process's records, as embedded from the disk's.
            // (Deleted since the groups were read: none.)
            let records = side.store.load_claims(group, queue).await?.map(|l| l.records).unwrap_or_default();
            let live = live.get(&(group.clone(), queue.clone()));
            let mut done = std::collections::BTreeSet::new();
            for r in records.into_iter().filter(|r| r.seq >= start) {
                match pending_claim(r.seq, r.claim, now, live).map(|p| p.state) {
                    None => {
                        done.insert(r.seq);
                    }
                    Some(PendingState::Leased) => g.in_flight += 1,
                    Some(PendingState::Waiting) => g.waiting_retry += 1,
                    Some(_) => {}
                }
            }
            g.lag = g.lag.saturating_sub(done.len() as u64);
            // The oldest message not finished, as embedded: past the finished ones above the
            // offset.
            let mut oldest = start;
            while done.contains(&oldest) {
                oldest += 1;
            }
            if oldest <= q.last_seq {
                g.oldest_unacked_age = age_of(qid, oldest).await?;
            }
            let (record, _) = side.store.work_settings(group, queue).await?;
            let record = record.unwrap_or_default();
            let dlq = crate::model::dead_letter_queue_of(&record, queue).to_string();
            if let Some((first, last)) = last_of(&dlq) {
                let (cursor, _) = side.store.cursor(&dlq).await?;
                let cursor = cursor.max(first - 1);
                // Less the letters settled on their own above the cursor.
                let settled = side.store.letter_marks(&dlq).await?.range(cursor + 1..).count() as u64;
                g.dlq_depth = last.saturating_sub(cursor).saturating_sub(settled);
            }
            g.dead_letter_queue = Some(dlq);
            if let Some(t) = &record.work {
                (g.lease, g.retry_policy, g.ordered_by_key) =
                    (Some(t.lease), Some(t.policy.clone()), t.ordered_by_key);
                g.keep_outcomes = Some(t.keep_outcomes).filter(|k| !k.is_zero());
                (g.rate_limit, g.concurrency_limit, g.per_key_limit) =
                    (t.rate_limit, t.concurrency_limit, t.per_key_limit);
                // Held back by a limit: as this process's claim index sees them (a process
                // that never loaded the group knows of none).
                let id = crate::store::group_id(group, queue);
                if let Some(w) = registry.work.get(&id) {
                    g.limited = w.limited(engine.clock().now());
                }
            }
        }
        if offset.mode == StoredMode::Ordered && start <= q.last_seq {
            g.oldest_unacked_age = age_of(qid, start).await?;
        }
        groups.push(g);
    }
    groups.sort_by(|a, b| (&a.queue, &a.group).cmp(&(&b.queue, &b.group)));
    let keyspaces = super::keyspaces::counts(engine, side).await?;
    Ok(Stats { queues, groups, bytes_on_disk: 0, keyspaces })
}
