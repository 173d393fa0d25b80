//! Metrics through the `metrics` facade: one test (the recorder is process-global) that runs
//! ordered and work-queue traffic against a real database and reads back every series.

mod common;

use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use rockq::telemetry as m;
use rockq::{ManualClock, RetryPolicy};

/// Everything recorded so far. The debugging recorder hands out deltas (counters reset on
/// each snapshot), so this accumulates them.
struct Seen {
    snap: Snapshotter,
    series: Vec<(metrics::Key, V)>,
}

/// A series' value so far (histograms: how many samples).
#[derive(Debug, Clone, PartialEq)]
enum V {
    Counter(u64),
    Gauge(f64),
    Histogram(usize),
}

impl Seen {
    fn refresh(&mut self) {
        for (k, _, _, v) in self.snap.snapshot().into_vec() {
            let key = k.key().clone();
            let v = match v {
                DebugValue::Counter(n) => V::Counter(n),
                DebugValue::Gauge(g) => V::Gauge(g.into_inner()),
                DebugValue::Histogram(h) => V::Histogram(h.len()),
            };
            match (self.series.iter_mut().find(|(have, _)| *have == key), v) {
                (Some((_, V::Counter(total))), V::Counter(n)) => *total += n,
                (Some((_, V::Histogram(total))), V::Histogram(n)) => *total += n,
                (Some((_, slot)), v) => *slot = v,
                (None, v) => self.series.push((key, v)),
            }
        }
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<V> {
        self.series.iter().find_map(|(key, v)| {
            let matches = key.name() == name
                && labels.iter().all(|(lk, lv)| key.labels().any(|l| l.key() == *lk && l.value() == *lv));
            matches.then(|| v.clone())
        })
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.refresh();
        match self.value(name, labels) {
            Some(V::Counter(n)) => n,
            None => 0,
            other => panic!("{name} is not a counter: {other:?}"),
        }
    }

    /// The gauge as of the last refresh (the recorder zeroes gauges on each snapshot too, so
    /// refresh once right after the gauges were set).
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.value(name, labels) {
            Some(V::Gauge(g)) => g,
            other => panic!("{name} {labels:?} is not a gauge: {other:?}"),
        }
    }
}

#[tokio::test]
async fn counters_gauges_and_histograms_follow_the_traffic() {
    // A queue whose broker opened before the recorder was installed: what it sends afterwards
    // is counted (the counter is registered with the recorder current at each count).
    let early_dir = tempdir();
    let early = open_clock(early_dir.path(), &ManualClock::new()).await;
    let early_q = early.queue("early").await.unwrap();
    early_q.send_batch(["before", "the", "recorder"]).await.unwrap();

    let recorder = DebuggingRecorder::new();
    let mut seen = Seen { snap: recorder.snapshotter(), series: Vec::new() };
    recorder.install().expect("install recorder");

    early_q.send_batch((0..10).map(|i| format!("e{i}"))).await.unwrap();
    assert_eq!(seen.counter(m::PRODUCED, &[("queue", "early")]), 10);
    early.shutdown().await.unwrap();
    // Its rounds are in the (unlabelled) round histograms too: not the broker's below.
    seen.refresh();
    let early_rounds = match seen.value(m::BATCH_SIZE, &[]) {
        Some(V::Histogram(n)) => n,
        _ => 0,
    };

    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;

    // Ordered: 10 produced, delivered, acked and committed.
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((0..10).map(|i| format!("o{i}"))).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 10).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    let og = [("queue", "orders"), ("group", "billing")];
    assert_eq!(seen.counter(m::PRODUCED, &[("queue", "orders")]), 10);
    assert_eq!(
        seen.counter(m::DELIVERED, &[("queue", "orders"), ("group", "billing"), ("mode", "ordered")]),
        10
    );
    assert_eq!(seen.counter(m::ACKED, &og), 10);

    // Work queue: one ack, one retry then dead letter, one lease expiry.
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["a", "b", "c"]).await.unwrap();
    let wg = jobs
        .work_group("workers")
        .unwrap()
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(0.0),
        )
        .read_batch(3)
        .max_in_flight(3);
    let mut js = wg.subscribe().await.unwrap();
    let (a, b, c) = (next_job(&mut js).await, next_job(&mut js).await, next_job(&mut js).await);
    a.ack_durable().await.unwrap();
    b.fail_durable("boom").await.unwrap();
    drop(c); // counted attempt, released
    // Hold the leased job past its lease so the next claim sees an expiry.
    clock.advance(Duration::from_secs(2));
    let b2 = next_job(&mut js).await;
    let c2 = next_job(&mut js).await;
    assert_eq!((b2.seq(), c2.seq()), (2, 3));
    b2.dead_letter_durable("giving up").await.unwrap();
    clock.advance(Duration::from_secs(31));
    // c2's lease expired: the next claim takes it over.
    let c3 = next_job(&mut js).await;
    assert_eq!((c3.seq(), c3.attempt()), (3, 3));
    c3.ack_durable().await.unwrap();
    drop(js);
    let wl = [("queue", "jobs"), ("group", "workers")];
    assert_eq!(seen.counter(m::ACKED, &wl), 2);
    assert_eq!(seen.counter(m::RETRIED, &wl), 1);
    assert_eq!(seen.counter(m::DEAD_LETTERED, &wl), 1);
    assert_eq!(seen.counter(m::LEASE_EXPIRED, &wl), 1);
    assert_eq!(
        seen.counter(m::DELIVERED, &[("queue", "jobs"), ("group", "workers"), ("mode", "work-queue")]),
        6
    );
    assert_eq!(seen.counter(m::PRODUCED, &[("queue", "jobs.dlq")]), 1);

    // Redrive and trim: a redriven message is produced into its queue again.
    let produced_jobs = seen.counter(m::PRODUCED, &[("queue", "jobs")]);
    let moved = broker.dead_letters("jobs.dlq").await.unwrap().redrive(rockq::Redrive::new()).await.unwrap();
    assert_eq!(moved, 1);
    assert_eq!(seen.counter(m::REDRIVEN, &[("queue", "jobs.dlq")]), 1);
    assert_eq!(seen.counter(m::PRODUCED, &[("queue", "jobs")]), produced_jobs + 1);
    // An ordered group's dead letter is produced into its dead-letter queue.
    let poison = broker.queue("poison").await.unwrap();
    poison.send("p").await.unwrap();
    let mut ps = poison.group("reader").unwrap().max_deliveries(1).subscribe().await.unwrap();
    next(&mut ps).await.nack();
    let dead = tokio::time::timeout(HANG_GUARD, async {
        while seen.counter(m::PRODUCED, &[("queue", "poison.dlq")]) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(dead.is_ok(), "the ordered dead letter was never counted as produced");
    assert_eq!(seen.counter(m::PRODUCED, &[("queue", "poison.dlq")]), 1);
    drop(ps);
    let report = broker.trim().await.unwrap();
    assert_eq!(seen.counter(m::TRIMMED, &[("queue", "orders")]), 10, "{report:?}");

    // Gauges come from stats: the redriven message is pending again for `workers`.
    clock.advance(Duration::from_secs(4));
    broker.stats().await.unwrap();
    seen.refresh();
    assert_eq!(seen.gauge(m::LAG, &wl), 1.0);
    assert_eq!(seen.gauge(m::OLDEST_UNACKED, &wl), 4.0);
    assert_eq!(seen.gauge(m::LAG, &og), 0.0);
    assert_eq!(seen.gauge(m::DLQ_DEPTH, &wl), 0.0);
    assert_eq!(seen.gauge(m::QUEUE_LENGTH, &[("queue", "jobs")]), 1.0);
    assert_eq!(seen.gauge(m::PAUSED, &og), 0.0);
    broker.pause_group("orders", "billing").await.unwrap();
    broker.stats().await.unwrap();
    seen.refresh();
    assert_eq!(seen.gauge(m::PAUSED, &og), 1.0);

    // Every round is measured.
    let rounds = broker.writer_stats().rounds as usize;
    seen.refresh();
    // One sample per round that wrote something (rounds that only answered a flush write nothing).
    let Some(V::Histogram(all_batches)) = seen.value(m::BATCH_SIZE, &[]) else {
        panic!("no batch size histogram")
    };
    let batches = all_batches - early_rounds;
    // (On etcd a round is a round of sends: claims and acks are transactions of their own.)
    let least = if common::against_etcd() { 1 } else { 11 };
    assert!(batches >= least && batches <= rounds, "{batches} samples for {rounds} rounds");
    assert_eq!(seen.value(m::COMMIT_LATENCY, &[]), Some(V::Histogram(all_batches)));
    broker.shutdown().await.unwrap();

    periodic_gauges_agree_with_stats(&mut seen).await;
}

/// Issue 15: the periodic refresh used to load every claim from disk each tick; it now builds
/// the gauges from memory (the claim index's counts) plus cached point reads. Whatever it
/// computes must match what `Broker::stats` reads from disk.
async fn periodic_gauges_agree_with_stats(seen: &mut Seen) {
    let dir = tempdir();
    let clock = ManualClock::new();
    // (On etcd the periodic task publishes what `Broker::stats` computes.)
    let options = rockq::Options::new()
        .durability(rockq::Durability::Buffered)
        .clock(clock.clone())
        .retention_interval(Duration::ZERO)
        .metrics_interval(Duration::from_secs(10));
    let broker = open_options(dir.path(), options).await;
    let q = broker.queue("gauged").await.unwrap();
    q.send_batch((0..8).map(|i| format!("m{i}"))).await.unwrap();
    let mut ordered = q.group("reader").unwrap().subscribe().await.unwrap();
    for d in take(&mut ordered, 3).await {
        d.ack().unwrap();
    }
    ordered.commit().await.unwrap();
    // Delayed messages: three scheduled, one cancelled, one fired (the gauge is the writer's
    // running count, never a scan of the schedule).
    let later = |secs| rockq::Message::new("later").deliver_after(Duration::from_secs(secs));
    let mut ids = Vec::new();
    for secs in [1, 3600, 7200] {
        match q.submit(later(secs)).await.unwrap() {
            rockq::Sent::Scheduled(s) => ids.push(s.id),
            other => panic!("{other:?}"),
        }
    }
    assert!(q.cancel(ids[2]).await.unwrap());
    let mut js = q.work_group("pool").unwrap().read_batch(4).max_in_flight(4).subscribe().await.unwrap();
    let (a, b, c) = (next_job(&mut js).await, next_job(&mut js).await, next_job(&mut js).await);
    b.ack_durable().await.unwrap(); // finished above a gap (1 is still held)
    c.retry_after_durable(Duration::from_secs(3600)).await.unwrap(); // waiting
    clock.advance(Duration::from_secs(5));
    // The delayed message due after 1 s fires now: wait for it to land before the gauges tick.
    let fired = tokio::time::timeout(HANG_GUARD, async {
        while q.last_seq() < 9 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(fired.is_ok(), "the delayed message never fired");

    // The task ticks at 10 s on the broker clock; wait for its first publication.
    clock.advance(Duration::from_secs(10));
    let (wl, ol) = ([("queue", "gauged"), ("group", "pool")], [("queue", "gauged"), ("group", "reader")]);
    // No sleeping: the condition itself is awaited, only guarded against a hang.
    let published = tokio::time::timeout(HANG_GUARD, async {
        loop {
            seen.refresh();
            if seen.value(m::WAITING_RETRY, &wl).is_some() {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(published.is_ok(), "the periodic task published no gauges");
    let gauges = |seen: &Seen, labels: &[(&str, &str)]| {
        [m::LAG, m::IN_FLIGHT, m::WAITING_RETRY, m::DLQ_DEPTH, m::OLDEST_UNACKED]
            .map(|n| seen.gauge(n, labels))
    };
    let (work, reader) = (gauges(seen, &wl), gauges(seen, &ol));
    let length = seen.gauge(m::QUEUE_LENGTH, &[("queue", "gauged")]);
    let scheduled = seen.gauge(m::SCHEDULED_DEPTH, &[("queue", "gauged")]);

    let stats = broker.stats().await.unwrap();
    let g = |name: &str| stats.groups.iter().find(|g| g.group == name).unwrap().clone();
    let expect = |g: &rockq::GroupStats| {
        [g.lag, g.in_flight, g.waiting_retry, g.dlq_depth]
            .map(|v| v as f64)
            .to_vec()
            .into_iter()
            .chain([g.oldest_unacked_age.map_or(0.0, |d| d.as_secs_f64())])
            .collect::<Vec<_>>()
    };
    let (pool, rd) = (g("pool"), g("reader"));
    // 8 sent and 1 fired, 1 finished; held: 1 and the claimed-ahead 4; 3 waits.
    assert_eq!((pool.lag, pool.in_flight, pool.waiting_retry), (8, 2, 1), "{pool:?}");
    assert_eq!(work.to_vec(), expect(&pool), "work group gauges vs stats");
    assert_eq!(reader.to_vec(), expect(&rd), "ordered group gauges vs stats");
    // The delayed message due after 1 s fired during the 15 s advanced: 9 stored, 1 waiting.
    assert_eq!(length, 9.0);
    assert_eq!(scheduled, 1.0, "one delayed message still waits");
    assert_eq!(stats.queues.iter().find(|q| q.name == "gauged").unwrap().scheduled, 1);
    drop((a, js, ordered));
    broker.shutdown().await.unwrap();
}
