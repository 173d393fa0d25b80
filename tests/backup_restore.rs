//! Online backups (`Broker::backup`) and restores (`Broker::restore`) against real databases:
//! a backup taken while producers, a subscription and a worker pool run is a consistent prefix
//! of the database, and a restored backup holds every kind of record as it was.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Broker, Error, ManualClock, Message, Original, RetryPolicy, Sent, Task};

/// Every file of `dir` with its length, sorted.
fn listing(dir: &std::path::Path) -> Vec<(std::ffi::OsString, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    v.sort();
    v
}

/// What a database holds, as its admin API shows it, without what a reopen changes by nature:
/// ages (the wall clock moves), byte estimates (memtables are flushed), and in-flight counts and lease
/// states (leases are this process's; after a reopen nothing is in flight).
async fn contents(
    broker: &Broker,
) -> (rockq::Stats, Vec<(u64, u32, Option<String>)>, usize, usize, Option<String>) {
    let stats = lasting_stats(broker).await;
    let pending = broker
        .pending("jobs", "workers")
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.seq, p.attempt, p.last_error))
        .collect();
    let schedules = broker.schedules().await.unwrap().len();
    let delayed = broker.delayed(None, 100).await.unwrap().len();
    let alice = broker.kv("accounts").await.unwrap().get("alice").await.unwrap();
    let alice = alice.map(|e| String::from_utf8(e.value.to_vec()).unwrap());
    (stats, pending, schedules, delayed, alice)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_holds_every_record_as_it_was_when_the_backup_was_taken() {
    let (dir, backups) = (tempdir(), tempdir());
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;

    // An ordered group two messages in, paused.
    let orders = broker.queue("orders").await.unwrap();
    orders.send_batch((1..=6).map(|i| format!("o{i}"))).await.unwrap();
    let mut sub = orders.group("billing").unwrap().subscribe().await.unwrap();
    for d in take(&mut sub, 2).await {
        d.ack().unwrap();
    }
    sub.commit().await.unwrap();
    drop(sub);
    broker.pause_group("orders", "billing").await.unwrap();
    // A work group with a dead letter, a failed job waiting for its retry and a leased one.
    let jobs = broker.queue("jobs").await.unwrap();
    jobs.send_batch(["j1", "j2", "j3", "j4"]).await.unwrap();
    let workers = jobs
        .work_group("workers")
        .unwrap()
        .lease(Duration::from_secs(30))
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(5)
                .backoff(Duration::from_secs(10), Duration::from_secs(10))
                .jitter(0.0),
        )
        .read_batch(3)
        .max_in_flight(3);
    let mut js = workers.subscribe().await.unwrap();
    next_job(&mut js).await.dead_letter_durable("malformed").await.unwrap();
    next_job(&mut js).await.fail_durable("downstream 503").await.unwrap();
    let held = next_job(&mut js).await;
    assert_eq!(held.seq(), 3);
    // A keyspace, a delayed message, a recurring schedule, an idempotency key.
    broker.kv("accounts").await.unwrap().put("alice", "10").await.unwrap();
    let later = broker.queue("later").await.unwrap();
    later.submit(Message::new("in a minute").deliver_after(Duration::from_secs(60))).await.unwrap();
    broker.schedule("tick", Duration::from_secs(300), "ticks", "tick").await.unwrap();
    let charged = orders.submit(Message::new("charge").idempotency_key("order-9")).await.unwrap();
    assert_eq!(charged, Sent::Appended(7));

    let before = contents(&broker).await;
    let copy = backups.path().join("nightly/1");
    let report = broker.backup(&copy).await.unwrap();
    assert_eq!(report.path, copy);
    assert!(report.files > 0 && report.bytes > 0, "{report:?}");
    let mut queues = report.queues.clone();
    queues.sort();
    assert_eq!(
        queues,
        vec![
            ("jobs".into(), 1, 4),
            ("jobs.dlq".into(), 1, 1),
            ("later".into(), 1, 0),
            ("orders".into(), 1, 7)
        ]
    );
    #[cfg(unix)]
    assert!(report.linked > 0, "SST files are hard-linked on one filesystem: {report:?}");

    // After the backup the live database goes on; the backup does not.
    orders.send("o8").await.unwrap();
    held.ack_durable().await.unwrap();
    drop(js);
    broker.kv("accounts").await.unwrap().put("alice", "11").await.unwrap();
    broker.shutdown().await.unwrap();

    let backup_files = listing(&copy);
    let restored_dir = dir.path().with_extension("restored");
    let restored = Broker::restore(&copy, &restored_dir).await.unwrap();
    assert_eq!(restored.queues.len(), 4);
    assert_eq!(listing(&copy), backup_files, "a restore leaves the backup as it was");

    let broker = open_clock(&restored_dir, &clock).await;
    assert_eq!(contents(&broker).await, before, "the restored database is the database at the backup");
    let orders = broker.queue("orders").await.unwrap();
    // The idempotency key is remembered, sequences go on after the backup's.
    assert_eq!(
        orders.submit(Message::new("charge again").idempotency_key("order-9")).await.unwrap(),
        Sent::Duplicate(Original::Appended(7))
    );
    assert_eq!(orders.send("o8'").await.unwrap(), 8);
    // Attempts survive: once the old lease and the backoff run out, jobs 2 and 3 come back as
    // their second attempts, then job 4 as its first.
    clock.advance(Duration::from_secs(31));
    let mut js =
        broker.queue("jobs").await.unwrap().work_group("workers").unwrap().subscribe().await.unwrap();
    let mut got = BTreeMap::new();
    for _ in 0..3 {
        let j = next_job(&mut js).await;
        got.insert(j.seq(), j.attempt());
        j.ack_durable().await.unwrap();
    }
    assert_eq!(got, BTreeMap::from([(2, 2), (3, 2), (4, 1)]));
    drop(js);
    // The ordered group resumes at its committed offset once resumed.
    broker.resume_group("orders", "billing").await.unwrap();
    let mut sub = broker.queue("orders").await.unwrap().group("billing").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 3);
    drop(sub);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_is_a_consistent_prefix_of_the_database() {
    let (dir, backups) = (tempdir(), tempdir());
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let resolved = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let highest = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::new();
    for p in 0..4 {
        let (q, stop, resolved, highest) = (q.clone(), stop.clone(), resolved.clone(), highest.clone());
        producers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let payload = format!("p{p}-{n}");
                let seq = q.send(payload.clone()).await.unwrap();
                resolved.lock().unwrap().push((seq, payload));
                highest.fetch_max(seq, Ordering::SeqCst);
                n += 1;
            }
        }));
    }
    // An ordered group acknowledging everything, and a worker pool.
    let mut sub = q.group("o").unwrap().subscribe().await.unwrap();
    let consumer = tokio::spawn(async move {
        while let Some(Ok(d)) = sub.next().await {
            d.ack().unwrap();
        }
    });
    let pool = tokio::spawn(
        q.work_group("w").unwrap().workers(4).run(|_t: Task| async { Ok::<(), rockq::HandlerError>(()) }),
    );

    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while highest.load(Ordering::SeqCst) < 3_000 {
        assert!(tokio::time::Instant::now() < deadline, "the load never reached 3,000 messages");
        tokio::task::yield_now().await;
    }
    // Every send resolved before the backup is called must be in it.
    let before: Vec<(u64, String)> = resolved.lock().unwrap().clone();
    let copy = backups.path().join("under-load");
    let report = broker.backup(&copy).await.unwrap();
    // The load goes on after it, then stops the hard way: tasks aborted, the broker dropped.
    let after = highest.load(Ordering::SeqCst);
    while highest.load(Ordering::SeqCst) < after + 1_000 {
        assert!(tokio::time::Instant::now() < deadline, "the load stopped after the backup");
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    for p in &producers {
        p.abort();
    }
    consumer.abort();
    pool.abort();
    drop((broker, q));
    // Waited for (their handles dropped), then the database reopened once its writer thread
    // has closed it: a test that returns while that thread is still closing RocksDB lets the
    // process exit under it, and RocksDB aborts in its teardown ("pthread lock: Invalid
    // argument", seen in CI).
    for p in producers {
        let _ = p.await;
    }
    let _ = consumer.await;
    let _ = pool.await;
    common::reopen_after_drop(dir.path()).await.shutdown().await.unwrap();

    let restored_dir = backups.path().join("restored");
    Broker::restore(&copy, &restored_dir).await.unwrap();
    let broker = open(&restored_dir).await;
    let stats = broker.stats().await.unwrap();
    let qs = stats.queues.iter().find(|s| s.name == "q").unwrap();
    assert_eq!(report.queues, vec![("q".to_owned(), qs.first_seq, qs.last_seq)]);
    let last = qs.last_seq;
    assert!(
        last >= before.iter().map(|(s, _)| *s).max().unwrap(),
        "a send resolved before the backup is missing"
    );
    // No sequence hole, and every message resolved before the backup is there as sent.
    let mut stored = BTreeMap::new();
    let mut from = 1;
    while from <= last {
        let page = broker.peek("q", Some(from), 1_000).await.unwrap();
        assert!(!page.is_empty(), "nothing stored from {from} up to {last}");
        for m in page {
            assert_eq!(m.seq, from, "a hole in the backup's sequences");
            stored.insert(m.seq, String::from_utf8(m.payload.to_vec()).unwrap());
            from += 1;
        }
    }
    assert_eq!(stored.len() as u64, last);
    for (seq, payload) in &before {
        assert_eq!(stored.get(seq), Some(payload), "message {seq} differs in the backup");
    }
    // No group's offset or claim is ahead of the messages the backup holds.
    for g in stats.groups.iter().filter(|g| g.queue == "q") {
        assert!(
            g.committed <= last,
            "{}: offset {} past the backup's last message {last}",
            g.group,
            g.committed
        );
    }
    for p in broker.pending("q", "w").await.unwrap() {
        assert!(p.seq <= last, "a claim of {} past the backup's last message {last}", p.seq);
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn backups_and_restores_refuse_what_they_would_overwrite_and_change_nothing() {
    let (dir, other) = (tempdir(), tempdir());
    let broker = open(dir.path()).await;
    broker.queue("q").await.unwrap().send("one").await.unwrap();

    // A backup never writes into something that exists, even an empty directory.
    let existing = other.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    assert!(matches!(broker.backup(&existing).await, Err(Error::Invalid { .. })));
    assert_eq!(listing(&existing), vec![]);
    std::fs::write(other.path().join("file"), b"keep").unwrap();
    assert!(matches!(broker.backup(other.path().join("file")).await, Err(Error::Invalid { .. })));
    assert_eq!(std::fs::read(other.path().join("file")).unwrap(), b"keep");

    let copy = other.path().join("copy");
    broker.backup(&copy).await.unwrap();
    broker.shutdown().await.unwrap();
    assert!(matches!(broker.backup(other.path().join("late")).await, Err(Error::Shutdown)));
    assert!(!other.path().join("late").exists());

    // A restore needs a new (or empty) directory, and a rockq database to restore from.
    assert!(matches!(Broker::restore(&copy, dir.path()).await, Err(Error::Invalid { .. })));
    let not_a_backup = other.path().join("not-a-backup");
    std::fs::create_dir(&not_a_backup).unwrap();
    std::fs::write(not_a_backup.join("notes.txt"), b"x").unwrap();
    let target = other.path().join("target");
    assert!(matches!(Broker::restore(&not_a_backup, &target).await, Err(Error::NotRockq { .. })));
    assert!(matches!(
        Broker::restore(other.path().join("missing"), &target).await,
        Err(Error::NoDatabase { .. })
    ));
    assert!(!target.exists(), "a refused restore writes nothing");
    // An empty directory (a prepared mount point) is taken; a leftover of a stopped restore is
    // removed.
    std::fs::create_dir(&target).unwrap();
    std::fs::create_dir(other.path().join(".target.rockq-restore")).unwrap();
    std::fs::write(other.path().join(".target.rockq-restore/000001.sst"), b"half").unwrap();
    let report = Broker::restore(&copy, &target).await.unwrap();
    assert_eq!(report.queues, vec![("q".to_owned(), 1, 1)]);
    assert!(!other.path().join(".target.rockq-restore").exists());
    let broker = open(&target).await;
    assert_eq!(broker.peek("q", None, 10).await.unwrap()[0].payload.as_ref(), b"one");
    broker.shutdown().await.unwrap();
}
