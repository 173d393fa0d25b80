//! What a work-group handle's settings become once it subscribes: one shared, immutable
//! configuration read by the subscription, its jobs and worker pools (kept apart from the
//! builder in `group.rs`, so that they need not import it).

use std::sync::Arc;
use std::time::Duration;

use super::policy::RetryPolicy;

/// Settings a subscription and its jobs use.
#[derive(Debug)]
pub(crate) struct WorkConfig {
    pub lease: Duration,
    pub policy: RetryPolicy,
    pub dlq: Arc<str>,
    pub max_in_flight: usize,
    pub claim_batch: usize,
    pub saturation_after: Duration,
    /// Recorded as the holder of each claim (see [`WorkGroup::consumer_name`]).
    pub consumer: Arc<str>,
}
