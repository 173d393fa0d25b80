//! Metrics, through the [`metrics`] facade: rockq records, the application's recorder
//! (Prometheus, StatsD, …) exports. Without a recorder every call is a cheap no-op.
//!
//! Counters are bumped where the work is already batched — once per writer round, per read
//! batch, per claim batch — never once per message on the hot path, so the facade's key lookup
//! costs nothing measurable. Gauges (lag, oldest un-acked age, in flight, depth) are computed
//! from [`Broker::stats`](crate::Broker::stats): every
//! [`metrics_interval`](crate::Options::metrics_interval) and on every call to it.

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::stats::Stats;

/// Messages appended, per queue.
pub const PRODUCED: &str = "rockq_messages_produced_total";
/// Messages handed to consumers, per queue, group and mode (redeliveries included).
pub const DELIVERED: &str = "rockq_messages_delivered_total";
/// Messages acknowledged (ordered: committed), per queue and group.
pub const ACKED: &str = "rockq_messages_acked_total";
/// Failed attempts scheduled for a retry, per queue and group.
pub const RETRIED: &str = "rockq_messages_retried_total";
/// Messages moved to a dead-letter queue, per queue and group.
pub const DEAD_LETTERED: &str = "rockq_messages_dead_lettered_total";
/// Leases that ran out before their holder settled, per queue and group.
pub const LEASE_EXPIRED: &str = "rockq_lease_expirations_total";
/// Dead letters moved back, per dead-letter queue.
pub const REDRIVEN: &str = "rockq_messages_redriven_total";
/// Messages deleted by retention, per queue.
pub const TRIMMED: &str = "rockq_messages_trimmed_total";
/// Times a consumer's in-flight bound stayed full, per queue and group.
pub const SATURATED: &str = "rockq_consumer_saturations_total";
/// Tries of a subscription or worker pool that found the store unreachable and waited to try
/// again (etcd: no member answered in time), per queue and group.
pub const STORE_UNAVAILABLE: &str = "rockq_store_unavailable_total";
/// Delayed messages appended when they fell due, per queue.
pub const SCHEDULED_DELIVERED: &str = "rockq_scheduled_delivered_total";
/// Messages sent by recurring schedules, per queue and schedule.
pub const SCHEDULE_FIRED: &str = "rockq_schedule_fired_total";
/// Worker-pool handler runs whose transaction conflicted (a condition did not hold at commit)
/// and that ran again holding the job, per queue and group. Not failed attempts.
pub const POOL_CONFLICTS: &str = "rockq_pool_conflicts_total";
/// Sends found to be duplicates of an idempotency key (nothing written), per queue.
pub const DEDUP_HITS: &str = "rockq_dedup_hits_total";
/// Delayed messages waiting to fall due, per queue (gauge).
pub const SCHEDULED_DEPTH: &str = "rockq_queue_scheduled";
/// Messages (and other records) in one writer round: the group-commit batch size.
pub const BATCH_SIZE: &str = "rockq_writer_batch_messages";
/// Seconds from a round's write starting to it being durable in the broker's mode.
pub const COMMIT_LATENCY: &str = "rockq_writer_commit_seconds";
/// Messages stored, per queue.
pub const QUEUE_LENGTH: &str = "rockq_queue_messages";
/// Approximate bytes on disk, per queue.
pub const QUEUE_BYTES: &str = "rockq_queue_bytes";
/// Lag as a count: messages after the offset not yet finished, per queue and group.
pub const LAG: &str = "rockq_group_lag_messages";
/// Lag as a time: age of the oldest unfinished message (0 when none), per queue and group.
pub const OLDEST_UNACKED: &str = "rockq_group_oldest_unacked_seconds";
/// Messages handed out and not finished, per queue and group.
pub const IN_FLIGHT: &str = "rockq_group_in_flight";
/// Work-queue messages waiting for a retry, per queue and group.
pub const WAITING_RETRY: &str = "rockq_group_waiting_retry";
/// Dead letters not yet redriven, per queue and group (work-queue groups).
pub const DLQ_DEPTH: &str = "rockq_group_dlq_depth";
/// 1 while the group is paused, per queue and group.
pub const PAUSED: &str = "rockq_group_paused";

/// Every metric above, by name: what a dashboard or an alert may query
/// (`docs/grafana/rockq.json` is checked against it).
pub const ALL: &[&str] = &[
    PRODUCED,
    DELIVERED,
    ACKED,
    RETRIED,
    DEAD_LETTERED,
    LEASE_EXPIRED,
    REDRIVEN,
    TRIMMED,
    SATURATED,
    STORE_UNAVAILABLE,
    SCHEDULED_DELIVERED,
    SCHEDULE_FIRED,
    POOL_CONFLICTS,
    DEDUP_HITS,
    SCHEDULED_DEPTH,
    BATCH_SIZE,
    COMMIT_LATENCY,
    QUEUE_LENGTH,
    QUEUE_BYTES,
    LAG,
    OLDEST_UNACKED,
    IN_FLIGHT,
    WAITING_RETRY,
    DLQ_DEPTH,
    PAUSED,
];

/// The metrics recorded as histograms (the Prometheus exporter renders each as a summary by
/// default: `{quantile="…"}`, `_sum` and `_count`).
pub const HISTOGRAMS: &[&str] = &[BATCH_SIZE, COMMIT_LATENCY];

/// The key of a queue's [`PRODUCED`] counter: built once per queue (`QueueState::produced`).
pub(crate) fn produced_key(queue: &Arc<str>) -> metrics::Key {
    metrics::Key::from_parts(PRODUCED, vec![metrics::Label::new("queue", queue.clone())])
}

/// Counts `n` messages appended to the queue whose [`produced_key`] this is.
///
/// Why a prepared key, not `counter!(PRODUCED, "queue" => …)`: the completer counts every queue
/// a round touched, thousands in a round over thousands of queues, and the macro clones the
/// name's `Arc` (a locked increment on a cache line the producer's core last wrote) and
/// hashes a new key each time — 4 % of the fanout bench's CPU. The key is still registered
/// with whichever recorder is current at each call, as the macro does, so a recorder
/// installed after the broker opened still receives every count.
pub(crate) fn produced(key: &metrics::Key, n: u64) {
    static METADATA: metrics::Metadata<'static> =
        metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
    metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(n);
}

pub(crate) fn delivered(queue: &Arc<str>, group: &Arc<str>, mode: &'static str, n: u64) {
    if n > 0 {
        counter!(DELIVERED, "queue" => queue.clone(), "group" => group.clone(), "mode" => mode).increment(n);
    }
}

/// A per-(queue, group) counter.
pub(crate) fn group_counter(name: &'static str, queue: &Arc<str>, group: &Arc<str>, n: u64) {
    if n > 0 {
        counter!(name, "queue" => queue.clone(), "group" => group.clone()).increment(n);
    }
}

pub(crate) fn queue_counter(name: &'static str, queue: &Arc<str>, n: u64) {
    if n > 0 {
        counter!(name, "queue" => queue.clone()).increment(n);
    }
}

pub(crate) fn round(messages: u64, latency: Duration) {
    histogram!(BATCH_SIZE).record(messages as f64);
    histogram!(COMMIT_LATENCY).record(latency.as_secs_f64());
}

/// Sets the gauges from a stats snapshot.
pub(crate) fn publish(stats: &Stats) {
    for q in &stats.queues {
        let name = q.name.clone();
        gauge!(QUEUE_LENGTH, "queue" => name.clone()).set(q.len as f64);
        gauge!(SCHEDULED_DEPTH, "queue" => name.clone()).set(q.scheduled as f64);
        gauge!(QUEUE_BYTES, "queue" => name).set(q.bytes_on_disk as f64);
    }
    for g in &stats.groups {
        let labels = [("queue", g.queue.clone()), ("group", g.group.clone())];
        gauge!(LAG, &labels).set(g.lag as f64);
        gauge!(OLDEST_UNACKED, &labels).set(g.oldest_unacked_age.map_or(0.0, |d| d.as_secs_f64()));
        gauge!(IN_FLIGHT, &labels).set(g.in_flight as f64);
        gauge!(WAITING_RETRY, &labels).set(g.waiting_retry as f64);
        gauge!(DLQ_DEPTH, &labels).set(g.dlq_depth as f64);
        gauge!(PAUSED, &labels).set(if g.paused { 1.0 } else { 0.0 });
    }
}

/// Whether a `metrics` recorder is installed. The facade has no getter for that; without one
/// it hands out its `NoopRecorder`, a zero-sized type, while a real recorder holds its registry
/// or exporter state. So a zero-sized recorder counts as none (a recorder that keeps all its
/// state in statics would have to call [`Broker::stats`](crate::Broker::stats) to refresh the
/// gauges).
pub(crate) fn recorder_installed() -> bool {
    metrics::with_recorder(|r| std::mem::size_of_val(r) != 0)
}

#[cfg(test)]
mod tests {
    // Issue 13 (gauges without a recorder): the metrics task ran a full `store::load` every interval with no recorder
    // installed. The refresh now asks `recorder_installed` first; this pins the detection (no
    // global recorder is ever installed in the library's unit tests).
    #[test]
    fn the_noop_recorder_counts_as_none_and_a_real_one_as_installed() {
        assert!(!super::recorder_installed(), "nothing installed: the facade's no-op recorder");
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            assert!(super::recorder_installed(), "a real recorder is seen");
        });
    }
}
