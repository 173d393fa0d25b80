//! Retention as callers see it: the policy a queue keeps its messages under ([`Retention`]),
//! where a replay starts ([`ResetTo`]) and what a retention pass did ([`TrimReport`]). The pass
//! itself is the engine's (`engine/retention.rs`), the delete the writer's
//! (`engine/writer/retention.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a queue keeps messages, persisted with the queue (see
/// [`Queue::set_retention`](crate::Queue::set_retention)). Deleted messages are removed with one
/// range tombstone per trim and the queue's first sequence moves past them, so readers never
/// walk deleted entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Retention {
    /// Delete a message once every group of the queue has finished it (its offset passed it; a
    /// work-queue group's offset never passes a claimed message). A queue without groups keeps
    /// everything. The default.
    #[default]
    UntilAcked,
    /// Delete messages enqueued longer ago than this, consumed or not. Groups that fall behind
    /// skip to the first live message (reported as [`Event::Skipped`](crate::Event::Skipped)).
    MaxAge(Duration),
    /// Keep at most this many messages, consumed or not; the oldest go first.
    MaxLen(u64),
    /// Never delete: a replayable log.
    Forever,
}

/// `until-acked`, `forever`, `max-len 1000`, `max-age 3600s` (fractional seconds below one).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(rockq::Retention::MaxAge(Duration::from_secs(3600)).to_string(), "max-age 3600s");
/// assert_eq!(rockq::Retention::MaxLen(10).to_string(), "max-len 10");
/// ```
impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Retention::UntilAcked => f.write_str("until-acked"),
            Retention::MaxAge(d) if d.subsec_nanos() == 0 => write!(f, "max-age {}s", d.as_secs()),
            Retention::MaxAge(d) => write!(f, "max-age {}s", d.as_secs_f64()),
            Retention::MaxLen(n) => write!(f, "max-len {n}"),
            Retention::Forever => f.write_str("forever"),
        }
    }
}

/// Where a replay starts: see [`Group::reset_to`](crate::Group::reset_to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetTo {
    /// Redeliver from this sequence on (it must still be retained).
    Sequence(u64),
    /// Redeliver from the first message enqueued at or after this time.
    Time(SystemTime),
}

/// What one retention pass did ([`Broker::trim`](crate::Broker::trim)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrimReport {
    /// `(queue, messages deleted, new first sequence)` for every queue that was trimmed.
    pub trimmed: Vec<(String, u64, u64)>,
    /// Messages deleted in all.
    pub deleted: u64,
    /// Bytes of SST files and memtables before the pass.
    pub bytes_before: u64,
    /// Bytes after (and after compaction, if the pass compacted).
    pub bytes_after: u64,
    /// Whether the trimmed ranges were compacted.
    pub compacted: bool,
    /// Idempotency keys forgotten because their dedup window had passed.
    pub dedup_expired: u64,
    /// Job outcomes deleted because their group's retention had passed
    /// ([`WorkGroup::keep_outcomes`](crate::WorkGroup::keep_outcomes)).
    pub outcomes_expired: u64,
}

/// Wall-clock microseconds of `t` (0 before the epoch).
pub(crate) fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}
