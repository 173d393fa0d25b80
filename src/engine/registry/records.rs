//! What an ordered group remembers about single messages above its offset, across its
//! subscriptions: delivery counts of messages that came back without an ack, redelivery
//! times, and messages already dead-lettered. Subscriptions add to it; the writer persists it
//! (marks, see `engine/writer/ordered.rs`) and forgets what the
//! offset passes.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use crate::store::RawMessage;

/// One ordered group's per-message state (in `OrderedGroupState`).
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

    /// A transaction acked `seq` with an `Acked` mark (written by the caller): the mark is
    /// `stored` (the offset commit that passes it deletes it), the message done for the group
    /// (`dead`: passed over by its next subscription), and any comeback of it forgotten — a
    /// "came back" mark still queued would be written after the `Acked` one and overwrite it,
    /// and the message would be delivered again after a restart. Returns the queued
    /// comebacks dropped, for the caller to drop outside the group's lock.
    pub fn acked_by_transaction(&mut self, seq: u64) -> Vec<PendingRecord> {
        self.stored.insert(seq);
        self.dead.insert(seq);
        self.failed.remove(&seq);
        let (stale, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| matches!(p, PendingRecord::Failed { seq: s, .. } if *s == seq));
        self.pending = keep;
        stale
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
    DeadLetter { msg: RawMessage, deliveries: u32, reason: String, sub: Arc<dyn LiveSubscription> },
}

/// What the engine needs of an ordered group's live subscription (the consumer's ack window),
/// without depending on the consumer: how much it has out, and, for a dead letter it queued,
/// where the message goes and how to count it done or hand it back.
pub(crate) trait LiveSubscription: Send + Sync {
    /// Deliveries handed out and not yet acknowledged.
    fn in_flight(&self) -> u64;
    /// The dead-letter queue of this subscription's group.
    fn dead_letter_queue(&self) -> Arc<str>;
    /// Counts `seq` acknowledged (it was dead-lettered in the batch being built).
    fn ack(&self, seq: u64);
    /// Hands `msg` out again (its dead letter could not be written), delivered `deliveries` times.
    fn redeliver(&self, msg: RawMessage, deliveries: u32);
    /// Hands `msg` back (a transaction acking it was refused). As a nack would — its delivery
    /// counted, persisted, and dead-lettered if it was the last — unless the transaction
    /// `conflicted`: then nothing failed, and it comes back after a short pause, uncounted.
    fn hand_back(self: Arc<Self>, msg: RawMessage, deliveries: u32, conflicted: bool);
}
