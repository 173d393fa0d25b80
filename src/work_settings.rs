//! A work group's settings as stored with the group and as a handle asks for them: which ones a
//! subscription runs with, and when a handle's explicit settings conflict with the stored ones.
//!
//! The rule (issue 17): the group's record is the one source of truth. A setting a handle did
//! not set explicitly takes the stored value; one it did set must equal it, or the subscribe
//! is refused ([`Mismatch`]) until an explicit `WorkGroup::update` changes the record. A group
//! without stored terms (new, or written by an older build) stores what the first subscribe
//! asks for, defaults included. The writer resolves both under its single thread, so two
//! handles racing to store different settings cannot both win.

use std::sync::Arc;
use std::time::Duration;

use crate::error::SubscribeError;
use crate::model::{GroupSettings, WorkTerms, default_dead_letter_queue};
use crate::retry::RetryPolicy;

/// The lease of a group that never set one.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease accepted: a shorter one would run out before any handler could start.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The settings a work group runs with, as stored: every subscription of the group, in every
/// process, uses these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkSettings {
    pub lease: Duration,
    pub policy: RetryPolicy,
    pub dead_letter_queue: Arc<str>,
    pub ordered_by_key: bool,
}

impl WorkSettings {
    /// The settings stored in `record` for a group of `queue`; `None` if its work terms are not
    /// stored (an ordered group, or a record from an older build).
    pub fn stored(record: &GroupSettings, queue: &str) -> Option<Self> {
        let t = record.work.as_ref()?;
        Some(WorkSettings {
            lease: t.lease,
            policy: t.policy.clone(),
            dead_letter_queue: dead_letter_queue_of(record, queue),
            ordered_by_key: t.ordered_by_key,
        })
    }

    /// `record` with these settings in it; its pause flag is kept.
    pub fn stored_in(&self, record: &GroupSettings) -> GroupSettings {
        GroupSettings {
            paused: record.paused,
            dead_letter_queue: self.dead_letter_queue.to_string(),
            work: Some(WorkTerms {
                lease: self.lease,
                policy: self.policy.clone(),
                ordered_by_key: self.ordered_by_key,
            }),
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
}

/// An explicitly set value that differs from the stored one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub setting: &'static str,
    pub stored: String,
    pub requested: String,
}

impl Mismatch {
    pub fn into_error(self, group: &str, queue: &str) -> SubscribeError {
        SubscribeError::SettingsMismatch {
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
        lease.or(policy).or(dlq).or(keyed)
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
        }
    }
}

#[cfg(test)]
mod tests {
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
