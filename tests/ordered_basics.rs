//! Ordering, payload fidelity and the basic produce → subscribe → ack cycle.

mod common;

use common::*;
use rockq::{Message, StartFrom};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_arrive_in_sequence_order_with_their_content() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("orders").await.unwrap();

    let mut expected = Vec::new();
    for i in 0..50 {
        let seq = q.send(format!("single-{i}")).await.unwrap();
        expected.push((seq, format!("single-{i}")));
    }
    let range = q.send_batch((0..50).map(|i| format!("batch-{i}"))).await.unwrap();
    assert_eq!(range.clone().count(), 50);
    expected.extend(range.zip((0..50).map(|i| format!("batch-{i}"))));
    let seqs: Vec<u64> = expected.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>(), "sequences are dense from 1");
    assert_eq!((q.first_seq(), q.last_seq(), q.len()), (1, 100, 100));

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let got = take(&mut sub, 100).await;
    let got_pairs: Vec<(u64, String)> = got.iter().map(|d| d.seq()).zip(payloads(&got)).collect();
    assert_eq!(got_pairs, expected);
    for d in got {
        assert_eq!((d.queue(), d.group(), d.delivery_count()), ("orders", "g", 1));
        d.ack().unwrap();
    }
    assert_next_is_sentinel(&q, &mut sub).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_enqueue_time_round_trip() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("h").await.unwrap();
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    q.send(Message::new(vec![0u8, 255, 7]).header("trace-id", "abc").header("trace-id", "def"))
        .await
        .unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(d.payload().as_ref(), &[0u8, 255, 7]);
    assert_eq!(d.headers().len(), 2);
    assert_eq!(d.header("trace-id").map(|v| v.as_ref()), Some(&b"abc"[..]));
    assert!(d.enqueued_at() >= before);
    d.ack().unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_subscriber_is_woken_by_new_writes() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("wake").await.unwrap();
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    // The consumer is parked before anything exists; the writer's publication must wake it.
    let consumer = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let d = next(&mut sub).await;
            seen.push(d.seq());
            d.ack().unwrap();
        }
        seen
    });
    tokio::task::yield_now().await;
    for i in 0..3 {
        q.send(format!("{i}")).await.unwrap();
    }
    assert_eq!(consumer.await.unwrap(), vec![1, 2, 3]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_groups_start_where_the_caller_says() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("starts").await.unwrap();
    q.send_batch(["1", "2", "3", "4"]).await.unwrap();

    let mut earliest =
        q.group("earliest").unwrap().start_from(StartFrom::Earliest).subscribe().await.unwrap();
    assert_eq!(next(&mut earliest).await.seq(), 1);

    let mut latest = q.group("latest").unwrap().start_from(StartFrom::Latest).subscribe().await.unwrap();
    let mut at3 = q.group("at3").unwrap().start_from(StartFrom::Sequence(3)).subscribe().await.unwrap();
    assert_eq!(next(&mut at3).await.seq(), 3);
    let five = q.send("5").await.unwrap();
    assert_eq!(next(&mut latest).await.seq(), five);

    let err = q.group("bad").unwrap().start_from(StartFrom::Sequence(99)).subscribe().await.unwrap_err();
    assert!(matches!(err, rockq::Error::OutOfRange { requested: 99, first: 1, next: 6 }), "{err:?}");
    let err = q.group("bad").unwrap().start_from(StartFrom::Sequence(0)).subscribe().await.unwrap_err();
    assert!(matches!(err, rockq::Error::OutOfRange { .. }), "{err:?}");
    assert_eq!(q.group("bad").unwrap().committed(), None, "a refused group is not created");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_from_applies_only_to_a_new_group() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch(["a", "b", "c"]).await.unwrap();
    {
        let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
        next(&mut sub).await.ack().unwrap();
        sub.commit().await.unwrap();
    }
    // The group exists with offset 1; Latest must not move it.
    let mut sub = q.group("g").unwrap().start_from(StartFrom::Latest).subscribe().await.unwrap();
    assert_eq!(next(&mut sub).await.seq(), 2);
    broker.shutdown().await.unwrap();
}
