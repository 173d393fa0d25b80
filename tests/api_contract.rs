//! The one ack contract (issue 17): `ack()` queues on both group kinds, `ack_durable()` waits
//! until durable on both; `Job::lease_remaining`; the event stream's filters; errors a user
//! can act on.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use rockq::{Durability, Event, ManualClock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_ack_durable_waits_for_the_contiguous_offset_and_survives_a_reopen() {
    let dir = tempdir();
    let broker = open_with(dir.path(), Durability::Fsync).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d1 = next(&mut sub).await;
    let d2 = next(&mut sub).await;

    let fut = d2.ack_durable();
    tokio::pin!(fut);
    assert!(futures::poll!(fut.as_mut()).is_pending());
    // Everything queued is durable now, yet the offset cannot pass the unacked first message.
    assert_eq!(sub.commit().await.unwrap(), 0);
    assert!(futures::poll!(fut.as_mut()).is_pending(), "ack_durable resolved before its offset was durable");
    d1.ack().unwrap();
    fut.await.unwrap();
    assert_eq!(sub.committed(), 2, "resolved only once the offset covered it");
    drop(sub);
    drop(q);
    let broker = reopen_after_drop_mode_from(broker, dir.path(), Durability::Fsync).await;
    assert_eq!(broker.queue("q").await.unwrap().group("g").unwrap().committed(), Some(2));
    broker.shutdown().await.unwrap();
}

async fn reopen_after_drop_mode_from(
    broker: rockq::Broker,
    path: &std::path::Path,
    mode: Durability,
) -> rockq::Broker {
    // Dropped, not shut down: only what was durable is found again.
    drop(broker);
    reopen_after_drop_mode(path, mode).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_ack_is_queued_at_once_and_ack_durable_returns_once_the_offset_is_written() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    let group = q.work_group("w").unwrap().lease(Duration::from_secs(10));
    let mut sub = group.subscribe().await.unwrap();
    let (a, b, c) = (next_job(&mut sub).await, next_job(&mut sub).await, next_job(&mut sub).await);

    // Sync, fenced now: an expired lease is refused before anything is queued.
    clock.advance(Duration::from_secs(11));
    assert!(matches!(c.ack(), Err(rockq::AckError::LeaseLost { seq: 3, attempt: 1 })));
    let a2 = {
        // The expired messages come back: take the first two again.
        let (x, y) = (next_job(&mut sub).await, next_job(&mut sub).await);
        drop((a, b));
        (x, y)
    };
    a2.0.ack().unwrap();
    broker.flush().await.unwrap();
    assert_eq!(group.committed(), Some(1), "a queued ack is durable after a flush");
    a2.1.ack_durable().await.unwrap();
    assert_eq!(group.committed(), Some(2), "ack_durable returned with the offset written");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_remaining_follows_the_broker_clock_and_extensions() {
    let dir = tempdir();
    let clock = ManualClock::new();
    let broker = open_clock(dir.path(), &clock).await;
    let q = broker.queue("q").await.unwrap();
    q.send("x").await.unwrap();
    let mut sub = q.work_group("w").unwrap().lease(Duration::from_secs(30)).subscribe().await.unwrap();
    let job = next_job(&mut sub).await;
    assert_eq!(job.lease_remaining(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(10));
    assert_eq!(job.lease_remaining(), Duration::from_secs(20));
    job.extend(Duration::from_secs(30)).unwrap();
    assert_eq!(job.lease_remaining(), Duration::from_secs(30));
    clock.advance(Duration::from_secs(45));
    assert_eq!(job.lease_remaining(), Duration::ZERO);
    assert!(job.ack().is_err());
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_delivery_can_be_dead_lettered_and_the_offset_passes_it() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["ok", "bad", "ok"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    next(&mut sub).await.ack().unwrap();
    next(&mut sub).await.dead_letter("rejected by the ledger").unwrap();
    next(&mut sub).await.ack_durable().await.unwrap();
    assert_eq!(sub.committed(), 3);
    let dead = broker.dead_letters("q.dlq").await.unwrap().list(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].seq, dead[0].reason.as_str(), dead[0].group.as_deref()),
        (Some(2), "rejected by the ledger", Some("g"))
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_filters_by_queue_and_group() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let (a, b) = (broker.queue("a").await.unwrap(), broker.queue("b").await.unwrap());
    let mut only_a_x = broker.event_stream().queue("a").group("x");
    let mut all = broker.event_stream();
    for q in [&a, &b] {
        q.send("m").await.unwrap();
        for g in ["x", "y"] {
            let mut sub = q.work_group(g).unwrap().subscribe().await.unwrap();
            next_job(&mut sub).await.ack_durable().await.unwrap();
        }
    }
    // Every queue and group got a Delivered and an Acked: 8 events, of which 2 are a/x.
    let mut seen = Vec::new();
    while seen.len() < 8 {
        seen.push(all.next().await.unwrap());
    }
    let filtered = [only_a_x.next().await.unwrap(), only_a_x.next().await.unwrap()];
    assert!(filtered.iter().all(|e| e.queue() == "a" && e.group() == Some("x")), "{filtered:?}");
    assert!(matches!(filtered[1], Event::Acked { .. }));
    assert_eq!(seen.iter().filter(|e| e.queue() == "a" && e.group() == Some("x")).count(), 2);
    assert_eq!(only_a_x.missed(), 0);
    broker.shutdown().await.unwrap();
    assert!(only_a_x.next().await.is_none(), "the stream ends at shutdown");
}

#[tokio::test]
async fn errors_say_whether_to_retry_and_io_errors_convert() {
    fn read_config() -> Result<Vec<u8>, rockq::Error> {
        Ok(std::fs::read("/nonexistent/rockq.toml")?)
    }
    assert!(matches!(read_config(), Err(rockq::Error::Io(_))));

    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let _sub = q.group("g").unwrap().subscribe().await.unwrap();
    let busy = rockq::Error::from(q.group("g").unwrap().subscribe().await.unwrap_err());
    assert!(busy.is_retryable() && !busy.is_shutdown(), "{busy:?}");
    let bad = rockq::Error::from(broker.queue("no spaces").await.unwrap_err());
    assert!(!bad.is_retryable() && !bad.is_shutdown());
    broker.shutdown().await.unwrap();
    let late = rockq::Error::from(q.send("x").await.unwrap_err());
    assert!(late.is_shutdown() && !late.is_retryable(), "{late:?}");
}
