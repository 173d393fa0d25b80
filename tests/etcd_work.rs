//! Work-queue groups on the etcd engine, against a real single-member etcd: several brokers
//! (as separate processes would) compete for one group's messages. Claims are fenced by the
//! claim record's etcd revision, leases and retries move between brokers through the stored
//! deadlines, dead letters and offsets are shared. Time is a `ManualClock` shared by the
//! brokers (leases and backoff never wait on the wall clock). Each test starts its own etcd on
//! loopback ports chosen at run time and stops it by its pid.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, Error, EtcdOptions, Job, ManualClock, RetryPolicy, WorkSubscription};

use common::HANG_GUARD;

async fn connect(cluster: &etcd::Cluster, ns: &str, clock: &ManualClock) -> Broker {
    let opts = EtcdOptions::new().options(rockq::Options::new().clock(clock.clone()));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

async fn next(jobs: &mut WorkSubscription) -> Job {
    tokio::time::timeout(HANG_GUARD, jobs.next())
        .await
        .expect("a job within the hang guard")
        .expect("the stream ended")
        .expect("a job, not an error")
}

/// Nothing is claimable for `jobs` now (it would have to wait): polls once after the claim
/// round trips settle. A claim never blocks on etcd for long, so a pending poll after a
/// flush-and-yield means "nothing to claim".
async fn nothing_claimable(broker: &Broker, jobs: &mut WorkSubscription) {
    broker.flush().await.unwrap();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    match tokio::time::timeout(Duration::from_millis(300), jobs.next()).await {
        Err(_) => {}
        Ok(j) => panic!("expected nothing claimable, got {:?}", j.map(|j| j.map(|j| (j.seq(), j.attempt())))),
    }
}

/// `broker`'s stats, asked again while a member is slow to answer on a loaded machine (until
/// `deadline`).
async fn stats_by(broker: &Broker, deadline: tokio::time::Instant) -> rockq::Stats {
    loop {
        match broker.stats().await {
            Ok(s) => return s,
            Err(rockq::Error::Storage(e)) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("stats: {e}"),
        }
    }
}

/// Waits (bounded by the hang guard) until `cond` holds on the stats of `broker`.
async fn wait_stats(broker: &Broker, cond: impl Fn(&rockq::Stats) -> bool) -> rockq::Stats {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let s = stats_by(broker, deadline).await;
        if cond(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "stats never got there: {:?}", s.groups);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Job `seq` of group `w` on `jobs` once `broker` sees it finished: another broker's outcome
/// reaches this one's view through its claim watch.
async fn finished(broker: &Broker, seq: u64) -> rockq::JobStatus {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let s = broker.job("jobs", "w", seq).await.unwrap();
        if s.state == rockq::JobState::Finished {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {seq} never read as finished: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The task of the next handler started.
async fn started(tasks: &mut tokio::sync::mpsc::UnboundedReceiver<rockq::Task>) -> rockq::Task {
    tokio::time::timeout(HANG_GUARD, tasks.recv()).await.expect("a handler started").unwrap()
}

fn committed(s: &rockq::Stats, group: &str) -> u64 {
    s.groups.iter().find(|g| g.group == group).map_or(0, |g| g.committed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_a_work_group_and_each_message_is_processed_once() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "shared", &clock).await, connect(&cluster, "shared", &clock).await);
    let (qa, qb) = (a.queue("q").await.unwrap(), b.queue("q").await.unwrap());
    const EACH: u64 = 300;
    let sent: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let mut producers = Vec::new();
    for (q, name) in [(qa.clone(), "a"), (qb.clone(), "b")] {
        let sent = sent.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let seq = q.send(format!("{name}-{i}")).await.unwrap();
                assert!(sent.lock().unwrap().insert(seq), "sequence {seq} handed out twice");
            }
        }));
    }
    let processed: Arc<Mutex<BTreeMap<u64, Vec<&'static str>>>> = Arc::default();
    let mut pools = Vec::new();
    for (q, name) in [(qa.clone(), "a"), (qb.clone(), "b")] {
        let processed = processed.clone();
        let group = q.work_group("w").unwrap().lease(Duration::from_secs(60));
        pools.push(tokio::spawn(async move {
            group.workers(4).spawn(move |task: rockq::Task| {
                let processed = processed.clone();
                async move {
                    processed.lock().unwrap().entry(task.seq()).or_default().push(name);
                    Ok(())
                }
            })
        }));
    }
    let mut handles = Vec::new();
    for p in pools {
        handles.push(p.await.unwrap());
    }
    for p in producers {
        p.await.unwrap();
    }
    let total = 2 * EACH;
    assert_eq!(sent.lock().unwrap().len() as u64, total);
    assert_eq!(*sent.lock().unwrap(), (1..=total).collect::<BTreeSet<_>>(), "dense sequences");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline && processed.lock().unwrap().len() < total as usize {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("processed {} of {total}", processed.lock().unwrap().len());
    let s = wait_stats(&a, |s| committed(s, "w") == total).await;
    assert_eq!(committed(&s, "w"), total, "the offset moved over both brokers' acks");
    for h in handles {
        h.shutdown().await.unwrap();
    }
    let processed = processed.lock().unwrap().clone();
    assert_eq!(processed.keys().copied().collect::<BTreeSet<_>>(), (1..=total).collect::<BTreeSet<_>>());
    let twice: Vec<_> = processed.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "processed more than once in a clean run: {twice:?}");
    let by_a = processed.values().filter(|by| by[0] == "a").count();
    eprintln!("a processed {by_a}, b processed {}", total as usize - by_a);
    assert!(by_a > 0 && by_a < total as usize, "both brokers took part");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Per-key order across processes: pools in two brokers take jobs of one group ordered by key
/// (20 keys × 40 messages, interleaved; one attempt in four fails and is retried at once; the
/// second broker joins once the first is under way). For every key, handlers run one at a time
/// and each starts only once every earlier message of its key finished — whichever broker ran
/// those — and every message finishes. Each broker learns the other's claims and outcomes
/// from etcd and reads the keys of what it may claim, the claims it learns included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_keep_each_keys_order_in_a_group_ordered_by_key() {
    keyed_across_two_brokers("keyed", None).await;
}

/// A per-key limit across processes, as [`two_brokers_keep_each_keys_order_in_a_group_ordered_by_key`]
/// with `per_key_limit(3)`: at most three of a key run at once over both brokers, and each
/// starts only while fewer than three earlier ones of its key are unfinished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_hold_each_key_to_its_per_key_limit() {
    keyed_across_two_brokers("per-key", Some(3)).await;
}

/// The workload of the two tests above: `limit` `None` is `ordered_by_key` (a window of one).
async fn keyed_across_two_brokers(ns: &str, limit: Option<u32>) {
    const KEYS: usize = 20;
    const PER_KEY: usize = 40;
    struct Key {
        running: usize,
        done: Vec<bool>,
    }
    struct Tracker {
        keys: Vec<Mutex<Key>>,
        violations: Mutex<Vec<String>>,
        by: Mutex<BTreeMap<&'static str, usize>>,
        finished: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }
    let window = limit.map_or(1, |n| n as usize);
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, ns, &clock).await, connect(&cluster, ns, &clock).await);
    let qa = a.queue("ledger").await.unwrap();
    // Interleaved: message n of every key, then n + 1.
    let msgs: Vec<rockq::Message> = (0..PER_KEY)
        .flat_map(|n| (0..KEYS).map(move |k| rockq::Message::new(format!("{k}:{n}")).key(format!("key-{k}"))))
        .collect();
    qa.send_batch(msgs).await.unwrap();
    let t = Arc::new(Tracker {
        keys: (0..KEYS).map(|_| Mutex::new(Key { running: 0, done: vec![false; PER_KEY] })).collect(),
        violations: Mutex::default(),
        by: Mutex::default(),
        finished: Default::default(),
        most: Default::default(),
    });
    let mut pools = Vec::new();
    for (broker, name) in [(&a, "a"), (&b, "b")] {
        // `b` joins once `a` is under way: its group loads `a`'s claims from etcd, and it
        // reads their keys before it claims anything.
        if name == "b" {
            let deadline = tokio::time::Instant::now() + HANG_GUARD;
            while t.finished.load(std::sync::atomic::Ordering::SeqCst) < 100 {
                assert!(tokio::time::Instant::now() < deadline, "a's pool hung");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let group = broker.queue("ledger").await.unwrap().work_group("w").unwrap();
        let group = match limit {
            None => group.ordered_by_key(true),
            Some(n) => group.per_key_limit(n),
        };
        let group = group
            .lease(Duration::from_secs(600))
            .retry_policy(RetryPolicy::default().max_attempts(100).backoff(Duration::ZERO, Duration::ZERO));
        let t = t.clone();
        pools.push(group.workers(8).spawn(move |task: rockq::Task| {
            let t = t.clone();
            async move {
                let text = String::from_utf8(task.payload().to_vec()).unwrap();
                let (k, n) = text.split_once(':').unwrap();
                let (k, n): (usize, usize) = (k.parse().unwrap(), n.parse().unwrap());
                {
                    let mut key = t.keys[k].lock().unwrap();
                    if key.running >= window {
                        t.violations
                            .lock()
                            .unwrap()
                            .push(format!("{name}: key {k} message {n} started beside {}", key.running));
                    }
                    let unfinished = key.done[..n].iter().filter(|d| !**d).count();
                    if unfinished >= window {
                        t.violations.lock().unwrap().push(format!(
                            "{name}: key {k} message {n} started before {unfinished} earlier ones finished"
                        ));
                    }
                    key.running += 1;
                    t.most.fetch_max(key.running, std::sync::atomic::Ordering::SeqCst);
                }
                // Long enough for the other broker's claims to land meanwhile.
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                let fail = (task.seq() * 7 + u64::from(task.attempt())).is_multiple_of(4);
                let mut key = t.keys[k].lock().unwrap();
                key.running -= 1;
                if fail {
                    return Err(rockq::HandlerError::retry("one attempt in four fails"));
                }
                key.done[n] = true;
                *t.by.lock().unwrap().entry(name).or_default() += 1;
                t.finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        }));
    }
    let total = KEYS * PER_KEY;
    // Bounded by the hang guard; a stall names what each broker holds of the first jobs
    // not finished (the records in etcd and each broker's own view of them).
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let s = stats_by(&a, deadline).await;
        if committed(&s, "w") == total as u64 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let first = committed(&s, "w") + 1;
            let mut views = Vec::new();
            for (broker, name) in [(&a, "a"), (&b, "b")] {
                for seq in first..(first + 3).min(total as u64 + 1) {
                    views.push(format!("{name} {seq}: {:?}", broker.job("ledger", "w", seq).await));
                }
            }
            let pending = a.pending("ledger", "w").await;
            let finished: Vec<bool> = pools.iter().map(|p| p.is_finished()).collect();
            panic!(
                "stalled: {:?}\nviews: {views:#?}\npending: {pending:?}\npools finished: {finished:?}",
                s.groups
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in pools {
        p.shutdown().await.unwrap();
    }
    let v = t.violations.lock().unwrap().clone();
    assert!(v.is_empty(), "{} violations, first: {:?}", v.len(), &v[..v.len().min(5)]);
    assert_eq!(t.finished.load(std::sync::atomic::Ordering::SeqCst), total, "each finished once");
    let by = t.by.lock().unwrap().clone();
    let most = t.most.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("finished by broker: {by:?}; most of one key at once: {most}");
    assert!(by.len() == 2, "both brokers took part: {by:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_by_one_broker_goes_to_the_other_only_when_it_runs_out_and_fences_the_old_holder() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "leases", &clock).await, connect(&cluster, "leases", &clock).await);
    let qa = a.queue("q").await.unwrap();
    qa.send("one").await.unwrap();
    let lease = Duration::from_secs(30);
    let mut ja = qa.work_group("w").unwrap().lease(lease).subscribe().await.unwrap();
    let held = next(&mut ja).await;
    assert_eq!((held.seq(), held.attempt()), (1, 1));

    let qb = b.queue("q").await.unwrap();
    let mut jb = qb.work_group("w").unwrap().subscribe().await.unwrap();
    nothing_claimable(&b, &mut jb).await;

    // The lease runs out: `b` claims it, with the attempt `a` used counted.
    clock.advance(lease + Duration::from_secs(1));
    let taken = next(&mut jb).await;
    assert_eq!((taken.seq(), taken.attempt()), (1, 2));
    // `a`'s outcome is refused and changes nothing.
    match held.ack() {
        Err(Error::LeaseLost { seq: 1, .. }) => {}
        other => panic!("the old holder's ack must be refused, got {other:?}"),
    }
    taken.ack_durable().await.unwrap();
    let s = wait_stats(&a, |s| committed(s, "w") == 1).await;
    assert_eq!(committed(&s, "w"), 1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The etcd fence, not the local one: `a`'s clock lags `b`'s (a clock skew), so `a` still
/// believes it holds the message when `b` claims it after the stored deadline. `a`'s ack passes
/// its local check and is refused by etcd's compare on the claim's revision; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_compares_the_claim_revision_in_etcd() {
    let cluster = etcd::Cluster::start(1).await;
    let (clock_a, clock_b) = (ManualClock::new(), ManualClock::new());
    let (a, b) = (connect(&cluster, "fence", &clock_a).await, connect(&cluster, "fence", &clock_b).await);
    let qa = a.queue("q").await.unwrap();
    qa.send("one").await.unwrap();
    let lease = Duration::from_secs(30);
    let mut ja = qa.work_group("w").unwrap().lease(lease).subscribe().await.unwrap();
    let held = next(&mut ja).await;
    let qb = b.queue("q").await.unwrap();
    let mut jb = qb.work_group("w").unwrap().subscribe().await.unwrap();
    clock_b.advance(lease + Duration::from_secs(5));
    let taken = next(&mut jb).await;
    assert_eq!((taken.seq(), taken.attempt()), (1, 2));
    assert!(held.lease_remaining() > Duration::ZERO, "a still believes it holds the message");
    match held.ack_durable().await {
        Err(Error::LeaseLost { seq: 1, .. }) => {}
        other => panic!("etcd must refuse the old holder's ack, got {other:?}"),
    }
    // Nothing changed: the offset did not move, and `b` still holds and settles it.
    assert_eq!(committed(&a.stats().await.unwrap(), "w"), 0);
    nothing_claimable(&a, &mut ja).await;
    taken.ack_durable().await.unwrap();
    let s = wait_stats(&a, |s| committed(s, "w") == 1).await;
    assert_eq!(committed(&s, "w"), 1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_their_backoff_across_brokers_and_exhausted_messages_are_dead_lettered_once() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "retries", &clock).await, connect(&cluster, "retries", &clock).await);
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .multiplier(1.0)
        .jitter(0.0);
    let qa = a.queue("q").await.unwrap();
    qa.send("poison").await.unwrap();
    let mut ja = qa.work_group("w").unwrap().retry_policy(policy.clone()).subscribe().await.unwrap();
    let qb = b.queue("q").await.unwrap();
    let mut jb = qb.work_group("w").unwrap().subscribe().await.unwrap();

    let j = next(&mut ja).await;
    assert_eq!(j.attempt(), 1);
    j.fail_durable("boom 1").await.unwrap();
    // Waiting for its backoff: neither broker may claim it before.
    nothing_claimable(&b, &mut jb).await;
    clock.advance(Duration::from_secs(11));
    // Whichever broker claims it first gets attempt 2; the other gets nothing.
    let j = tokio::select! {
        j = next(&mut ja) => j,
        j = next(&mut jb) => j,
    };
    assert_eq!(j.attempt(), 2, "the attempt survives the move between brokers");
    j.fail_durable("boom 2").await.unwrap();
    clock.advance(Duration::from_secs(11));
    let j = tokio::select! {
        j = next(&mut ja) => j,
        j = next(&mut jb) => j,
    };
    assert_eq!(j.attempt(), 3);
    j.fail_durable("boom 3").await.unwrap();

    // Dead-lettered once, with its origin in the headers.
    let dlq = b.queue("q.dlq").await.unwrap();
    let mut letters = dlq.group("inspect").unwrap().subscribe().await.unwrap();
    let d = tokio::time::timeout(HANG_GUARD, letters.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(&d.payload()[..], b"poison");
    assert_eq!(d.header("rockq-dlq-attempts").map(|v| &v[..]), Some(&b"3"[..]));
    assert!(String::from_utf8_lossy(d.header("rockq-dlq-reason").unwrap()).contains("boom 3"));
    assert_eq!(dlq.last_seq(), 1, "one copy");
    let s = wait_stats(&a, |s| committed(s, "w") == 1).await;
    assert_eq!(committed(&s, "w"), 1, "the offset passed the dead letter");
    clock.advance(Duration::from_secs(60));
    nothing_claimable(&a, &mut ja).await;
    nothing_claimable(&b, &mut jb).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// An operator on one broker (the console of another instance) acts on jobs another broker
/// claimed: a retry waiting an hour runs now with its attempts, a job never claimed is deleted
/// or dead-lettered, a live lease is refused; every broker sees the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_on_one_broker_acts_on_jobs_another_broker_claimed() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "operator", &clock).await;
    let hour = Duration::from_secs(3600);
    let policy = RetryPolicy::default().max_attempts(5).backoff(hour, hour).jitter(0.0);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch(["1", "2", "3", "4", "5"]).await.unwrap();
    let mut ja = qa
        .work_group("w")
        .unwrap()
        .retry_policy(policy)
        .read_batch(1)
        .max_in_flight(1)
        .subscribe()
        .await
        .unwrap();
    let failed = next(&mut ja).await;
    assert_eq!(failed.seq(), 1);
    failed.fail_durable("downstream 503").await.unwrap();
    let held = next(&mut ja).await;
    assert_eq!(held.seq(), 2);

    // `b` starts after (it loads the group, `a`'s lease and the waiting retry with it).
    let b = connect(&cluster, "operator", &clock).await;
    for e in [
        b.delete_job("q", "w", 2).await.unwrap_err(),
        b.retry_job_now("q", "w", 2).await.unwrap_err(),
        b.dead_letter_job("q", "w", 2, "x").await.unwrap_err(),
    ] {
        assert!(matches!(e, Error::JobState { state: "leased", seq: 2, .. }), "{e}");
    }
    let e = b.retry_job_now("q", "w", 3).await.unwrap_err();
    assert!(matches!(e, Error::JobState { state: "claimable now", .. }), "{e}");
    b.retry_job_now("q", "w", 1).await.unwrap();
    b.delete_job("q", "w", 3).await.unwrap();
    b.dead_letter_job("q", "w", 4, "bad input").await.unwrap();
    // As stored in etcd, read by the other broker: 1 due now with its attempt and error.
    let pending = a.pending("q", "w").await.unwrap();
    let one = pending.iter().find(|p| p.seq == 1).expect("job 1 pending");
    assert_eq!((one.attempt, one.last_error.as_deref()), (1, Some("downstream 503")));
    assert!(one.retry_at.unwrap() <= clock.wall_time(), "due now, not in an hour: {one:?}");

    // `a` runs 1 at once (attempt 2, the clock never moved), then 5; 3 and 4 never come.
    held.ack_durable().await.unwrap();
    let j = next(&mut ja).await;
    assert_eq!((j.seq(), j.attempt()), (1, 2));
    j.ack_durable().await.unwrap();
    let j = next(&mut ja).await;
    assert_eq!((j.seq(), j.attempt()), (5, 1));
    j.ack_durable().await.unwrap();
    let s = wait_stats(&b, |s| committed(s, "w") == 5).await;
    assert_eq!(s.groups.iter().find(|g| g.group == "w").unwrap().lag, 0);
    nothing_claimable(&a, &mut ja).await;
    // The dead letter, with the operator's reason.
    let dlq = a.queue("q.dlq").await.unwrap();
    let mut letters = dlq.group("inspect").unwrap().subscribe().await.unwrap();
    let d = tokio::time::timeout(HANG_GUARD, letters.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(&d.payload()[..], b"4");
    assert!(String::from_utf8_lossy(d.header("rockq-dlq-reason").unwrap()).contains("bad input"));
    assert_eq!(dlq.last_seq(), 1, "one copy");
    // Finished jobs are no one's to act on.
    let e = b.delete_job("q", "w", 3).await.unwrap_err();
    assert!(matches!(e, Error::NoSuchJob { seq: 3, .. }), "{e}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_broker_resumes_the_group_with_the_leases_and_attempts_others_left() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "resume", &clock).await;
    let q = a.queue("q").await.unwrap();
    for i in 0..5 {
        q.send(format!("m{i}")).await.unwrap();
    }
    let lease = Duration::from_secs(30);
    let mut jobs =
        q.work_group("w").unwrap().lease(lease).read_batch(1).max_in_flight(3).subscribe().await.unwrap();
    let first = next(&mut jobs).await;
    let second = next(&mut jobs).await;
    let third = next(&mut jobs).await;
    assert_eq!([first.seq(), second.seq(), third.seq()], [1, 2, 3]);
    second.ack_durable().await.unwrap();
    // `first` stays leased in etcd; `third` too. Forgotten here without an outcome, as a
    // crashed process would (its broker goes away without releasing anything in etcd).
    std::mem::forget(first);
    std::mem::forget(third);
    drop(jobs);
    a.shutdown().await.unwrap();

    let b = connect(&cluster, "resume", &clock).await;
    let q = b.queue("q").await.unwrap();
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    // 1 and 3 are someone's until the lease runs out; 2 is done: 4 and 5 come first.
    let j = next(&mut jobs).await;
    assert_eq!((j.seq(), j.attempt()), (4, 1));
    j.ack_durable().await.unwrap();
    let j = next(&mut jobs).await;
    assert_eq!((j.seq(), j.attempt()), (5, 1));
    j.ack_durable().await.unwrap();
    nothing_claimable(&b, &mut jobs).await;
    clock.advance(lease + Duration::from_secs(1));
    let mut got = Vec::new();
    for _ in 0..2 {
        let j = next(&mut jobs).await;
        got.push((j.seq(), j.attempt()));
        j.ack_durable().await.unwrap();
    }
    got.sort_unstable();
    assert_eq!(got, [(1, 2), (3, 2)], "the crashed holder's attempts stay counted");
    let s = wait_stats(&b, |s| committed(s, "w") == 5).await;
    assert_eq!(committed(&s, "w"), 5);
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_shared_through_etcd_and_a_bad_one_is_refused() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "settings", &clock).await, connect(&cluster, "settings", &clock).await);
    let qa = a.queue("q").await.unwrap();
    qa.send("x").await.unwrap();
    let _ja = qa.work_group("w").unwrap().lease(Duration::from_secs(45)).subscribe().await.unwrap();
    // Another broker with a different explicit lease is refused; without one it adopts 45 s.
    let qb = b.queue("q").await.unwrap();
    match qb.work_group("w").unwrap().lease(Duration::from_secs(10)).subscribe().await {
        Err(rockq::Error::SettingsMismatch { .. }) => {}
        other => panic!("expected SettingsMismatch, got {:?}", other.map(|_| ())),
    }
    let mut jb = qb.work_group("w").unwrap().subscribe().await.unwrap();
    let j = next(&mut jb).await;
    let left = j.lease_remaining();
    assert!(left > Duration::from_secs(40) && left <= Duration::from_secs(45), "adopted lease: {left:?}");

    // Key order and a per-key limit are one setting: both at once is refused.
    let e = qb.work_group("k").unwrap().ordered_by_key(true).per_key_limit(2).subscribe().await.unwrap_err();
    assert!(matches!(e, Error::InvalidOption(_)), "ordered by key and a per-key limit: {e}");
    // A limit set through one broker is the other's.
    drop(qa.work_group("c").unwrap().concurrency_limit(2).subscribe().await.unwrap());
    let s =
        wait_stats(&b, |s| s.groups.iter().any(|g| g.group == "c" && g.concurrency_limit == Some(2))).await;
    assert!(s.groups.iter().any(|g| g.group == "c"));
    // Refusals changed nothing: no group "k", and the job is still held and acks.
    let s = b.stats().await.unwrap();
    assert!(!s.groups.iter().any(|g| g.group == "k"), "{:?}", s.groups);
    j.ack_durable().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A reset from another broker: refused while a lease `a` holds is live (seen in etcd, not in
/// `b`'s own state), then every claim goes, and `a`'s subscription, still running, starts
/// again at the new offset with attempts counted from 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_by_another_broker_waits_for_live_leases_and_the_running_subscription_follows_it() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "reset", &clock).await;
    let qa = a.queue("q").await.unwrap();
    qa.send_batch(["1", "2", "3"]).await.unwrap();
    let mut ja = qa.work_group("w").unwrap().lease(Duration::from_secs(30)).subscribe().await.unwrap();
    for _ in 0..2 {
        next(&mut ja).await.ack_durable().await.unwrap();
    }
    let held = next(&mut ja).await;
    assert_eq!(held.seq(), 3);
    let b = connect(&cluster, "reset", &clock).await;
    let gb = b.queue("q").await.unwrap().work_group("w").unwrap();
    match gb.reset_to(rockq::ResetTo::Sequence(1)).await {
        Err(Error::Active { group, queue }) => assert_eq!((group.as_str(), queue.as_str()), ("w", "q")),
        other => panic!("a live lease in another broker must refuse the reset, got {other:?}"),
    }
    // Waiting for a retry (its backoff never passes on the manual clock): no lease is live.
    held.fail_durable("not yet").await.unwrap();
    assert_eq!(gb.reset_to(rockq::ResetTo::Sequence(1)).await.unwrap(), 1);
    assert_eq!(committed(&b.stats().await.unwrap(), "w"), 0);
    let mut got = Vec::new();
    for _ in 0..3 {
        let j = next(&mut ja).await;
        got.push((j.seq(), j.attempt()));
        j.ack_durable().await.unwrap();
    }
    assert_eq!(got, [(1, 1), (2, 1), (3, 1)], "replayed in `a`, the retry's attempt forgotten");
    let s = wait_stats(&b, |s| committed(s, "w") == 3).await;
    assert_eq!(committed(&s, "w"), 3);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_is_written_to_etcd_and_the_other_broker_respects_it() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "extend", &clock).await, connect(&cluster, "extend", &clock).await);
    let qa = a.queue("q").await.unwrap();
    qa.send("long").await.unwrap();
    let lease = Duration::from_secs(10);
    let mut ja = qa.work_group("w").unwrap().lease(lease).subscribe().await.unwrap();
    let job = next(&mut ja).await;
    let qb = b.queue("q").await.unwrap();
    let mut jb = qb.work_group("w").unwrap().subscribe().await.unwrap();
    clock.advance(Duration::from_secs(8));
    job.extend(Duration::from_secs(30)).unwrap();
    // Written before anything else `a` asks of the writer: a flush answers after it.
    a.flush().await.unwrap();
    clock.advance(Duration::from_secs(8)); // past the first deadline, inside the extension
    nothing_claimable(&b, &mut jb).await;
    job.ack_durable().await.unwrap();
    let s = wait_stats(&b, |s| committed(s, "w") == 1).await;
    assert_eq!(committed(&s, "w"), 1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The claim keys of work group `w` on queue `q` in namespace `ns`, in key order.
async fn claim_keys(client: &mut etcd_client::Client, ns: &str) -> Vec<Vec<u8>> {
    let prefix = format!("{ns}/c/claim:w:q:");
    let got = client
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("read the claims");
    // (Not the offset's echo, which every move rewrites: `<u64::MAX>o`.)
    let echo = [[0xff; 8].as_slice(), b"o"].concat();
    got.kvs().iter().map(|kv| kv.key().to_vec()).filter(|k| !k.ends_with(&echo)).collect()
}

/// A job's own claim key in namespace `ns`, and the key of a range record ending at `last`.
fn job_key(ns: &str, seq: u64) -> Vec<u8> {
    [format!("{ns}/c/claim:w:q:").as_bytes(), &seq.to_be_bytes()].concat()
}
fn run_key(ns: &str, last: u64) -> Vec<u8> {
    [job_key(ns, last).as_slice(), b"r"].concat()
}

/// A claim of a batch of first attempts is one range record in etcd, not a record per job
/// (etcd's CPU goes per key written: docs/performance.md). A job of the run that leaves the
/// common path — here its lease extended — gets a record of its own, which stands over the
/// run's for every broker: when the run's lease runs out another broker takes every job but
/// that one, and the first broker's outcome of that one lands. The offset's move deletes both
/// kinds of record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_batch_is_one_range_record_and_a_jobs_own_record_stands_over_it() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "runs", &clock).await, connect(&cluster, "runs", &clock).await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
    let lease = Duration::from_secs(30);
    let mut ja = qa.work_group("w").unwrap().lease(lease).read_batch(10).subscribe().await.unwrap();
    let mut held = Vec::new();
    for seq in 1..=10 {
        let job = next(&mut ja).await;
        assert_eq!((job.seq(), job.attempt()), (seq, 1));
        held.push(job);
    }
    let mut client = cluster.client().await;
    assert_eq!(claim_keys(&mut client, "runs").await, vec![run_key("runs", 10)], "one record for the batch");

    held[2].extend(Duration::from_secs(120)).unwrap();
    a.flush().await.unwrap();
    assert_eq!(claim_keys(&mut client, "runs").await, vec![job_key("runs", 3), run_key("runs", 10)]);

    // `b` loads the group with both records; once the run's lease ran out, it takes the rest.
    let qb = b.queue("q").await.unwrap();
    let mut jb = qb.work_group("w").unwrap().read_batch(10).subscribe().await.unwrap();
    nothing_claimable(&b, &mut jb).await;
    let remaining = |s: rockq::JobStatus| match s.state {
        rockq::JobState::Leased { lease_remaining } => lease_remaining,
        other => panic!("job {} is {other:?}, not leased", s.seq),
    };
    assert!(remaining(b.job("q", "w", 3).await.unwrap()) > lease, "b reads 3's own record over the run's");
    assert!(remaining(b.job("q", "w", 4).await.unwrap()) <= lease, "and the run's lease for the others");
    clock.advance(lease + Duration::from_secs(1));
    let mut taken = Vec::new();
    for _ in 0..9 {
        taken.push(next(&mut jb).await);
    }
    let seqs: BTreeSet<u64> = taken.iter().map(|j| j.seq()).collect();
    assert_eq!(seqs, (1..=10).filter(|&s| s != 3).collect::<BTreeSet<u64>>());
    assert!(taken.iter().all(|j| j.attempt() == 2), "the run's attempts counted");
    nothing_claimable(&b, &mut jb).await;

    held.remove(2).ack_durable().await.expect("the extended job is still a's");
    for job in taken {
        job.ack_durable().await.unwrap();
    }
    wait_stats(&a, |s| committed(s, "w") == 10).await;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !claim_keys(&mut client, "runs").await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the offset's move left claim records");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((held, ja, jb));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// An ack that moves the offset past a job of a range record that ends further on deletes no
/// key; the move's echo under the claim prefix tells every other broker's claim watch that the
/// job finished (without it, another broker read the job as leased until the offset passed the
/// whole run or the run's lease ran out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_move_inside_a_range_record_reaches_every_broker() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "echo", &clock).await, connect(&cluster, "echo", &clock).await);
    let qa = a.queue("q").await.unwrap();
    qa.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
    let mut ja = qa.work_group("w").unwrap().read_batch(10).subscribe().await.unwrap();
    let first = next(&mut ja).await;
    assert_eq!(first.seq(), 1);
    let mut client = cluster.client().await;
    assert_eq!(claim_keys(&mut client, "echo").await, vec![run_key("echo", 10)], "one run for the ten");
    let leased = |s: &rockq::JobStatus| matches!(s.state, rockq::JobState::Leased { .. });
    assert!(leased(&b.job("q", "w", 1).await.unwrap()), "b loads a's run");
    first.ack_durable().await.unwrap();
    assert_eq!(claim_keys(&mut client, "echo").await, vec![run_key("echo", 10)], "the move deleted no key");
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let s = b.job("q", "w", 1).await.unwrap();
        if s.state == rockq::JobState::Finished {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "b never learned job 1 finished: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leased(&b.job("q", "w", 2).await.unwrap()), "the run's other jobs stay a's");
    drop(ja);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A pool renews a job's lease as its handler starts only if the job waited in the pool for
/// more than a hundredth of the lease: on etcd each renewal is a write of its own. Another
/// broker reads the deadlines as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_writes_a_lease_renewal_only_for_a_job_that_waited() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "renew", &clock).await, connect(&cluster, "renew", &clock).await);
    let q = a.queue("q").await.unwrap();
    let seqs: Vec<u64> = q.send_batch(["one", "two", "three"]).await.unwrap().collect();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let (tx, mut tasks) = tokio::sync::mpsc::unbounded_channel::<rockq::Task>();
    let go = Arc::new(tokio::sync::Notify::new());
    let handler = common::handing_over(tx, go.clone());
    // The deadline of `seq`'s lease as stored in etcd, once it is claimed.
    let stored = |seq: u64| {
        let b = b.clone();
        async move {
            let deadline = tokio::time::Instant::now() + HANG_GUARD;
            loop {
                let pending = b.pending("q", "w").await.unwrap();
                if let Some(d) = pending.iter().find(|p| p.seq == seq).and_then(|p| p.lease_deadline) {
                    return d;
                }
                assert!(tokio::time::Instant::now() < deadline, "job {seq} was never claimed: {pending:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // One handler and a prefetch of one: each next job is claimed while the one before runs.
    let token = rockq::CancellationToken::new();
    let run = tokio::spawn(group.workers(1).prefetch(1).shutdown_on(token.clone()).run(handler));
    assert_eq!(started(&mut tasks).await.seq(), seqs[0]);
    let claimed = stored(seqs[1]).await;
    // Handed out 50 ms after its claim: a two-hundredth of its lease gone, not renewed.
    clock.advance(Duration::from_millis(50));
    go.notify_one();
    assert_eq!(started(&mut tasks).await.seq(), seqs[1]);
    // A renewal asked for as the handler started would be written before the flush answers.
    a.flush().await.unwrap();
    assert_eq!(stored(seqs[1]).await, claimed, "a renewal was written for a job handed out at once");
    let claimed = stored(seqs[2]).await;
    // Handed out 6 s after its claim: renewed to a whole lease, and written for others to see.
    clock.advance(Duration::from_secs(6));
    go.notify_one();
    assert_eq!(started(&mut tasks).await.seq(), seqs[2]);
    a.flush().await.unwrap();
    assert_eq!(stored(seqs[2]).await, claimed + Duration::from_secs(6));
    go.notify_one();
    wait_stats(&b, |s| committed(s, "w") == seqs[2]).await;
    token.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.acked, report.unsettled), (3, 0));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// `pending`, `peek` and `stats` read what every broker left in etcd: another broker's lease
/// and retry, its dead letter, the group's settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_peek_and_stats_show_every_brokers_claims() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "inspect", &clock).await, connect(&cluster, "inspect", &clock).await);
    let qa = a.queue("q").await.unwrap();
    for i in 1..=3 {
        qa.send(format!("m{i}")).await.unwrap();
    }
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .jitter(0.0);
    let lease = Duration::from_secs(30);
    let mut ja = qa
        .work_group("w")
        .unwrap()
        .lease(lease)
        .retry_policy(policy)
        .read_batch(1)
        .max_in_flight(2)
        .subscribe()
        .await
        .unwrap();
    let one = next(&mut ja).await;
    let two = next(&mut ja).await;
    assert_eq!((one.seq(), two.seq()), (1, 2));
    two.fail_durable("flaky").await.unwrap();

    let pending = b.pending("q", "w").await.unwrap();
    let seen: Vec<_> = pending.iter().map(|p| (p.seq, p.state, p.attempt)).collect();
    assert_eq!(seen, [(1, rockq::PendingState::Leased, 1), (2, rockq::PendingState::Waiting, 1)]);
    assert!(pending[0].holder.is_some(), "the holder is named");
    assert_eq!(pending[1].last_error.as_deref(), Some("flaky"));
    let peeked = b.peek("q", Some(2), 5).await.unwrap();
    assert_eq!(
        peeked.iter().map(|m| (m.seq, m.payload.to_vec())).collect::<Vec<_>>(),
        [(2, b"m2".to_vec()), (3, b"m3".to_vec())]
    );
    let s = b.stats().await.unwrap();
    let g = s.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!((g.committed, g.in_flight, g.waiting_retry, g.lag), (0, 1, 1, 3));
    assert_eq!((g.lease, g.dead_letter_queue.as_deref(), g.dlq_depth), (Some(lease), Some("q.dlq"), 0));

    // The lease runs out (expired, still pending); the retry's second attempt is dead-lettered;
    // the first is acked after the claim moved: only etcd's records count.
    one.ack_durable().await.unwrap();
    clock.advance(Duration::from_secs(11));
    let again = next(&mut ja).await;
    assert_eq!((again.seq(), again.attempt()), (2, 2));
    again.fail_durable("still flaky").await.unwrap();
    let s = wait_stats(&b, |s| s.groups.iter().any(|g| g.group == "w" && g.dlq_depth == 1)).await;
    let g = s.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!((g.committed, g.in_flight, g.waiting_retry, g.lag), (2, 0, 0, 1));
    assert!(b.pending("q", "w").await.unwrap().is_empty());
    match b.pending("q", "nope").await {
        Err(rockq::Error::NoSuchGroup { .. }) => {}
        other => panic!("expected NoSuchGroup, got {other:?}"),
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Two rockq processes on one namespace (the test binary runs itself again as the helper).

/// One rockq process of the two-process tests, run through `common::spawn_helper`. Connects to
/// `ROCKQ_ETCD_NS` and prints `@ready`, then:
/// - `ROCKQ_ETCD_MODE=work`: once told `go` on stdin, sends `ROCKQ_ETCD_SENDS` messages
///   (`@sent <seq> <payload>` for each that resolved `Ok`, then `@produced`) while a pool of
///   four workers on group `w` prints `@got <seq> <attempt> <payload>` for every job it
///   handles; told `stop`, it shuts the pool and the broker down and prints `@done`.
/// - `ROCKQ_ETCD_MODE=hold`: takes five jobs of group `w` (lease `ROCKQ_ETCD_LEASE_MS`), prints
///   `@held <seq> <attempt>` for each and keeps them, never settling: the parent SIGKILLs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of the two-process work-group tests"]
async fn work_helper_process() {
    use std::io::{BufRead, Write};
    let Ok(endpoints) = std::env::var("ROCKQ_ETCD_ENDPOINTS") else { return };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let (ns, name, mode) = (var("ROCKQ_ETCD_NS"), var("ROCKQ_ETCD_NAME"), var("ROCKQ_ETCD_MODE"));
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let opts = EtcdOptions::new().request_timeout(Duration::from_secs(20));
    let broker = Broker::connect_etcd(endpoints, &ns, opts).await.expect("connect");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = {
        let out = out.clone();
        move |line: String| {
            let mut o = out.lock().unwrap();
            writeln!(o, "{line}").expect("stdout");
            o.flush().expect("stdout");
        }
    };
    let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if cmd_tx.send(line.trim().to_owned()).is_err() {
                return;
            }
        }
    });
    let q = broker.queue("q").await.expect("queue");
    if mode == "hold" {
        let lease = Duration::from_millis(var("ROCKQ_ETCD_LEASE_MS").parse().expect("ms"));
        let group = q.work_group("w").expect("group").lease(lease).read_batch(1).max_in_flight(5);
        let mut jobs = group.subscribe().await.expect("subscribe");
        say("@ready".into());
        let mut held = Vec::new();
        for _ in 0..5 {
            let j = next(&mut jobs).await;
            say(format!("@held {} {}", j.seq(), j.attempt()));
            held.push(j);
        }
        // Kept until the parent kills this process.
        futures::future::pending::<()>().await;
        return;
    }
    if mode == "fire" {
        // Nothing but the broker's timer, firing the namespace's schedules until killed.
        say("@ready".into());
        futures::future::pending::<()>().await;
        return;
    }
    say("@ready".into());
    while cmd_rx.recv().await.as_deref() != Some("go") {}
    let sends: u64 = var("ROCKQ_ETCD_SENDS").parse().expect("number");
    let producing = {
        let (q, say, name) = (q.clone(), say.clone(), name.clone());
        tokio::spawn(async move {
            for i in 0..sends {
                let payload = format!("{name}-{i}");
                match q.send(payload.clone()).await {
                    Ok(seq) => say(format!("@sent {seq} {payload}")),
                    Err(e) => eprintln!("{payload} failed: {e}"),
                }
            }
            say("@produced".into());
        })
    };
    let handler_say = say.clone();
    let pool = q.work_group("w").expect("group").lease(Duration::from_secs(30)).workers(4).spawn(
        move |task: rockq::Task| {
            let say = handler_say.clone();
            async move {
                say(format!(
                    "@got {} {} {}",
                    task.seq(),
                    task.attempt(),
                    String::from_utf8_lossy(task.payload())
                ));
                Ok(())
            }
        },
    );
    while cmd_rx.recv().await.as_deref() != Some("stop") {}
    producing.await.expect("producer");
    pool.shutdown().await.expect("pool shutdown");
    broker.shutdown().await.expect("shutdown");
    say("@done".into());
}

/// A child's stdout, line by line, into a shared log.
fn collect(child: &mut std::process::Child) -> (Arc<Mutex<Vec<String>>>, std::thread::JoinHandle<()>) {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let into = log.clone();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            into.lock().unwrap().push(line);
        }
    });
    (log, reader)
}

/// The words after `marker` on each line that has it (the test harness may print its own
/// text before the helper's first line, so the marker is looked for anywhere in the line).
fn lines(log: &Mutex<Vec<String>>, marker: &str) -> Vec<Vec<String>> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|l| l.find(marker).map(|i| l[i + marker.len()..].split(' ').map(str::to_owned).collect()))
        .collect()
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD * 2;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn helper(endpoints: &str, vars: &[(&str, &str)]) -> std::process::Child {
    let mut env = vec![("ROCKQ_ETCD_ENDPOINTS", endpoints)];
    env.extend_from_slice(vars);
    common::spawn_helper("work_helper_process", &env)
}

fn tell(child: &mut std::process::Child, line: &str) {
    use std::io::Write;
    let stdin = child.stdin.as_mut().expect("stdin");
    writeln!(stdin, "{line}").expect("write to helper");
    stdin.flush().expect("flush helper stdin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_produce_and_consume_one_work_group_and_each_message_is_processed_once() {
    let cluster = etcd::Cluster::start(1).await;
    let endpoints = cluster.endpoints().join(",");
    const EACH: u64 = 300;
    let each = EACH.to_string();
    let mut children = Vec::new();
    for name in ["a", "b"] {
        let vars = [
            ("ROCKQ_ETCD_NS", "procs"),
            ("ROCKQ_ETCD_NAME", name),
            ("ROCKQ_ETCD_MODE", "work"),
            ("ROCKQ_ETCD_SENDS", each.as_str()),
        ];
        let mut child = helper(&endpoints, &vars);
        let (log, reader) = collect(&mut child);
        children.push((name, child, log, reader));
    }
    for (name, _, log, _) in &children {
        wait_until(&format!("{name} ready"), || !lines(log, "@ready").is_empty()).await;
    }
    for (_, child, _, _) in &mut children {
        tell(child, "go");
    }
    let total = 2 * EACH;
    let got_all =
        || children.iter().map(|(_, _, log, _)| lines(log, "@got ").len()).sum::<usize>() >= total as usize;
    let produced = || children.iter().all(|(_, _, log, _)| !lines(log, "@produced").is_empty());
    wait_until("every message handled", || produced() && got_all()).await;
    // The offset, as etcd holds it, passes everything.
    let clock = ManualClock::new();
    let observer = connect(&cluster, "procs", &clock).await;
    let s = wait_stats(&observer, |s| committed(s, "w") == total).await;
    assert_eq!(committed(&s, "w"), total);
    observer.shutdown().await.unwrap();
    for (name, child, _, _) in &mut children {
        tell(child, "stop");
        let status = child.wait().expect("helper exits");
        assert!(status.success(), "{name} failed");
    }
    let mut sent = BTreeSet::new();
    let mut processed: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for (name, _, log, reader) in children {
        reader.join().expect("helper output");
        assert!(!lines(&log, "@done").is_empty(), "{name} shut down cleanly");
        for w in lines(&log, "@sent ") {
            assert!(sent.insert(w[0].parse::<u64>().unwrap()), "sequence {} handed out twice", w[0]);
        }
        let mine = lines(&log, "@got ");
        eprintln!("{name} processed {}", mine.len());
        assert!(!mine.is_empty(), "{name} took part in consuming");
        for w in mine {
            assert_eq!(w[1], "1", "a clean run has no second attempt: {w:?}");
            processed.entry(w[0].parse().unwrap()).or_default().push((name.to_owned(), w[2].clone()));
        }
    }
    assert_eq!(sent, (1..=total).collect::<BTreeSet<_>>(), "dense sequences from both producers");
    assert_eq!(processed.keys().copied().collect::<BTreeSet<_>>(), sent, "every message processed");
    let twice: Vec<_> = processed.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "processed more than once (held by two) in a clean run: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_process_s_leased_jobs_go_to_the_other_process_once_their_leases_run_out() {
    let cluster = etcd::Cluster::start(1).await;
    let endpoints = cluster.endpoints().join(",");
    // This process is the survivor; its clock is the wall clock, as the helper's is.
    let broker = Broker::connect_etcd(cluster.endpoints(), "kill", EtcdOptions::new()).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    for i in 0..20 {
        q.send(format!("m{i}")).await.unwrap();
    }
    let vars = [
        ("ROCKQ_ETCD_NS", "kill"),
        ("ROCKQ_ETCD_NAME", "holder"),
        ("ROCKQ_ETCD_MODE", "hold"),
        ("ROCKQ_ETCD_LEASE_MS", "8000"),
    ];
    let mut holder = helper(&endpoints, &vars);
    let (log, reader) = collect(&mut holder);
    wait_until("five jobs held", || lines(&log, "@held ").len() == 5).await;
    let held: BTreeSet<u64> = lines(&log, "@held ").iter().map(|w| w[0].parse().unwrap()).collect();
    assert!(lines(&log, "@held ").iter().all(|w| w[1] == "1"));

    // While the holder lives, this process gets every other message, none of the held ones.
    let mut jobs = q.work_group("w").unwrap().subscribe().await.unwrap();
    let mut before = BTreeSet::new();
    for _ in 0..15 {
        let j = next(&mut jobs).await;
        assert_eq!(j.attempt(), 1);
        assert!(!held.contains(&j.seq()), "seq {} is leased to the other process", j.seq());
        before.insert(j.seq());
        j.ack_durable().await.unwrap();
    }
    // SIGKILL the holder: its leases stay in etcd until they run out, then its jobs come here,
    // each once, with the attempt the dead process used counted.
    holder.kill().expect("kill the holder");
    holder.wait().expect("reap the holder");
    reader.join().expect("holder output");
    let mut after = BTreeSet::new();
    for _ in 0..5 {
        let j = next(&mut jobs).await;
        assert_eq!(j.attempt(), 2, "seq {}: the killed holder's attempt is counted", j.seq());
        assert!(after.insert(j.seq()), "seq {} handed out twice", j.seq());
        j.ack_durable().await.unwrap();
    }
    assert_eq!(after, held, "exactly the killed process's jobs came back");
    assert_eq!(before.union(&after).copied().collect::<BTreeSet<_>>(), (1..=20).collect());
    let s = wait_stats(&broker, |s| committed(s, "w") == 20).await;
    assert_eq!(committed(&s, "w"), 20);
    broker.shutdown().await.unwrap();
}

/// Where a job stands and waiting for it, across processes: one broker's lookup sees another's
/// lease (with its holder) and its ack; a wait in one broker ends when the other acks the job,
/// or when the other trims it away before anyone claimed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_looked_up_and_waited_for_in_one_broker_follows_what_another_does() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "status", &clock).await;
    let b = connect(&cluster, "status", &clock).await;
    let q = a.queue("jobs").await.unwrap();
    q.send_batch(["j1", "j2", "j3"]).await.unwrap();
    let group = |broker: &Broker| {
        let broker = broker.clone();
        async move {
            let q = broker.queue("jobs").await.unwrap();
            q.work_group("workers").unwrap().consumer_name("host-a").read_batch(1).max_in_flight(1)
        }
    };
    let mut sub_a = group(&a).await.subscribe().await.unwrap();
    let sub_b = group(&b).await.subscribe().await.unwrap(); // loads the group in b
    let job = next(&mut sub_a).await;
    assert_eq!(job.seq(), 1);
    a.flush().await.unwrap();
    // b sees a's lease once its record is watched.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let seen = loop {
        let s = b.job("jobs", "workers", 1).await.unwrap();
        if matches!(s.state, rockq::JobState::Leased { .. }) && s.holder.is_some() {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "b never saw a's lease: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((seen.attempt, seen.holder.as_deref()), (1, Some("host-a")));

    // A wait in b ends when a acks.
    let wait = tokio::spawn({
        let b = b.clone();
        async move { b.wait_job("jobs", "workers", 1).await }
    });
    job.ack_durable().await.unwrap();
    let done =
        tokio::time::timeout(HANG_GUARD, wait).await.expect("b's wait was not woken").unwrap().unwrap();
    assert_eq!(done.state, rockq::JobState::Finished);

    // A wait in b on a job nobody claimed ends when a's retention deletes it.
    drop(sub_a);
    let wait = tokio::spawn({
        let b = b.clone();
        async move { b.wait_job("jobs", "workers", 2).await }
    });
    q.set_retention(rockq::Retention::MaxLen(1)).await.unwrap();
    assert_eq!(a.trim().await.unwrap().deleted, 2);
    let gone =
        tokio::time::timeout(HANG_GUARD, wait).await.expect("b's wait was not woken").unwrap().unwrap();
    assert_eq!(gone.state, rockq::JobState::Removed);
    drop(sub_b);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Dead letters settled on their own (`DeadLetters::delete`, `redrive_one`) from one broker are
/// settled for every broker: listings, counts and `dlq_depth` agree; two brokers settling the
/// same letter at once settle it once (the other is told it is gone); the cursor moves over
/// settled letters once the next one is settled; a later redrive moves only what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_settled_on_one_broker_are_settled_for_every_broker() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "letters", &clock).await;
    let b = connect(&cluster, "letters", &clock).await;
    let jobs = a.queue("jobs").await.unwrap();
    jobs.send_batch((1..=6).map(|i| format!("job {i}"))).await.unwrap();
    let mut ja = jobs.work_group("w").unwrap().read_batch(6).max_in_flight(6).subscribe().await.unwrap();
    for _ in 0..6 {
        next(&mut ja).await.dead_letter_durable("poison").await.unwrap();
    }
    let (da, db) = (a.dead_letters("jobs.dlq").await.unwrap(), b.dead_letters("jobs.dlq").await.unwrap());
    let seqs = |ls: Vec<rockq::DeadLetter>| ls.iter().map(|d| d.dlq_seq).collect::<Vec<_>>();
    let depth = |s: &rockq::Stats| s.groups.iter().find(|g| g.group == "w").unwrap().dlq_depth;
    assert_eq!(db.len().await.unwrap(), 6);

    db.delete(3).await.unwrap();
    let (queue, seq) = da.redrive_one(4, None).await.unwrap();
    assert_eq!((queue.as_str(), seq), ("jobs", 7), "appended to its origin queue");
    for d in [&da, &db] {
        assert_eq!(seqs(d.list(10).await.unwrap()), [1, 2, 5, 6]);
        assert_eq!(d.len().await.unwrap(), 4);
    }
    assert_eq!(depth(&a.stats().await.unwrap()), 4);
    assert_eq!(depth(&b.stats().await.unwrap()), 4);
    // The copy is a job like any other, in either broker.
    let j = next(&mut ja).await;
    assert_eq!((j.seq(), &j.payload()[..]), (7, &b"job 4"[..]));
    j.ack_durable().await.unwrap();

    // Both settle letter 5 at once: one does, the other finds it gone.
    b.queue("quarantine").await.unwrap();
    let (x, y) = tokio::join!(da.delete(5), db.redrive_one(5, Some("quarantine")));
    match (&x, &y) {
        (Ok(()), Err(Error::NoSuchLetter { seq: 5, .. })) => {
            assert_eq!(b.queue("quarantine").await.unwrap().last_seq(), 0, "not redriven as well");
        }
        (Err(Error::NoSuchLetter { seq: 5, .. }), Ok((q, 1))) if q == "quarantine" => {}
        other => panic!("exactly one settle of letter 5, got {other:?}"),
    }
    for d in [&da, &db] {
        assert_eq!(seqs(d.list(10).await.unwrap()), [1, 2, 6]);
        for s in [3, 4, 5] {
            assert!(matches!(d.delete(s).await.unwrap_err(), Error::NoSuchLetter { .. }), "letter {s}");
        }
    }

    // Settling 2 marks it; settling 1 (the next) moves the cursor over 1..=5.
    da.delete(2).await.unwrap();
    db.delete(1).await.unwrap();
    assert_eq!(seqs(da.list(10).await.unwrap()), [6]);
    assert_eq!(depth(&b.stats().await.unwrap()), 1);
    // A redrive from the other broker moves 6 alone, then finds nothing.
    assert_eq!(da.redrive(rockq::Redrive::new().to("quarantine")).await.unwrap(), 1);
    let last = a.queue("quarantine").await.unwrap();
    let q: Vec<_> = a.peek("quarantine", None, 10).await.unwrap().into_iter().map(|m| m.payload).collect();
    assert_eq!(q.last().map(|p| &p[..]), Some(&b"job 6"[..]), "{q:?} (last {})", last.last_seq());
    assert_eq!(db.redrive(rockq::Redrive::new()).await.unwrap(), 0);
    assert!(db.is_empty().await.unwrap());
    assert_eq!(depth(&a.stats().await.unwrap()), 0);
    drop(ja);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Kept job outcomes (`WorkGroup::keep_outcomes`) on etcd: an outcome and its result written by
/// one broker's ack (queued or durable) or dead letter are what another broker's lookup and
/// wait return; a reset back from either broker drops the outcomes of the jobs that run again;
/// any broker's retention pass expires them on the brokers' clock once the group's retention
/// has passed; the setting is the group's, as stored in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_kept_by_one_broker_are_read_waited_for_reset_and_expired_by_another() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "outcomes", &clock).await;
    // b starts before the group exists: its lookups, waits and job actions load the group
    // from etcd when first asked.
    let b = connect(&cluster, "outcomes", &clock).await;
    let keep = Duration::from_secs(3600);
    let jobs = a.queue("jobs").await.unwrap();
    jobs.set_retention(rockq::Retention::Forever).await.unwrap();
    jobs.send_batch(["j1", "j2", "j3", "j4"]).await.unwrap();
    let policy = RetryPolicy::default().max_attempts(1);
    let wg =
        jobs.work_group("w").unwrap().keep_outcomes(keep).retry_policy(policy).read_batch(1).max_in_flight(1);
    let mut ja = wg.subscribe().await.unwrap();
    // b waits for job 1 before it is finished.
    let wait = tokio::spawn({
        let b = b.clone();
        async move { b.wait_job("jobs", "w", 1).await }
    });
    let j = next(&mut ja).await;
    j.set_result("sent to 3 recipients").unwrap();
    j.ack_durable().await.unwrap();
    let done = tokio::time::timeout(HANG_GUARD, wait).await.expect("b's wait was woken").unwrap().unwrap();
    assert_eq!(done.state, rockq::JobState::Finished);
    let o = done.outcome.expect("the outcome a kept");
    assert_eq!((o.kind.as_str(), o.attempt), ("acked", 1));
    assert_eq!(o.result.as_deref(), Some(&b"sent to 3 recipients"[..]));
    // A queued ack (written by a's next round), and a handler's dead letter.
    let j = next(&mut ja).await;
    j.set_result("queued").unwrap();
    j.ack().unwrap();
    a.flush().await.unwrap();
    next(&mut ja).await.dead_letter_durable("malformed").await.unwrap();
    drop(ja);
    let o = finished(&b, 2).await.outcome.expect("job 2's outcome");
    assert_eq!(o.result.as_deref(), Some(&b"queued"[..]));
    let o = finished(&b, 3).await.outcome.expect("job 3's outcome");
    match &o.kind {
        rockq::OutcomeKind::DeadLettered { reason, dead_letter_queue, dead_letter_seq } => {
            assert_eq!(
                (reason.as_str(), dead_letter_queue.as_str(), *dead_letter_seq),
                ("malformed", "jobs.dlq", 1)
            );
        }
        other => panic!("job 3 was dead-lettered, not {other:?}"),
    }
    let stats = b.stats().await.unwrap();
    assert_eq!(stats.groups.iter().find(|g| g.group == "w").unwrap().keep_outcomes, Some(keep));
    // An operator on b deletes job 4 (never claimed): kept as deleted, read by a.
    b.delete_job("jobs", "w", 4).await.unwrap();
    let o = finished(&a, 4).await.outcome.expect("job 4's outcome");
    assert_eq!((o.kind.as_str(), o.attempt), ("deleted", 0));

    // b resets the group back to job 2: 2, 3 and 4 run again, their outcomes go; 1's stays.
    b.reset_group("jobs", "w", rockq::ResetTo::Sequence(2)).await.unwrap();
    for seq in [2, 3, 4] {
        let s = b.job("jobs", "w", seq).await.unwrap();
        assert_eq!((s.state, s.outcome), (rockq::JobState::Queued, None), "job {seq}");
    }
    // a follows once its claim watch brings the reset.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    for seq in [2, 3, 4] {
        loop {
            let s = a.job("jobs", "w", seq).await.unwrap();
            if s.state == rockq::JobState::Queued {
                assert_eq!(s.outcome, None, "job {seq}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "a never saw the reset of job {seq}: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(a.job("jobs", "w", 1).await.unwrap().outcome.is_some());

    // An hour later on the brokers' clock, b's pass expires job 1's outcome (the only one).
    clock.advance(keep - Duration::from_secs(1));
    assert_eq!(b.trim().await.unwrap().outcomes_expired, 0, "one second short");
    clock.advance(Duration::from_secs(1));
    assert_eq!(b.trim().await.unwrap().outcomes_expired, 1);
    let s = a.job("jobs", "w", 1).await.unwrap();
    assert_eq!((s.state, s.outcome), (rockq::JobState::Finished, None));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Progress reports (`Task::progress`) on etcd: a holder's report is written by its broker's
/// next round, fenced by its claim, and read by another broker's lookup; the next attempt, in
/// another broker, reads it back; the ack that finishes the job deletes it, also above an
/// unfinished job, where the offset does not pass it (none is left in the namespace's export).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_report_is_seen_by_other_brokers_and_read_back_by_the_next_attempt_elsewhere() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let a = connect(&cluster, "progress", &clock).await;
    let b = connect(&cluster, "progress", &clock).await;
    let lease = Duration::from_secs(30);
    let jobs = a.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2"]).await.unwrap();
    let group = |broker: &Broker| {
        let broker = broker.clone();
        async move {
            let q = broker.queue("jobs").await.unwrap();
            q.work_group("w").unwrap().lease(lease).read_batch(2).max_in_flight(2)
        }
    };
    let mut ja = group(&a).await.subscribe().await.unwrap();
    let (one, two) = (next(&mut ja).await, next(&mut ja).await);
    assert_eq!((two.seq(), two.attempt(), two.last_progress()), (2, 1, None));
    two.progress("step 1 of 3").unwrap();
    two.progress("step 2 of 3").unwrap(); // coalesced: the last one is written
    a.flush().await.unwrap();
    let seen = b.job("jobs", "w", 2).await.unwrap();
    assert_eq!(seen.progress.as_deref(), Some(&b"step 2 of 3"[..]), "b reads a's report from etcd");

    // a stalls: its leases run out, and b's attempt reads the report back.
    drop(ja);
    clock.advance(lease + Duration::from_secs(1));
    let e = two.progress("too late").unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e}");
    drop(one);
    let mut jb = group(&b).await.subscribe().await.unwrap();
    let (first, again) = (next(&mut jb).await, next(&mut jb).await);
    assert_eq!((first.seq(), again.seq(), again.attempt()), (1, 2, 2));
    assert_eq!(again.last_progress().as_deref(), Some(&b"step 2 of 3"[..]));
    again.progress("step 3 of 3").unwrap();
    b.flush().await.unwrap();
    assert_eq!(a.job("jobs", "w", 2).await.unwrap().progress.as_deref(), Some(&b"step 3 of 3"[..]));
    // Job 2 finishes while job 1 is still held: the offset stays below it.
    again.ack_durable().await.unwrap();
    assert_eq!(finished(&a, 2).await.progress, None);
    // The record went with the ack.
    let dir = common::tempdir();
    let file = dir.path().join("ns.jsonl");
    a.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(r#""t":"progress""#), "a progress record was left: {text}");
    first.ack_durable().await.unwrap();
    drop(jb);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A recurring schedule fires each occurrence once while the processes firing it are SIGKILLed
/// at random moments, mid-firing among them: two processes race for every occurrence, both die,
/// two more start; at the end every message its firings appended is counted once in its record
/// (`fired`), and the record names the last of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_each_occurrence_once_while_its_firing_processes_are_killed() {
    let cluster = etcd::Cluster::start(1).await;
    let endpoints = cluster.endpoints().join(",");
    let broker = Broker::connect_etcd(cluster.endpoints(), "tick-kill", EtcdOptions::new()).await.unwrap();
    broker.schedule("tick", Duration::from_millis(20), "ticks", "t").await.unwrap();
    broker.shutdown().await.unwrap();
    let mut rng = common::Rng::from_clock();
    let vars = [("ROCKQ_ETCD_NS", "tick-kill"), ("ROCKQ_ETCD_NAME", "firer"), ("ROCKQ_ETCD_MODE", "fire")];
    for _ in 0..6 {
        let (mut a, mut b) = (helper(&endpoints, &vars), helper(&endpoints, &vars));
        let ((la, ra), (lb, rb)) = (collect(&mut a), collect(&mut b));
        wait_until("both firing processes up", || {
            !lines(&la, "@ready").is_empty() && !lines(&lb, "@ready").is_empty()
        })
        .await;
        // Kill moments, not synchronisation: whatever they hit, the counts below must agree.
        for child in [&mut a, &mut b] {
            tokio::time::sleep(Duration::from_millis(rng.next(250))).await;
            child.kill().expect("kill");
            child.wait().expect("reap");
        }
        ra.join().expect("output");
        rb.join().expect("output");
    }
    let broker = Broker::connect_etcd(cluster.endpoints(), "tick-kill", EtcdOptions::new()).await.unwrap();
    broker.pause_schedule("tick").await.unwrap();
    let s = broker.schedules().await.unwrap().remove(0);
    let stats = broker.stats().await.unwrap();
    let ticks = stats.queues.iter().find(|q| q.name == "ticks").expect("the schedule fired");
    assert!(s.fired > 0);
    assert_eq!(ticks.last_seq, s.fired, "each firing's message appended once, none lost");
    assert_eq!(s.last.map(|(_, seq)| seq), Some(ticks.last_seq));
    broker.shutdown().await.unwrap();
}
