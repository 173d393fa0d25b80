//! What an ordered group remembers about single messages above its offset, across its
//! subscriptions: delivery counts of messages that came back without an ack, redelivery
//! times, and messages already dead-lettered. Subscriptions add to it; the writer persists it
//! (`ordered:<group>:<queue>:<seq>` records, see `writer/ordered.rs`) and forgets what the
//! offset passes.

use std::collections::{BTreeMap, BTreeSet};

use super::acks::PendingRecord;

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

impl GroupRecords {
    /// Forgets everything at or below `seq` (the offset passed it, or retention deleted it) and
    /// returns the sequences whose records are on disk, for the writer to delete.
    pub fn forget_through(&mut self, seq: u64) -> BTreeSet<u64> {
        let above = seq.saturating_add(1);
        self.failed = self.failed.split_off(&above);
        self.dead = self.dead.split_off(&above);
        let keep = self.stored.split_off(&above);
        std::mem::replace(&mut self.stored, keep)
    }
}
