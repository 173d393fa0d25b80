//! What this process knows of one work group's claim records in etcd: the revision each was
//! last seen at, and this process's own claims (their fencing tokens). Taught to the claim state
//! machine as it learns them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::clock::Clock;
use crate::engine::registry::WorkGroupState;
use crate::model::Claim;
use crate::store::etcd::work::ClaimRecord;

/// Doubted claims kept per message (the oldest go first).
const MAX_DOUBTS: usize = 16;

/// What this process knows of one work group's records in etcd.
pub(crate) struct WorkSide {
    pub(super) group: Arc<WorkGroupState>,
    pub(super) known: tokio::sync::Mutex<Known>,
}

#[derive(Default)]
pub(super) struct Known {
    /// The `mod_revision` of each claim record above the offset, as last seen.
    pub(super) revs: HashMap<u64, i64>,
    /// The offset as stored (or further: learned from records the offset move deleted).
    pub(super) stored_offset: u64,
    /// The `mod_revision` of this process's last write of each record: an outcome may only
    /// be written over this process's own claim (its fencing token).
    pub(super) mine: HashMap<u64, i64>,
    /// Claims this process sent whose outcome stayed unknown (etcd unreachable): the claims
    /// were given back here without counting, but the write may have landed. Found stored
    /// later, such a record is this process's own — not another holder's lease whose attempt
    /// counts and whose expiry could use the job's last attempt up with no handler run.
    /// Every such claim since the last known write, not only the latest: a request held in a
    /// paused member's socket may be applied after later ones failed too.
    pub(super) doubted: HashMap<u64, Vec<Claim>>,
    /// The `mod_revision` of the group's last reset known here (0: none): offset moves
    /// compare it, so that none written on a view from before a reset stands.
    pub(super) reset_rev: i64,
}

impl Known {
    pub(super) fn expected(&self, seq: u64) -> i64 {
        self.revs.get(&seq).copied().unwrap_or(0)
    }

    /// The revision an outcome of `seq` compares: this process's claim, unless something
    /// another process wrote since was learned (then the claim is lost, and nothing is sent).
    pub(super) fn own(&self, seq: u64) -> Option<i64> {
        let mine = self.mine.get(&seq).copied()?;
        (self.revs.get(&seq) == Some(&mine)).then_some(mine)
    }

    /// This process wrote `seq`'s record at `rev`.
    pub(super) fn wrote(&mut self, seq: u64, rev: i64) {
        self.revs.insert(seq, rev);
        self.mine.insert(seq, rev);
        self.doubted.remove(&seq);
    }

    /// This process's claim `claim` of `seq` may or may not have been stored.
    pub(super) fn doubt(&mut self, seq: u64, claim: Claim) {
        let doubts = self.doubted.entry(seq).or_default();
        if doubts.len() == MAX_DOUBTS {
            doubts.remove(0);
        }
        doubts.push(claim);
    }

    /// `r` as found in etcd: if it is a doubted claim of this process's, it landed — adopted
    /// as this process's own write (true: not to be taught as another holder's).
    pub(super) fn adopt(&mut self, r: &ClaimRecord) -> bool {
        if !self.doubted.get(&r.seq).is_some_and(|d| d.contains(&r.claim)) {
            return false;
        }
        self.wrote(r.seq, r.rev);
        true
    }

    /// The records of a refused write, as they are: taught to the state machine.
    pub(super) fn learn(
        &mut self,
        g: &WorkGroupState,
        offset: u64,
        found: Vec<(u64, Option<ClaimRecord>)>,
        clock: &Clock,
    ) {
        self.learn_offset(g, offset);
        for (seq, rec) in found {
            match rec {
                // As last seen: nothing to learn. Such a record may be this process's own —
                // an earlier claim of the message, given back in memory and claimed again in
                // the refused write — and taught as found it would pass for another holder's
                // lease, parking the message here until that lease's deadline (the two-broker
                // drain found 54 jobs parked for 30 s).
                Some(r) if r.rev == self.expected(seq) => {}
                Some(r) if self.adopt(&r) => {}
                Some(r) => {
                    self.revs.insert(seq, r.rev);
                    g.learn_claim(seq, &r.claim, clock);
                }
                None if seq <= offset => {}
                None => {
                    self.revs.remove(&seq);
                    g.learn_unclaimed(seq);
                }
            }
        }
    }

    /// The group was reset to `offset` at `rev` (by this process or another): everything
    /// known of its records went with the reset, and the state machine starts again at
    /// `offset` (outcomes and acks decided before carry the old epoch and are refused). A reset
    /// already known changes nothing.
    pub(super) fn reset(&mut self, g: &WorkGroupState, offset: u64, rev: i64) -> bool {
        if rev <= self.reset_rev {
            return false;
        }
        self.reset_rev = rev;
        self.stored_offset = offset;
        self.revs.clear();
        self.mine.clear();
        self.doubted.clear();
        g.progress().reset_to(offset);
        g.reset(offset);
        // A reset may go backwards: store, not max.
        g.durable.store(offset, Ordering::SeqCst);
        g.changed.notify_waiters();
        g.settled.notify_waiters();
        true
    }

    /// The stored offset is at least `offset`: everything up to it is finished.
    pub(super) fn learn_offset(&mut self, g: &WorkGroupState, offset: u64) {
        if offset <= self.stored_offset {
            return;
        }
        self.stored_offset = offset;
        self.revs.retain(|&s, _| s > offset);
        self.mine.retain(|&s, _| s > offset);
        self.doubted.retain(|&s, _| s > offset);
        g.learn_offset(offset);
        let before = g.durable.fetch_max(offset, Ordering::SeqCst);
        if offset > before {
            g.changed.notify_waiters();
            g.settled.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::registry::QueueState;
    use std::time::Duration;

    /// A claim write refused for another record's sake answers with this process's own
    /// earlier record of a message it gave back in memory and claimed again in that write:
    /// the record is as last seen, and the message stays this claim's (taught as found, it
    /// passed for another process's lease and parked the message until its deadline).
    #[test]
    fn a_refusal_finding_a_record_as_last_seen_leaves_the_claim_with_its_claimer() {
        let queue = QueueState::new(1, "q", 1, 100, crate::retention::Retention::Forever);
        let g = WorkGroupState::new("w", queue, 0);
        let clock = Clock::tokio();
        let lease = Duration::from_secs(30);
        let mut known = Known::default();
        let first = g.take(clock.now(), 1, 100, lease, 5, 0).claimed;
        let (seq, t1) = (first[0].seq, first[0].token);
        let record =
            |token| Claim::Leased { attempt: 1, token, deadline_micros: u64::MAX / 2, holder: "p".into() };
        known.wrote(seq, 10);
        // Given back in memory (a batch lost to a reset, say); its record stays in etcd.
        g.release(seq, t1, false);
        let again = g.take(clock.now(), 1, 100, lease, 5, 0).claimed;
        assert_eq!(again[0].seq, seq);
        let t2 = again[0].token;
        assert!(g.holds_lease(seq, t2));
        // The write of the new claim is refused (another record of it moved): found as it was.
        let found = vec![(seq, Some(ClaimRecord { seq, claim: record(t1), rev: 10 }))];
        known.learn(&g, 0, found, &clock);
        assert!(g.holds_lease(seq, t2), "still this claim's, not parked as another holder's");
        // A record another process wrote since is learned as its lease.
        let found = vec![(seq, Some(ClaimRecord { seq, claim: record(99), rev: 11 }))];
        known.learn(&g, 0, found, &clock);
        assert!(!g.holds_lease(seq, t2));
    }
}
