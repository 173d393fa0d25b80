//! A work group's rate and concurrency limits on the etcd engine, held by two brokers
//! together (as two processes would), against a real single-member etcd: every limited claim
//! rewrites the group's limit record and compares its revision, so a process that decided on
//! a view missing the other's claims writes nothing. Time is a `ManualClock` shared by the
//! brokers: the rate check reads each claim's instant from its lease deadline, exactly. The
//! single-broker semantics (windows, bursts, restarts, updates) are `tests/limits.rs`, which
//! `scripts/etcd-semantics.sh` runs against etcd. Each test starts its own etcd on loopback
//! ports chosen at run time and stops it by its pid.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, EtcdOptions, ManualClock, RateLimit};

use common::HANG_GUARD;

/// Long enough that no lease runs out while the manual clock is driven.
const LEASE: Duration = Duration::from_secs(3_600);

async fn connect(cluster: &etcd::Cluster, ns: &str, clock: &ManualClock) -> Broker {
    let opts = EtcdOptions::new().options(rockq::Options::new().clock(clock.clone()));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

/// What the handlers of both brokers saw.
#[derive(Default)]
struct Seen {
    running: AtomicUsize,
    most: AtomicUsize,
    finished: AtomicUsize,
    /// Runs of each message.
    runs: Mutex<BTreeMap<u64, usize>>,
    /// Jobs run by each broker.
    by: Mutex<BTreeMap<&'static str, usize>>,
    /// Each claim's lease deadline (all leases are `LEASE` long: the claims' instants, shifted).
    deadlines: Mutex<Vec<(std::time::Instant, &'static str, u64)>>,
}

/// Waits, bounded by the hang guard, until the handlers finished `n` jobs (meanwhile calling
/// `step`, which may move the manual clock).
async fn until_finished(seen: &Seen, n: usize, mut step: impl FnMut()) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while seen.finished.load(Ordering::SeqCst) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} finished",
            seen.finished.load(Ordering::SeqCst)
        );
        step();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Pools of eight workers in two brokers drain one group with a concurrency limit of 3: never
/// more than 3 jobs run at once across both, 3 do, and each job runs once. Without the limit
/// record's compare, the two brokers each fill the places they see free (checked: it fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_hold_a_concurrency_limit_together() {
    const JOBS: usize = 300;
    const LIMIT: usize = 3;
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "capped", &clock).await, connect(&cluster, "capped", &clock).await);
    let q = a.queue("jobs").await.unwrap();
    q.send_batch((0..JOBS).map(|i| format!("job {i}"))).await.unwrap();
    let seen = Arc::new(Seen::default());
    let mut pools = Vec::new();
    for (broker, name) in [(&a, "a"), (&b, "b")] {
        let group = broker.queue("jobs").await.unwrap().work_group("w").unwrap();
        let seen = seen.clone();
        let group = group.lease(LEASE).concurrency_limit(LIMIT as u32);
        pools.push(group.workers(8).spawn(move |task: rockq::Task| {
            let seen = seen.clone();
            async move {
                let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                *seen.runs.lock().unwrap().entry(task.seq()).or_default() += 1;
                // Work that lasts: the other broker's claims land meanwhile.
                tokio::time::sleep(Duration::from_millis(1)).await;
                seen.running.fetch_sub(1, Ordering::SeqCst);
                *seen.by.lock().unwrap().entry(name).or_default() += 1;
                seen.finished.fetch_add(1, Ordering::SeqCst);
                Ok::<(), rockq::HandlerError>(())
            }
        }));
    }
    until_finished(&seen, JOBS, || {}).await;
    for p in pools {
        p.shutdown().await.unwrap();
    }
    let most = seen.most.load(Ordering::SeqCst);
    assert_eq!(most, LIMIT, "at most {LIMIT} at once across both brokers, and {LIMIT} did run at once");
    let runs = seen.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), JOBS);
    assert!(runs.values().all(|&n| n == 1), "each job ran once");
    let by = seen.by.lock().unwrap().clone();
    assert!(by.len() == 2, "both brokers ran jobs: {by:?}");
    let stats = b.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!(g.concurrency_limit, Some(LIMIT as u32));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Pools in two brokers drain one group with a rate limit of 10 a second (burst 2) while the
/// shared manual clock moves on in small steps: in every window of a second, at most 11
/// claims start (`jobs + burst − 1`) across both brokers. Without the limit record's compare,
/// both brokers take the same token (checked: it fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_one_rate_limit() {
    const JOBS: usize = 60;
    let rate = RateLimit::per_second(10).burst(2);
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "rated", &clock).await, connect(&cluster, "rated", &clock).await);
    let q = a.queue("jobs").await.unwrap();
    q.send_batch((0..JOBS).map(|i| format!("job {i}"))).await.unwrap();
    let seen = Arc::new(Seen::default());
    let mut consumers = Vec::new();
    for (broker, name) in [(&a, "a"), (&b, "b")] {
        let group = broker.queue("jobs").await.unwrap().work_group("w").unwrap();
        // A subscription, not a pool: a pool renews the lease of a job it hands a handler
        // later than it claimed it, and the deadline would not tell the claim's instant.
        let mut jobs = group.lease(LEASE).rate_limit(rate).max_in_flight(4).subscribe().await.unwrap();
        let seen = seen.clone();
        consumers.push(tokio::spawn(async move {
            while let Some(job) = jobs.next().await {
                let job = job.expect("a job, not an error");
                #[allow(deprecated)] // the exact instant of the claim, on the manual clock
                let deadline = job.lease_deadline();
                seen.deadlines.lock().unwrap().push((deadline, name, job.seq()));
                *seen.runs.lock().unwrap().entry(job.seq()).or_default() += 1;
                *seen.by.lock().unwrap().entry(name).or_default() += 1;
                job.ack().unwrap();
                seen.finished.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // A token every 100 ms: steps of 20 ms let both brokers race for each one.
    until_finished(&seen, JOBS, || clock.advance(Duration::from_millis(20))).await;
    for c in consumers {
        c.abort();
    }
    let mut claims = seen.deadlines.lock().unwrap().clone();
    claims.sort_unstable();
    let at: Vec<std::time::Instant> = claims.iter().map(|c| c.0).collect();
    let t0 = at[0];
    let shown: Vec<(u128, &str, u64)> =
        claims.iter().map(|(t, n, s)| ((*t - t0).as_millis(), *n, *s)).collect();
    let most = (rate.jobs() + rate.burst_size() - 1) as usize;
    for (i, &start) in at.iter().enumerate() {
        let within = at[i..].iter().take_while(|&&t| t < start + rate.per()).count();
        assert!(within <= most, "{within} claims in the second from claim {i} (at most {most}): {shown:?}");
    }
    let runs = seen.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), JOBS);
    assert!(runs.values().all(|&n| n == 1), "each job ran once");
    let by = seen.by.lock().unwrap().clone();
    assert!(by.len() == 2, "both brokers ran jobs: {by:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A rate limit removed and set again starts with a full bucket, as embedded, in every
/// process: the removal empties the shared bucket (the limit record) in the settings'
/// transaction, so a broker connecting later does not read the old one's token time back — a
/// day away here (checked: it fails when the removal leaves the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_removed_and_set_again_starts_with_a_full_bucket_everywhere() {
    let day = RateLimit::new(1, Duration::from_secs(86_400));
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "reset-bucket", &clock).await;
    let q = a.queue("jobs").await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let group = || q.work_group("w").unwrap().lease(LEASE);
    let mut jobs = group().rate_limit(day).subscribe().await.unwrap();
    let first = jobs.next().await.unwrap().unwrap();
    assert_eq!(first.seq(), 1);
    first.ack_durable().await.unwrap();
    drop(jobs);
    let state = |broker: &Broker, seq| {
        let broker = broker.clone();
        async move { broker.job("jobs", "w", seq).await.unwrap().state }
    };
    assert_eq!(state(&a, 2).await, rockq::JobState::Limited, "a day's limit");
    group().rate_limit(None).update().await.unwrap();
    group().rate_limit(day).update().await.unwrap();
    let b = connect(&cluster, "reset-bucket", &clock).await;
    assert_eq!(state(&b, 2).await, rockq::JobState::Queued, "set again: a full bucket");
    let mut jobs = b.queue("jobs").await.unwrap().work_group("w").unwrap().subscribe().await.unwrap();
    let second = jobs.next().await.unwrap().unwrap();
    assert_eq!(second.seq(), 2);
    second.ack_durable().await.unwrap();
    assert_eq!(state(&b, 3).await, rockq::JobState::Limited, "and the limit holds again");
    drop(jobs);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
