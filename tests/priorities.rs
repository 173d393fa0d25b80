//! Message priorities in work groups (`Message::priority`), against a real database on a
//! `ManualClock`: claims take the highest priority first and sequence order within one, for
//! subscriptions and pools; a retry, a released lease, a restart (claims made ahead of the
//! group's frontier, finished or not) keep that order and claim nothing twice; the share
//! (`WorkGroup::priority_share`) takes the oldest every n-th claim; ordered groups and groups
//! ordered by key keep their orders; a delayed message, a dead letter and its redrive keep the
//! priority; retention and purges drop the index with the messages; lookups report it. The
//! claim order itself is checked against a full-scan reference in
//! `src/engine/registry/priority_props.rs`. The suite runs unchanged against etcd
//! (`scripts/etcd-semantics.sh`); across processes, tests/etcd_engine.rs.

mod common;

use std::time::Duration;

use common::{next_job, open_clock, reopen_after_drop_with};
use rockq::{Broker, ManualClock, Message, Options, Retention};

/// Sends plain messages `plain` and then prioritised ones `(payload, priority)`.
async fn send(broker: &Broker, plain: u64, urgent: &[(&str, u8)]) {
    let q = broker.queue("jobs").await.unwrap();
    if plain > 0 {
        q.send_batch((1..=plain).map(|i| format!("plain {i}"))).await.unwrap();
    }
    for &(payload, p) in urgent {
        q.send(Message::new(payload.to_owned()).priority(p)).await.unwrap();
    }
}

async fn group(broker: &Broker) -> rockq::WorkGroup {
    common::hourly_workers(broker).await
}

/// Claims and acks `n` jobs one at a time; returns their payloads.
async fn drain(sub: &mut rockq::WorkSubscription, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let j = next_job(sub).await;
        out.push(String::from_utf8_lossy(j.payload()).into_owned());
        j.ack().unwrap();
    }
    out
}

fn plain(range: std::ops::RangeInclusive<u64>) -> Vec<String> {
    range.map(|i| format!("plain {i}")).collect()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn the_highest_priority_is_claimed_first_and_in_sequence_order_within_one() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    send(&broker, 5, &[("a5", 5), ("b9", 9), ("c5", 5), ("d255", 255), ("e1", 1)]).await;
    // More plain ones after the prioritised ones: still behind them.
    send(&broker, 2, &[]).await;
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    let got = drain(&mut sub, 12).await;
    let mut want = strs(&["d255", "b9", "a5", "c5", "e1"]);
    want.extend(plain(1..=5));
    want.extend(plain(1..=2));
    assert_eq!(got, want);
    // A prioritised message sent while the backlog drains jumps what is left of it.
    send(&broker, 3, &[]).await;
    let mut sub2 = group(&broker).await.subscribe().await.unwrap();
    drop(sub);
    assert_eq!(drain(&mut sub2, 1).await, plain(1..=1));
    send(&broker, 0, &[("late", 3)]).await;
    assert_eq!(drain(&mut sub2, 3).await, vec!["late".to_string(), "plain 2".into(), "plain 3".into()]);
    broker.flush().await.unwrap();
    assert_eq!(group(&broker).await.committed(), Some(16), "every job finished once, the offset past all");
    // The priority is on the message and in its status.
    let q = broker.queue("jobs").await.unwrap();
    let seq = q.send(Message::new("x").priority(7)).await.unwrap();
    assert_eq!(broker.job("jobs", "workers", seq).await.unwrap().priority, 7);
    let j = next_job(&mut sub2).await;
    assert_eq!((j.seq(), j.priority()), (seq, 7));
    assert_eq!(broker.job("jobs", "workers", 1).await.unwrap().priority, 0);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_retry_keeps_the_priority() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    send(&broker, 3, &[("urgent", 4)]).await;
    // A lease longer than the backoff: only the retry's time moves anything.
    let backoff = Duration::from_secs(10);
    let wg = broker
        .queue("jobs")
        .await
        .unwrap()
        .work_group("workers")
        .unwrap()
        .lease(Duration::from_secs(3600))
        .retry_policy(rockq::RetryPolicy::default().max_attempts(5).backoff(backoff, backoff).jitter(0.0))
        .read_batch(1)
        .max_in_flight(1);
    let mut sub = wg.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.payload(), "urgent");
    j.fail_durable("flaky").await.unwrap();
    // Waiting for its retry: the plain ones go meanwhile.
    assert_eq!(drain(&mut sub, 1).await, plain(1..=1));
    clock.advance(backoff);
    // Due: ahead of the plain ones still waiting.
    let j = next_job(&mut sub).await;
    assert_eq!((j.payload().as_ref(), j.attempt(), j.priority()), (&b"urgent"[..], 2, 4));
    j.ack().unwrap();
    assert_eq!(drain(&mut sub, 2).await, plain(2..=3));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_a_restart_claims_made_ahead_of_the_backlog_are_neither_lost_nor_repeated() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    send(&broker, 4, &[("u1", 2), ("u2", 2), ("u3", 2)]).await;
    send(&broker, 2, &[]).await;
    let mut sub = group(&broker).await.max_in_flight(2).read_batch(2).subscribe().await.unwrap();
    // u1 finished durably, u2 held (its lease record written), u3 and the backlog untouched.
    let u1 = next_job(&mut sub).await;
    let u2 = next_job(&mut sub).await;
    assert_eq!((u1.payload().as_ref(), u2.payload().as_ref()), (&b"u1"[..], &b"u2"[..]));
    u1.ack_durable().await.unwrap();
    broker.flush().await.unwrap();
    drop(u2);
    drop(sub);
    drop(broker);
    let clock2 = clock.clone();
    let broker = reopen_after_drop_with(dir.path(), move || Options::new().clock(clock2.clone())).await;
    // u2's lease from before the restart has no holder: claimable at once, and first (its
    // attempt counted); then u3; then the backlog; u1 never again.
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.payload().as_ref(), j.attempt()), (&b"u2"[..], 2));
    j.ack().unwrap();
    let mut got = drain(&mut sub, 7).await;
    assert_eq!(got.remove(0), "u3");
    assert_eq!(got, plain(1..=4).into_iter().chain(plain(1..=2)).collect::<Vec<_>>());
    broker.flush().await.unwrap();
    let wg = group(&broker).await;
    assert_eq!(wg.committed(), Some(9));
    assert_eq!(wg.job(5).await.unwrap().state, rockq::JobState::Finished, "u1, once");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_share_takes_the_oldest_every_nth_claim() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    send(&broker, 3, &[("h1", 1), ("h2", 1), ("h3", 1), ("h4", 1)]).await;
    let mut sub = group(&broker).await.priority_share(3).subscribe().await.unwrap();
    let got = drain(&mut sub, 7).await;
    assert_eq!(got, strs(&["h1", "h2", "plain 1", "h3", "h4", "plain 2", "plain 3"]));
    // Share 1: sequence order whatever the priority.
    send(&broker, 1, &[("h5", 9)]).await;
    send(&broker, 1, &[]).await;
    let mut fair = group(&broker).await.priority_share(1).subscribe().await.unwrap();
    drop(sub);
    assert_eq!(drain(&mut fair, 3).await, strs(&["plain 1", "h5", "plain 1"]));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pool_claims_by_priority() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    send(&broker, 50, &[("u", 1)]).await;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let pool = group(&broker).await.workers(1).spawn(move |task: rockq::Task| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(String::from_utf8_lossy(task.payload()).into_owned());
            Ok(())
        }
    });
    let wg = group(&broker).await;
    tokio::time::timeout(common::HANG_GUARD, async {
        while wg.committed() < Some(51) {
            broker.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the pool drained");
    pool.shutdown().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 51);
    assert_eq!(seen[0], "u", "claimed before the 50 sent earlier");
    assert_eq!(seen[1..], plain(1..=50)[..]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn ordered_groups_and_groups_ordered_by_key_keep_their_order() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send(Message::new("k-1").key("k")).await.unwrap();
    q.send(Message::new("k-2").key("k").priority(9)).await.unwrap();
    q.send(Message::new("free").priority(1)).await.unwrap();
    // An ordered group: sequence order.
    let mut ordered = q.group("audit").unwrap().subscribe().await.unwrap();
    let ds = common::take(&mut ordered, 3).await;
    assert_eq!(common::payloads(&ds), strs(&["k-1", "k-2", "free"]));
    assert_eq!(ds.iter().map(|d| d.priority()).collect::<Vec<_>>(), [0, 9, 1]);
    // Ordered by key: k-2 waits for k-1 whatever its priority; among the claimable ones,
    // priority first.
    let keyed = group(&broker).await.ordered_by_key(true).max_in_flight(3).read_batch(3);
    let mut keyed = keyed.subscribe().await.unwrap();
    let a = next_job(&mut keyed).await;
    let b = next_job(&mut keyed).await;
    assert_eq!((a.payload().as_ref(), b.payload().as_ref()), (&b"free"[..], &b"k-1"[..]));
    b.ack_durable().await.unwrap();
    assert_eq!(next_job(&mut keyed).await.payload(), "k-2");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn delayed_dead_lettered_and_redriven_messages_keep_their_priority() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["p1", "p2"]).await.unwrap();
    q.submit(Message::new("later").priority(3).deliver_after(Duration::from_secs(60))).await.unwrap();
    clock.advance(Duration::from_secs(60));
    // Due now (appended as sequence 3 when its timer fires), and claimed ahead of p1 and p2.
    tokio::time::timeout(common::HANG_GUARD, async {
        while q.last_seq() < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the delayed message fired");
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!((j.payload().as_ref(), j.priority()), (&b"later"[..], 3));
    j.dead_letter_durable("poison").await.unwrap();
    let letters = broker.dead_letters("jobs.dlq").await.unwrap();
    let dl = letters.peek().await.unwrap().expect("a dead letter");
    assert_eq!(dl.priority, 3, "the dead letter keeps it");
    assert_eq!(drain(&mut sub, 1).await, strs(&["p1"]));
    // Redriven: back ahead of what is left.
    q.send_batch(["p3"]).await.unwrap();
    assert_eq!(letters.redrive(rockq::Redrive::new()).await.unwrap(), 1);
    let got = drain(&mut sub, 3).await;
    assert_eq!(got, strs(&["later", "p2", "p3"]));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn retention_and_purges_drop_the_index_with_the_messages() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.set_retention(Retention::MaxLen(2)).await.unwrap();
    q.send(Message::new("old-urgent").priority(9)).await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    // The group exists before the trim: retention cuts under it.
    let wg = group(&broker).await;
    let mut sub = wg.subscribe().await.unwrap();
    let j = next_job(&mut sub).await;
    assert_eq!(j.payload(), "old-urgent");
    drop(j);
    drop(sub);
    assert_eq!(broker.trim().await.unwrap().deleted, 1);
    assert_eq!(broker.job("jobs", "workers", 1).await.unwrap().priority, 0, "gone with its message");
    // Purged too: a restart finds no index entry of either (one would name a purged message).
    q.send(Message::new("purged-urgent").priority(9)).await.unwrap();
    broker.purge_queue("jobs").await.unwrap();
    broker.shutdown().await.unwrap();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    q.send_batch(["c"]).await.unwrap();
    q.send(Message::new("new-urgent").priority(1)).await.unwrap();
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    assert_eq!(drain(&mut sub, 2).await, strs(&["new-urgent", "c"]));
    let inspector_dir = dir.path().to_path_buf();
    broker.shutdown().await.unwrap();
    let inspector = common::inspector(&inspector_dir).await;
    assert_eq!(inspector.job("jobs", "workers", 6).await.unwrap().priority, 1, "read from the index on disk");
    assert_eq!(inspector.job("jobs", "workers", 5).await.unwrap().priority, 0);
    // The trimmed and the purged prioritised messages left no index entry behind.
    assert_eq!(inspector.job("jobs", "workers", 1).await.unwrap().priority, 0, "trimmed");
    assert_eq!(inspector.job("jobs", "workers", 4).await.unwrap().priority, 0, "purged");
}

#[tokio::test]
async fn a_stream_of_urgent_jobs_is_not_starved_by_a_large_backlog() {
    // 20k plain jobs, then urgent ones sent one by one while the backlog drains: each is the
    // next claim after it is published, whatever is left of the backlog.
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("jobs").await.unwrap();
    for chunk in 0..20 {
        q.send_batch((0..1000).map(|i| format!("bulk {}", chunk * 1000 + i))).await.unwrap();
    }
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    for round in 0..10 {
        drain(&mut sub, 100).await;
        let seq = q.send(Message::new(format!("urgent {round}")).priority(200)).await.unwrap();
        let j = next_job(&mut sub).await;
        assert_eq!(j.seq(), seq, "round {round}");
        j.ack().unwrap();
    }
    drop(sub);
    broker.shutdown().await.unwrap();
}

/// An export carries each message's priority; the import rebuilds the index from the
/// envelopes, so the imported database claims in the same order.
#[cfg(feature = "json")]
#[tokio::test]
async fn an_export_and_import_keep_the_priorities() {
    let dir = common::tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(&dir.path().join("db"), &clock).await;
    send(&broker, 3, &[("u7", 7), ("u2", 2)]).await;
    let file = dir.path().join("export.jsonl");
    broker.export(std::fs::File::create(&file).unwrap()).await.unwrap();
    broker.shutdown().await.unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches(r#""priority":"#).count(), 2, "written for the two that have one: {text}");
    let imported = dir.path().join("imported");
    Broker::import(std::fs::File::open(&file).unwrap(), &imported).await.unwrap();
    let broker = open_clock(&imported, &clock).await;
    let mut sub = group(&broker).await.subscribe().await.unwrap();
    let mut want = strs(&["u7", "u2"]);
    want.extend(plain(1..=3));
    assert_eq!(drain(&mut sub, 5).await, want);
    broker.shutdown().await.unwrap();
}
