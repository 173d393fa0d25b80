//! The one JSON shape of rockq's reports — [`Stats`] and its parts, [`PendingClaim`], [`JobStatus`],
//! [`StoredMessage`], the schedule listings, a [`Retention`], a [`FlowStatus`] — as `serde::Serialize`
//! implementations, so the web console's `/api` and `rockq … --json` print the same fields
//! under the same names. Written by hand rather than derived: durations are seconds
//! (`…_secs`, fractional), times are microseconds since the Unix epoch (`…_micros`), and bytes
//! are `{"text": …}` when they are UTF-8, else `{"hex": …}`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};

use crate::flow_state::{FlowStatus, StepState, StepStatus, StepTally};
use crate::retention::Retention;
use crate::retry::RetryPolicy;
use crate::schedule::{DelayedInfo, Missed, ScheduleInfo};
use crate::stats::{
    GroupStats, JobOutcome, JobState, JobStatus, KeyspaceStats, OutcomeKind, PendingClaim, QueueStats, Stats,
    StoredMessage,
};

/// Microseconds since the Unix epoch (0 before it).
pub(crate) fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn opt_micros(t: Option<SystemTime>) -> Option<u64> {
    t.map(micros)
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// Bytes as `{"text": …}` when they are UTF-8, else `{"hex": …}`.
pub(crate) struct Blob<'a>(pub &'a [u8]);

impl Serialize for Blob<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        match std::str::from_utf8(self.0) {
            Ok(text) => m.serialize_entry("text", text)?,
            Err(_) => {
                m.serialize_entry("hex", &self.0.iter().map(|b| format!("{b:02x}")).collect::<String>())?
            }
        }
        m.end()
    }
}

/// Headers as `[{"name": …, "value": {"text"|"hex": …}}]`, in their order.
pub(crate) struct Headers<'a>(pub &'a [(String, Bytes)]);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(name, value)| Header { name, value }))
    }
}

struct Header<'a> {
    name: &'a str,
    value: &'a [u8],
}

impl Serialize for Header<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut h = s.serialize_struct("Header", 2)?;
        h.serialize_field("name", self.name)?;
        h.serialize_field("value", &Blob(self.value))?;
        h.end()
    }
}

/// `"until-acked"`, `"forever"`, `"max-len 1000"`, `"max-age 3600s"`.
impl Serialize for Retention {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for RetryPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut p = s.serialize_struct("RetryPolicy", 5)?;
        p.serialize_field("max_attempts", &self.attempts())?;
        p.serialize_field("initial_backoff_secs", &self.initial_delay().as_secs_f64())?;
        p.serialize_field("max_backoff_secs", &self.max_delay().as_secs_f64())?;
        p.serialize_field("multiplier", &self.growth())?;
        p.serialize_field("jitter", &self.jitter_fraction())?;
        p.end()
    }
}

impl Serialize for Stats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Stats", 4)?;
        st.serialize_field("queues", &self.queues)?;
        st.serialize_field("groups", &self.groups)?;
        st.serialize_field("bytes_on_disk", &self.bytes_on_disk)?;
        st.serialize_field("keyspaces", &self.keyspaces)?;
        st.end()
    }
}

impl Serialize for KeyspaceStats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut k = s.serialize_struct("KeyspaceStats", 2)?;
        k.serialize_field("name", &self.name)?;
        k.serialize_field("keys", &self.keys)?;
        k.end()
    }
}

impl Serialize for QueueStats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_struct("QueueStats", 11)?;
        q.serialize_field("name", &self.name)?;
        q.serialize_field("first_seq", &self.first_seq)?;
        q.serialize_field("last_seq", &self.last_seq)?;
        q.serialize_field("len", &self.len)?;
        q.serialize_field("bytes_on_disk", &self.bytes_on_disk)?;
        q.serialize_field("bytes", &self.bytes)?;
        q.serialize_field("retention", &self.retention)?;
        q.serialize_field("oldest_age_secs", &secs(self.oldest_age))?;
        q.serialize_field("scheduled", &self.scheduled)?;
        q.serialize_field("next_due_micros", &opt_micros(self.next_due))?;
        q.serialize_field("dedup_window_secs", &self.dedup_window.as_secs_f64())?;
        q.end()
    }
}

impl Serialize for GroupStats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut g = s.serialize_struct("GroupStats", 19)?;
        g.serialize_field("group", &self.group)?;
        g.serialize_field("queue", &self.queue)?;
        g.serialize_field("mode", self.mode.as_str())?;
        g.serialize_field("committed", &self.committed)?;
        g.serialize_field("lag", &self.lag)?;
        g.serialize_field("oldest_unacked_age_secs", &secs(self.oldest_unacked_age))?;
        g.serialize_field("in_flight", &self.in_flight)?;
        g.serialize_field("waiting_retry", &self.waiting_retry)?;
        g.serialize_field("dead_letter_queue", &self.dead_letter_queue)?;
        g.serialize_field("dlq_depth", &self.dlq_depth)?;
        g.serialize_field("paused", &self.paused)?;
        g.serialize_field("lease_secs", &secs(self.lease))?;
        g.serialize_field("retry_policy", &self.retry_policy)?;
        g.serialize_field("ordered_by_key", &self.ordered_by_key)?;
        g.serialize_field("keep_outcomes_secs", &secs(self.keep_outcomes))?;
        g.serialize_field("rate_limit", &self.rate_limit)?;
        g.serialize_field("concurrency_limit", &self.concurrency_limit)?;
        g.serialize_field("per_key_limit", &self.per_key_limit)?;
        g.serialize_field("limited", &self.limited)?;
        g.end()
    }
}

impl Serialize for crate::rate_limit::RateLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut r = s.serialize_struct("RateLimit", 3)?;
        r.serialize_field("jobs", &self.jobs())?;
        r.serialize_field("per_secs", &self.per().as_secs_f64())?;
        r.serialize_field("burst", &self.burst_size())?;
        r.end()
    }
}

impl Serialize for PendingClaim {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut c = s.serialize_struct("PendingClaim", 7)?;
        c.serialize_field("seq", &self.seq)?;
        c.serialize_field("state", self.state.as_str())?;
        c.serialize_field("attempt", &self.attempt)?;
        c.serialize_field("holder", &self.holder)?;
        c.serialize_field("lease_deadline_micros", &opt_micros(self.lease_deadline))?;
        c.serialize_field("retry_at_micros", &opt_micros(self.retry_at))?;
        c.serialize_field("last_error", &self.last_error)?;
        c.end()
    }
}

impl Serialize for JobStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (lease_remaining, due_in) = match self.state {
            JobState::Leased { lease_remaining } => (Some(lease_remaining), None),
            JobState::RetryWaiting { due_in } => (None, Some(due_in)),
            _ => (None, None),
        };
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        let mut j = s.serialize_struct("JobStatus", 10)?;
        j.serialize_field("seq", &self.seq)?;
        j.serialize_field("state", self.state.as_str())?;
        j.serialize_field("priority", &self.priority)?;
        j.serialize_field("attempt", &self.attempt)?;
        j.serialize_field("holder", &self.holder)?;
        j.serialize_field("lease_remaining_secs", &secs(lease_remaining))?;
        j.serialize_field("due_in_secs", &secs(due_in))?;
        j.serialize_field("last_error", &self.last_error)?;
        j.serialize_field("progress", &self.progress.as_deref().map(Blob))?;
        j.serialize_field("outcome", &self.outcome)?;
        j.end()
    }
}

/// `{"kind", "finished_at_micros", "attempt", "result"}`, and for a dead letter `"reason"`,
/// `"dead_letter_queue"`, `"dead_letter_seq"`; the result as a blob (`{"text"}` or `{"hex"}`) or `null`.
impl Serialize for JobOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut o = s.serialize_struct("JobOutcome", 7)?;
        o.serialize_field("kind", self.kind.as_str())?;
        o.serialize_field("finished_at_micros", &micros(self.finished_at))?;
        o.serialize_field("attempt", &self.attempt)?;
        o.serialize_field("result", &self.result.as_deref().map(Blob))?;
        if let OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } = &self.kind {
            o.serialize_field("reason", reason)?;
            o.serialize_field("dead_letter_queue", dead_letter_queue)?;
            o.serialize_field("dead_letter_seq", dead_letter_seq)?;
        }
        o.end()
    }
}

impl Serialize for StoredMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("StoredMessage", 7)?;
        m.serialize_field("seq", &self.seq)?;
        m.serialize_field("enqueued_at_micros", &micros(self.enqueued_at))?;
        m.serialize_field("key", &self.key)?;
        m.serialize_field("idempotency_key", &self.idempotency_key)?;
        m.serialize_field("priority", &self.priority)?;
        m.serialize_field("headers", &Headers(&self.headers))?;
        m.serialize_field("payload", &Blob(&self.payload))?;
        m.end()
    }
}

impl Serialize for DelayedInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("DelayedInfo", 6)?;
        m.serialize_field("id", &self.id)?;
        m.serialize_field("queue", &self.queue)?;
        m.serialize_field("due_micros", &micros(self.due))?;
        m.serialize_field("sent_at_micros", &micros(self.sent_at))?;
        m.serialize_field("payload_bytes", &self.payload_len)?;
        m.serialize_field("key", &self.key)?;
        m.end()
    }
}

impl Serialize for ScheduleInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("ScheduleInfo", 13)?;
        m.serialize_field("name", &self.name)?;
        m.serialize_field("queue", &self.queue)?;
        m.serialize_field("recurrence", &self.recurrence)?;
        m.serialize_field("cron", &self.cron)?;
        m.serialize_field("interval_micros", &self.interval.map(|d| d.as_micros() as u64))?;
        m.serialize_field("grace_micros", &(self.grace.as_micros() as u64))?;
        m.serialize_field(
            "on_missed",
            match self.missed {
                Missed::Skip => "skip",
                _ => "catch-up-once",
            },
        )?;
        m.serialize_field("next_micros", &opt_micros(self.next))?;
        m.serialize_field("paused", &self.paused)?;
        m.serialize_field("fired", &self.fired)?;
        m.serialize_field("missed_firings", &self.missed_firings)?;
        m.serialize_field("last_micros", &opt_micros(self.last.map(|(t, _)| t)))?;
        m.serialize_field("last_seq", &self.last.map(|(_, seq)| seq))?;
        m.end()
    }
}

/// `{"id", "created_at_micros", "state", "tally", "steps": [...]}`, the flow's state as
/// [`FlowState::as_str`](crate::FlowState::as_str) names it.
impl Serialize for FlowStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut f = s.serialize_struct("FlowStatus", 5)?;
        f.serialize_field("id", &self.id)?;
        f.serialize_field("created_at_micros", &micros(self.created_at))?;
        f.serialize_field("state", self.state.as_str())?;
        f.serialize_field("tally", &self.tally())?;
        f.serialize_field("steps", &self.steps)?;
        f.end()
    }
}

/// A flow without its steps (listings): `{"id", "created_at_micros", "state", "tally"}`.
#[cfg(feature = "web")]
pub(crate) struct FlowSummary<'a>(pub &'a FlowStatus);

#[cfg(feature = "web")]
impl Serialize for FlowSummary<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut f = s.serialize_struct("FlowSummary", 4)?;
        f.serialize_field("id", &self.0.id)?;
        f.serialize_field("created_at_micros", &micros(self.0.created_at))?;
        f.serialize_field("state", self.0.state.as_str())?;
        f.serialize_field("tally", &self.0.tally())?;
        f.end()
    }
}

/// `{"waiting", "blocked", "queued", "succeeded", "failed", "total"}`.
impl Serialize for StepTally {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_struct("StepTally", 6)?;
        t.serialize_field("waiting", &self.waiting)?;
        t.serialize_field("blocked", &self.blocked)?;
        t.serialize_field("queued", &self.queued)?;
        t.serialize_field("succeeded", &self.succeeded)?;
        t.serialize_field("failed", &self.failed)?;
        t.serialize_field("total", &self.total())?;
        t.end()
    }
}

/// Every field on every step, `null` where the state has none: `"when"` (`null` for a step sent
/// at once), `"after"`, `"state"`, `"seq"` (once sent), `"dependencies"` (`{"succeeded",
/// "failed", "of"}` while waiting or blocked; `"succeeded"` is `null` for a blocked step), `"finished_at_micros"`, `"result"` (a blob) and
/// `"failure"` (the kept outcome of a failed step, as a job's `"outcome"` has it, without result).
impl Serialize for StepStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Deps {
            /// Unknown for a blocked step (its record keeps only the failures).
            succeeded: Option<u32>,
            failed: u32,
            of: u32,
        }
        let (seq, deps, finished, result, how) = match &self.state {
            StepState::Waiting { succeeded, failed, of } => {
                (None, Some(Deps { succeeded: Some(*succeeded), failed: *failed, of: *of }), None, None, None)
            }
            StepState::Blocked { failed, of } => {
                (None, Some(Deps { succeeded: None, failed: *failed, of: *of }), None, None, None)
            }
            StepState::Queued { seq } => (Some(*seq), None, None, None, None),
            StepState::Succeeded { seq, finished_at, result } => {
                (Some(*seq), None, Some(micros(*finished_at)), result.as_deref().map(Blob), None)
            }
            StepState::Failed { seq, finished_at, how } => {
                (Some(*seq), None, Some(micros(*finished_at)), None, Some(StepFailure(how)))
            }
        };
        let mut m = s.serialize_struct("StepStatus", 11)?;
        m.serialize_field("step", &self.step)?;
        m.serialize_field("queue", &self.queue)?;
        m.serialize_field("group", &self.group)?;
        m.serialize_field("when", &(!self.after.is_empty()).then(|| self.when.as_str()))?;
        m.serialize_field("after", &self.after)?;
        m.serialize_field("state", self.state.as_str())?;
        m.serialize_field("seq", &seq)?;
        m.serialize_field("dependencies", &deps)?;
        m.serialize_field("finished_at_micros", &finished)?;
        m.serialize_field("result", &result)?;
        m.serialize_field("failure", &how)?;
        m.end()
    }
}

/// How a failed step ended: `{"kind"}`, and for a dead letter `"reason"`, `"dead_letter_queue"`,
/// `"dead_letter_seq"`.
struct StepFailure<'a>(&'a OutcomeKind);

impl Serialize for StepFailure<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut o = s.serialize_struct("StepFailure", 4)?;
        o.serialize_field("kind", self.0.as_str())?;
        if let OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } = self.0 {
            o.serialize_field("reason", reason)?;
            o.serialize_field("dead_letter_queue", dead_letter_queue)?;
            o.serialize_field("dead_letter_seq", dead_letter_seq)?;
        }
        o.end()
    }
}
