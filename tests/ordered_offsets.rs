//! Acknowledgement and commit semantics: contiguous prefix, restart, redelivery.

mod common;

use common::*;
use futures::StreamExt;
use rockq::Durability;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_acks_commit_only_the_contiguous_prefix() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3", "4", "5"]).await.unwrap();
    let group = q.group("g").unwrap();
    let mut sub = group.subscribe().await.unwrap();
    let mut ds = take(&mut sub, 5).await;
    let d5 = ds.pop().unwrap();
    let d4 = ds.pop().unwrap();
    let d3 = ds.pop().unwrap();
    let d2 = ds.pop().unwrap();
    let d1 = ds.pop().unwrap();

    d3.ack().unwrap();
    d2.ack().unwrap();
    assert_eq!(sub.commit().await.unwrap(), 0, "1 is not acked: nothing commits");
    d1.ack().unwrap();
    assert_eq!(sub.commit().await.unwrap(), 3);
    d5.ack().unwrap();
    assert_eq!(sub.commit().await.unwrap(), 3, "4 is still open");
    assert_eq!(group.committed(), Some(3));
    drop(d4); // handed back, never acked
    drop(sub);
    broker.shutdown().await.unwrap();

    // After a restart the group resumes right after the committed prefix: 4 and 5 again.
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let again = take(&mut sub, 2).await;
    assert_eq!(again.iter().map(|d| d.seq()).collect::<Vec<_>>(), vec![4, 5]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_resumes_after_the_committed_offset() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
        let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
        for d in take(&mut sub, 6).await {
            d.ack().unwrap();
        }
        // No explicit commit: shutdown must flush the coalesced offset.
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.last_seq(), 10, "last sequence recovered from the last key");
    let group = q.group("g").unwrap();
    assert_eq!(group.committed(), Some(6));
    let mut sub = group.subscribe().await.unwrap();
    let rest = take(&mut sub, 4).await;
    assert_eq!(payloads(&rest), vec!["7", "8", "9", "10"]);
    rest.into_iter().for_each(|d| d.ack().unwrap());
    // New sends continue the sequence; nothing is reused.
    assert_eq!(q.send("11").await.unwrap(), 11);
    assert_eq!(next(&mut sub).await.seq(), 11);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_come_back_after_restart() {
    let dir = tempdir();
    {
        let broker = open(dir.path()).await;
        let q = broker.queue("q").await.unwrap();
        q.send_batch(["a", "b", "c"]).await.unwrap();
        let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
        let ds = take(&mut sub, 3).await;
        // Received but never acknowledged: simulates a crash mid-handler.
        std::mem::forget(ds);
        broker.shutdown().await.unwrap();
    }
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut sub, 3).await), vec!["a", "b", "c"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_deliveries_are_redelivered_first_in_the_same_subscription() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3"]).await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d1 = next(&mut sub).await;
    let d2 = next(&mut sub).await;
    d2.nack();
    d1.ack().unwrap();
    let again = next(&mut sub).await;
    assert_eq!((again.seq(), again.delivery_count()), (2, 2));
    again.ack().unwrap();
    let d3 = next(&mut sub).await;
    assert_eq!((d3.seq(), d3.delivery_count()), (3, 1));
    d3.ack().unwrap();
    assert_eq!(sub.commit().await.unwrap(), 3);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_subscription_hands_its_unacked_deliveries_to_the_next_subscriber() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["1", "2", "3", "4"]).await.unwrap();
    let group = q.group("g").unwrap();
    let mut first = group.subscribe().await.unwrap();
    let ds = take(&mut first, 3).await;
    let mut ds = ds.into_iter();
    ds.next().unwrap().ack().unwrap();
    // One subscriber at a time: a second one is refused while the first (or any of its
    // deliveries) is alive.
    let err = group.subscribe().await.unwrap_err();
    assert!(matches!(err, rockq::Error::Active { .. }), "{err:?}");
    drop(first);
    let held: Vec<_> = ds.collect();
    assert!(matches!(group.subscribe().await, Err(rockq::Error::Active { .. })));
    drop(held);

    let mut second = group.subscribe().await.unwrap();
    assert_eq!(payloads(&take(&mut second, 3).await), vec!["2", "3", "4"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_from_deliveries_that_outlive_the_stream_still_commit() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
    let group = q.group("g").unwrap();
    let sub = group.subscribe().await.unwrap();
    // `take` drops the subscription after 5 items; the deliveries are acked afterwards.
    let ds: Vec<_> = sub.take(5).map(|d| d.unwrap()).collect().await;
    ds.into_iter().for_each(|d| d.ack().unwrap());
    let mut again = group.subscribe().await.unwrap();
    assert_eq!(next(&mut again).await.seq(), 6);
    assert_eq!(again.commit().await.unwrap(), 5);
    broker.shutdown().await.unwrap();
}

/// `next()` is cancel safe: a `select!` that drops it for another branch, again and again,
/// loses no message, repeats none and keeps the order (a read in progress stays with the
/// subscription).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_next_loses_no_message_and_keeps_the_order() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    let n = 300u64;
    q.send_batch((1..=n).map(|i| i.to_string())).await.unwrap();
    let group = q.group("g").unwrap().read_batch(7);
    let mut sub = group.subscribe().await.unwrap();
    let (mut want, mut dropped, mut polls) = (1u64, 0u64, 0u64);
    while want <= n {
        polls += 1;
        assert!(polls < 100 * n, "messages stopped coming at {want} of {n}");
        // Every other round another branch is ready at once: `next()` is polled once and, if
        // it is not ready (a read in flight), dropped.
        let other_ready = polls % 2 == 0;
        tokio::select! {
            biased;
            d = sub.next() => {
                let d = d.expect("stream ended").expect("a delivery");
                assert_eq!((d.seq(), d.delivery_count()), (want, 1), "in order, each once");
                want += 1;
                d.ack().unwrap();
            }
            _ = std::future::ready(()), if other_ready => dropped += 1,
        }
    }
    assert!(dropped > 0);
    broker.flush().await.unwrap();
    assert_eq!(group.committed(), Some(n));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_are_bounded() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((1..=10).map(|i| i.to_string())).await.unwrap();
    let mut sub = q.group("g").unwrap().max_in_flight(3).subscribe().await.unwrap();
    let mut held = take(&mut sub, 3).await;
    // Out-of-order acks do not free the window: 2 is acked but 1 still holds the offset.
    held.remove(1).ack().unwrap();
    let pending = futures::poll!(sub.next());
    assert!(pending.is_pending(), "a fourth delivery while three are beyond the offset");
    held.remove(0).ack().unwrap();
    // 1 and 2 acked: the offset moved to 2, so two more may go out.
    let more = take(&mut sub, 2).await;
    assert_eq!(more.iter().map(|d| d.seq()).collect::<Vec<_>>(), vec![4, 5]);
    assert!(futures::poll!(sub.next()).is_pending());
    broker.shutdown().await.unwrap();
}

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
