//! What an ordered group remembers about single messages above its offset, across its
//! subscriptions: delivery counts of messages that came back without an ack, redelivery
//! times, and messages already dead-lettered. Subscriptions add to it; the writer persists it
//! (`ordered:<group>:<queue>:<seq>` records, see `writer/ordered.rs`) and forgets what the
//! offset passes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::acks::SubShared;
use crate::store::RawMessage;

/// One ordered group's per-message state (in `GroupState`).
#[derive(Default)]
pub(crate) struct GroupRecords {
    /// Messages above the offset whose deliveries came back without an ack: how many came
    /// back, and the wall-clock time (µs, 0: none) before which not to deliver again. The
    /// next subscription's counts start here.
    pub failed: BTreeMap<u64, (u32, u64)>,
    /// Messages above the offset that were dead-lettered: done, never delivered again.
    pub dead: BTreeSet<u64>,
    /// Sequences with a record on disk, as the writer wrote them: deleted when the offset
    /// passes them. Only the writer changes it.
    pub stored: BTreeSet<u64>,
    /// Records for the writer's next round, in the order they were decided.
    pub pending: Vec<PendingRecord>,
}

impl std::fmt::Debug for GroupRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRecords")
            .field("failed", &self.failed.len())
            .field("dead", &self.dead.len())
            .field("stored", &self.stored.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

/// A record the writer writes in its next round.
pub(crate) enum PendingRecord {
    /// A delivery came back without an ack: its count (and redelivery time) survive a restart.
    Failed { seq: u64, deliveries: u32, not_before_micros: u64 },
    /// The message used up its deliveries: move it to the dead-letter queue and mark it done
    /// for the group, in one write. Holds the subscription (and so the group's active slot)
    /// until that write is durable, so no new subscription can start below it and deliver it
    /// again meanwhile.
    DeadLetter { msg: RawMessage, deliveries: u32, reason: String, sub: Arc<SubShared> },
}
