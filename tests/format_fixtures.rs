//! On-disk compatibility: `tests/fixtures/v1/` is a database written by rockq's format 1, and
//! `tests/fixtures/v2/` one written by format 2 (the generator below, run once per format and
//! committed). Every later version must open both and deliver exactly what they hold: messages
//! with headers, an ordered group's offset, delivery count and dead letter, a work group's
//! done, retrying, dead-lettered and abandoned claims, group settings, retention settings and
//! a trimmed queue head; and in format 2, delayed messages, a recurring schedule, idempotency
//! keys and keyed messages held by a group ordered by key. A change that breaks the format
//! makes this test fail; such a change needs a new format version and a migration, not a new
//! fixture.
//!
//! Regenerate (only with a new format version, into a new folder):
//! `ROCKQ_WRITE_FIXTURE=tests/fixtures/v3 cargo test --test format_fixtures -- --ignored write_fixture`

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use rockq::{GroupMode, PendingState, Retention, RetryPolicy};

/// Copies fixture `name` to a temporary directory: the committed files are never opened for
/// writing.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempdir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    for entry in std::fs::read_dir(&src).expect("fixture folder") {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_database_opens_and_delivers_what_it_holds() {
    let dir = copy_fixture("v1");
    check_format_1_content(dir.path()).await;
    // Upgraded in place: the job-queue features work on it.
    let broker = open(dir.path()).await;
    let orders = broker.queue("orders").await.unwrap();
    assert_eq!(orders.dedup_window(), Duration::from_secs(300), "the default window");
    let sent = orders.submit(rockq::Message::new("o8").idempotency_key("k")).await.unwrap();
    assert_eq!(sent, rockq::Sent::Appended(8));
    assert!(orders.submit(rockq::Message::new("o8").idempotency_key("k")).await.unwrap().is_duplicate());
    let later =
        orders.submit(rockq::Message::new("o9").deliver_after(Duration::from_secs(3600))).await.unwrap();
    assert!(matches!(later, rockq::Sent::Scheduled(_)));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_2_database_opens_and_delivers_what_it_holds() {
    let dir = copy_fixture("v2");
    check_format_1_content(dir.path()).await;
    let broker = open(dir.path()).await;
    // Delayed messages: one a year out (written at fixture time, so still pending), with its
    // key and headers; one cancelled before the fixture was taken.
    let reminders = broker.queue("reminders").await.unwrap();
    let pending = reminders.delayed(10).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!((pending[0].key.as_deref(), pending[0].payload_len), (Some("user-7"), 5));
    assert!(reminders.reschedule(pending[0].id, SystemTime::UNIX_EPOCH).await.unwrap().is_some());
    let mut sub = reminders.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(
        (d.payload().as_ref(), d.key(), d.header("h").map(|v| v.to_vec())),
        (&b"renew"[..], Some("user-7"), Some(b"v".to_vec()))
    );
    drop(sub);
    // The recurring schedule, its counters and its queue.
    let schedules = broker.schedules().await.unwrap();
    assert_eq!(schedules.len(), 1);
    let s = &schedules[0];
    assert_eq!(
        (s.name.as_str(), s.queue.as_str(), s.paused, s.recurrence.as_str()),
        ("nightly", "reports", true, "cron 0 0 3 * * *")
    );
    broker.resume_schedule("nightly").await.unwrap();
    assert!(broker.schedules().await.unwrap()[0].next.is_some());
    // Idempotency keys, remembered for a century, and the queue's window.
    let payments = broker.queue("payments").await.unwrap();
    assert_eq!(payments.dedup_window(), Duration::from_secs(100 * 365 * 24 * 3600));
    assert_eq!(
        payments.submit(rockq::Message::new("again").idempotency_key("order-1")).await.unwrap(),
        rockq::Sent::Duplicate(rockq::Original::Appended(1))
    );
    // Keyed messages: a group ordered by key held 1 (key a) when the process died; 2 (a) waits
    // behind it after the restart, 3 (b) does not.
    let ledger = broker.queue("ledger").await.unwrap();
    let group = ledger.work_group("books").unwrap().ordered_by_key(true).max_in_flight(10);
    let mut jobs = group.subscribe().await.unwrap();
    let first = next_job(&mut jobs).await;
    let second = next_job(&mut jobs).await;
    let mut got =
        [(first.seq(), first.key().map(str::to_owned)), (second.seq(), second.key().map(str::to_owned))];
    got.sort();
    assert_eq!(got, [(1, Some("a".to_string())), (3, Some("b".to_string()))]);
    first.ack_durable().await.unwrap();
    let third = next_job(&mut jobs).await;
    assert_eq!((third.seq(), third.key()), (2, Some("a")));
    third.ack_durable().await.unwrap();
    second.ack_durable().await.unwrap();
    drop(jobs);
    broker.shutdown().await.unwrap();
}

/// What both fixtures hold from format 1 on.
async fn check_format_1_content(path: &Path) {
    let broker = open(path).await;

    // Queues, their bounds and retention settings.
    let stats = broker.stats().await.unwrap();
    let q = |name: &str| stats.queues.iter().find(|q| q.name == name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!((q("orders").first_seq, q("orders").last_seq), (1, 6));
    assert_eq!(q("orders").retention, Retention::MaxLen(1000));
    assert_eq!((q("events").first_seq, q("events").last_seq), (3, 3), "trimmed head stays trimmed");
    assert_eq!(q("events").retention, Retention::UntilAcked);
    let g = |group: &str, queue: &str| {
        stats
            .groups
            .iter()
            .find(|g| g.group == group && g.queue == queue)
            .unwrap_or_else(|| panic!("{group}"))
    };
    assert!(g("audit", "orders").paused, "paused setting survives");
    assert_eq!(g("ship", "orders").mode, GroupMode::WorkQueue);
    assert_eq!(g("ship", "orders").dead_letter_queue.as_deref(), Some("ship.dlq"));
    // Written before work groups stored their lease and retry policy: none stored yet.
    assert_eq!((g("ship", "orders").lease, g("ship", "orders").retry_policy.as_ref()), (None, None));

    // Ordered group: offset past the dead letter, the delivery count of 4 continues.
    let orders = broker.queue("orders").await.unwrap();
    let billing = orders.group("billing").unwrap().max_deliveries(2).dead_letter_queue("billing.dlq");
    assert_eq!(billing.committed(), Some(3));
    let mut sub = billing.subscribe().await.unwrap();
    let ds = take(&mut sub, 3).await;
    let got: Vec<_> = ds
        .iter()
        .map(|d| (d.seq(), d.delivery_count(), String::from_utf8_lossy(d.payload()).into_owned()))
        .collect();
    assert_eq!(got, [(4, 2, "o4".into()), (5, 1, "o5".into()), (6, 1, "o6".into())]);
    for d in ds {
        d.ack().unwrap(); // dropped, 4 would use up its second delivery
    }
    assert_eq!(sub.commit().await.unwrap(), 6);
    drop(sub);

    // Every message of `orders`, headers and enqueue times included.
    let mut replay = orders.group("replay").unwrap().subscribe().await.unwrap();
    let all = take(&mut replay, 6).await;
    assert_eq!(payloads(&all), ["o1", "o2", "o3", "o4", "o5", "o6"]);
    assert_eq!(all[0].header("customer").map(|v| &v[..]), Some(&b"ada"[..]));
    assert!(all[1].headers().is_empty());
    let stamps: Vec<SystemTime> = all.iter().map(|d| d.enqueued_at()).collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "enqueue times in order: {stamps:?}");
    assert!(stamps[0] > SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    drop(replay);

    // Work group: 1 acked, 2 failed once ("boom"), 3 dead-lettered, 4 abandoned by a process
    // that died holding it (attempt counted); 5 and 6 never claimed.
    let pending = broker.pending("orders", "ship").await.unwrap();
    let p: Vec<_> = pending.iter().map(|c| (c.seq, c.attempt, c.state, c.last_error.clone())).collect();
    assert_eq!(
        p,
        [(2, 1, PendingState::Waiting, Some("boom".to_string())), (4, 1, PendingState::Expired, None)],
        "{pending:?}"
    );
    let ship = orders.work_group("ship").unwrap().lease(Duration::from_secs(30));
    assert_eq!(ship.committed(), Some(1));
    let mut jobs = ship.subscribe().await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..4 {
        let job = next_job(&mut jobs).await;
        claimed.push((job.seq(), job.attempt()));
        job.ack_durable().await.unwrap();
    }
    claimed.sort();
    assert_eq!(claimed, [(2, 2), (4, 2), (5, 1), (6, 1)]);
    drop(jobs);
    assert_eq!(ship.committed(), Some(6));
    // That subscribe stored the group's settings: its lease, the default policy, and the
    // dead-letter queue the old record named (not set on the handle).
    let stats = broker.stats().await.unwrap();
    let ship_stats = stats.groups.iter().find(|g| g.group == "ship").unwrap();
    assert_eq!(
        (ship_stats.lease, ship_stats.retry_policy.clone(), ship_stats.dead_letter_queue.as_deref()),
        (Some(Duration::from_secs(30)), Some(RetryPolicy::default()), Some("ship.dlq"))
    );

    // Dead letters of both kinds, with their origin.
    for (dlq, seq, reason) in [("billing.dlq", 3, "deliveries used up"), ("ship.dlq", 3, "bad")] {
        let letters = broker.dead_letters(dlq).await.unwrap().list(10).await.unwrap();
        assert_eq!(letters.len(), 1, "{dlq}");
        let d = &letters[0];
        assert_eq!((d.queue.as_deref(), d.seq, &d.payload[..]), (Some("orders"), Some(seq), &b"o3"[..]));
        assert!(d.reason.contains(reason), "{dlq}: {}", d.reason);
    }

    // `events`: the group that held the head back still starts after it.
    let events = broker.queue("events").await.unwrap();
    let mut sub = events.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 3);
    drop(sub);

    // And the database takes new writes after the old ones.
    assert_eq!(orders.send("o7").await.unwrap(), 7);
    broker.shutdown().await.unwrap();
}

/// Writes the fixture (see the module docs). Ignored: run by hand only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes a fixture; run by hand with ROCKQ_WRITE_FIXTURE=<folder>"]
async fn write_fixture() {
    let out = PathBuf::from(std::env::var("ROCKQ_WRITE_FIXTURE").expect("ROCKQ_WRITE_FIXTURE=<folder>"));
    assert!(!out.exists(), "{} exists: fixtures are written once", out.display());
    let dir = tempdir();
    let broker = open(dir.path()).await;

    let orders = broker.queue("orders").await.unwrap();
    orders.set_retention(Retention::MaxLen(1000)).await.unwrap();
    orders.send(rockq::Message::new("o1").header("customer", "ada")).await.unwrap();
    orders.send_batch(["o2", "o3", "o4", "o5", "o6"]).await.unwrap();

    // Ordered: 1 and 2 acked, 3 dead-lettered after two deliveries, 4 handed back once.
    let billing = orders.group("billing").unwrap().max_deliveries(2).dead_letter_queue("billing.dlq");
    let mut sub = billing.subscribe().await.unwrap();
    let mut ds = take(&mut sub, 4).await;
    let d4 = ds.pop().unwrap();
    let d3 = ds.pop().unwrap();
    for d in ds {
        d.ack().unwrap();
    }
    d3.nack();
    let d3 = next(&mut sub).await;
    assert_eq!((d3.seq(), d3.delivery_count()), (3, 2));
    d3.nack(); // the last delivery: dead-lettered
    drop(d4); // counted: came back once
    assert_eq!(sub.commit().await.unwrap(), 3);
    drop(sub);

    // A paused ordered group.
    orders.group("audit").unwrap().subscribe().await.unwrap();
    broker.pause_group("orders", "audit").await.unwrap();

    // Work group: ack 1, fail 2 (retry due a second later), dead-letter 3, hold 4 and "die".
    let ship = orders
        .work_group("ship")
        .unwrap()
        .lease(Duration::from_secs(1)) // long gone when the fixture is read
        .read_batch(1)
        .max_in_flight(4)
        .dead_letter_queue("ship.dlq")
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(0.0),
        );
    let mut jobs = ship.subscribe().await.unwrap();
    let j1 = next_job(&mut jobs).await;
    let j2 = next_job(&mut jobs).await;
    let j3 = next_job(&mut jobs).await;
    let j4 = next_job(&mut jobs).await;
    assert_eq!([j1.seq(), j2.seq(), j3.seq(), j4.seq()], [1, 2, 3, 4]);
    j1.ack_durable().await.unwrap();
    j2.fail_durable("boom").await.unwrap();
    j3.dead_letter_durable("bad").await.unwrap();
    std::mem::forget(j4); // as if the process died holding it
    std::mem::forget(jobs);

    // `events`: UntilAcked, 2 of 3 acked, trimmed.
    let events = broker.queue("events").await.unwrap();
    events.set_retention(Retention::UntilAcked).await.unwrap();
    events.send_batch(["e1", "e2", "e3"]).await.unwrap();
    let mut sub = events.group("g").unwrap().subscribe().await.unwrap();
    let ds = take(&mut sub, 2).await;
    for d in ds {
        d.ack().unwrap();
    }
    assert_eq!(sub.commit().await.unwrap(), 2);
    drop(sub);
    broker.trim().await.unwrap();
    assert_eq!(events.first_seq(), 3);

    // Format 2. Delayed messages: one a year out (with a key and a header), one cancelled.
    let reminders = broker.queue("reminders").await.unwrap();
    let year = Duration::from_secs(365 * 24 * 3600);
    reminders
        .submit(rockq::Message::new("renew").key("user-7").header("h", "v").deliver_after(year))
        .await
        .unwrap();
    let gone = reminders.submit(rockq::Message::new("gone").deliver_after(year)).await.unwrap();
    let rockq::Sent::Scheduled(gone) = gone else { panic!("{gone:?}") };
    assert!(reminders.cancel(gone.id).await.unwrap());
    // A recurring schedule, paused.
    broker
        .schedule("nightly", rockq::Recurrence::cron("0 0 3 * * *").unwrap(), "reports", "build")
        .await
        .unwrap();
    broker.pause_schedule("nightly").await.unwrap();
    // An idempotency key remembered for a century.
    let payments = broker.queue("payments").await.unwrap();
    payments.set_dedup_window(Duration::from_secs(100 * 365 * 24 * 3600)).await.unwrap();
    payments.submit(rockq::Message::new("charge").idempotency_key("order-1")).await.unwrap();
    // Keyed messages; a group ordered by key holds the first when the process "dies".
    let ledger = broker.queue("ledger").await.unwrap();
    ledger
        .send_batch([
            rockq::Message::new("a1").key("a"),
            rockq::Message::new("a2").key("a"),
            rockq::Message::new("b1").key("b"),
        ])
        .await
        .unwrap();
    let books = ledger
        .work_group("books")
        .unwrap()
        .ordered_by_key(true)
        .lease(Duration::from_secs(1))
        .read_batch(1)
        .max_in_flight(1);
    let mut held = books.subscribe().await.unwrap();
    let j = next_job(&mut held).await;
    assert_eq!(j.seq(), 1);
    std::mem::forget(j);
    std::mem::forget(held);
    broker.shutdown().await.unwrap();

    // Everything but RocksDB's info logs and lock file.
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "LOCK" || name.starts_with("LOG") {
            continue;
        }
        std::fs::copy(entry.path(), out.join(&name)).unwrap();
    }
}
