//! `/metrics`: the figures of [`Broker::stats`](crate::Broker::stats) in the Prometheus text
//! exposition format (version 0.0.4), one gauge family per field, labelled by queue and group.

use std::fmt::Write as _;

use crate::stats::Stats;

/// The content type Prometheus expects for this format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label values escape backslash, double quote and newline (the format's only rules).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

/// The whole exposition.
pub(crate) fn render(stats: &Stats) -> String {
    let mut out = String::new();
    family(&mut out, "rockq_database_bytes", "Bytes of the database: live SST files and memtables.");
    let _ = writeln!(out, "rockq_database_bytes {}", stats.bytes_on_disk);

    type QueueField = fn(&crate::stats::QueueStats) -> f64;
    let queue_fields: [(&str, &str, QueueField); 6] = [
        ("rockq_queue_length", "Messages stored in the queue.", |q| q.len as f64),
        ("rockq_queue_first_seq", "First live sequence of the queue.", |q| q.first_seq as f64),
        ("rockq_queue_last_seq", "Last written sequence of the queue.", |q| q.last_seq as f64),
        ("rockq_queue_bytes", "Approximate bytes of the queue's messages in SST files.", |q| {
            q.bytes_on_disk as f64
        }),
        ("rockq_queue_oldest_age_seconds", "Age of the oldest stored message (0 when empty).", |q| {
            q.oldest_age.map_or(0.0, |d| d.as_secs_f64())
        }),
        ("rockq_queue_scheduled", "Delayed messages waiting to fall due.", |q| q.scheduled as f64),
    ];
    for (name, help, f) in queue_fields {
        family(&mut out, name, help);
        for q in &stats.queues {
            let _ = writeln!(out, "{name}{{queue=\"{}\"}} {}", label(&q.name), f(q));
        }
    }

    type GroupField = fn(&crate::stats::GroupStats) -> f64;
    let group_fields: [(&str, &str, GroupField); 7] = [
        ("rockq_group_committed", "Committed offset of the group.", |g| g.committed as f64),
        ("rockq_group_lag", "Messages after the offset the group has not finished.", |g| g.lag as f64),
        ("rockq_group_lag_seconds", "Age of the oldest unfinished message (0 when none).", |g| {
            g.oldest_unacked_age.map_or(0.0, |d| d.as_secs_f64())
        }),
        ("rockq_group_in_flight", "Messages handed out and not yet finished.", |g| g.in_flight as f64),
        ("rockq_group_waiting_retry", "Work-queue messages waiting for a retry.", |g| g.waiting_retry as f64),
        ("rockq_group_dlq_depth", "Dead letters of the group's dead-letter queue not yet redriven.", |g| {
            g.dlq_depth as f64
        }),
        ("rockq_group_paused", "1 when the group is paused.", |g| u8::from(g.paused).into()),
    ];
    for (name, help, f) in group_fields {
        family(&mut out, name, help);
        for g in &stats.groups {
            let _ = writeln!(
                out,
                "{name}{{queue=\"{}\",group=\"{}\",mode=\"{}\"}} {}",
                label(&g.queue),
                label(&g.group),
                g.mode.as_str(),
                f(g)
            );
        }
    }
    family(&mut out, "rockq_keyspace_keys", "Keys held by the keyspace.");
    for k in &stats.keyspaces {
        let _ = writeln!(out, "rockq_keyspace_keys{{keyspace=\"{}\"}} {}", label(&k.name), k.keys);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
