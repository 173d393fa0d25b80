//! The stats API, pending claims, peek, pause/resume and the read-only inspector, against
//! real databases. Time is a `ManualClock`, so ages and deadlines are exact.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use futures::StreamExt;
use rockq::{Error, GroupMode, Inspector, ManualClock, PendingState, RetryPolicy};

/// Stored times have microsecond precision.
fn micros(t: std::time::SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_micros()
}

fn group<'a>(stats: &'a rockq::Stats, queue: &str, group: &str) -> &'a rockq::GroupStats {
    stats.groups.iter().find(|g| g.queue == queue && g.group == group).expect("group in stats")
}

/// Stats of two views of one database without what differs between them by nature: ages, taken
/// at different instants on the real clock, and the database's bytes (each instance has its
/// own memtables).
fn without_ages(mut s: rockq::Stats) -> rockq::Stats {
    s.bytes_on_disk = 0;
    s.queues.iter_mut().for_each(|q| q.oldest_age = q.oldest_age.map(|_| Duration::ZERO));
    for g in &mut s.groups {
        g.oldest_unacked_age = g.oldest_unacked_age.map(|_| Duration::ZERO);
    }
    s
}

#[tokio::test]
async fn stats_report_lag_as_count_and_age_in_flight_and_paused_for_an_ordered_group() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((1..=10).map(|i| format!("o{i}"))).await.unwrap();
    clock.advance(Duration::from_secs(5));

    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, 4).await;
    let mut ds = ds.into_iter();
    for d in ds.by_ref().take(3) {
        d.ack().unwrap();
    }
    let held = ds.next().unwrap();
    assert_eq!(sub.commit().await.unwrap(), 3);

    let stats = broker.stats().await.unwrap();
    let q = stats.queues.iter().find(|q| q.name == "orders").unwrap();
    assert!(stats.bytes_on_disk > 0, "the memtables hold the writes");
    assert_eq!((q.first_seq, q.last_seq, q.len), (1, 10, 10));
    // Nothing is flushed: the files hold none of it, yet the queue's size counts every message
    // (a key of 12 bytes and at least its payload each; the envelope adds a little).
    assert_eq!(q.bytes_on_disk, 0);
    let payloads: u64 = (1..=10).map(|i| format!("o{i}").len() as u64).sum();
    assert!(q.bytes >= 10 * 12 + payloads && q.bytes < 10 * 200, "{}", q.bytes);
    assert_eq!(q.oldest_age, Some(Duration::from_secs(5)));
    let g = group(&stats, "orders", "billing");
    assert_eq!(g.mode, GroupMode::Ordered);
    assert_eq!((g.committed, g.lag, g.in_flight, g.paused), (3, 7, 1, false));
    assert_eq!(g.oldest_unacked_age, Some(Duration::from_secs(5)));
    assert_eq!((g.dead_letter_queue.as_deref(), g.dlq_depth), (None, 0));

    // Pause: nothing new is handed out, durably across a restart.
    broker.pause_group("orders", "billing").await.unwrap();
    assert!(orders.group("billing").unwrap().is_paused());
    assert!(futures::poll!(sub.next()).is_pending(), "a paused group delivered");
    assert!(group(&broker.stats().await.unwrap(), "orders", "billing").paused);
    held.ack().unwrap();
    drop(sub);
    broker.shutdown().await.unwrap();

    let broker = open_clock(dir.path(), &clock).await;
    let orders = broker.queue("orders").await.unwrap();
    let billing = orders.group("billing").unwrap();
    assert!(billing.is_paused(), "pause did not survive a restart");
    let mut sub = billing.subscribe().await.unwrap();
    assert!(futures::poll!(sub.next()).is_pending(), "a paused group delivered after restart");
    let g = group(&broker.stats().await.unwrap(), "orders", "billing").clone();
    assert_eq!((g.committed, g.lag, g.paused), (4, 6, true));

    // Resume wakes the waiting subscription.
    broker.resume_group("orders", "billing").await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 5);
    assert!(!group(&broker.stats().await.unwrap(), "orders", "billing").paused);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn stats_and_pending_show_work_group_leases_holders_retries_and_dead_letters() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=5).map(|i| format!("j{i}"))).await.unwrap();
    let wg = jobs
        .work_group("workers")
        .unwrap()
        .consumer_name("host-a/7")
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(10), Duration::from_secs(10))
                .jitter(0.0),
        )
        .read_batch(3)
        .max_in_flight(3);
    let mut sub = wg.subscribe().await.unwrap();
    let j1 = next_job(&mut sub).await;
    let j2 = next_job(&mut sub).await;
    let j3 = next_job(&mut sub).await;
    assert_eq!((j1.seq(), j2.seq(), j3.seq()), (1, 2, 3));
    j1.dead_letter_durable("bad input").await.unwrap();
    j2.fail_durable("downstream 503").await.unwrap();

    let now = clock.wall_time();
    let pending = broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(pending.len(), 2, "{pending:?}");
    let (p2, p3) = (&pending[0], &pending[1]);
    assert_eq!((p2.seq, p2.state, p2.attempt), (2, PendingState::Waiting, 1));
    assert_eq!(micros(p2.retry_at.unwrap()), micros(now + Duration::from_secs(10)));
    assert_eq!(p2.last_error.as_deref(), Some("downstream 503"));
    assert_eq!(p2.holder, None);
    assert_eq!((p3.seq, p3.state, p3.attempt), (3, PendingState::Leased, 1));
    assert_eq!(p3.holder.as_deref(), Some("host-a/7"));
    assert_eq!(micros(p3.lease_deadline.unwrap()), micros(now + Duration::from_secs(30)));

    let stats = broker.stats().await.unwrap();
    let g = group(&stats, "jobs", "workers");
    assert_eq!(g.mode, GroupMode::WorkQueue);
    assert_eq!((g.committed, g.lag, g.in_flight, g.waiting_retry), (1, 4, 1, 1));
    assert_eq!((g.dead_letter_queue.as_deref(), g.dlq_depth), (Some("jobs.dlq"), 1));

    // Once the lease runs out the claim shows as expired, and no longer as in flight.
    clock.advance(Duration::from_secs(31));
    let pending = broker.pending("jobs", "workers").await.unwrap();
    assert_eq!(pending[1].state, PendingState::Expired);
    assert_eq!(group(&broker.stats().await.unwrap(), "jobs", "workers").in_flight, 0);
    drop(j3);

    // A paused work group claims nothing; resuming hands out the next job.
    broker.pause_group("jobs", "workers").await.unwrap();
    assert!(wg.is_paused());
    assert!(futures::poll!(sub.next()).is_pending(), "a paused work group claimed");
    wg.resume().await.unwrap();
    let j = next_job(&mut sub).await;
    assert!(j.seq() >= 2);
    drop(j);
    drop(sub);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn peek_reads_without_moving_any_group_and_errors_are_typed() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("events").await.unwrap();
    q.send_batch((1..=20).map(|i| format!("e{i}"))).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    sub.commit().await.unwrap();

    let page = broker.peek("events", Some(5), 3).await.unwrap();
    assert_eq!(page.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![5, 6, 7]);
    assert_eq!(page[0].payload.as_ref(), b"e5");
    assert_eq!(broker.peek("events", None, 2).await.unwrap()[0].seq, 1);
    assert!(broker.peek("events", Some(19), 10).await.unwrap().len() == 2);
    assert_eq!(q.group("g").unwrap().committed(), Some(1), "peek moved a group");

    assert!(matches!(broker.peek("nope", None, 1).await, Err(Error::NoSuchQueue { .. })));
    assert!(matches!(broker.peek("bad name", None, 1).await, Err(Error::InvalidName(_))));
    assert!(matches!(broker.pending("events", "nope").await, Err(Error::NoSuchGroup { .. })));
    assert!(broker.pending("events", "g").await.unwrap().is_empty(), "ordered groups have no claims");
    assert!(matches!(broker.pause_group("events", "nope").await, Err(Error::NoSuchGroup { .. })));
    assert!(matches!(broker.pause_group("nope", "g").await, Err(Error::NoSuchGroup { .. })));
    assert!(matches!(broker.pause_group("events", "a:b").await, Err(Error::InvalidName(_))));
    assert!(matches!(
        broker.reset_group("events", "nope", rockq::ResetTo::Sequence(1)).await,
        Err(rockq::Error::NoSuchGroup { .. })
    ));
    drop(sub);
    assert_eq!(broker.reset_group("events", "g", rockq::ResetTo::Sequence(1)).await.unwrap(), 1);
    assert_eq!(q.group("g").unwrap().committed(), Some(0));
    broker.shutdown().await.unwrap();
    assert!(matches!(broker.stats().await, Err(Error::Shutdown)));
    assert!(matches!(broker.pause_group("events", "g").await, Err(Error::Shutdown)));
}

#[tokio::test]
async fn inspector_reads_a_database_another_broker_holds_and_writes_nothing() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("orders").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let mut sub = q.group("billing").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    sub.commit().await.unwrap();
    broker.pause_group("orders", "billing").await.unwrap();

    // The broker holds the lock; the inspector takes none.
    let inspector = Inspector::open(dir.path()).await.expect("read-only open while locked");
    let seen = inspector.stats().await.unwrap();
    let live = broker.stats().await.unwrap();
    // The inspector sees only the disk (no live in-flight count), and ages are taken at
    // different instants on the real clock.
    let normalise = |s: rockq::Stats| {
        assert!(s.queues.iter().all(|q| q.bytes_on_disk == 0), "nothing flushed yet");
        let mut s = without_ages(s);
        s.groups.iter_mut().for_each(|g| g.in_flight = 0);
        s
    };
    assert_eq!(normalise(seen.clone()), normalise(live));
    let g = group(&seen, "orders", "billing");
    assert_eq!((g.committed, g.lag, g.paused), (1, 2, true));
    assert_eq!(inspector.peek("orders", None, 10).await.unwrap().len(), 3);
    drop(sub);
    broker.shutdown().await.unwrap();

    // Nothing in the directory changes when only an inspector opens it.
    let listing = || {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().len())
            })
            .collect();
        v.sort();
        v
    };
    let before = listing();
    let inspector = Inspector::open(dir.path()).await.unwrap();
    assert_eq!(inspector.stats().await.unwrap().queues.len(), 1);
    drop(inspector);
    assert_eq!(listing(), before);

    let empty = tempdir();
    assert!(matches!(Inspector::open(empty.path()).await, Err(rockq::Error::NoDatabase { .. })));
    std::fs::write(empty.path().join("file"), b"x").unwrap();
    assert!(matches!(Inspector::open(empty.path()).await, Err(rockq::Error::NotRockq { .. })));
}

// Issue 36 (stats from memory): a live broker's `stats()` used to load every claim record from
// disk (1.4 s with a million waiting retries); it is now served from the registry's counts.
// These must agree with what the store holds, figure for figure: the read-only inspector still
// computes them from the records.
#[tokio::test]
async fn live_stats_from_memory_agree_with_the_records_on_disk() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch((1..=12).map(|i| format!("j{i}"))).await.unwrap();
    let mut sub =
        jobs.work_group("mail").unwrap().lease(Duration::from_secs(3600)).subscribe().await.unwrap();
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(next_job(&mut sub).await);
    }
    let mut held = held.into_iter();
    // seq 1 done (the offset moves), seq 2 waits for a retry, seq 3 done above the gap, seq 4
    // dead-lettered, seq 5..=7 stay leased.
    held.next().unwrap().ack_durable().await.unwrap();
    held.next().unwrap().retry_after_durable(Duration::from_secs(600)).await.unwrap();
    held.next().unwrap().ack_durable().await.unwrap();
    held.next().unwrap().dead_letter_durable("bad").await.unwrap();
    let leased: Vec<_> = held.collect();
    assert_eq!(leased.len(), 3);

    let mut ordered = jobs.group("audit").unwrap().subscribe().await.unwrap();
    for d in take(&mut ordered, 5).await {
        d.ack().unwrap();
    }
    assert_eq!(ordered.commit().await.unwrap(), 5);
    drop(ordered);

    let later = broker.queue("later").await.unwrap();
    later.submit(rockq::Message::new("b").deliver_after(Duration::from_secs(120))).await.unwrap();
    later.submit(rockq::Message::new("a").deliver_after(Duration::from_secs(60))).await.unwrap();
    broker.queue("idle").await.unwrap();
    let kv = broker.kv("state").await.unwrap();
    for k in ["x", "y", "z"] {
        kv.put(k, "v").await.unwrap();
    }
    broker.flush().await.unwrap();

    let live = broker.stats().await.unwrap();
    let seen = Inspector::open(dir.path()).await.unwrap().stats().await.unwrap();
    assert_eq!(without_ages(live.clone()), without_ages(seen));
    // And the figures themselves, so that both cannot be wrong the same way.
    let mail = group(&live, "jobs", "mail");
    // In flight: the 3 held and the 5 the subscription claimed ahead into its buffer.
    assert_eq!(
        (mail.committed, mail.lag, mail.in_flight, mail.waiting_retry, mail.dlq_depth),
        (1, 9, 8, 1, 1),
        "{mail:?}"
    );
    assert!(mail.oldest_unacked_age.is_some());
    let audit = group(&live, "jobs", "audit");
    assert_eq!((audit.committed, audit.lag, audit.in_flight), (5, 7, 0));
    let later = live.queues.iter().find(|q| q.name == "later").unwrap();
    assert_eq!(later.scheduled, 2);
    let due = later.next_due.expect("the earliest delayed message's due time");
    let from_now = due.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(from_now > Duration::from_secs(50) && from_now <= Duration::from_secs(60), "{from_now:?}");
    let names: Vec<_> = live.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["idle", "jobs", "jobs.dlq", "later"]);
    assert_eq!(live.keyspaces.iter().map(|k| (k.name.as_str(), k.keys)).collect::<Vec<_>>(), [("state", 3)]);
    drop(leased);
    drop(sub);
    broker.shutdown().await.unwrap();
}

// Issue 13 (live leases in the admin reads): `Job::extend` changed only memory, so `pending()` showed a live job as expired and
// `stats()` did not count it as in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_leases_show_in_pending_and_stats() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send("a").await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut sub = group.subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    job.extend(Duration::from_secs(100)).unwrap();
    clock.advance(Duration::from_secs(20));
    let pending = broker.pending("jobs", "w").await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].state, PendingState::Leased, "{pending:?}");
    let deadline = pending[0].lease_deadline.unwrap();
    let expected = clock.wall_time() + Duration::from_secs(80);
    let diff = deadline.duration_since(expected).unwrap_or_else(|e| e.duration());
    assert!(diff < Duration::from_millis(5), "deadline {deadline:?}, expected {expected:?}");
    let stats = broker.stats().await.unwrap();
    let g = stats.groups.iter().find(|g| g.group == "w").unwrap();
    assert_eq!(g.in_flight, 1, "the extended job is in flight");
    job.ack_durable().await.unwrap();
    broker.shutdown().await.unwrap();
}

/// Leases of a process that is gone are void (the next open hands those jobs out at once), so
/// a live broker does not count them in flight nor show them leased — an operator would think
/// workers are busy. A read-only `Inspector` beside a live broker keeps trusting the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_process_that_is_gone_are_not_in_flight_after_a_restart() {
    let dir = tempdir();
    let clock = ManualClock::new();
    {
        let broker = open_clock(dir.path(), &clock).await;
        let q = broker.queue("jobs").await.unwrap();
        q.send_batch(["a", "b", "c"]).await.unwrap();
        let group = q.work_group("w").unwrap().lease(Duration::from_secs(3600));
        let mut jobs = group.subscribe().await.unwrap();
        for _ in 0..3 {
            std::mem::forget(next_job(&mut jobs).await); // the process dies holding them
        }
        assert_eq!(broker.stats().await.unwrap().groups[0].in_flight, 3);
        drop(jobs);
        broker.shutdown().await.unwrap();
    }
    let broker = open_clock(dir.path(), &clock).await;
    let stats = broker.stats().await.unwrap();
    assert_eq!(stats.groups[0].in_flight, 0, "no one holds them: {:?}", stats.groups[0]);
    let pending = broker.pending("jobs", "w").await.unwrap();
    assert_eq!(pending.len(), 3);
    assert!(pending.iter().all(|p| p.state == PendingState::Expired), "{pending:?}");
    // This process's own leases count, and show leased (the subscription claims ahead).
    let mut jobs = broker.queue("jobs").await.unwrap().work_group("w").unwrap().subscribe().await.unwrap();
    let held = next_job(&mut jobs).await;
    let in_flight = broker.stats().await.unwrap().groups[0].in_flight;
    let pending = broker.pending("jobs", "w").await.unwrap();
    let leased = pending.iter().filter(|p| p.state == PendingState::Leased).count() as u64;
    assert!(in_flight >= 1 && in_flight == leased, "{in_flight} in flight, {pending:?}");
    assert!(pending.iter().any(|p| p.seq == held.seq() && p.state == PendingState::Leased));
    drop((held, jobs));
    broker.shutdown().await.unwrap();
}
