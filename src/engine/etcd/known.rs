//! What this process knows of one work group's claim records in etcd: the revision each was
//! last seen at, and this process's own claims (their fencing tokens). Taught to the claim state
//! machine as it learns them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::clock::Clock;
use crate::engine::registry::WorkGroupState;
use crate::model::Claim;
use crate::store::etcd::limits::{LimitRecord, LimitWrite};
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
    /// The jobs held in a range record (`store/etcd/claim_ranges.rs`), with its last
    /// sequence: their `revs` are the range record's, and a write over one compares it.
    pub(super) runs: HashMap<u64, u64>,
    /// The revision through which this process knows every claim record of the group: what
    /// its watch applied, or what a load read. A claim of new leases compares that no record
    /// that could hold one of them was made after it.
    pub(super) view_rev: i64,
    /// The watch skipped events (a test's held-back watch): the view stays where it was, as
    /// what was skipped is not known, until a reload reads everything again.
    pub(super) view_gap: bool,
    /// The offset as stored (or further: learned from records the offset move deleted).
    pub(super) stored_offset: u64,
    /// The `mod_revision` of this process's last write of each record: an outcome may only
    /// be written over this process's own claim (its fencing token).
    pub(super) mine: HashMap<u64, i64>,
    /// This process's leases whose claim landed, by the fencing token of the last one written:
    /// only such a lease may have a handler running. Not `mine`, which holds any record this
    /// process wrote: after its own retry record, a claim of the next attempt decided here is
    /// nobody's handler until its write lands (another process may take the retry first).
    pub(super) leases: HashMap<u64, u64>,
    /// Claims this process sent whose outcome stayed unknown (etcd unreachable): the claims
    /// were given back here without counting, but the write may have landed. Found stored
    /// later, such a record is this process's own — not another holder's lease whose attempt
    /// counts and whose expiry could use the job's last attempt up with no handler run.
    /// Every such claim since the last known write, not only the latest: a request held in a
    /// paused member's socket may be applied after later ones failed too.
    pub(super) doubted: HashMap<u64, Vec<Claim>>,
    /// The `mod_revision` of the group's last reset known here (0: none): offset moves and
    /// claims of new leases compare it, so that none written on a view from before a reset
    /// stands.
    pub(super) reset_rev: i64,
    /// The `mod_revision` of the group's limit record (`store/etcd/limits.rs`) as this
    /// process last wrote or learned it: what its next limited claim compares (0: none).
    pub(super) limit_rev: i64,
}

impl Known {
    pub(super) fn expected(&self, seq: u64) -> i64 {
        self.revs.get(&seq).copied().unwrap_or(0)
    }

    /// The range record `seq` is held in, by its last sequence (`None`: a record of its own,
    /// or none).
    pub(super) fn run(&self, seq: u64) -> Option<u64> {
        self.runs.get(&seq).copied()
    }

    /// `r` as read or watched (not this process's own write): what writes over it compare.
    pub(super) fn saw(&mut self, r: &ClaimRecord) {
        self.revs.insert(r.seq, r.rev);
        match r.run {
            Some(last) => self.runs.insert(r.seq, last),
            None => self.runs.remove(&r.seq),
        };
    }

    /// The watch or a load brought everything through `rev`.
    pub(super) fn viewed(&mut self, rev: i64) {
        if !self.view_gap {
            self.view_rev = self.view_rev.max(rev);
        }
    }

    /// The revision an outcome of `seq` compares: this process's claim, unless something
    /// another process wrote since was learned (then the claim is lost, and nothing is sent).
    pub(super) fn own(&self, seq: u64) -> Option<i64> {
        let mine = self.mine.get(&seq).copied()?;
        (self.revs.get(&seq) == Some(&mine)).then_some(mine)
    }

    /// This process wrote `seq`'s record `claim` at `rev` (`run`: in the range record ending
    /// there).
    pub(super) fn wrote(&mut self, seq: u64, rev: i64, run: Option<u64>, claim: &Claim) {
        self.revs.insert(seq, rev);
        self.mine.insert(seq, rev);
        match claim {
            Claim::Leased { token, .. } => self.leases.insert(seq, *token),
            _ => self.leases.remove(&seq),
        };
        self.doubted.remove(&seq);
        match run {
            Some(last) => self.runs.insert(seq, last),
            None => self.runs.remove(&seq),
        };
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
        self.wrote(r.seq, r.rev, r.run, &r.claim);
        true
    }

    /// The group's limit record as read or watched, after the claims written with it were
    /// learned: unless this process wrote it (or learned it) already, the claim state machine
    /// may decide limited claims on this view.
    pub(super) fn learn_limit(&mut self, g: &WorkGroupState, l: LimitRecord, clock: &Clock) {
        if l.rev <= self.limit_rev {
            return;
        }
        self.limit_rev = l.rev;
        g.learn_limit(l.tat_micros, l.rev, clock);
    }

    /// The limit record a claim of `g` decided on the view of `limit_rev` writes (`None`:
    /// decided under no rate or concurrency limit): the rate bucket as the claim left it
    /// (`bucket`; 0 without a rate limit — what an earlier rate left is no floor for a later
    /// one, as embedded), compared with the revision this process last wrote or learned. The
    /// bucket is every other process's as learned, and later: the view includes every record
    /// written before. This process's own limited claims since the view do not matter (they were
    /// counted when decided); another process's do: `Err` when one was learned (or found by a
    /// refusal) since — compared with the newer revision, the write would pass for a decision
    /// that counted it.
    pub(super) fn limit_write(
        &self,
        g: &WorkGroupState,
        bucket: Option<u64>,
        limit_rev: Option<i64>,
    ) -> Result<Option<LimitWrite>, ()> {
        let Some(decided) = limit_rev else { return Ok(None) };
        if !g.limit_view_current(decided) {
            return Err(());
        }
        Ok(Some(LimitWrite { expected: self.limit_rev, tat_micros: bucket.unwrap_or(0) }))
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
                // A range record's entry older than what is known of the job (its own record,
                // read since): the job's own record stands.
                Some(r) if r.run.is_some() && r.rev < self.expected(seq) => {}
                Some(r) if self.adopt(&r) => {}
                Some(r) => {
                    self.saw(&r);
                    g.learn_claim(seq, &r.claim, clock);
                }
                None if seq <= offset => {}
                None => {
                    self.revs.remove(&seq);
                    self.runs.remove(&seq);
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
        self.runs.clear();
        self.mine.clear();
        self.leases.clear();
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
        // This process's leases whose claim landed: a handler may be running them. One decided
        // here and refused (or not written yet) started none; kept as a running lease, it held
        // its key's next message back until its deadline (two brokers on a group ordered by key
        // stalled on it) — a claim of a retry this process wrote itself included.
        let written: HashMap<u64, u64> =
            self.leases.iter().filter(|&(&s, _)| s <= offset).map(|(&s, &t)| (s, t)).collect();
        self.revs.retain(|&s, _| s > offset);
        self.runs.retain(|&s, _| s > offset);
        self.mine.retain(|&s, _| s > offset);
        self.leases.retain(|&s, _| s > offset);
        self.doubted.retain(|&s, _| s > offset);
        g.learn_offset(offset, &|s, token| written.get(&s) == Some(&token));
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
    use crate::model::WorkSettings;
    use std::time::Duration;

    /// Group `w` of queue `q` (messages 1 to 100), ordered by key or not, with a concurrency
    /// limit or not.
    fn group(ordered_by_key: bool, concurrency_limit: Option<u32>) -> Arc<WorkGroupState> {
        let queue = QueueState::new(1, "q", 1, 100, crate::retention::Retention::Forever);
        let g = WorkGroupState::new("w", queue, 0);
        g.set_settings(Arc::new(WorkSettings {
            lease: Duration::from_secs(30),
            policy: crate::retry::RetryPolicy::default(),
            dead_letter_queue: "dlq".into(),
            ordered_by_key,
            keep_outcomes: Duration::ZERO,
            rate_limit: None,
            concurrency_limit,
            per_key_limit: None,
        }));
        g
    }

    /// A group ordered by key: messages 1 and 3 of key 7, 2 and 4 of key 8.
    fn two_keys() -> Arc<WorkGroupState> {
        let g = group(true, None);
        assert_eq!(g.learn([(1, Some(7)), (2, Some(8)), (3, Some(7)), (4, Some(8))]), 4);
        g
    }

    fn leased(attempt: u32, token: u64) -> Claim {
        Claim::Leased { attempt, token, deadline_micros: u64::MAX / 2, holder: "p".into() }
    }

    /// Limited claims stand only on a view that includes every limited claim of another
    /// process this one knows of: one decided before such a claim was learned is refused
    /// before it is written (compared with the newer revision, etcd would let it through), one
    /// after it is written against it; while a refusal has shown a newer record than the
    /// watch has taught, nothing limited is decided at all. This process's own claims since a
    /// view do not make it stale.
    #[test]
    fn a_limited_claim_decided_before_another_process_s_was_learned_does_not_stand() {
        let g = group(false, Some(10));
        let clock = Clock::tokio();
        let lease = Duration::from_secs(30);
        let mut known = Known::default();
        let take = |n| g.take(clock.now(), n, 100, lease, 5, 0);
        let first = take(1);
        assert_eq!(first.limit_rev, Some(0));
        let w = known.limit_write(&g, None, first.limit_rev).unwrap().unwrap();
        assert_eq!(w.expected, 0);
        // Written at 7 by this process: a claim decided before it still stands, against 7.
        known.limit_rev = 7;
        assert_eq!(known.limit_write(&g, None, first.limit_rev).unwrap().unwrap().expected, 7);
        // Another process's limited claim at 9, taught by the watch after `second` was decided.
        let second = take(1);
        known.learn_limit(&g, LimitRecord { tat_micros: 0, rev: 9 }, &clock);
        assert!(known.limit_write(&g, None, second.limit_rev).is_err(), "decided on a view without 9");
        let third = take(1);
        assert_eq!(third.limit_rev, Some(9));
        assert_eq!(known.limit_write(&g, None, third.limit_rev).unwrap().unwrap().expected, 9);
        // A refusal found the record at 12, which the watch has not taught yet: nothing is
        // claimed until it has.
        g.note_limit(12);
        let stale = take(3);
        assert!(stale.claimed.is_empty() && stale.limited, "no limited claim on a view known stale");
        known.learn_limit(&g, LimitRecord { tat_micros: 0, rev: 12 }, &clock);
        let fourth = take(1);
        assert_eq!((fourth.claimed.len(), fourth.limit_rev), (1, Some(12)));
        // Unlimited claims write no record.
        assert_eq!(known.limit_write(&g, None, None), Ok(None));
    }

    /// The stored offset passing a claim this process decided but never wrote (its write was
    /// refused: another process finished the message first) frees the message's key at once:
    /// no handler runs it. One whose claim landed keeps its key's place until its lease runs
    /// out (its handler may still be running). Two brokers on a group ordered by key stalled
    /// on such keys, held for a whole lease.
    #[test]
    fn an_offset_passing_an_unwritten_claim_frees_its_key_at_once() {
        let (g, clock) = (two_keys(), Clock::tokio());
        let mut known = Known::default();
        let take = || g.take(clock.now(), 10, 100, Duration::from_secs(30), 5, 0).claimed;
        let first = take();
        assert_eq!(first.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2], "each key's first");
        // 2's claim landed; 1's was refused: another process finished 1 and 2 meanwhile.
        known.wrote(2, 10, None, &leased(1, first[1].token));
        known.learn_offset(&g, 2);
        assert_eq!(
            take().iter().map(|c| c.seq).collect::<Vec<_>>(),
            [3],
            "key 7 goes on at once; key 8 waits for 2's lease"
        );
    }

    /// A claim of a retry's next attempt, decided here over this process's own retry record
    /// and not written yet, is nobody's handler: the stored offset passing it (another process
    /// took the retry first and finished it) frees its key at once. So does a claim decided
    /// again here after one that landed was given back in memory (a new token, unwritten). A
    /// record of this process's that is not that lease (the retry's) counted as its claim,
    /// and two brokers on a group ordered by key stalled for the whole lease.
    #[test]
    fn an_offset_passing_an_unwritten_claim_over_an_own_record_frees_its_key() {
        let (g, clock) = (two_keys(), Clock::tokio());
        let mut known = Known::default();
        let take = || g.take(clock.now(), 10, 100, Duration::from_secs(30), 5, 0).claimed;
        let first = take();
        let (t1, t2) = (first[0].token, first[1].token);
        known.wrote(1, 10, None, &leased(1, t1));
        known.wrote(2, 11, None, &leased(1, t2));
        // 1's handler failed: its retry, due at once, written here.
        g.begin_settle(1, t1, clock.now()).unwrap();
        g.to_waiting(1, clock.now(), "failed".into());
        let waiting =
            Claim::Waiting { attempt: 1, token: t1, not_before_micros: 0, last_error: "failed".into() };
        known.wrote(1, 12, None, &waiting);
        // 2 given back in memory (its record stays in etcd), and both claimed again here.
        g.release(2, t2, false);
        let again = take();
        assert_eq!(again.iter().map(|c| (c.seq, c.attempt)).collect::<Vec<_>>(), [(1, 2), (2, 1)]);
        // Before either write lands, the offset passes both: another process finished them.
        known.learn_offset(&g, 2);
        assert_eq!(
            take().iter().map(|c| c.seq).collect::<Vec<_>>(),
            [3, 4],
            "neither key waits for a lease that started no handler"
        );
    }

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
        known.wrote(seq, 10, None, &record(t1));
        // Given back in memory (a batch lost to a reset, say); its record stays in etcd.
        g.release(seq, t1, false);
        let again = g.take(clock.now(), 1, 100, lease, 5, 0).claimed;
        assert_eq!(again[0].seq, seq);
        let t2 = again[0].token;
        assert!(g.holds_lease(seq, t2));
        // The write of the new claim is refused (another record of it moved): found as it was.
        let found = vec![(seq, Some(ClaimRecord { seq, claim: record(t1), rev: 10, run: None }))];
        known.learn(&g, 0, found, &clock);
        assert!(g.holds_lease(seq, t2), "still this claim's, not parked as another holder's");
        // A record another process wrote since is learned as its lease.
        let found = vec![(seq, Some(ClaimRecord { seq, claim: record(99), rev: 11, run: None }))];
        known.learn(&g, 0, found, &clock);
        assert!(!g.holds_lease(seq, t2));
    }
}
