//! What a work-group handle's own limits become once it subscribes (how many jobs it holds,
//! how many it claims at once, when it reports saturation, the holder name it records): read by
//! the subscription, its jobs and worker pools, and kept apart from the builder in `group.rs`
//! so that they need not import it.
//!
//! The group's stored settings (lease, retry policy, dead-letter queue, key ordering) are not
//! copied here: they live in the engine's group state, which a durable `WorkGroup::update`
//! replaces, and are read each time a claim or an outcome is decided. Only this handle's own
//! limits are fixed at subscribe.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::boundary::WorkGroupState;
use crate::model::WorkSettings;

/// The limits a subscription and its jobs run with (the group's own settings are the
/// engine's: [`WorkSettings`]).
#[derive(Debug)]
pub(crate) struct HandleLimits {
    /// The group's settings as resolved at subscribe; what `settings` falls back to (the
    /// group's state always has them once a subscribe resolved them).
    pub resolved: Arc<WorkSettings>,
    pub max_in_flight: usize,
    pub claim_batch: usize,
    pub saturation_after: Duration,
    /// One claim in this many takes the oldest job whatever its priority (0: never).
    pub priority_share: u32,
    /// Recorded as the holder of each claim (see [`WorkGroup::consumer_name`]).
    pub consumer: Arc<str>,
}

impl HandleLimits {
    /// The group's stored settings now: what a claim or outcome decided at this moment uses.
    pub fn settings(&self, group: &WorkGroupState) -> Arc<WorkSettings> {
        group.settings().unwrap_or_else(|| self.resolved.clone())
    }
}
