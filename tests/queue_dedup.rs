//! Idempotent producers: within a queue's dedup window a second message with the same
//! idempotency key writes nothing and reports the original — also for producers racing in one
//! writer round, inside one batch, across restarts — and expired keys are forgotten in bulk by
//! the retention pass.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rockq::{ManualClock, Message, Original, Sent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_send_with_the_same_key_writes_nothing_and_reports_the_original() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("payments").await.unwrap();
    assert_eq!(q.submit(Message::new("charge").idempotency_key("order-1")).await.unwrap(), Sent::Appended(1));
    assert_eq!(
        q.submit(Message::new("charge again").idempotency_key("order-1")).await.unwrap(),
        Sent::Duplicate(Original::Appended(1))
    );
    assert_eq!(q.submit(Message::new("other").idempotency_key("order-2")).await.unwrap(), Sent::Appended(2));
    // `send` answers a duplicate with the original's sequence.
    assert_eq!(q.send(Message::new("x").idempotency_key("order-1")).await.unwrap(), 1);
    assert_eq!(q.last_seq(), 2, "duplicates wrote nothing");
    // Keys are per queue.
    let other = broker.queue("refunds").await.unwrap();
    assert_eq!(other.submit(Message::new("r").idempotency_key("order-1")).await.unwrap(), Sent::Appended(1));
    // The consumer sees the key.
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!((d.payload().as_ref(), d.idempotency_key()), (&b"charge"[..], Some("order-1")));
    broker.shutdown().await.unwrap();
}

/// Sixty-four producers send the same key at once (many land in one writer round): exactly
/// one is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_producers_with_one_key_write_exactly_one_message() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("payments").await.unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (q, start) = (q.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            q.submit(Message::new(format!("attempt {i}")).idempotency_key("once")).await.unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let appended: Vec<_> = outcomes.iter().filter(|o| matches!(o, Sent::Appended(_))).collect();
    assert_eq!(appended.len(), 1, "{outcomes:?}");
    let seq = appended[0].seq().unwrap();
    assert!(outcomes.iter().all(|o| o.seq() == Some(seq)), "every duplicate names the original");
    assert_eq!(q.last_seq(), 1);
    // And inside one batch: the second occurrence is the duplicate.
    let out = q
        .submit_batch([
            Message::new("a").idempotency_key("b1"),
            Message::new("b").idempotency_key("b1"),
            Message::new("c").idempotency_key("once"),
        ])
        .await
        .unwrap();
    assert_eq!(
        out,
        [Sent::Appended(2), Sent::Duplicate(Original::Appended(2)), Sent::Duplicate(Original::Appended(1))]
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_survive_a_restart_expire_with_the_window_and_are_forgotten_in_bulk() {
    for mode in [rockq::Durability::Buffered, rockq::Durability::Fsync] {
        survive_and_expire(mode).await;
    }
}

async fn survive_and_expire(mode: rockq::Durability) {
    let dir = tempdir();
    let clock = ManualClock::new();
    {
        let broker = open_clock_mode(dir.path(), &clock, mode).await;
        let q = broker.queue("payments").await.unwrap();
        assert_eq!(q.dedup_window(), Duration::from_secs(300), "SQS's five minutes by default");
        q.set_dedup_window(Duration::from_secs(60)).await.unwrap();
        for i in 0..100 {
            q.submit(Message::new("p").idempotency_key(format!("k{i}"))).await.unwrap();
        }
        broker.shutdown().await.unwrap();
    }
    let broker = open_clock_mode(dir.path(), &clock, mode).await;
    let q = broker.queue("payments").await.unwrap();
    assert_eq!(q.dedup_window(), Duration::from_secs(60), "the window is persisted");
    assert_eq!(broker.stats().await.unwrap().queues[0].dedup_window, Duration::from_secs(60));
    assert_eq!(
        q.submit(Message::new("p").idempotency_key("k7")).await.unwrap(),
        Sent::Duplicate(Original::Appended(8)),
        "remembered across the restart"
    );
    // On etcd, expired records go with their etcd lease (on etcd's clock), not with a pass:
    // the pass reports none there.
    let pass_forgets = !against_etcd();
    assert_eq!(broker.trim().await.unwrap().dedup_expired, 0, "nothing expired yet");
    clock.advance(Duration::from_secs(61));
    // Expired: the key is new again (and gets a fresh window).
    assert_eq!(q.submit(Message::new("p2").idempotency_key("k7")).await.unwrap(), Sent::Appended(101));
    // The pass forgets the 99 expired keys, not the one just recorded again.
    assert_eq!(broker.trim().await.unwrap().dedup_expired, if pass_forgets { 99 } else { 0 });
    assert_eq!(broker.trim().await.unwrap().dedup_expired, 0, "the expiry index went with them");
    assert_eq!(
        q.submit(Message::new("p3").idempotency_key("k7")).await.unwrap(),
        Sent::Duplicate(Original::Appended(101))
    );
    assert_eq!(q.submit(Message::new("p4").idempotency_key("k8")).await.unwrap(), Sent::Appended(102));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_with_a_key_is_deduplicated_against_its_schedule_id() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("reminders").await.unwrap();
    let first = q
        .submit(Message::new("r").idempotency_key("user-7").deliver_after(Duration::from_secs(30)))
        .await
        .unwrap();
    let Sent::Scheduled(s) = first else { panic!("{first:?}") };
    let again = q
        .submit(Message::new("r").idempotency_key("user-7").deliver_after(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(again, Sent::Duplicate(Original::Scheduled(s.id)));
    assert_eq!(broker.stats().await.unwrap().queues[0].scheduled, 1, "one reminder scheduled");
    broker.shutdown().await.unwrap();
}
