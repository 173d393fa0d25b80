//! Durable limits of work groups (`WorkGroup::rate_limit`, `WorkGroup::concurrency_limit`),
//! against a real database on a `ManualClock`: never more claims than the rate in any window,
//! across a restart (the bucket is not refilled by one); never more jobs held at once than the
//! limit, across subscriptions and a pool's workers; jobs held back are not claimed and show as
//! `Limited` (job status) and in `GroupStats::limited`; the limits are stored, compared and
//! updated like the group's other settings, and bad ones are refused before anything is
//! written. The bucket arithmetic against every window is a proptest in `src/rate_limit.rs`.
//! `scripts/etcd-semantics.sh` runs the whole file against etcd; two processes sharing the
//! limits there are `tests/etcd_limits.rs`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{next_job, open_clock, reopen_after_drop_with};
use rockq::{Broker, JobState, ManualClock, Options, RateLimit};

async fn group(broker: &Broker) -> rockq::WorkGroup {
    common::hourly_workers(broker).await
}

async fn state(broker: &Broker, seq: u64) -> JobState {
    broker.job("jobs", "workers", seq).await.unwrap().state
}

/// Drives one subscription under a rate limit: the clock moves only when the next job is
/// `Limited` (so every claim is seen at the instant it was made), by the next step of `steps`.
/// Returns the clock's elapsed time at each claim.
async fn drive(
    broker: &Broker,
    clock: &ManualClock,
    sub: &mut rockq::WorkSubscription,
    next: &mut u64,
    until: u64,
    steps: &mut impl Iterator<Item = u64>,
) -> Vec<Duration> {
    let mut claims = Vec::new();
    while *next <= until {
        match state(broker, *next).await {
            JobState::Limited => clock.advance(Duration::from_millis(steps.next().unwrap())),
            JobState::Queued | JobState::Leased { .. } | JobState::Settling => {
                let j = next_job(sub).await;
                assert_eq!(j.seq(), *next, "claims in order");
                claims.push(clock.elapsed());
                j.ack().unwrap();
                *next += 1;
            }
            other => panic!("job {next} is {other:?}"),
        }
    }
    claims
}

fn check_windows(claims: &[Duration], per: Duration, max: usize) {
    for (i, &start) in claims.iter().enumerate() {
        let within = claims[i..].iter().take_while(|&&t| t < start + per).count();
        assert!(within <= max, "{within} claims in the window from {start:?} (at most {max}): {claims:?}");
    }
}

#[tokio::test]
async fn a_rate_limit_holds_in_every_window_and_a_restart_does_not_refill_the_bucket() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=40).map(|i| format!("job {i}"))).await.unwrap();
    let rate = RateLimit::new(5, Duration::from_secs(1));
    let mut sub = group(&broker).await.rate_limit(rate).subscribe().await.unwrap();
    // Uneven steps: some shorter than the interval (200 ms), some far longer (a full burst's
    // worth of quiet, which a burst of 1 must not turn into several claims at once).
    let pattern = [70u64, 130, 10, 400, 200, 50, 1_500, 90, 250, 30];
    let mut steps = pattern.iter().copied().cycle();
    let mut next = 1;
    let mut claims = drive(&broker, &clock, &mut sub, &mut next, 20, &mut steps).await;
    // Held back, not claimed: no lease runs while it waits.
    assert_eq!(state(&broker, next).await, JobState::Limited);
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((g.rate_limit, g.in_flight), (Some(rate), 0));
    assert_eq!(g.limited, 40 - 20, "every job left is held back by the limit");

    // Restart at once after a claim: the bucket is as that claim left it.
    drop((sub, q));
    drop(broker);
    let c2 = clock.clone();
    let broker = reopen_after_drop_with(dir.path(), move || Options::new().clock(c2.clone())).await;
    assert_eq!(state(&broker, next).await, JobState::Limited, "a restart does not refill the bucket");
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    claims.extend(drive(&broker, &clock, &mut sub, &mut next, 40, &mut steps).await);
    check_windows(&claims, rate.per(), 5);
    assert_eq!(claims.len(), 40);
    let g = group(&broker).await;
    broker.flush().await.unwrap();
    assert_eq!(g.committed(), Some(40));
}

#[tokio::test]
async fn a_burst_starts_that_many_at_once_and_then_the_rate_applies() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=30).map(|i| format!("job {i}"))).await.unwrap();
    let rate = RateLimit::new(4, Duration::from_secs(2)).burst(3);
    let mut sub = group(&broker).await.rate_limit(rate).max_in_flight(8).subscribe().await.unwrap();
    // Three at once on a full bucket, then one per interval (500 ms).
    let first: Vec<u64> = futures_take(&mut sub, 3).await;
    assert_eq!(first, [1, 2, 3]);
    assert_eq!(state(&broker, 4).await, JobState::Limited);
    clock.advance(Duration::from_millis(499));
    assert_eq!(state(&broker, 4).await, JobState::Limited);
    clock.advance(Duration::from_millis(1));
    assert_eq!(futures_take(&mut sub, 1).await, [4]);
    let mut steps = [120u64, 700, 40, 3_000, 260].into_iter().cycle();
    let mut next = 5;
    let mut claims = vec![Duration::ZERO; 3];
    claims.push(Duration::from_millis(500));
    claims.extend(drive(&broker, &clock, &mut sub, &mut next, 30, &mut steps).await);
    check_windows(&claims, rate.per(), 4 + 3 - 1);
    broker.shutdown().await.unwrap();
}

/// Takes `n` jobs and acks them; their sequences.
async fn futures_take(sub: &mut rockq::WorkSubscription, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for _ in 0..n {
        let j = next_job(sub).await;
        out.push(j.seq());
        j.ack().unwrap();
    }
    out
}

#[tokio::test]
async fn a_concurrency_limit_holds_across_subscriptions_and_frees_a_place_per_finished_job() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=10).map(|i| format!("job {i}"))).await.unwrap();
    let g = || async { group(&broker).await.concurrency_limit(2).max_in_flight(5).read_batch(5) };
    let mut a = g().await.subscribe().await.unwrap();
    let mut b = g().await.subscribe().await.unwrap();
    let j1 = next_job(&mut a).await;
    let j2 = next_job(&mut a).await;
    assert_eq!((j1.seq(), j2.seq()), (1, 2));
    // The limit is the group's: the second subscription claims nothing while two are held.
    assert_eq!(state(&broker, 3).await, JobState::Limited);
    let stats = broker.stats().await.unwrap();
    let gs = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((gs.concurrency_limit, gs.in_flight, gs.limited), (Some(2), 2, 8));
    // A retry frees the place too (the job waits, it is not held).
    j1.nack().await.unwrap();
    let j3 = next_job(&mut b).await;
    assert_eq!(j3.seq(), 3);
    assert_eq!(state(&broker, 4).await, JobState::Limited);
    j2.ack_durable().await.unwrap();
    let j4 = tokio::select! { j = next_job(&mut a) => j, j = next_job(&mut b) => j };
    assert_eq!(j4.seq(), 4);
    assert_eq!(state(&broker, 5).await, JobState::Limited);
    // An expired lease frees its place.
    clock.advance(common::JOB_LEASE + Duration::from_secs(1));
    let j5 = tokio::select! { j = next_job(&mut a) => j, j = next_job(&mut b) => j };
    let j6 = tokio::select! { j = next_job(&mut a) => j, j = next_job(&mut b) => j };
    let mut got = [j5.seq(), j6.seq()];
    got.sort_unstable();
    assert_eq!(got, [3, 4], "the expired leases were claimed again first (job 1's retry is an hour away)");
    drop((j3, j4));
    broker.shutdown().await.unwrap();
}

/// Handlers that report each start and then wait for the test to let them finish, counting
/// how many run at once: all together, or per `Message::key`.
struct Gate {
    go: Arc<tokio::sync::Semaphore>,
    started: tokio::sync::mpsc::UnboundedReceiver<u64>,
    started_tx: tokio::sync::mpsc::UnboundedSender<u64>,
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    most: Arc<AtomicUsize>,
    per_key: bool,
}

impl Gate {
    fn new(per_key: bool) -> Gate {
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
        Gate {
            go: Arc::new(tokio::sync::Semaphore::new(0)),
            started,
            started_tx,
            running: Default::default(),
            most: Arc::new(AtomicUsize::new(0)),
            per_key,
        }
    }

    /// The pool's handler.
    fn handler(
        &self,
    ) -> impl Fn(rockq::Task) -> futures::future::BoxFuture<'static, Result<(), rockq::HandlerError>>
    + Clone
    + Send
    + Sync
    + 'static {
        let (go, tx, running, most, per_key) =
            (self.go.clone(), self.started_tx.clone(), self.running.clone(), self.most.clone(), self.per_key);
        move |task: rockq::Task| {
            let (go, tx, running, most) = (go.clone(), tx.clone(), running.clone(), most.clone());
            Box::pin(async move {
                let key = if per_key { task.key().unwrap_or_default().to_owned() } else { String::new() };
                let now = {
                    let mut r = running.lock().unwrap();
                    let n = r.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                most.fetch_max(now, Ordering::SeqCst);
                tx.send(task.seq()).unwrap();
                go.acquire().await.unwrap().forget();
                *running.lock().unwrap().get_mut(&key).unwrap() -= 1;
                Ok(())
            })
        }
    }

    /// The next job a handler started.
    async fn started(&mut self) -> u64 {
        tokio::time::timeout(common::HANG_GUARD, self.started.recv()).await.unwrap().unwrap()
    }

    /// Lets `n` waiting (or future) handlers finish.
    fn release(&self, n: usize) {
        self.go.add_permits(n);
    }

    /// The most handlers that ran at once (of one key, per key).
    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_pool_of_eight_workers_runs_at_most_the_limit_at_once() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=20).map(|i| format!("job {i}"))).await.unwrap();
    let mut gate = Gate::new(false);
    let handler = gate.handler();
    let pool = group(&broker).await.max_in_flight(64).concurrency_limit(3).workers(8).spawn(handler);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(gate.started().await);
    }
    // Three running, every other job held back (not prefetched: a prefetched job is leased).
    assert_eq!(state(&broker, 4).await, JobState::Limited);
    for _ in 3..20 {
        gate.release(1);
        seen.push(gate.started().await);
    }
    gate.release(3);
    for seq in 1..=20 {
        broker.wait_job("jobs", "workers", seq).await.unwrap();
    }
    let report = pool.shutdown().await.unwrap();
    assert_eq!(report.acked, 20);
    seen.sort_unstable();
    assert_eq!(seen, (1..=20).collect::<Vec<_>>(), "each job ran once");
    assert_eq!(gate.most(), 3, "never more than the limit at once, and the limit reached");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn limits_are_stored_compared_updated_and_survive_a_restart() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    let rate = RateLimit::per_minute(600).burst(10);
    drop(group(&broker).await.rate_limit(rate).concurrency_limit(4).subscribe().await.unwrap());
    // A handle that sets another value is refused; one that sets nothing adopts the stored.
    let e = group(&broker).await.concurrency_limit(5).subscribe().await.unwrap_err();
    assert!(matches!(e, rockq::Error::SettingsMismatch { setting: "concurrency_limit", .. }), "{e}");
    let e = group(&broker).await.rate_limit(None).subscribe().await.unwrap_err();
    assert!(matches!(e, rockq::Error::SettingsMismatch { setting: "rate_limit", .. }), "{e}");
    drop(group(&broker).await.subscribe().await.unwrap());
    drop(q);
    drop(broker);
    let c2 = clock.clone();
    let broker = reopen_after_drop_with(dir.path(), move || Options::new().clock(c2.clone())).await;
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((g.rate_limit, g.concurrency_limit), (Some(rate), Some(4)));
    // An update removes one and keeps the other.
    group(&broker).await.rate_limit(None).update().await.unwrap();
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((g.rate_limit, g.concurrency_limit), (None, Some(4)));
    broker.shutdown().await.unwrap();
    // The inspector (the disk) reads them too.
    let inspector = common::inspector(dir.path()).await;
    let stats = inspector.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((g.rate_limit, g.concurrency_limit, g.limited), (None, Some(4), 0));
}

#[tokio::test]
async fn bad_limits_are_refused_before_anything_is_written() {
    let dir = common::tempdir();
    let broker = common::open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let bad = [
        q.work_group("w").unwrap().rate_limit(RateLimit::per_second(0)),
        q.work_group("w").unwrap().rate_limit(RateLimit::per_second(3).burst(0)),
        q.work_group("w").unwrap().rate_limit(RateLimit::new(3, Duration::from_micros(10))),
        q.work_group("w").unwrap().rate_limit(RateLimit::new(3, Duration::MAX)),
        q.work_group("w").unwrap().concurrency_limit(0),
    ];
    for g in bad {
        let e = g.subscribe().await.unwrap_err();
        assert!(matches!(e, rockq::Error::InvalidOption(_)), "{e}");
    }
    let stats = broker.stats().await.unwrap();
    assert!(stats.groups.is_empty(), "no group was created");
    broker.shutdown().await.unwrap();
}

async fn keyed_sends(broker: &Broker) {
    let q = broker.queue("jobs").await.unwrap();
    for (i, key) in ["t1", "t1", "t2", "t1", "none", "t1", "t2", "t2", "t1", "none"].iter().enumerate() {
        let m = rockq::Message::new(format!("job {}", i + 1));
        q.send(if *key == "none" { m } else { m.key(*key) }).await.unwrap();
    }
}

fn keys_of(seqs: &[u64]) -> Vec<&'static str> {
    const KEYS: [&str; 10] = ["t1", "t1", "t2", "t1", "none", "t1", "t2", "t2", "t1", "none"];
    seqs.iter().map(|&s| KEYS[s as usize - 1]).collect()
}

/// Takes every job a subscription hands out before the next one is `Limited`: `expect` of
/// them (their order is the claim order).
async fn take_held(sub: &mut rockq::WorkSubscription, expect: usize) -> Vec<rockq::Job> {
    let mut jobs = Vec::new();
    for _ in 0..expect {
        jobs.push(next_job(sub).await);
    }
    jobs
}

#[tokio::test]
async fn a_per_key_limit_holds_each_key_to_n_at_once_in_order_and_across_a_restart() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    keyed_sends(&broker).await;
    let g = || async { group(&broker).await.per_key_limit(2).max_in_flight(20).read_batch(20) };
    let mut sub = g().await.subscribe().await.unwrap();
    // The first two of each key, and every job without one.
    let held = take_held(&mut sub, 6).await;
    let mut seqs: Vec<u64> = held.iter().map(|j| j.seq()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 2, 3, 5, 7, 10]);
    for (seq, want) in
        [(4, JobState::Limited), (6, JobState::Limited), (8, JobState::Limited), (9, JobState::Limited)]
    {
        assert_eq!(state(&broker, seq).await, want, "job {seq}");
    }
    let stats = broker.stats().await.unwrap();
    let gs = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((gs.per_key_limit, gs.limited, gs.in_flight), (Some(2), 4, 6));
    // A t1 finishes: the next t1 (4, in order) may start; t2 stays held.
    let mut held: std::collections::BTreeMap<u64, rockq::Job> =
        held.into_iter().map(|j| (j.seq(), j)).collect();
    held.remove(&1).unwrap().ack_durable().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 4);
    held.insert(4, j);
    // A retry keeps its place among the key's two: t2's 8 stays held while 3 waits.
    held.remove(&3).unwrap().nack().await.unwrap();
    assert_eq!(state(&broker, 8).await, JobState::Limited);

    // Restart with t1's 2 and 4 held: leases are void after it, and each key again runs at
    // most two, its earliest first.
    drop((held, sub));
    broker.shutdown().await.unwrap();
    let c2 = clock.clone();
    let broker = reopen_after_drop_with(dir.path(), move || Options::new().clock(c2.clone())).await;
    clock.advance(common::JOB_BACKOFF); // 3's retry is due
    let mut sub = group(&broker).await.max_in_flight(20).read_batch(20).subscribe().await.unwrap();
    let mut got: Vec<u64> = take_held(&mut sub, 6)
        .await
        .into_iter()
        .map(|j| {
            let s = j.seq();
            std::mem::forget(j);
            s
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [2, 3, 4, 5, 7, 10], "t1: 2 and 4; t2: 3 and 7; the keyless ones");
    assert_eq!(keys_of(&got).iter().filter(|k| **k == "t1").count(), 2);
    for seq in [6, 8, 9] {
        assert_eq!(state(&broker, seq).await, JobState::Limited, "job {seq}");
    }
}

#[tokio::test]
async fn a_per_key_limit_and_key_order_are_one_setting() {
    let dir = common::tempdir();
    let broker = common::open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    let both = q.work_group("w").unwrap().ordered_by_key(true).per_key_limit(2);
    assert!(matches!(both.subscribe().await.unwrap_err(), rockq::Error::InvalidOption(_)));
    for n in [0, 1025] {
        let e = q.work_group("w").unwrap().per_key_limit(n).subscribe().await.unwrap_err();
        assert!(matches!(e, rockq::Error::InvalidOption(_)), "{n}: {e}");
    }
    // Stored as ordered by key; an update adding a per-key limit is refused and changes nothing.
    drop(q.work_group("w").unwrap().ordered_by_key(true).subscribe().await.unwrap());
    let e = q.work_group("w").unwrap().per_key_limit(3).update().await.unwrap_err();
    assert!(matches!(e, rockq::Error::InvalidOption(_)), "{e}");
    // Switching is one update of both.
    q.work_group("w").unwrap().ordered_by_key(false).per_key_limit(3).update().await.unwrap();
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!((g.ordered_by_key, g.per_key_limit), (false, Some(3)));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pool_runs_at_most_n_jobs_of_a_key_at_once() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    for i in 0..18 {
        q.send(rockq::Message::new(format!("job {i}")).key(format!("tenant-{}", i % 3))).await.unwrap();
    }
    let mut gate = Gate::new(true);
    let handler = gate.handler();
    let pool = group(&broker).await.max_in_flight(64).per_key_limit(2).workers(8).spawn(handler);
    let mut seen = Vec::new();
    // Two per tenant: six of the eight workers busy, every other job held back.
    for _ in 0..6 {
        seen.push(gate.started().await);
    }
    let stats = broker.stats().await.unwrap();
    assert_eq!(stats.groups.iter().find(|g| g.group == "workers").unwrap().limited, 12);
    for _ in 6..18 {
        gate.release(1);
        seen.push(gate.started().await);
    }
    gate.release(6);
    for seq in 1..=18 {
        broker.wait_job("jobs", "workers", seq).await.unwrap();
    }
    assert_eq!(pool.shutdown().await.unwrap().acked, 18);
    seen.sort_unstable();
    assert_eq!(seen, (1..=18).collect::<Vec<_>>(), "each job ran once");
    assert_eq!(gate.most(), 2, "never more than two of a tenant at once");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_loosened_rate_limit_applies_at_once_and_a_removed_one_across_a_restart() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=4).map(|i| format!("job {i}"))).await.unwrap();
    let slow = RateLimit::new(1, Duration::from_secs(86_400));
    let mut sub = group(&broker).await.rate_limit(slow).subscribe().await.unwrap();
    next_job(&mut sub).await.ack().unwrap();
    assert_eq!(state(&broker, 2).await, JobState::Limited, "a day's limit");
    // Loosened: the next claim waits one new interval, not the rest of the day.
    group(&broker).await.rate_limit(RateLimit::per_second(10)).update().await.unwrap();
    clock.advance(Duration::from_millis(100));
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 2);
    j.ack().unwrap();
    assert_eq!(state(&broker, 3).await, JobState::Limited);
    // Removed: nothing holds claims back, now or after a restart.
    group(&broker).await.rate_limit(None).update().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.seq(), 3);
    j.ack().unwrap();
    drop((sub, q));
    broker.shutdown().await.unwrap();
    let c2 = clock.clone();
    let broker = reopen_after_drop_with(dir.path(), move || Options::new().clock(c2.clone())).await;
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    assert_eq!(next_job(&mut sub).await.seq(), 4);
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((g.rate_limit, g.limited), (None, 0));
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// A rate limit counts claims, so a pool on a rate-limited group claims only for idle
/// handlers: a job claimed ahead would wait, then start bunched with others.
#[tokio::test]
async fn a_pool_on_a_rate_limited_group_claims_only_for_idle_handlers() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch((1..=6).map(|i| format!("job {i}"))).await.unwrap();
    let mut gate = Gate::new(false);
    let handler = gate.handler();
    let rate = RateLimit::per_second(100).burst(10);
    let pool = group(&broker).await.max_in_flight(64).rate_limit(rate).workers(2).spawn(handler);
    for _ in 0..2 {
        gate.started().await;
    }
    // Tokens are there, but both handlers are busy: nothing more is claimed.
    assert_eq!(state(&broker, 3).await, JobState::Queued);
    gate.release(1);
    let third = gate.started().await;
    assert_eq!(third, 3);
    assert_eq!(state(&broker, 4).await, JobState::Queued);
    gate.release(10);
    for seq in 1..=6 {
        broker.wait_job("jobs", "workers", seq).await.unwrap();
    }
    assert_eq!(pool.shutdown().await.unwrap().acked, 6);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn removing_a_per_key_limit_frees_what_it_held_back_at_once() {
    let dir = common::tempdir();
    let broker = common::open(dir.path()).await;
    let q = broker.queue("jobs").await.unwrap();
    for i in 1..=6 {
        q.send(rockq::Message::new(format!("job {i}")).key("tenant")).await.unwrap();
    }
    let g = || async { group(&broker).await.max_in_flight(20).read_batch(20) };
    let mut sub = g().await.per_key_limit(2).subscribe().await.unwrap();
    let held = take_held(&mut sub, 2).await;
    assert_eq!(state(&broker, 3).await, JobState::Limited);
    g().await.per_key_limit(None).update().await.unwrap();
    // Not one at a time behind the held two: all four at once.
    let rest = take_held(&mut sub, 4).await;
    let mut seqs: Vec<u64> = held.iter().chain(&rest).map(|j| j.seq()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    let stats = broker.stats().await.unwrap();
    let gs = stats.groups.iter().find(|g| g.group == "workers").unwrap();
    assert_eq!((gs.per_key_limit, gs.limited, gs.in_flight), (None, 0, 6));
    drop((held, rest, sub));
    broker.shutdown().await.unwrap();
}
