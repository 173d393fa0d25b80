//! The etcd engine keeps serving through a member's fault (issue 37; feature `etcd`,
//! `scripts/etcd-tests.sh`). A real three-member cluster on loopback, two brokers sharing a
//! namespace under a steady load (producers in both, a worker pool in both, an ordered group
//! in one), and one fault at a time:
//!
//! - a follower SIGSTOPped for 30 s: no kind of progress (sends resolved, jobs acknowledged,
//!   ordered deliveries) stops for more than a second;
//! - the leader SIGKILLed: progress stops no longer than the election plus a second;
//! - one of three endpoints dead: connecting succeeds 100 times in 100;
//! - every member SIGSTOPped for 10 s with a 5 s request timeout: pools and subscriptions do
//!   not end, nothing acknowledged is lost, nothing is dead-lettered or run twice (two
//!   attempts), sends fail at the request timeout, and the outage is reported as events.
//!
//! The first two run with leases of 2 s and two attempts (the setting): a stall longer
//! than a lease would run jobs out of their leases and into the dead-letter queue.
//!
//! Each run prints the longest stall it measured (the README's fault table quotes them).

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rockq::{Broker, CancellationToken, Error, EtcdOptions, Event, PoolHandle, RetryPolicy};

const NS: &str = "avail";
/// Work-group leases: short, as in the runs, so that a stall longer than this would
/// run jobs out of leases (and, at two attempts, into the dead-letter queue).
const LEASE: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sent,
    Acked,
    Ordered,
}

/// What a load run saw.
#[derive(Default)]
struct Seen {
    /// When each kind of progress happened.
    progress: Mutex<Vec<(Instant, Kind)>>,
    /// Sends that resolved `Ok`: (sequence, payload).
    ok: Mutex<Vec<(u64, String)>>,
    /// Sequences acknowledged by either work-group pool (from `Event::Acked`).
    acked: Mutex<BTreeSet<u64>>,
    /// Sequences the ordered group delivered.
    ordered: Mutex<BTreeSet<u64>>,
    /// The attempts each handled sequence ran at.
    attempts: Mutex<BTreeMap<u64, Vec<u32>>>,
    /// `Event::StoreUnavailable` seen.
    unavailable: AtomicU64,
    /// Send errors (during an outage, expected).
    send_errors: AtomicU64,
    /// How long the slowest failed send took to fail.
    slowest_failure: Mutex<Duration>,
    /// Anything a subscription or pool ended with.
    ended: Mutex<Vec<String>>,
}

impl Seen {
    fn note(&self, kind: Kind) {
        self.progress.lock().unwrap().push((Instant::now(), kind));
    }

    /// The longest time in `from..to` with no progress of `kind`.
    fn longest_gap(&self, kind: Kind, from: Instant, to: Instant) -> Duration {
        let mut at: Vec<Instant> = self
            .progress
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, k)| *k == kind && *t >= from && *t <= to)
            .map(|(t, _)| *t)
            .collect();
        at.sort();
        let mut last = from;
        let mut gap = Duration::ZERO;
        for t in at.into_iter().chain([to]) {
            gap = gap.max(t - last);
            last = t;
        }
        gap
    }
}

/// Two brokers under load, until `stop`.
struct Load {
    brokers: Vec<Broker>,
    seen: Arc<Seen>,
    stop: CancellationToken,
    producers: Vec<tokio::task::JoinHandle<()>>,
    pools: Vec<PoolHandle>,
    others: Vec<tokio::task::JoinHandle<()>>,
}

fn options(request_timeout: Duration) -> EtcdOptions {
    EtcdOptions::new().request_timeout(request_timeout).owner_ttl(Duration::from_secs(20))
}

impl Load {
    /// Starts two brokers on `endpoints` (in that order: the first is asked first), each with
    /// two producers (one send per 5 ms each) and a worker pool on work group `w` (lease
    /// `lease`, two attempts); the first also reads ordered group `o`.
    async fn start(endpoints: &[String], request_timeout: Duration, lease: Duration) -> Load {
        let seen = Arc::new(Seen::default());
        let stop = CancellationToken::new();
        let mut load = Load {
            brokers: Vec::new(),
            seen: seen.clone(),
            stop,
            producers: Vec::new(),
            pools: Vec::new(),
            others: Vec::new(),
        };
        for b in 0..2 {
            let broker = Broker::connect_etcd(endpoints.to_vec(), NS, options(request_timeout))
                .await
                .expect("connect");
            let q = broker.queue("q").await.expect("queue");
            // Events first: every ack and outage is seen.
            let mut events = broker.events();
            let s = seen.clone();
            load.others.push(tokio::spawn(async move {
                loop {
                    match events.recv().await {
                        Ok(Event::Acked { seq, .. }) => {
                            s.acked.lock().unwrap().insert(seq);
                            s.note(Kind::Acked);
                        }
                        Ok(Event::StoreUnavailable { .. }) => {
                            s.unavailable.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            panic!("the test's event receiver fell {n} behind")
                        }
                        Err(_) => return,
                    }
                }
            }));
            for p in 0..2 {
                let (q, s, stop) = (q.clone(), seen.clone(), load.stop.clone());
                load.producers.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(5));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    let mut i = 0u64;
                    while !stop.is_cancelled() {
                        tick.tick().await;
                        let payload = format!("b{b}-p{p}-{i}");
                        i += 1;
                        let started = Instant::now();
                        match q.send(payload.clone()).await {
                            Ok(seq) => {
                                s.ok.lock().unwrap().push((seq, payload));
                                s.note(Kind::Sent);
                            }
                            Err(_) => {
                                s.send_errors.fetch_add(1, Ordering::Relaxed);
                                let mut slowest = s.slowest_failure.lock().unwrap();
                                *slowest = (*slowest).max(started.elapsed());
                            }
                        }
                    }
                }));
            }
            let policy = RetryPolicy::default().max_attempts(2);
            let group = q.work_group("w").expect("group").lease(lease).retry_policy(policy);
            let s = seen.clone();
            load.pools.push(group.workers(4).spawn(move |task: rockq::Task| {
                let s = s.clone();
                async move {
                    s.attempts.lock().unwrap().entry(task.seq()).or_default().push(task.attempt());
                    Ok(())
                }
            }));
            if b == 0 {
                // Reads until aborted (after the drain): the last sends are delivered too.
                let (group, s) = (q.group("o").expect("group"), seen.clone());
                load.others.push(tokio::spawn(async move {
                    let mut sub = group.subscribe().await.expect("subscribe");
                    loop {
                        match sub.next().await {
                            Some(Ok(d)) => {
                                s.ordered.lock().unwrap().insert(d.seq());
                                s.note(Kind::Ordered);
                                d.ack().expect("ack");
                            }
                            Some(Err(e)) => {
                                s.ended.lock().unwrap().push(format!("ordered subscription: {e}"));
                                return;
                            }
                            None => {
                                s.ended.lock().unwrap().push("ordered subscription ended".into());
                                return;
                            }
                        }
                    }
                }));
            }
            load.brokers.push(broker);
        }
        load
    }

    /// Stops the producers, waits until every `Ok` send was acknowledged by a pool and
    /// delivered to the ordered group, checks nothing ended and nothing was dead-lettered,
    /// then stops everything.
    async fn drain_and_check(self) {
        self.stop.cancel();
        for p in self.producers {
            p.await.expect("producer");
        }
        let ok: Vec<(u64, String)> = self.seen.ok.lock().unwrap().clone();
        let want: BTreeSet<u64> = ok.iter().map(|(s, _)| *s).collect();
        assert_eq!(want.len(), ok.len(), "a sequence was handed out twice");
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let acked = self.seen.acked.lock().unwrap().clone();
            let ordered = self.seen.ordered.lock().unwrap().clone();
            let missing_acks = want.difference(&acked).count();
            let missing_ordered = want.difference(&ordered).count();
            if missing_acks == 0 && missing_ordered == 0 {
                break;
            }
            if Instant::now() >= deadline {
                let missing: Vec<u64> = want.difference(&acked).copied().collect();
                let attempts: Vec<_> = {
                    let a = self.seen.attempts.lock().unwrap();
                    missing.iter().map(|s| (*s, a.get(s).cloned())).collect()
                };
                let stats = self.brokers[0].stats().await.map(|s| format!("{:?}", s.groups));
                let pending = match self.brokers[0].dead_letters("q.dlq").await {
                    Ok(d) => format!(
                        "{:?}",
                        d.list(20).await.map(|l| l.iter().map(|x| format!("{:?}", x)).collect::<Vec<_>>())
                    ),
                    Err(e) => format!("{e}"),
                };
                panic!(
                    "not drained: {missing_acks} acks and {missing_ordered} ordered deliveries missing of {}; \
                     missing acks {missing:?} ran at {attempts:?}; groups {stats:?}; pending {pending:?}",
                    want.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(*self.seen.ended.lock().unwrap(), Vec::<String>::new(), "a subscription ended");
        for p in &self.pools {
            assert!(!p.is_finished(), "a worker pool stopped by itself");
        }
        let stats = self.brokers[0].stats().await.expect("stats");
        let dead: u64 = stats.queues.iter().filter(|q| q.name == "q.dlq").map(|q| q.len).sum();
        assert_eq!(dead, 0, "nothing is dead-lettered by a fault");
        for p in self.pools {
            p.shutdown().await.expect("a pool ends without an error");
        }
        for b in self.brokers {
            b.shutdown().await.expect("shutdown");
        }
        for t in self.others {
            t.abort();
        }
    }
}

fn report(what: &str, seen: &Seen, from: Instant, to: Instant) -> [Duration; 3] {
    let gaps = [Kind::Sent, Kind::Acked, Kind::Ordered].map(|k| seen.longest_gap(k, from, to));
    eprintln!(
        "{what}: longest stall — sends {:?}, acks {:?}, ordered deliveries {:?} (over {:?}, {} sends ok, {} failed)",
        gaps[0],
        gaps[1],
        gaps[2],
        to - from,
        seen.ok.lock().unwrap().len(),
        seen.send_errors.load(Ordering::Relaxed),
    );
    gaps
}

/// The cluster's endpoints with member `first` listed first (the one a broker asks first).
fn endpoints_first(cluster: &etcd::Cluster, first: usize) -> Vec<String> {
    let mut all = cluster.endpoints();
    let e = all.remove(first);
    all.insert(0, e);
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_does_not_stop_any_instance() {
    let cluster = etcd::Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let load = Load::start(&endpoints_first(&cluster, follower), Duration::from_secs(10), LEASE).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let paused = Instant::now();
    cluster.members[follower].pause(true);
    tokio::time::sleep(Duration::from_secs(30)).await;
    cluster.members[follower].pause(false);
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gaps = report("follower paused 30 s", &load.seen, paused, resumed + Duration::from_secs(1));
    for (gap, what) in gaps.iter().zip(["sends", "acks", "ordered deliveries"]) {
        assert!(*gap <= Duration::from_secs(1), "{what} stopped for {gap:?} while one follower was paused");
    }
    load.drain_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_stops_progress_no_longer_than_the_election_and_a_second() {
    let mut cluster = etcd::Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let load = Load::start(&endpoints_first(&cluster, leader), Duration::from_secs(10), LEASE).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    cluster.members[leader].kill();
    let new = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let election = killed.elapsed();
    assert_ne!(new, leader);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let gaps = report("leader killed", &load.seen, killed, Instant::now());
    eprintln!("leader killed: election took at most {election:?}");
    for (gap, what) in gaps.iter().zip(["sends", "acks", "ordered deliveries"]) {
        assert!(
            *gap <= election + Duration::from_secs(1),
            "{what} stopped for {gap:?}; the election took {election:?}"
        );
    }
    load.drain_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_with_one_of_three_endpoints_dead_succeeds_every_time() {
    let mut cluster = etcd::Cluster::start(3).await;
    let dead = cluster.members[0].client_url.clone();
    cluster.members[0].kill();
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let live: Vec<String> = cluster.endpoints().into_iter().skip(1).collect();
    let started = Instant::now();
    for i in 0..100 {
        // The dead endpoint at every position in turn.
        let mut endpoints = live.clone();
        endpoints.insert(i % 3, dead.clone());
        let broker = Broker::connect_etcd(endpoints.clone(), NS, options(Duration::from_secs(10)))
            .await
            .unwrap_or_else(|e| panic!("connect {i} with {endpoints:?}: {e}"));
        broker.queue("q").await.expect("queue").send(format!("m{i}")).await.expect("send");
        broker.shutdown().await.expect("shutdown");
    }
    eprintln!("100 connects with one endpoint dead in {:?}", started.elapsed());
    // A malformed endpoint is the caller's mistake: a typed error before anything is asked.
    for bad in ["http://127.0.0.1:notaport", "ftp://127.0.0.1:2379", "http://", "http://a b:1"] {
        let mut endpoints = live.clone();
        endpoints.push(bad.to_owned());
        match Broker::connect_etcd(endpoints, NS, EtcdOptions::new()).await {
            Err(Error::InvalidOption(why)) => assert!(why.contains("endpoint"), "{why}"),
            other => panic!("{bad}: {:?}", other.map(|_| ())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_and_subscriptions_ride_out_a_whole_cluster_outage_and_nothing_is_dead_lettered() {
    let cluster = etcd::Cluster::start(3).await;
    // Leases of 30 s (the default) and two attempts: acks of handlers that succeeded during
    // the outage wait for etcd and land; nothing is run twice or dead-lettered for it. (With
    // leases shorter than the outage, another process may run such a job again once its lease
    // ran out: at least once — docs/DISTRIBUTED.md, "Riding out an outage".)
    let load = Load::start(&cluster.endpoints(), Duration::from_secs(5), Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = load.seen.acked.lock().unwrap().len();
    assert!(before > 0, "the load runs before the outage");
    let down = Instant::now();
    for m in &cluster.members {
        m.pause(true);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for m in &cluster.members {
        m.pause(false);
    }
    let up = Instant::now();
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    report("whole cluster paused 10 s", &load.seen, down, Instant::now());
    let resumed_after = {
        let p = load.seen.progress.lock().unwrap();
        p.iter().filter(|(t, k)| *t > up && *k == Kind::Acked).map(|(t, _)| *t - up).min()
    };
    eprintln!("whole cluster paused 10 s: first ack {resumed_after:?} after the members were continued");
    assert!(resumed_after.is_some(), "acks resume after the outage");
    // A send that fails does so after the request timeout (5 s), not after two of them.
    let slowest = *load.seen.slowest_failure.lock().unwrap();
    eprintln!(
        "whole cluster paused 10 s: {} sends failed, the slowest after {slowest:?}",
        load.seen.send_errors.load(Ordering::Relaxed)
    );
    assert!(load.seen.send_errors.load(Ordering::Relaxed) > 0, "sends during a 10 s outage fail");
    assert!(slowest <= Duration::from_secs(6), "a send took {slowest:?} to fail with a 5 s request timeout");
    assert!(
        load.seen.unavailable.load(Ordering::Relaxed) > 0,
        "the outage is reported (Event::StoreUnavailable)"
    );
    let seen = load.seen.clone();
    load.drain_and_check().await;
    let attempts = seen.attempts.lock().unwrap();
    let most = attempts.values().flat_map(|a| a.iter().copied()).max().unwrap_or(0);
    assert_eq!(most, 1, "no job ran twice: every ack held through the outage landed");
}
