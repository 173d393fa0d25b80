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
