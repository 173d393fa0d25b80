//! Claims under a rate and a concurrency limit against a reference that scans everything and
//! counts tokens (the classic "level" form of a token bucket, not the engine's single
//! timestamp): random sends, claims, acks, nacks, releases, clock moves in milliseconds and
//! restarts (the bucket restored as the last claims wrote it). After each claim the two agree
//! on what was claimed, what was exhausted, whether a limit stopped the claim, and how many
//! claimable jobs the limit holds back (`GroupStats::limited`); at no instant are more jobs
//! held than the concurrency limit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{QueueState, WorkGroupState};
use crate::clock::Clock;
use crate::model::{Claim, GroupSettings, RequestedWork};
use crate::rate_limit::RateLimit;

const LEASE: Duration = Duration::from_millis(900);
const MAX: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Available,
    Leased { deadline: Instant },
    Waiting { due: Instant },
}

/// The reference. `level`: tokens times the interval, in nanoseconds (full: `burst` tokens).
struct Model {
    last: u64,
    slots: BTreeMap<u64, (u32, St)>,
    finished: BTreeSet<u64>,
    rate: Option<RateLimit>,
    concurrency: Option<u32>,
    level: u128,
    level_at: Option<Instant>,
}

impl Model {
    fn interval(&self) -> u128 {
        self.rate.map_or(0, |r| r.interval().as_nanos())
    }

    fn full(&self) -> u128 {
        self.rate.map_or(0, |r| u128::from(r.burst_size()) * self.interval())
    }

    /// The bucket's level at `now`, refilled since it was last looked at.
    fn refill(&mut self, now: Instant) {
        let full = self.full();
        self.level = match self.level_at {
            None => full,
            Some(at) => (self.level + now.saturating_duration_since(at).as_nanos()).min(full),
        };
        self.level_at = Some(now);
    }

    fn has_token(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.rate.is_none() || self.level >= self.interval()
    }

    fn expire(&mut self, now: Instant) {
        for (_, st) in self.slots.values_mut() {
            match *st {
                St::Leased { deadline } if deadline <= now => *st = St::Available,
                St::Waiting { due } if due <= now => *st = St::Available,
                _ => {}
            }
        }
    }

    fn held(&self) -> usize {
        self.slots.values().filter(|(_, st)| matches!(st, St::Leased { .. })).count()
    }

    fn claimable(&self) -> Vec<u64> {
        (1..=self.last)
            .filter(|s| !self.finished.contains(s))
            .filter(|s| self.slots.get(s).is_none_or(|(_, st)| *st == St::Available))
            .collect()
    }

    fn reached(&mut self, now: Instant) -> bool {
        let full = self.concurrency.is_some_and(|n| self.held() >= n as usize);
        full || !self.has_token(now)
    }

    /// (claimed (seq, attempt), exhausted, stopped by a limit) of a claim of `max`.
    fn take(&mut self, now: Instant, max: usize) -> (Vec<(u64, u32)>, Vec<u64>, bool) {
        self.expire(now);
        let (mut claimed, mut exhausted, mut limited) = (Vec::new(), Vec::new(), false);
        let mut room = self.concurrency.map(|n| (n as usize).saturating_sub(self.held()));
        let mut open = self.claimable().into_iter();
        while claimed.len() < max {
            if room == Some(0) || !self.has_token(now) {
                limited = true;
                break;
            }
            let Some(seq) = open.next() else { break };
            let attempt = self.slots.get(&seq).map_or(0, |s| s.0);
            if attempt >= MAX {
                self.slots.remove(&seq);
                self.finished.insert(seq);
                exhausted.push(seq);
                continue;
            }
            self.slots.insert(seq, (attempt + 1, St::Leased { deadline: now + LEASE }));
            claimed.push((seq, attempt + 1));
            room = room.map(|r| r - 1);
            if self.rate.is_some() {
                self.level -= self.interval();
            }
        }
        (claimed, exhausted, limited)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Send(u64),
    Take(usize),
    Ack(usize),
    Nack { pick: usize, ms: u64 },
    Release(usize),
    Advance(u64),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u64..6).prop_map(Op::Send),
        5 => (1usize..5).prop_map(Op::Take),
        3 => any::<usize>().prop_map(Op::Ack),
        1 => (any::<usize>(), 0u64..800).prop_map(|(pick, ms)| Op::Nack { pick, ms }),
        1 => any::<usize>().prop_map(Op::Release),
        3 => (0u64..700).prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

fn limits() -> impl Strategy<Value = (Option<RateLimit>, Option<u32>)> {
    let rate = (1u32..6, 50u64..2_000, 1u32..4)
        .prop_map(|(jobs, ms, burst)| RateLimit::new(jobs, Duration::from_millis(ms)).burst(burst));
    (proptest::option::weighted(0.7, rate), proptest::option::weighted(0.7, 1u32..4))
}

fn group(
    queue: &Arc<QueueState>,
    committed: u64,
    limits: (Option<RateLimit>, Option<u32>),
) -> Arc<WorkGroupState> {
    let g = WorkGroupState::new("w", queue.clone(), committed);
    let mut s = RequestedWork::default().initial(&GroupSettings::default(), "q");
    (s.rate_limit, s.concurrency_limit) = limits;
    g.set_settings(Arc::new(s));
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn claims_stop_exactly_where_the_limits_say_across_restarts(
        limits in limits(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let clock = Clock::tokio();
        let queue = QueueState::new(1, "q", 1, 0, crate::retention::Retention::Forever);
        let mut g = group(&queue, 0, limits);
        let mut m = Model {
            last: 0,
            slots: BTreeMap::new(),
            finished: BTreeSet::new(),
            rate: limits.0,
            concurrency: limits.1,
            level: 0,
            level_at: None,
        };
        let mut now = clock.now();
        // The bucket as the writer last wrote it.
        let mut written: Option<Instant> = None;
        let mut held: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Send(n) => {
                    m.last += n;
                    queue.publish(m.last);
                }
                Op::Take(max) => {
                    let t = g.take(now, max, m.last, LEASE, MAX, 0);
                    let (claimed, exhausted, limited) = m.take(now, max);
                    let got: Vec<_> = t.claimed.iter().map(|c| (c.seq, c.attempt)).collect();
                    prop_assert_eq!(got, claimed);
                    let gone: Vec<_> = t.exhausted.iter().map(|e| e.seq).collect();
                    prop_assert_eq!(&gone, &exhausted);
                    prop_assert_eq!(t.limited, limited);
                    g.finished(&gone.iter().map(|&s| (s, g.epoch())).collect::<Vec<_>>());
                    if t.rate_tat.is_some() {
                        written = t.rate_tat;
                    }
                    for c in &t.claimed {
                        held.retain(|h| h.0 != c.seq);
                        held.push((c.seq, c.token));
                    }
                    // What stats report as held back, right after the claim.
                    let want = if m.reached(now) { m.claimable().len() as u64 } else { 0 };
                    prop_assert_eq!(g.limited(now), want);
                    if let Some(n) = m.concurrency {
                        prop_assert!(g.live_leased(now) <= n as usize, "more held than the limit");
                    }
                }
                Op::Ack(pick) | Op::Nack { pick, .. } if !held.is_empty() => {
                    let (seq, token) = held.remove(pick % held.len());
                    if g.begin_settle(seq, token, now).is_ok() {
                        if let Op::Nack { ms, .. } = op {
                            let due = now + Duration::from_millis(ms);
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
                        && matches!(s.1, St::Leased { deadline } if deadline > now)
                    {
                        s.1 = St::Available;
                    }
                }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Restart => {
                    // Every record written (no loss here: the priority model covers lost
                    // claims); leases come back claimable at once, retries due at once.
                    let mut records = Vec::new();
                    for (&seq, &(attempt, st)) in &m.slots {
                        let claim = match st {
                            St::Leased { .. } | St::Available => {
                                Claim::Leased { attempt, token: 1, deadline_micros: 0, holder: Arc::from("h") }
                            }
                            St::Waiting { .. } => Claim::Waiting { attempt, token: 1, not_before_micros: 0, last_error: String::new() },
                        };
                        records.push((seq, claim));
                    }
                    let committed = (1..).take_while(|s| m.finished.contains(s)).last().unwrap_or(0);
                    records.extend(m.finished.iter().filter(|&&s| s > committed).map(|&s| (s, Claim::Done)));
                    records.retain(|r| r.0 > committed);
                    records.sort_by_key(|r| r.0);
                    g = group(&queue, committed, limits);
                    g.restore(records, &clock);
                    if let Some(tat) = written {
                        g.restore_bucket(tat, 1, now);
                    }
                    now = now.max(clock.now());
                    for s in m.slots.values_mut() {
                        s.1 = St::Available;
                    }
                    held.clear();
                }
                _ => {}
            }
        }
    }
}
