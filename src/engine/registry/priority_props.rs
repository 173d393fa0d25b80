//! Claims by priority against a reference that scans everything: random sends with random
//! priorities, claims with and without a share, acks, nacks, releases, clock moves and
//! restarts (the group rebuilt from the claim records the writer would have written, some of
//! them lost in the crash). After each claim the two agree on what was claimed, in which order,
//! with which attempt, and what was exhausted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{QueueState, WorkGroupState};
use crate::clock::Clock;
use crate::model::Claim;

const LEASE: Duration = Duration::from_secs(10);
const MAX: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Available,
    Leased { token: u64, deadline: Instant },
    Waiting { due: Instant },
}

/// The reference: every published message's priority, every claimed one's slot, the finished
/// ones; a claim scans them all.
#[derive(Default)]
struct Model {
    priorities: BTreeMap<u64, u8>,
    last: u64,
    slots: BTreeMap<u64, (u32, St)>,
    finished: BTreeSet<u64>,
    since_oldest: u32,
}

impl Model {
    fn claimable(&mut self, now: Instant) -> Vec<u64> {
        for (_, st) in self.slots.values_mut() {
            match *st {
                St::Leased { deadline, .. } if deadline <= now => *st = St::Available,
                St::Waiting { due } if due <= now => *st = St::Available,
                _ => {}
            }
        }
        (1..=self.last)
            .filter(|s| !self.finished.contains(s))
            .filter(|s| self.slots.get(s).is_none_or(|(_, st)| *st == St::Available))
            .collect()
    }

    /// (claimed (seq, attempt), exhausted) of a claim of `max` with share `share`.
    fn take(&mut self, now: Instant, max: usize, share: u32) -> (Vec<(u64, u32)>, Vec<u64>) {
        let (mut claimed, mut exhausted) = (Vec::new(), Vec::new());
        let mut open = self.claimable(now);
        while claimed.len() < max && !open.is_empty() {
            let prio = |s: &u64| self.priorities.get(s).copied().unwrap_or(0);
            let oldest = open[0];
            let high = open
                .iter()
                .filter(|s| prio(s) > 0)
                .max_by_key(|s| (prio(s), std::cmp::Reverse(**s)))
                .copied();
            let share_turn = share > 0 && self.since_oldest + 1 >= share;
            let seq = match high {
                Some(h) if !share_turn => {
                    self.since_oldest = if h == oldest { 0 } else { self.since_oldest + 1 };
                    h
                }
                _ => {
                    self.since_oldest = 0;
                    oldest
                }
            };
            open.retain(|&s| s != seq);
            let attempt = self.slots.get(&seq).map_or(0, |s| s.0);
            if attempt >= MAX {
                self.slots.remove(&seq);
                self.finished.insert(seq); // settling for good: the test dead-letters it
                exhausted.push(seq);
                continue;
            }
            self.slots.insert(seq, (attempt + 1, St::Leased { token: 0, deadline: now + LEASE }));
            claimed.push((seq, attempt + 1));
        }
        (claimed, exhausted)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Send(Vec<u8>),
    Take {
        max: usize,
        share: u32,
    },
    Ack(usize),
    Nack {
        pick: usize,
        secs: u64,
    },
    Release(usize),
    Advance(u64),
    /// A reset to the offset picked by the number (everything above runs again).
    Reset(u64),
    /// Retention deletes everything through the sequence picked by the number.
    Skip(u64),
    /// A restart: every record the writer wrote is found, but those whose bit is set in
    /// `lost` (one bit per leased slot, in order) never reached the disk.
    Restart {
        lost: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let priority = prop_oneof![6 => Just(0u8), 2 => 1u8..3, 1 => Just(255u8)];
    prop_oneof![
        3 => proptest::collection::vec(priority, 1..6).prop_map(Op::Send),
        4 => (1usize..5, prop_oneof![3 => Just(0u32), 1 => 1u32..4]).prop_map(|(max, share)| Op::Take { max, share }),
        3 => any::<usize>().prop_map(Op::Ack),
        1 => (any::<usize>(), 0u64..20).prop_map(|(pick, secs)| Op::Nack { pick, secs }),
        1 => any::<usize>().prop_map(Op::Release),
        2 => (0u64..15).prop_map(Op::Advance),
        1 => any::<u64>().prop_map(Op::Reset),
        1 => any::<u64>().prop_map(Op::Skip),
        1 => any::<u64>().prop_map(|lost| Op::Restart { lost }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn claims_follow_priority_then_sequence_across_restarts(ops in proptest::collection::vec(op(), 1..100)) {
        let clock = Clock::tokio();
        let queue = QueueState::new(1, "q", 1, 0, crate::retention::Retention::Forever);
        let mut g = WorkGroupState::new("w", queue.clone(), 0);
        let mut m = Model::default();
        let mut now = clock.now();
        // Live claims: (seq, token).
        let mut held: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Send(priorities) => {
                    for p in priorities {
                        m.last += 1;
                        queue.index_priority(m.last, p);
                        m.priorities.insert(m.last, p);
                    }
                }
                Op::Take { max, share } => {
                    let t = g.take(now, max, m.last, LEASE, MAX, share);
                    let (claimed, exhausted) = m.take(now, max, share);
                    let got: Vec<_> = t.claimed.iter().map(|c| (c.seq, c.attempt)).collect();
                    prop_assert_eq!(got, claimed);
                    let gone: Vec<_> = t.exhausted.iter().map(|e| e.seq).collect();
                    prop_assert_eq!(&gone, &exhausted);
                    // Exhausted ones are dead-lettered: finished.
                    g.finished(&gone.iter().map(|&s| (s, g.epoch())).collect::<Vec<_>>());
                    for c in &t.claimed {
                        m.slots.insert(c.seq, (c.attempt, St::Leased { token: c.token, deadline: c.deadline }));
                        held.retain(|h| h.0 != c.seq);
                        held.push((c.seq, c.token));
                    }
                }
                Op::Ack(pick) | Op::Nack { pick, .. } if !held.is_empty() => {
                    let (seq, token) = held.remove(pick % held.len());
                    if g.begin_settle(seq, token, now).is_ok() {
                        if let Op::Nack { secs, .. } = op {
                            let due = now + Duration::from_secs(secs);
                            g.to_waiting(seq, due, "e".into());
                            if let Some(s) = m.slots.get_mut(&seq) { s.1 = St::Waiting { due }; }
                        } else {
                            g.finished(&[(seq, g.epoch())]);
                            m.slots.remove(&seq);
                            m.finished.insert(seq);
                        }
                    }
                }
                Op::Release(pick) if !held.is_empty() => {
                    let (seq, token) = held.remove(pick % held.len());
                    g.release(seq, token, true);
                    if let Some(s) = m.slots.get_mut(&seq)
                        && matches!(s.1, St::Leased { token: t, .. } if t == token)
                    {
                        s.1 = St::Available;
                    }
                }
                Op::Advance(secs) => now += Duration::from_secs(secs),
                Op::Reset(pick) => {
                    let to = pick % (m.last + 1);
                    g.reset(to);
                    m.slots.clear();
                    m.finished = (1..=to).collect();
                    m.since_oldest = 0;
                    held.clear();
                }
                Op::Skip(pick) => {
                    let to = pick % (m.last + 1);
                    g.skip_to(to);
                    m.slots = m.slots.split_off(&(to + 1));
                    m.finished.extend(1..=to);
                    held.retain(|h| h.0 > to);
                }
                Op::Restart { lost } => {
                    let mut records = Vec::new();
                    let mut leased = 0;
                    let mut forget = Vec::new();
                    for (&seq, &(attempt, st)) in &m.slots {
                        let claim = match st {
                            St::Leased { .. } | St::Available => {
                                leased += 1;
                                if lost >> (leased % 64) & 1 == 1 {
                                    forget.push(seq);
                                    continue;
                                }
                                Claim::Leased { attempt, token: 1, deadline_micros: 0, holder: Arc::from("h") }
                            }
                            // A retry due at once after the restart (a past wall time).
                            St::Waiting { .. } => Claim::Waiting { attempt, token: 1, not_before_micros: 0, last_error: String::new() },
                        };
                        records.push((seq, claim));
                    }
                    // The offset is past the finished prefix; records above it only.
                    let committed = (1..).take_while(|s| m.finished.contains(s)).last().unwrap_or(0);
                    records.extend(m.finished.iter().filter(|&&s| s > committed).map(|&s| (s, Claim::Done)));
                    records.retain(|r| r.0 > committed);
                    records.sort_by_key(|r| r.0);
                    g = WorkGroupState::new("w", queue.clone(), committed);
                    g.restore(records, &clock);
                    // Retries restored at a past wall time are due at the clock's now.
                    now = now.max(clock.now());
                    // A lost claim was never made; every lease and retry is claimable at once.
                    for seq in forget {
                        m.slots.remove(&seq);
                    }
                    for s in m.slots.values_mut() {
                        s.1 = St::Available;
                    }
                    // The share's count is this process's.
                    m.since_oldest = 0;
                    held.clear();
                }
                _ => {}
            }
        }
        // Drained to the end, the two agree on every remaining claim too.
        now += Duration::from_secs(3600);
        loop {
            let t = g.take(now, 7, m.last, LEASE, MAX, 0);
            let (claimed, exhausted) = m.take(now, 7, 0);
            let got: Vec<_> = t.claimed.iter().map(|c| (c.seq, c.attempt)).collect();
            prop_assert_eq!(&got, &claimed);
            prop_assert_eq!(t.exhausted.iter().map(|e| e.seq).collect::<Vec<_>>(), exhausted.clone());
            if claimed.is_empty() && exhausted.is_empty() {
                break;
            }
            let done: Vec<_> = t.claimed.iter().map(|c| c.seq).chain(exhausted.iter().copied()).collect();
            for &seq in &done {
                if let Some(c) = t.claimed.iter().find(|c| c.seq == seq) {
                    let _ = g.begin_settle(seq, c.token, now);
                }
                m.slots.remove(&seq);
                m.finished.insert(seq);
            }
            g.finished(&done.iter().map(|&s| (s, g.epoch())).collect::<Vec<_>>());
        }
        prop_assert_eq!(m.finished.len() as u64, m.last, "every message finished exactly once");
    }
}
