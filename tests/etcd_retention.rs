//! Retention on the etcd engine, against a real single-member etcd: a policy set by one broker
//! (as another process would) is the namespace's; a trim by any broker deletes a queue's head in
//! one transaction and every broker's subscriptions and work groups move past it; `UntilAcked`
//! waits for the slowest group of every broker; etcd's history is compacted only past a
//! window. The embedded retention suite runs against etcd too (`scripts/etcd-semantics.sh`).

mod common;
#[path = "common/etcd.rs"]
mod etcd;

use std::time::Duration;

use rockq::{Broker, EtcdOptions, Event, ManualClock, Retention};

use common::HANG_GUARD;

async fn connect(cluster: &etcd::Cluster, ns: &str, clock: &ManualClock) -> Broker {
    let opts = EtcdOptions::new()
        .options(rockq::Options::new().clock(clock.clone()).retention_interval(Duration::ZERO));
    Broker::connect_etcd(cluster.endpoints(), ns, opts).await.expect("connect to etcd")
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_and_a_trim_by_one_broker_reach_the_other_whose_readers_skip_the_deleted_head() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "trim", &clock).await, connect(&cluster, "trim", &clock).await);
    let qa = a.queue("q").await.unwrap();
    for i in 1..=20 {
        qa.send(format!("m{i}")).await.unwrap();
    }
    // `b` holds an ordered group and a work group, both behind.
    let qb = b.queue("q").await.unwrap();
    let mut ordered = qb.group("g").unwrap().read_batch(1).subscribe().await.unwrap();
    let first = common::next(&mut ordered).await;
    assert_eq!(first.seq(), 1);
    first.ack().unwrap();
    b.flush().await.unwrap();
    let mut jobs = qb.work_group("w").unwrap().subscribe().await.unwrap();
    let job = common::next_job(&mut jobs).await;
    assert_eq!(job.seq(), 1);
    let mut events = a.events();

    // `a` sets the policy; `b` learns it through its watch.
    qa.set_retention(Retention::MaxLen(5)).await.unwrap();
    wait_until("b learns the policy", || qb.retention() == Retention::MaxLen(5)).await;
    let report = a.trim().await.unwrap();
    assert_eq!(report.trimmed, [("q".to_owned(), 15, 16)]);
    assert_eq!(qa.first_seq(), 16);
    wait_until("b learns the new head", || qb.first_seq() == 16).await;
    // The work group behind was moved past the cut in the same transaction, reported as
    // skipped; the lease `b` held on 1 is gone with it: its ack is refused.
    let skipped = common::wait_event(&mut events, |e| matches!(e, Event::Skipped { .. })).await;
    assert!(
        matches!(skipped, Event::Skipped { ref group, from: 1, to: 15, .. } if &**group == "w"),
        "{skipped:?}"
    );
    assert!(job.ack_durable().await.is_err(), "a claim deleted by the trim cannot be settled");
    let j = common::next_job(&mut jobs).await;
    assert_eq!(j.seq(), 16, "the work group continues after the cut");
    j.ack_durable().await.unwrap();
    // The ordered subscription skips to the new head (after the one message it may have read
    // ahead before the trim, as embedded: what was read is delivered).
    let mut d = common::next(&mut ordered).await;
    if d.seq() == 2 {
        d.ack().unwrap();
        d = common::next(&mut ordered).await;
    }
    assert_eq!(d.seq(), 16, "the ordered subscription skips the deleted head");
    d.ack().unwrap();
    b.flush().await.unwrap();
    // What is left is what etcd holds: five messages from 16.
    let stats = b.stats().await.unwrap();
    let q = stats.queues.iter().find(|q| q.name == "q").unwrap();
    assert_eq!((q.first_seq, q.last_seq, q.len), (16, 20, 5));
    let peeked = b.peek("q", None, 100).await.unwrap();
    assert_eq!(peeked.iter().map(|m| m.seq).collect::<Vec<_>>(), (16..=20).collect::<Vec<_>>());
    // A second pass, by either broker, has nothing left to do.
    assert_eq!(b.trim().await.unwrap().deleted, 0);
    drop((ordered, jobs));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Regression (a review of the engine): the `MaxAge` scan sized each page of messages from the
/// page before and read it with a plain read. A small message followed by large ones made a
/// page of 1,024 messages outgrow the client's 4 MiB answer limit, which failed every later
/// pass at the same place: no queue of the namespace was trimmed again. A page that does not
/// fit is now asked again for fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_age_cut_past_a_small_message_and_many_large_ones_is_found() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let broker = connect(&cluster, "age", &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send(vec![b's'; 200]).await.unwrap();
    let large = 1_100u64;
    for _ in 0..large / 100 {
        q.send_batch((0..100).map(|_| vec![b'L'; 8 << 10])).await.unwrap();
    }
    q.set_retention(Retention::MaxAge(Duration::from_secs(60))).await.unwrap();
    clock.advance(Duration::from_secs(120));
    let report = broker.trim().await.expect("the pass finds the cut");
    assert_eq!(report.trimmed, [("q".to_owned(), large + 1, large + 2)]);
    assert_eq!(q.first_seq(), large + 2);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_acked_keeps_what_any_brokers_group_has_not_finished() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let (a, b) = (connect(&cluster, "acked", &clock).await, connect(&cluster, "acked", &clock).await);
    let qa = a.queue("q").await.unwrap();
    for i in 1..=10 {
        qa.send(format!("m{i}")).await.unwrap();
    }
    // `a`'s ordered group finishes 1..=8; `b`'s work group finishes 1..=3 and holds 4.
    let mut sub = qa.group("fast").unwrap().subscribe().await.unwrap();
    for _ in 0..8 {
        common::next(&mut sub).await.ack().unwrap();
    }
    a.flush().await.unwrap();
    let qb = b.queue("q").await.unwrap();
    let mut jobs = qb.work_group("slow").unwrap().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    for _ in 0..3 {
        common::next_job(&mut jobs).await.ack_durable().await.unwrap();
    }
    let held = common::next_job(&mut jobs).await;
    assert_eq!(held.seq(), 4);
    // The default policy: only what both finished goes, whichever broker trims.
    let report = a.trim().await.unwrap();
    assert_eq!(report.deleted, 3);
    assert_eq!(qa.first_seq(), 4);
    assert_eq!(b.trim().await.unwrap().deleted, 0);
    held.ack_durable().await.unwrap();
    assert_eq!(b.trim().await.unwrap().deleted, 1);
    wait_until("a learns the new head", || qa.first_seq() == 5).await;
    drop((sub, jobs));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// etcd keeps the history of deleted keys until it is compacted: a pass compacts only to the
/// revision its passes saw [`COMPACT_WINDOW`](5 minutes) earlier, so recent history stays
/// readable (a watch behind, an append whose answer was lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_the_last_window_of_history_and_drops_what_is_older() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let broker = connect(&cluster, "compact", &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::MaxLen(1)).await.unwrap();
    q.send("one").await.unwrap();
    let mut client = cluster.client().await;
    let old = client.get("compact/", None).await.unwrap().header().unwrap().revision();
    // The first pass notes where history stood; nothing is old enough to compact yet.
    q.send("two").await.unwrap();
    let report = broker.trim().await.unwrap();
    assert_eq!(report.deleted, 1);
    assert!(!report.compacted, "nothing is older than the window yet");
    let opts = || Some(etcd_client::GetOptions::new().with_prefix().with_revision(old));
    client.get("compact/", opts()).await.expect("history inside the window is readable");
    // Past the window, the next pass compacts to where the first one started.
    clock.advance(Duration::from_secs(6 * 60));
    q.send("three").await.unwrap();
    let report = broker.trim().await.unwrap();
    assert!(report.compacted);
    let err = client.get("compact/", opts()).await.expect_err("history before the window is compacted");
    assert!(err.to_string().contains("compacted"), "{err}");
    // The broker's own watch and reads go on: a subscription sees what comes next.
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = common::next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), b"three");
    q.send("four").await.unwrap();
    assert_eq!(common::next(&mut sub).await.payload().as_ref(), b"four");
    drop(sub);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_pass_runs_on_etcd_too() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let opts = EtcdOptions::new()
        .options(rockq::Options::new().clock(clock.clone()).retention_interval(Duration::from_secs(30)));
    let broker = Broker::connect_etcd(cluster.endpoints(), "background", opts).await.unwrap();
    let q = broker.queue("q").await.unwrap();
    q.set_retention(Retention::MaxLen(2)).await.unwrap();
    for i in 1..=6 {
        q.send(format!("m{i}")).await.unwrap();
    }
    let mut events = broker.events();
    clock.advance(Duration::from_secs(31));
    let e = common::wait_event(&mut events, |e| matches!(e, Event::Trimmed { .. })).await;
    assert!(matches!(e, Event::Trimmed { deleted: 4, first_seq: 5, .. }), "{e:?}");
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(common::next(&mut sub).await.seq(), 5);
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// Regression (the engine's review): a trim holds a ranged delete and an offset move for every
/// work group behind the cut, and etcd takes 128 operations per transaction, so a queue with
/// more than about 60 groups behind its cut was never trimmed. The groups beyond one
/// transaction are now moved past the cut first (work groups) or cleaned after it (ordered
/// groups' marks); every group ends past the cut, as in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_with_more_groups_behind_than_one_transaction_holds_moves_them_all() {
    let cluster = etcd::Cluster::start(1).await;
    let clock = ManualClock::new();
    let b = connect(&cluster, "many", &clock).await;
    let q = b.queue("q").await.unwrap();
    for i in 1..=20 {
        q.send(format!("m{i}")).await.unwrap();
    }
    // 130 work groups that finished nothing: 260 operations, two transactions ahead of the trim.
    for i in 0..130 {
        q.work_group(&format!("w{i:03}")).unwrap().update().await.unwrap();
    }
    // One more holds a lease on the first message: its claim record goes with the cut.
    let mut jobs = q.work_group("holder").unwrap().read_batch(1).max_in_flight(1).subscribe().await.unwrap();
    let held = common::next_job(&mut jobs).await;
    assert_eq!(held.seq(), 1);
    // 70 ordered groups, each with a mark (the second message acknowledged before the first).
    for i in 0..70 {
        let mut sub = q.group(&format!("o{i:02}")).unwrap().read_batch(2).subscribe().await.unwrap();
        let first = common::next(&mut sub).await;
        let second = common::next(&mut sub).await;
        assert_eq!((first.seq(), second.seq()), (1, 2));
        second.ack().unwrap();
        b.flush().await.unwrap();
        drop((first, sub));
    }
    b.flush().await.unwrap();
    let etcd = cluster.client().await;
    let count = |prefix: &'static str| {
        let mut etcd = etcd.clone();
        async move {
            let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
            etcd.get(format!("many/{prefix}"), Some(opts)).await.unwrap().count()
        }
    };
    assert_eq!(count("k/").await, 70, "a mark per ordered group");
    assert!(count("c/").await >= 1, "the holder's claim");
    let mut events = b.events();

    q.set_retention(Retention::MaxLen(5)).await.unwrap();
    let report = b.trim().await.unwrap();
    assert_eq!(report.trimmed, [("q".to_owned(), 15, 16)]);
    assert_eq!(q.first_seq(), 16);
    let stats = b.stats().await.unwrap();
    let work: Vec<_> = stats.groups.iter().filter(|g| g.mode == rockq::GroupMode::WorkQueue).collect();
    assert_eq!(work.len(), 131);
    assert!(work.iter().all(|g| g.committed == 15), "every work group moved past the cut");
    let mut skipped = std::collections::BTreeSet::new();
    while skipped.len() < 131 {
        match common::wait_event(&mut events, |e| matches!(e, Event::Skipped { .. })).await {
            Event::Skipped { group, from: 1, to: 15, .. } => assert!(skipped.insert(group.to_string())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(count("k/").await, 0, "every ordered group's marks below the cut are gone");
    assert_eq!(count("c/").await, 0, "the claim below the cut is gone");
    assert!(held.ack_durable().await.is_err(), "a claim deleted by the trim cannot be settled");
    assert_eq!(common::next_job(&mut jobs).await.seq(), 16);
    // Every ordered group goes on from the new head.
    let mut sub = q.group("o07").unwrap().subscribe().await.unwrap();
    assert_eq!(common::next(&mut sub).await.seq(), 16);
    assert_eq!(b.trim().await.unwrap().deleted, 0);
    drop((sub, jobs));
    b.shutdown().await.unwrap();
}
