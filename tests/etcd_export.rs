//! Export of an etcd namespace (`Broker::export` on the etcd engine) against a real
//! single-member etcd, imported into an embedded database: the embedded database holds what
//! the namespace held — queues with trimmed heads, messages with keys and headers, ordered and
//! work groups' offsets, claims with their attempts and errors, dead letters and redrive
//! cursors, idempotency keys — and goes on from there as the namespace would have.

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use rockq::{Broker, EtcdOptions, ManualClock, Message, Original, Sent};

use common::{HANG_GUARD, lasting_stats, open_clock, orders_mid_work, tempdir};

async fn next_job(jobs: &mut rockq::WorkSubscription) -> rockq::Job {
    tokio::time::timeout(HANG_GUARD, jobs.next()).await.expect("a job in time").expect("open").expect("a job")
}

/// What a broker shows of its state, on either engine.
async fn contents(broker: &Broker) -> String {
    let stats = lasting_stats(broker).await;
    let queues: Vec<_> =
        stats.queues.iter().map(|q| (q.name.clone(), q.first_seq, q.last_seq, q.len)).collect();
    let groups: Vec<_> =
        stats.groups.iter().map(|g| (g.group.clone(), g.queue.clone(), g.committed, g.paused)).collect();
    let pending: Vec<_> = broker
        .pending("jobs", "workers")
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.seq, p.attempt, p.last_error))
        .collect();
    let mut messages = Vec::new();
    for q in &stats.queues {
        for m in broker.peek(&q.name, None, 100).await.unwrap() {
            messages.push(format!(
                "{}#{} {:?} {:?} {:?} {:?}",
                q.name, m.seq, m.payload, m.headers, m.key, m.enqueued_at
            ));
        }
    }
    format!("{queues:?}\n{groups:?}\n{pending:?}\n{messages:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_namespace_exported_and_imported_into_an_embedded_database_is_the_same_state() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let opts = EtcdOptions::new()
        .owner_ttl(Duration::from_secs(2))
        .options(rockq::Options::new().clock(clock.clone()).retention_interval(Duration::ZERO));
    let broker = Broker::connect_etcd(cluster.endpoints(), "moving", opts).await.unwrap();

    orders_mid_work(&broker).await;
    let trimmed = broker.queue("trimmed").await.unwrap();
    trimmed.send_batch(["t1", "t2", "t3"]).await.unwrap();
    broker.purge_queue("trimmed").await.unwrap();
    trimmed.send("t4").await.unwrap();
    // A work group: a dead letter, a failed job waiting for its retry, and a leased one.
    let (js, held) = common::jobs_mid_work(&broker).await;
    // A dead-letter queue redriven in part: its cursor (after letter 1), and letter 3 settled
    // on its own (a mark); letter 2 is still to be redriven.
    let mail = broker.queue("mail").await.unwrap();
    mail.send_batch(["m1", "m2", "m3"]).await.unwrap();
    let mut senders = mail.work_group("senders").unwrap().subscribe().await.unwrap();
    for _ in 0..3 {
        next_job(&mut senders).await.dead_letter_durable("bounced").await.unwrap();
    }
    drop(senders);
    let mail_dlq = broker.dead_letters("mail.dlq").await.unwrap();
    assert_eq!(mail_dlq.redrive(rockq::Redrive::new().limit(1)).await.unwrap(), 1);
    mail_dlq.delete(3).await.unwrap();
    // A keyspace: entries at etcd's revisions, one deleted.
    let accounts = broker.kv("accounts").await.unwrap();
    let alice = accounts.put("alice", "10").await.unwrap();
    accounts.put("bob", "20").await.unwrap();
    accounts.delete("bob").await.unwrap();
    let carol = accounts.put("carol", "30").await.unwrap();
    broker.kv("empty").await.unwrap();
    broker.flush().await.unwrap();

    let before = contents(&broker).await;
    let dir = tempdir();
    let file = dir.path().join("moving.jsonl");
    let report = broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    assert_eq!(report.bytes, std::fs::metadata(&file).unwrap().len());
    assert_eq!((report.queues, report.idempotency_keys), (6, 1), "{report:?}");
    let kinds: std::collections::BTreeSet<String> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["t"].as_str().unwrap().to_owned())
        .collect();
    for kind in [
        "header", "queue", "message", "group", "offset", "claim", "redrive", "letter", "dedup", "keyspace",
        "entry", "counter", "end",
    ] {
        assert!(kinds.contains(kind), "no {kind} line in {kinds:?}");
    }
    let header: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&file).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(header["source"], "etcd");
    drop(js);
    drop(held);
    broker.shutdown().await.unwrap();

    let into = dir.path().join("embedded");
    let read = Broker::import(std::fs::File::open(&file).unwrap(), &into).await.unwrap();
    assert_eq!(read.records, report.records);
    let embedded = open_clock(&into, &clock).await;
    assert_eq!(contents(&embedded).await, before, "the embedded database holds what the namespace held");
    // The keyspaces, their entries at the revisions etcd gave them; a write goes on above.
    assert_eq!(embedded.kv_names(), ["accounts", "empty"]);
    let accounts = embedded.get_kv("accounts").unwrap();
    let entries: Vec<(String, String, u64)> =
        futures::TryStreamExt::try_collect::<Vec<_>>(accounts.scan::<&[u8], _>(..))
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    String::from_utf8(e.key.to_vec()).unwrap(),
                    String::from_utf8(e.value.to_vec()).unwrap(),
                    e.revision,
                )
            })
            .collect();
    assert_eq!(entries, [("alice".into(), "10".into(), alice), ("carol".into(), "30".into(), carol)]);
    assert_eq!(accounts.len(), 2);
    assert!(accounts.put("dave", "40").await.unwrap() > carol);
    accounts.compare_and_set("alice", rockq::Expect::Revision(alice), Some("11")).await.unwrap();

    // And goes on from there: the key is remembered, sequences follow, attempts survive.
    let orders = embedded.queue("orders").await.unwrap();
    assert_eq!(
        orders.submit(Message::new("again").idempotency_key("order-9")).await.unwrap(),
        Sent::Duplicate(Original::Appended(7))
    );
    assert_eq!(orders.send("o8").await.unwrap(), 8);
    assert_eq!(embedded.queue("trimmed").await.unwrap().send("t5").await.unwrap(), 5);
    clock.advance(Duration::from_secs(31));
    let mut js =
        embedded.queue("jobs").await.unwrap().work_group("workers").unwrap().subscribe().await.unwrap();
    let mut got = BTreeMap::new();
    for _ in 0..3 {
        let j = next_job(&mut js).await;
        got.insert(j.seq(), j.attempt());
        j.ack_durable().await.unwrap();
    }
    assert_eq!(got, BTreeMap::from([(2, 2), (3, 2), (4, 1)]));
    drop(js);
    let dlq = embedded.dead_letters("jobs.dlq").await.unwrap();
    assert_eq!(dlq.len().await.unwrap(), 1);
    // The redrive cursor and the mark came along: letter 2 alone is left to move.
    let mail_dlq = embedded.dead_letters("mail.dlq").await.unwrap();
    let left: Vec<_> = mail_dlq.list(10).await.unwrap().iter().map(|d| d.dlq_seq).collect();
    assert_eq!(left, [2]);
    assert_eq!(mail_dlq.redrive(rockq::Redrive::new()).await.unwrap(), 1);
    assert_eq!(mail_dlq.redrive(rockq::Redrive::new()).await.unwrap(), 0);
    embedded.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_moves_embedded_to_etcd_and_back_with_its_state() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let dir = tempdir();
    let embedded = open_clock(&dir.path().join("one-machine"), &clock).await;

    // What a service on one machine has: ordered and work groups in the middle of their work.
    orders_mid_work(&embedded).await;
    embedded.pause_group("orders", "billing").await.unwrap();
    let (js, held) = common::jobs_mid_work(&embedded).await;
    // A dead letter settled on its own (a mark above the cursor).
    let returns = embedded.queue("returns.dlq").await.unwrap();
    returns.send_batch(["r1", "r2", "r3"]).await.unwrap();
    embedded.dead_letters("returns.dlq").await.unwrap().delete(2).await.unwrap();
    // A group that keeps job outcomes, with one kept (and its result).
    let reports = embedded.queue("reports").await.unwrap();
    reports.send("build report").await.unwrap();
    let makers = reports.work_group("makers").unwrap().keep_outcomes(Duration::from_secs(3600));
    let mut ms = makers.subscribe().await.unwrap();
    let j = next_job(&mut ms).await;
    j.set_result("report.pdf").unwrap();
    j.ack_durable().await.unwrap();
    drop(ms);
    let accounts = embedded.kv("accounts").await.unwrap();
    accounts.put("alice", "10").await.unwrap();
    accounts.put("bob", vec![0u8, 255]).await.unwrap();
    let before = contents(&embedded).await;
    let file = dir.path().join("to-etcd.jsonl");
    let exported = embedded.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    drop((js, held));
    embedded.shutdown().await.unwrap();

    // Into etcd: the namespace holds the same state, and every instance sees it.
    let report = Broker::import_etcd(
        std::fs::File::open(&file).unwrap(),
        cluster.endpoints(),
        "grown",
        EtcdOptions::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (report.records, report.messages, report.claims),
        (exported.records, exported.messages, exported.claims)
    );
    assert_eq!(
        report.path.as_deref().map(|p| p.display().to_string()),
        Some(format!("etcd://{}/grown", cluster.endpoints()[0]))
    );
    let opts = || {
        EtcdOptions::new()
            .owner_ttl(Duration::from_secs(2))
            // Retention only when the test asks: a background pass may trim the acked head of
            // `orders` at any moment, between two reads compared (a flake seen in CI).
            .options(rockq::Options::new().clock(clock.clone()).retention_interval(Duration::ZERO))
    };
    let a = Broker::connect_etcd(cluster.endpoints(), "grown", opts()).await.unwrap();
    let b = Broker::connect_etcd(cluster.endpoints(), "grown", opts()).await.unwrap();
    assert_eq!(contents(&a).await, before, "the namespace holds what the embedded database held");
    assert_eq!(contents(&b).await, before);
    let letters = |ls: Vec<rockq::DeadLetter>| ls.iter().map(|d| d.dlq_seq).collect::<Vec<_>>();
    let listed = letters(a.dead_letters("returns.dlq").await.unwrap().list(10).await.unwrap());
    assert_eq!(listed, [1, 3], "letter 2 stays settled");
    b.dead_letters("returns.dlq").await.unwrap().delete(3).await.unwrap();
    let result = |s: rockq::JobStatus| s.outcome.and_then(|o| o.result);
    let kept = result(b.job("reports", "makers", 1).await.unwrap());
    assert_eq!(kept.as_deref(), Some(&b"report.pdf"[..]), "the kept outcome came along");
    // The keyspace, in every instance: keys and values kept, revisions etcd's own; a
    // compare-and-set on a revision read there fences the other instance.
    let (ka, kb) = (a.get_kv("accounts").unwrap(), b.get_kv("accounts").unwrap());
    assert_eq!((ka.len(), kb.len()), (2, 2));
    assert_eq!(kb.get("bob").await.unwrap().unwrap().value.as_ref(), [0u8, 255]);
    let alice = ka.get("alice").await.unwrap().unwrap();
    assert_eq!(alice.value.as_ref(), b"10");
    kb.compare_and_set("alice", rockq::Expect::Revision(alice.revision), Some("11")).await.unwrap();
    assert!(
        ka.compare_and_set("alice", rockq::Expect::Revision(alice.revision), Some("12"))
            .await
            .unwrap_err()
            .is_conflict()
    );
    ka.put("carol", "30").await.unwrap();
    assert!(a.kv("more").await.is_ok(), "a keyspace made after the import gets a fresh id");
    a.get_kv("more").unwrap().put("k", "v").await.unwrap();
    assert_eq!(ka.len(), 3);
    // It goes on there as it would have: the key is remembered across instances, sequences
    // follow, the paused group stays paused, attempts survive.
    let orders_b = b.queue("orders").await.unwrap();
    assert_eq!(
        orders_b.submit(Message::new("again").idempotency_key("order-9")).await.unwrap(),
        Sent::Duplicate(Original::Appended(7))
    );
    assert_eq!(a.queue("orders").await.unwrap().send("o8").await.unwrap(), 8);
    assert!(a.stats().await.unwrap().groups.iter().any(|g| g.group == "billing" && g.paused));
    clock.advance(Duration::from_secs(31));
    // One job at a time, and the group paused once it has it: nothing else is claimed.
    let one = b.queue("jobs").await.unwrap().work_group("workers").unwrap().read_batch(1).max_in_flight(1);
    let mut js = one.subscribe().await.unwrap();
    let j = next_job(&mut js).await;
    assert_eq!((j.seq(), j.attempt()), (2, 2), "the failed job's next attempt");
    b.pause_group("jobs", "workers").await.unwrap();
    j.fail_durable("still down").await.unwrap();
    drop(js);
    b.flush().await.unwrap();
    let middle = contents(&b).await;

    // And back: an export of the namespace imported into a new embedded database.
    let back = dir.path().join("back.jsonl");
    a.export(std::fs::File::create(&back).unwrap()).await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    let again = dir.path().join("again");
    Broker::import(std::fs::File::open(&back).unwrap(), &again).await.unwrap();
    let embedded = open_clock(&again, &clock).await;
    assert_eq!(contents(&embedded).await, middle, "back on one machine with the namespace's state");
    let accounts = embedded.get_kv("accounts").unwrap();
    let values: Vec<(rockq::Bytes, rockq::Bytes)> =
        futures::TryStreamExt::try_collect::<Vec<_>>(accounts.scan::<&[u8], _>(..))
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect();
    let bytes = |s: &'static [u8]| rockq::Bytes::from_static(s);
    let expected =
        [(bytes(b"alice"), bytes(b"11")), (bytes(b"bob"), bytes(&[0, 255])), (bytes(b"carol"), bytes(b"30"))];
    assert_eq!(values, expected);
    assert_eq!(embedded.get_kv("more").unwrap().get("k").await.unwrap().unwrap().value.as_ref(), b"v");
    let returns = embedded.dead_letters("returns.dlq").await.unwrap();
    assert_eq!(letters(returns.list(10).await.unwrap()), [1], "settled in etcd, settled here");
    assert_eq!(returns.len().await.unwrap(), 1);
    let kept = result(embedded.job("reports", "makers", 1).await.unwrap());
    assert_eq!(kept.as_deref(), Some(&b"report.pdf"[..]), "and back");
    embedded.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_into_etcd_keeps_priorities_and_work_group_limits_and_refuses_a_namespace_in_use() {
    let cluster = etcd::Cluster::start(1).await;
    let dir = tempdir();
    // Prioritised messages: their index entries rebuilt from the envelopes.
    let other = common::open(&dir.path().join("prio")).await;
    let q = other.queue("q").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    q.send(Message::new("urgent").priority(9)).await.unwrap();
    let with_priority = dir.path().join("with-priority.jsonl");
    other.export(std::fs::File::create(&with_priority).unwrap()).await.unwrap();
    other.shutdown().await.unwrap();
    // Groups with a per-key limit, and with rate and concurrency limits, are carried over.
    let keyed = common::open(&dir.path().join("keyed")).await;
    let kq = keyed.queue("q").await.unwrap();
    drop(kq.work_group("tenants").unwrap().per_key_limit(2).subscribe().await.unwrap());
    let rate = rockq::RateLimit::per_second(5).burst(2);
    drop(kq.work_group("capped").unwrap().concurrency_limit(2).rate_limit(rate).subscribe().await.unwrap());
    let with_per_key = dir.path().join("with-per-key.jsonl");
    keyed.export(std::fs::File::create(&with_per_key).unwrap()).await.unwrap();
    keyed.shutdown().await.unwrap();

    let mut client = cluster.client().await;
    Broker::import_etcd(
        std::fs::File::open(&with_priority).unwrap(),
        cluster.endpoints(),
        "prio",
        EtcdOptions::new(),
    )
    .await
    .unwrap();
    let b = Broker::connect_etcd(cluster.endpoints(), "prio", EtcdOptions::new()).await.unwrap();
    let mut sub = b.queue("q").await.unwrap().work_group("w").unwrap().subscribe().await.unwrap();
    assert_eq!(b.job("q", "w", 3).await.unwrap().priority, 9, "read from the index rebuilt in etcd");
    let mut got = Vec::new();
    for _ in 0..3 {
        let j = tokio::time::timeout(common::HANG_GUARD, sub.next()).await.unwrap().unwrap().unwrap();
        got.push(String::from_utf8_lossy(j.payload()).into_owned());
        j.ack().unwrap();
    }
    assert_eq!(got, ["urgent", "a", "b"], "claimed by priority, as before the export");
    drop(sub);
    b.shutdown().await.unwrap();

    Broker::import_etcd(
        std::fs::File::open(&with_per_key).unwrap(),
        cluster.endpoints(),
        "per-key",
        EtcdOptions::new(),
    )
    .await
    .unwrap();
    let b = Broker::connect_etcd(cluster.endpoints(), "per-key", EtcdOptions::new()).await.unwrap();
    let groups = b.stats().await.unwrap().groups;
    assert_eq!(
        groups
            .iter()
            .map(|g| (g.group.as_str(), g.per_key_limit, g.concurrency_limit, g.rate_limit))
            .collect::<Vec<_>>(),
        [("capped", None, Some(2), Some(rate)), ("tenants", Some(2), None, None)]
    );
    b.shutdown().await.unwrap();

    // A namespace in use is not an import's target.
    let used = Broker::connect_etcd(cluster.endpoints(), "used", EtcdOptions::new()).await.unwrap();
    used.queue("x").await.unwrap().send("x").await.unwrap();
    let small = small_file(dir.path()).await;
    let e = Broker::import_etcd(
        std::fs::File::open(&small).unwrap(),
        cluster.endpoints(),
        "used",
        EtcdOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, rockq::Error::Invalid { .. }), "{e}");
    assert_eq!(used.stats().await.unwrap().queues.len(), 1);
    used.shutdown().await.unwrap();

    // A stopped import's mark: connecting is refused until an import clears it.
    client.put("stopped/meta/importing", "rockq import", None).await.unwrap();
    client.put("stopped/q/half", "x", None).await.unwrap();
    let e = Broker::connect_etcd(cluster.endpoints(), "stopped", EtcdOptions::new()).await.err().unwrap();
    assert!(e.to_string().contains("import"), "{e}");
    Broker::import_etcd(
        std::fs::File::open(&small).unwrap(),
        cluster.endpoints(),
        "stopped",
        EtcdOptions::new(),
    )
    .await
    .unwrap();
    let b = Broker::connect_etcd(cluster.endpoints(), "stopped", EtcdOptions::new()).await.unwrap();
    let names: Vec<_> = b.stats().await.unwrap().queues.into_iter().map(|q| (q.name, q.len)).collect();
    assert_eq!(names, [("s".to_owned(), 2)]);
    b.shutdown().await.unwrap();
}

/// An export of one queue `s` with two messages.
async fn small_file(dir: &std::path::Path) -> std::path::PathBuf {
    let broker = common::open(&dir.join("small")).await;
    broker.queue("s").await.unwrap().send_batch(["1", "2"]).await.unwrap();
    let file = dir.join("small.jsonl");
    broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    broker.shutdown().await.unwrap();
    file
}

/// Delayed messages and recurring schedules move both ways: embedded → file → etcd (listed
/// with their ids and due times, fired there when due, ids never handed out again) → file →
/// embedded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_go_through_export_and_import_both_ways() {
    let cluster = etcd::Cluster::start(1).await;
    let dir = tempdir();
    let clock = rockq::ManualClock::new();
    let embedded = common::open_clock(&dir.path().join("db"), &clock).await;
    let q = embedded.queue("q").await.unwrap();
    q.send("now").await.unwrap();
    let later = match q
        .submit(Message::new("later").key("k").deliver_after(Duration::from_secs(60)))
        .await
        .unwrap()
    {
        rockq::Sent::Scheduled(s) => s,
        other => panic!("expected scheduled, got {other:?}"),
    };
    embedded.schedule("tick", Duration::from_secs(90), "q", "t").await.unwrap();
    let file = dir.path().join("delayed.jsonl");
    embedded.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    embedded.shutdown().await.unwrap();

    Broker::import_etcd(
        std::fs::File::open(&file).unwrap(),
        cluster.endpoints(),
        "delays",
        EtcdOptions::new(),
    )
    .await
    .unwrap();
    let opts = EtcdOptions::new().options(rockq::Options::new().clock(clock.clone()));
    let on_etcd = Broker::connect_etcd(cluster.endpoints(), "delays", opts).await.unwrap();
    let listed = on_etcd.delayed(Some("q"), 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| (d.id, d.due, d.key.as_deref())).collect::<Vec<_>>(),
        [(later.id, later.due, Some("k"))]
    );
    let schedules = on_etcd.schedules().await.unwrap();
    assert_eq!(schedules.iter().map(|s| (s.name.as_str(), s.fired)).collect::<Vec<_>>(), [("tick", 0)]);
    let back = dir.path().join("back.jsonl");
    on_etcd.export(std::fs::File::create(&back).unwrap()).await.unwrap();
    let q = on_etcd.queue("q").await.unwrap();
    let fresh = match q.submit(Message::new("x").deliver_after(Duration::from_secs(600))).await.unwrap() {
        rockq::Sent::Scheduled(s) => s,
        other => panic!("expected scheduled, got {other:?}"),
    };
    assert!(fresh.id > later.id, "ids the file named are not handed out again");
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let first = tokio::time::timeout(common::HANG_GUARD, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.seq(), 1);
    first.ack().unwrap();
    clock.advance(Duration::from_secs(61));
    let d = tokio::time::timeout(common::HANG_GUARD, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(
        (d.seq(), d.payload().as_ref(), d.key()),
        (2, &b"later"[..], Some("k")),
        "fired on etcd when due"
    );
    d.ack().unwrap();
    clock.advance(Duration::from_secs(30));
    let d = tokio::time::timeout(common::HANG_GUARD, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((d.seq(), d.payload().as_ref()), (3, &b"t"[..]), "the schedule fired on etcd");
    d.ack().unwrap();
    assert_eq!(on_etcd.schedules().await.unwrap()[0].fired, 1);
    drop(sub);
    on_etcd.shutdown().await.unwrap();

    // The file etcd wrote (before the firing) holds it too: imported embedded, it is listed.
    let again = dir.path().join("again");
    Broker::import(std::fs::File::open(&back).unwrap(), &again).await.unwrap();
    let embedded = common::open(&again).await;
    let listed = embedded.delayed(Some("q"), 10).await.unwrap();
    assert_eq!(listed.iter().map(|d| (d.id, d.due)).collect::<Vec<_>>(), [(later.id, later.due)]);
    let schedules = embedded.schedules().await.unwrap();
    assert_eq!(schedules.iter().map(|s| (s.name.as_str(), s.fired)).collect::<Vec<_>>(), [("tick", 0)]);
    embedded.shutdown().await.unwrap();
}

/// What etcd could never fire is refused by the import, as a submit or a schedule's upsert on
/// etcd refuses it, instead of being written and then failing at every firing: a recurring
/// schedule whose message is over a quarter of a transaction (the embedded engine takes it),
/// and a message larger than a transaction. Nothing is left in the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_refuses_a_schedule_etcd_could_never_fire_and_leaves_nothing() {
    let cluster = etcd::Cluster::start(1).await;
    let dir = tempdir();
    let embedded = common::open(&dir.path().join("db")).await;
    embedded.queue("q").await.unwrap().send("kept?").await.unwrap();
    embedded.schedule("big", Duration::from_secs(60), "q", vec![7u8; 300 * 1024]).await.unwrap();
    let file = dir.path().join("big.jsonl");
    embedded.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    embedded.shutdown().await.unwrap();

    let e = Broker::import_etcd(
        std::fs::File::open(&file).unwrap(),
        cluster.endpoints(),
        "big",
        EtcdOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(e.unsupported().is_some_and(|u| u.engine() == "etcd"), "{e}");
    let mut client = cluster.client().await;
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    assert_eq!(client.get("big/", Some(opts)).await.unwrap().count(), 0, "the namespace is left empty");

    // Nor a message larger than one transaction (2 MiB: the embedded engine takes up to
    // 64 MiB when so configured), which a send on etcd refuses: `Unsupported`, not etcd's
    // request limit.
    let embedded =
        rockq::Options::new().max_message_bytes(4 << 20).open(dir.path().join("db2")).await.unwrap();
    embedded.queue("q").await.unwrap().send(vec![7u8; 2 << 20]).await.unwrap();
    let file = dir.path().join("huge.jsonl");
    embedded.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    embedded.shutdown().await.unwrap();
    let e = Broker::import_etcd(
        std::fs::File::open(&file).unwrap(),
        cluster.endpoints(),
        "huge",
        EtcdOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(e.unsupported().is_some_and(|u| u.engine() == "etcd"), "{e}");
    let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
    assert_eq!(client.get("huge/", Some(opts)).await.unwrap().count(), 0, "the namespace is left empty");
}
