//! The durable facts of the queue domain, as the engine and the handles use them: a work
//! group's claim on a message, an ordered group's mark on a message that came back, a group's
//! mode, offset and settings, a queue's metadata, and the headers that make a message a dead
//! letter.
//!
//! These are plain values. `store/records.rs` maps each to its on-disk record (version byte,
//! field order, caps); nothing above `store/` sees a record layout, so a format change stays a
//! store change.

use std::sync::Arc;
use std::time::Duration;

use crate::retention::Retention;
use crate::retry::RetryPolicy;
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
    /// A work group's lease, retry policy and key ordering (its dead-letter queue is the
    /// record's, above); `None` for an ordered group, and for a work group whose record
    /// predates them (the next subscribe stores them).
    pub work: Option<WorkSettings>,
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

// ---- A work group's settings: as stored, as a handle asks for them, and the rule between them.
//
// The rule (issue 17): the group's record is the one source of truth. A setting a handle did
// not set explicitly takes the stored value; one it did set must equal it, or the subscribe is
// refused ([`Mismatch`]) until an explicit `WorkGroup::update` changes the record. A group
// without stored terms (new, or written by an older build) stores what the first subscribe
// asks for, defaults included. The writer resolves both under its single thread, so two
// handles racing to store different settings cannot both win.

/// The largest per-key limit (`WorkGroup::per_key_limit`): each finish looks at its key's
/// first `n` unfinished messages.
pub(crate) const MAX_PER_KEY_LIMIT: u32 = 1024;

/// The lease of a group that never set one.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease accepted: a shorter one would run out before any handler could start.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The settings a work group runs with, as stored with the group (the work part of its
/// [`GroupSettings`]): every subscription of the group, in every process, uses these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkSettings {
    /// How long a claim is held before the message may go to another consumer.
    pub lease: Duration,
    pub policy: RetryPolicy,
    /// Where exhausted messages go. In a record as read, the record's dead-letter queue as
    /// stored (possibly empty: the default); [`WorkSettings::stored`] resolves it.
    pub dead_letter_queue: Arc<str>,
    /// Messages with the same ordering key are handed out one at a time.
    pub ordered_by_key: bool,
    /// How long a finished job's outcome record is kept; zero: none is written.
    pub keep_outcomes: Duration,
    /// Claims per interval, across every pool and restart (`WorkGroup::rate_limit`).
    pub rate_limit: Option<crate::rate_limit::RateLimit>,
    /// Jobs held at once, across every pool (`WorkGroup::concurrency_limit`).
    pub concurrency_limit: Option<u32>,
    /// Jobs held at once per ordering key (`WorkGroup::per_key_limit`).
    pub per_key_limit: Option<u32>,
}

impl WorkSettings {
    /// Resolved settings both engines refuse before storing them: a per-key limit on a group
    /// stored as ordered by key (or the other way round) — the two are one setting, and one
    /// handle may set one on a group another stored with the other.
    pub fn check_key_setting(&self, group: &str, queue: &str) -> Result<(), crate::error::Error> {
        if self.ordered_by_key && self.per_key_limit.is_some() {
            return Err(crate::error::Error::InvalidOption(format!(
                "work group {group} on queue {queue}: ordered_by_key is a per-key limit of 1; set one or \
                 the other (update one to `false`/`None` first)"
            )));
        }
        Ok(())
    }

    /// The settings stored in `record` for a group of `queue`; `None` if its work terms are not
    /// stored (an ordered group, or a record from an older build).
    pub fn stored(record: &GroupSettings, queue: &str) -> Option<Self> {
        let t = record.work.as_ref()?;
        Some(WorkSettings { dead_letter_queue: dead_letter_queue_of(record, queue), ..t.clone() })
    }

    /// `record` with these settings in it; its pause flag is kept.
    pub fn stored_in(&self, record: &GroupSettings) -> GroupSettings {
        GroupSettings {
            paused: record.paused,
            dead_letter_queue: self.dead_letter_queue.to_string(),
            work: Some(self.clone()),
        }
    }
}

/// The dead-letter queue a record names, or the default one if it names none.
pub(crate) fn dead_letter_queue_of(record: &GroupSettings, queue: &str) -> Arc<str> {
    match record.dead_letter_queue.as_str() {
        "" => Arc::from(default_dead_letter_queue(queue)),
        n => Arc::from(n),
    }
}

/// The settings a handle set explicitly; `None`: not set, the stored value applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RequestedWork {
    pub lease: Option<Duration>,
    pub policy: Option<RetryPolicy>,
    pub dead_letter_queue: Option<String>,
    pub ordered_by_key: Option<bool>,
    pub keep_outcomes: Option<Duration>,
    /// `Some(None)`: explicitly no rate limit.
    pub rate_limit: Option<Option<crate::rate_limit::RateLimit>>,
    /// `Some(None)`: explicitly no concurrency limit.
    pub concurrency_limit: Option<Option<u32>>,
    /// `Some(None)`: explicitly no per-key limit.
    pub per_key_limit: Option<Option<u32>>,
}

/// An explicitly set value that differs from the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub setting: &'static str,
    pub stored: String,
    pub requested: String,
}

impl Mismatch {
    pub fn into_error(self, group: &str, queue: &str) -> crate::error::Error {
        crate::error::Error::SettingsMismatch {
            queue: queue.to_owned(),
            group: group.to_owned(),
            setting: self.setting,
            stored: self.stored,
            requested: self.requested,
        }
    }
}

impl RequestedWork {
    /// The first explicitly set value that differs from `stored`. The policy is compared field
    /// by field, so the error names the one that differs.
    pub fn mismatch(&self, stored: &WorkSettings) -> Option<Mismatch> {
        fn differ<T: PartialEq + std::fmt::Debug>(
            setting: &'static str,
            stored: &T,
            asked: &T,
        ) -> Option<Mismatch> {
            (stored != asked).then(|| Mismatch {
                setting,
                stored: format!("{stored:?}"),
                requested: format!("{asked:?}"),
            })
        }
        let lease = self.lease.and_then(|l| differ("lease", &stored.lease, &l));
        let policy = self.policy.as_ref().and_then(|p| {
            let s = &stored.policy;
            differ("retry_policy.max_attempts", &s.attempts(), &p.attempts())
                .or_else(|| differ("retry_policy.initial_backoff", &s.initial_delay(), &p.initial_delay()))
                .or_else(|| differ("retry_policy.max_backoff", &s.max_delay(), &p.max_delay()))
                .or_else(|| differ("retry_policy.multiplier", &s.growth(), &p.growth()))
                .or_else(|| differ("retry_policy.jitter", &s.jitter_fraction(), &p.jitter_fraction()))
        });
        let dlq = self
            .dead_letter_queue
            .as_deref()
            .and_then(|d| differ("dead_letter_queue", &&*stored.dead_letter_queue, &d));
        let keyed = self.ordered_by_key.and_then(|k| differ("ordered_by_key", &stored.ordered_by_key, &k));
        let outcomes = self.keep_outcomes.and_then(|k| differ("keep_outcomes", &stored.keep_outcomes, &k));
        let rate = self.rate_limit.and_then(|r| differ("rate_limit", &stored.rate_limit, &r));
        let concurrency =
            self.concurrency_limit.and_then(|c| differ("concurrency_limit", &stored.concurrency_limit, &c));
        let per_key = self.per_key_limit.and_then(|c| differ("per_key_limit", &stored.per_key_limit, &c));
        lease.or(policy).or(dlq).or(keyed).or(outcomes).or(rate).or(concurrency).or(per_key)
    }

    /// The settings to store for a group of `queue` whose record (`record`) has no work terms
    /// yet: the explicit ones, else the dead-letter queue an older build recorded, else the
    /// defaults.
    pub fn initial(&self, record: &GroupSettings, queue: &str) -> WorkSettings {
        WorkSettings {
            lease: self.lease.unwrap_or(DEFAULT_LEASE),
            policy: self.policy.clone().unwrap_or_default(),
            dead_letter_queue: match &self.dead_letter_queue {
                Some(d) => Arc::from(d.as_str()),
                None => dead_letter_queue_of(record, queue),
            },
            ordered_by_key: self.ordered_by_key.unwrap_or(false),
            keep_outcomes: self.keep_outcomes.unwrap_or(Duration::ZERO),
            rate_limit: self.rate_limit.flatten(),
            concurrency_limit: self.concurrency_limit.flatten(),
            per_key_limit: self.per_key_limit.flatten(),
        }
    }

    /// `stored` with every explicitly set value replaced.
    pub fn applied_to(&self, stored: &WorkSettings) -> WorkSettings {
        WorkSettings {
            lease: self.lease.unwrap_or(stored.lease),
            policy: self.policy.clone().unwrap_or_else(|| stored.policy.clone()),
            dead_letter_queue: match &self.dead_letter_queue {
                Some(d) => Arc::from(d.as_str()),
                None => stored.dead_letter_queue.clone(),
            },
            ordered_by_key: self.ordered_by_key.unwrap_or(stored.ordered_by_key),
            keep_outcomes: self.keep_outcomes.unwrap_or(stored.keep_outcomes),
            rate_limit: self.rate_limit.unwrap_or(stored.rate_limit),
            concurrency_limit: self.concurrency_limit.unwrap_or(stored.concurrency_limit),
            per_key_limit: self.per_key_limit.unwrap_or(stored.per_key_limit),
        }
    }
}

#[cfg(test)]
mod settings_tests {
    use super::*;

    fn stored() -> WorkSettings {
        RequestedWork::default().initial(&GroupSettings::default(), "jobs")
    }

    #[test]
    fn unset_values_adopt_the_stored_ones_and_set_ones_must_match() {
        let s = stored();
        assert_eq!(s.dead_letter_queue.as_ref(), "jobs.dlq");
        assert_eq!(s.lease, DEFAULT_LEASE);
        assert_eq!(RequestedWork::default().mismatch(&s), None);
        let same = RequestedWork {
            lease: Some(DEFAULT_LEASE),
            policy: Some(RetryPolicy::default()),
            ..Default::default()
        };
        assert_eq!(same.mismatch(&s), None);
        let other = RequestedWork { lease: Some(Duration::from_secs(5)), ..Default::default() };
        let m = other.mismatch(&s).unwrap();
        assert_eq!((m.setting, m.stored.as_str(), m.requested.as_str()), ("lease", "30s", "5s"));
        let policy = RequestedWork { policy: Some(RetryPolicy::default().jitter(0.0)), ..Default::default() };
        assert_eq!(policy.mismatch(&s).unwrap().setting, "retry_policy.jitter");
        let dlq = RequestedWork { dead_letter_queue: Some("other".into()), ..Default::default() };
        assert_eq!(dlq.mismatch(&s).unwrap().setting, "dead_letter_queue");
        let keyed = RequestedWork { ordered_by_key: Some(true), ..Default::default() };
        assert_eq!(keyed.mismatch(&s).unwrap().setting, "ordered_by_key");
        let kept = RequestedWork { keep_outcomes: Some(Duration::from_secs(60)), ..Default::default() };
        assert_eq!(kept.mismatch(&s).unwrap().setting, "keep_outcomes");
        let rate = crate::rate_limit::RateLimit::per_second(5);
        let limited = RequestedWork { rate_limit: Some(Some(rate)), ..Default::default() };
        assert_eq!(limited.mismatch(&s).unwrap().setting, "rate_limit");
        let unlimited =
            RequestedWork { rate_limit: Some(None), concurrency_limit: Some(None), ..Default::default() };
        assert_eq!(unlimited.mismatch(&s), None, "explicitly none matches none stored");
        let stored_limited = limited.applied_to(&s);
        assert_eq!(unlimited.mismatch(&stored_limited).unwrap().setting, "rate_limit");
        assert_eq!(RequestedWork::default().mismatch(&stored_limited), None, "unset adopts the stored limit");
        assert_eq!(unlimited.applied_to(&stored_limited).rate_limit, None, "an update can remove a limit");
        let capped = RequestedWork { concurrency_limit: Some(Some(3)), ..Default::default() };
        assert_eq!(capped.mismatch(&s).unwrap().setting, "concurrency_limit");
        let per_key = RequestedWork { per_key_limit: Some(Some(2)), ..Default::default() };
        assert_eq!(per_key.mismatch(&s).unwrap().setting, "per_key_limit");
    }

    #[test]
    fn an_update_replaces_only_what_is_set_and_a_record_round_trips() {
        let s = stored();
        let req = RequestedWork { lease: Some(Duration::from_secs(9)), ..Default::default() };
        let next = req.applied_to(&s);
        assert_eq!(next, WorkSettings { lease: Duration::from_secs(9), ..s.clone() });
        let record = next.stored_in(&GroupSettings { paused: true, ..Default::default() });
        assert!(record.paused, "the pause flag is kept");
        assert_eq!(WorkSettings::stored(&record, "jobs"), Some(next));
    }

    #[test]
    fn an_older_record_lends_its_dead_letter_queue_unless_one_is_set() {
        let old = GroupSettings { dead_letter_queue: "custom".into(), ..Default::default() };
        assert_eq!(WorkSettings::stored(&old, "jobs"), None, "no terms stored yet");
        assert_eq!(RequestedWork::default().initial(&old, "jobs").dead_letter_queue.as_ref(), "custom");
        let set = RequestedWork { dead_letter_queue: Some("mine".into()), ..Default::default() };
        assert_eq!(set.initial(&old, "jobs").dead_letter_queue.as_ref(), "mine");
    }
}

impl ScheduleRecord {
    /// What `Broker::schedules` says of this schedule, named `name` (either engine).
    pub(crate) fn info(self, name: String) -> crate::schedule::ScheduleInfo {
        use crate::schedule::time_of;
        crate::schedule::ScheduleInfo {
            name,
            recurrence: self.recurrence.describe(),
            cron: self.recurrence.cron_expr().map(str::to_owned),
            interval: self.recurrence.interval(),
            grace: self.recurrence.grace,
            missed: self.recurrence.missed,
            next: (self.next_micros != 0).then(|| time_of(self.next_micros)),
            paused: self.paused,
            fired: self.fired,
            missed_firings: self.missed_firings,
            last: (self.last_seq != 0).then(|| (time_of(self.last_micros), self.last_seq)),
            queue: self.queue,
        }
    }
}
