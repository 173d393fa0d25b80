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
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen { snap: recorder.snapshotter(), series: Vec::new() };
    recorder.install().expect("install recorder");

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
        .claim_batch(3)
        .max_in_flight(3);
    let mut js = wg.subscribe().await.unwrap();
    let (a, b, c) = (next_job(&mut js).await, next_job(&mut js).await, next_job(&mut js).await);
    a.ack().await.unwrap();
    b.fail("boom").await.unwrap();
    drop(c); // counted attempt, released
    // Hold the leased job past its lease so the next claim sees an expiry.
    clock.advance(Duration::from_secs(2));
    let b2 = next_job(&mut js).await;
    let c2 = next_job(&mut js).await;
    assert_eq!((b2.seq(), c2.seq()), (2, 3));
    b2.dead_letter("giving up").await.unwrap();
    clock.advance(Duration::from_secs(31));
    // c2's lease expired: the next claim takes it over.
    let c3 = next_job(&mut js).await;
    assert_eq!((c3.seq(), c3.attempt()), (3, 3));
    c3.ack().await.unwrap();
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

    // Redrive and trim.
    let moved = broker.dead_letters("jobs.dlq").await.unwrap().redrive(rockq::Redrive::new()).await.unwrap();
    assert_eq!(moved, 1);
    assert_eq!(seen.counter(m::REDRIVEN, &[("queue", "jobs.dlq")]), 1);
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
    broker.pause_group("billing", "orders").await.unwrap();
    broker.stats().await.unwrap();
    seen.refresh();
    assert_eq!(seen.gauge(m::PAUSED, &og), 1.0);

    // Every round is measured.
    let rounds = broker.writer_stats().rounds as usize;
    seen.refresh();
    // One sample per round that wrote something (rounds that only answered a flush write nothing).
    let Some(V::Histogram(batches)) = seen.value(m::BATCH_SIZE, &[]) else {
        panic!("no batch size histogram")
    };
    assert!(batches > 10 && batches <= rounds, "{batches} samples for {rounds} rounds");
    assert_eq!(seen.value(m::COMMIT_LATENCY, &[]), Some(V::Histogram(batches)));
    broker.shutdown().await.unwrap();
}
