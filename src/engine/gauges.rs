//! The metrics gauges and a live broker's `Broker::stats`, from memory: queue bounds, offsets,
//! lease and retry counts come from the registry (the claim index keeps its counts), and the
//! few figures only the store knows are point reads — the enqueue time of a queue's or group's
//! oldest message (cached between gauge ticks while that message stays the oldest), a
//! dead-letter queue's redrive cursor once per queue, the next due time of queues with delayed
//! messages. Both used to run a full `store::load` of every claim (1.4 s with a million waiting
//! retries); the read-only `Inspector`, which has no registry, still does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Engine;
use crate::error::Error;
use crate::stats::{GroupMode, GroupStats, KeyspaceStats, QueueStats, Stats};
use crate::store::Store;

/// What earlier ticks read: per queue id and sequence, its enqueue time (µs).
#[derive(Default)]
pub(crate) struct GaugeCache {
    oldest: HashMap<(u32, u64), u64>,
}

/// A live broker's stats at the broker clock's wall time `now`: the gauges' figures with each
/// queue's next due time, queues and groups in name order. Blocking (point reads, and a walk
/// of the due index's head when delayed messages wait).
pub(crate) fn stats(engine: &Engine, store: &Store, now: u64) -> Result<Stats, Error> {
    let mut stats = snapshot(engine, store, &mut GaugeCache::default(), now)?;
    let waiting: std::collections::HashSet<u32> = engine
        .registry
        .queues
        .iter()
        .filter(|q| q.scheduled.load(Ordering::Relaxed) > 0)
        .map(|q| q.id)
        .collect();
    if !waiting.is_empty() {
        let next = {
            let guard = store.lock();
            let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
            db.next_due(&waiting).map_err(Error::from)?
        };
        for q in &mut stats.queues {
            let due = engine.registry.queues.get(q.name.as_str()).and_then(|s| next.get(&s.id).copied());
            q.next_due = due.map(crate::schedule::time_of);
        }
    }
    stats.queues.sort_by(|a, b| a.name.cmp(&b.name));
    stats.groups.sort_by(|a, b| (&a.queue, &a.group).cmp(&(&b.queue, &b.group)));
    Ok(stats)
}

/// The gauges' figures at the broker clock's wall time `now`. Blocking (a few point reads).
pub(crate) fn snapshot(
    engine: &Engine,
    store: &Store,
    cache: &mut GaugeCache,
    now: u64,
) -> Result<Stats, Error> {
    let guard = store.lock();
    let Some(db) = guard.inspect(&store.path) else { return Err(Error::Shutdown) };
    let mut seen = HashMap::new();
    let mut age = |queue: u32, seq: u64| -> Result<Option<Duration>, Error> {
        let at = match cache.oldest.get(&(queue, seq)) {
            Some(&t) => Some(t),
            None => db.enqueued_at(queue, seq).map_err(Error::Storage)?,
        };
        Ok(at.map(|t| {
            seen.insert((queue, seq), t);
            Duration::from_micros(now.saturating_sub(t))
        }))
    };
    let mut queues = Vec::new();
    let mut last_of = HashMap::new();
    for q in engine.registry.queues.iter() {
        let (first, last) = (q.first_seq.load(Ordering::Acquire), q.last_seq());
        last_of.insert(q.name.clone(), (q.id, first, last));
        queues.push(QueueStats {
            name: q.name.to_string(),
            first_seq: first,
            last_seq: last,
            len: (last + 1).saturating_sub(first),
            bytes_on_disk: db.queue_bytes(q.id),
            bytes: db.queue_size(q.id, first, (last + 1).saturating_sub(first)),
            retention: q.retention(),
            oldest_age: if last >= first { age(q.id, first)? } else { None },
            // The writer's running count: no scan of the schedule per tick.
            scheduled: q.scheduled.load(Ordering::Relaxed),
            next_due: None,
            dedup_window: q.dedup_window(),
        });
    }
    let mut groups = Vec::new();
    for g in engine.registry.ordered.iter() {
        let (first, last) = (g.queue.first_seq.load(Ordering::Acquire), g.queue.last_seq());
        let committed = g.durable.load(Ordering::Acquire);
        let start = (committed + 1).max(first);
        groups.push(GroupStats {
            group: g.name.to_string(),
            queue: g.queue.name.to_string(),
            mode: GroupMode::Ordered,
            committed,
            lag: (last + 1).saturating_sub(start),
            oldest_unacked_age: if last >= start { age(g.queue.id, start)? } else { None },
            in_flight: g.in_flight(),
            waiting_retry: 0,
            dead_letter_queue: None,
            dlq_depth: 0,
            paused: g.paused.load(Ordering::Acquire),
            lease: None,
            retry_policy: None,
            ordered_by_key: false,
            keep_outcomes: None,
            rate_limit: None,
            concurrency_limit: None,
            per_key_limit: None,
            limited: 0,
        });
    }
    let clock_now = engine.clock().now();
    let mut cursors: HashMap<Arc<str>, (u64, u64)> = HashMap::new();
    for g in engine.registry.work.iter() {
        let (first, last) = (g.queue.first_seq.load(Ordering::Acquire), g.queue.last_seq());
        let committed = g.durable.load(Ordering::Acquire);
        let start = (committed + 1).max(first);
        // The oldest message not finished: above the offset, finished ones may wait for the
        // gap below them to close.
        let (finished, oldest) = {
            let p = g.progress();
            let mut oldest = start;
            while oldest <= last && p.done.contains(oldest) {
                oldest += 1;
            }
            (p.done.len() as u64, oldest)
        };
        let settings = g.settings();
        let dlq: Arc<str> = match &settings {
            Some(s) => s.dead_letter_queue.clone(),
            None => g.recorded_dlq(),
        };
        let dlq_depth = match last_of.get(&dlq) {
            Some(&(_, dlq_first, dlq_last)) => {
                let (cursor, settled) = match cursors.get(&dlq) {
                    Some(&c) => c,
                    None => {
                        let c = db.cursor(&dlq).map_err(Error::from)?.unwrap_or(0).max(dlq_first - 1);
                        // Less the letters settled on their own above the cursor.
                        let marks = db.letter_marks(&dlq).map_err(Error::from)?;
                        let c = (c, marks.range(c + 1..).count() as u64);
                        cursors.insert(dlq.clone(), c);
                        c
                    }
                };
                dlq_last.saturating_sub(cursor).saturating_sub(settled)
            }
            None => 0,
        };
        groups.push(GroupStats {
            group: g.name.to_string(),
            queue: g.queue.name.to_string(),
            mode: GroupMode::WorkQueue,
            committed,
            lag: (last + 1).saturating_sub(start).saturating_sub(finished),
            oldest_unacked_age: if last >= oldest { age(g.queue.id, oldest)? } else { None },
            // Leases not yet run out: an expired one is no one's (its outcome is refused),
            // though the claim index counts it until the message is claimed again.
            in_flight: g.live_leased(clock_now) as u64,
            waiting_retry: g.waiting() as u64,
            dead_letter_queue: Some(dlq.to_string()),
            dlq_depth,
            paused: g.paused.load(Ordering::Acquire),
            lease: settings.as_ref().map(|s| s.lease),
            retry_policy: settings.as_ref().map(|s| s.policy.clone()),
            ordered_by_key: settings.as_ref().is_some_and(|s| s.ordered_by_key),
            keep_outcomes: settings.as_ref().map(|s| s.keep_outcomes).filter(|k| !k.is_zero()),
            rate_limit: settings.as_ref().and_then(|s| s.rate_limit),
            concurrency_limit: settings.as_ref().and_then(|s| s.concurrency_limit),
            per_key_limit: settings.as_ref().and_then(|s| s.per_key_limit),
            limited: g.limited(clock_now),
        });
    }
    // Only what this tick used is kept: the cache never outgrows the queues and groups.
    cache.oldest = seen;
    let mut keyspaces: Vec<KeyspaceStats> = engine
        .registry
        .keyspaces
        .iter()
        .map(|k| KeyspaceStats { name: k.name.to_string(), keys: k.keys() })
        .collect();
    keyspaces.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Stats { queues, groups, bytes_on_disk: db.db_bytes(), keyspaces })
}
