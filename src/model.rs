//! The durable facts of the queue domain, as the engine and the handles use them: a work
//! group's claim on a message, an ordered group's mark on a message that came back, a group's
//! mode, offset and settings, a queue's metadata, and the headers that make a message a dead
//! letter.
//!
//! These are plain values. `store/records.rs` maps each to its on-disk record (version byte,
//! field order, caps); nothing above `store/` sees a record layout, so a format change stays a
//! store change.

use std::sync::Arc;

use crate::retention::Retention;
pub use crate::stats::GroupMode;

/// Where a group that has never subscribed starts. Ignored once the group exists: it then
/// always resumes after its committed offset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartFrom {
    /// The oldest message still stored.
    #[default]
    Earliest,
    /// Only messages sent after the group is created.
    Latest,
    /// This sequence (must be within `first_seq..=last_seq + 1`).
    Sequence(u64),
}

/// A queue's metadata: its numeric id (the key prefix of its messages), first live sequence
/// and retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueMeta {
    pub id: u32,
    /// Sequences below this were deleted by retention (or never existed).
    pub first_seq: u64,
    pub retention: Retention,
    /// How long an idempotency key is remembered.
    pub dedup_window: std::time::Duration,
}

/// How long an idempotency key is remembered unless the queue sets its own window (SQS's
/// five minutes).
pub(crate) const DEFAULT_DEDUP_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// An idempotency key's record: what became of the first message with it, and until when a
/// second one is a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DedupRecord {
    pub original: crate::sent::Original,
    pub expires_micros: u64,
}

/// A recurring schedule as stored: its recurrence, its message, and when it fires next. The
/// writer rewrites it in the batch that delivers a firing, so each firing happens once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScheduleRecord {
    /// Its id in the due index (`t<due><RECURRING><id>`).
    pub id: u64,
    pub queue: String,
    pub recurrence: crate::schedule::Recurrence,
    /// Interval schedules fire at `anchor + k·interval`.
    pub anchor_micros: u64,
    pub paused: bool,
    /// The due entry it has (0: none — paused, or it never fires again).
    pub next_micros: u64,
    pub fired: u64,
    pub missed_firings: u64,
    /// Last delivery: its time and sequence (0: never).
    pub last_micros: u64,
    pub last_seq: u64,
    /// The message it sends, encoded.
    pub envelope: Vec<u8>,
}

/// A group's committed offset: every sequence up to it is finished for the group (0: none).
/// The mode is stored with it, so a name cannot silently switch between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupOffset {
    pub mode: GroupMode,
    pub committed: u64,
}

/// Settings of a group that outlive its handles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GroupSettings {
    /// A paused group hands out nothing until resumed.
    pub paused: bool,
    /// A work group's dead-letter queue (empty: not recorded). Records written before the
    /// work terms were stored hold the queue the group last subscribed with.
    pub dead_letter_queue: String,
    /// A work group's lease, retry policy and key ordering; `None` for an ordered group, and
    /// for a work group whose record predates them (the next subscribe stores them).
    pub work: Option<WorkTerms>,
}

/// What a work group stores besides its dead-letter queue: every subscription of the group,
/// in any process, runs with these (see `work_settings.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkTerms {
    /// How long a claim is held before the message may go to another consumer.
    pub lease: std::time::Duration,
    pub policy: crate::retry::RetryPolicy,
    /// Messages with the same ordering key are handed out one at a time.
    pub ordered_by_key: bool,
}

/// Where one message above a work group's offset stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Attempt `attempt` is held by the holder of `token` until `deadline_micros` (wall clock).
    /// Written before the job is handed out, so attempt counts survive a crash.
    Leased { attempt: u32, token: u64, deadline_micros: u64, holder: Arc<str> },
    /// Attempt `attempt` failed with `last_error`; claimable again at `not_before_micros`.
    Waiting { attempt: u32, token: u64, not_before_micros: u64, last_error: String },
    /// Acknowledged or dead-lettered above a sequence still in flight: the offset cannot pass
    /// it yet. Deleted when the offset passes it.
    Done,
}

/// What an ordered group knows about one message above its offset. Kept only for messages
/// whose deliveries came back without an ack, or that were dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrderedMark {
    /// `deliveries` deliveries came back (nacked or dropped); not to be delivered again before
    /// `not_before_micros` (wall clock; 0: at once).
    CameBack { deliveries: u32, not_before_micros: u64 },
    /// Moved to the dead-letter queue after `deliveries` deliveries: done for the group.
    DeadLettered { deliveries: u32 },
    /// Acknowledged by a transaction while an earlier delivery was still out: done for the
    /// group (the transaction's writes and this mark landed together), though the offset
    /// cannot pass it yet.
    Acked,
}

/// Longest last-error text kept in a claim record or a dead letter's reason.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;
/// Longest holder (consumer) name kept in a claim record.
pub(crate) const MAX_HOLDER_BYTES: usize = 255;

/// The dead-letter queue a group of `queue` uses unless told otherwise: `<queue>.dlq`.
pub(crate) fn default_dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// Refuses a group's dead-letter queue that is the group's own queue: every dead letter would
/// be appended where the group reads it, and delivered (and fail) again, for ever.
pub(crate) fn check_dead_letter_queue(queue: &str, group: &str, dlq: &str) -> Result<(), String> {
    if dlq == queue {
        return Err(format!(
            "group {group} on queue {queue}: the dead-letter queue cannot be the group's own queue \
             (dead letters would be delivered to it again)"
        ));
    }
    Ok(())
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

/// The headers that record a dead letter's origin, appended to its original headers. Every one
/// starts with [`dlq::PREFIX`](self::dlq::PREFIX).
pub(crate) mod dlq {
    /// Prefix of every dead-letter header.
    pub(crate) const PREFIX: &str = "rockq-dlq-";
    pub(crate) const QUEUE: &str = "rockq-dlq-queue";
    pub(crate) const SEQ: &str = "rockq-dlq-seq";
    pub(crate) const GROUP: &str = "rockq-dlq-group";
    pub(crate) const ATTEMPTS: &str = "rockq-dlq-attempts";
    /// Why the message was dead-lettered.
    pub(crate) const REASON: &str = "rockq-dlq-reason";
    pub(crate) const ENQUEUED: &str = "rockq-dlq-enqueued-at";

    /// The headers of a dead letter of message `seq` of `queue`, given up on by `group` after
    /// `attempts` attempts.
    pub(crate) fn headers(
        queue: &str,
        group: &str,
        seq: u64,
        attempts: u32,
        reason: &str,
        enqueued_micros: u64,
    ) -> [(&'static str, String); 6] {
        [
            (QUEUE, queue.to_owned()),
            (SEQ, seq.to_string()),
            (GROUP, group.to_owned()),
            (ATTEMPTS, attempts.to_string()),
            (REASON, super::truncate_utf8(reason, super::MAX_ERROR_BYTES).to_owned()),
            (ENQUEUED, enqueued_micros.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
