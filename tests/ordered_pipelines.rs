//! Subscriptions in `StreamExt` pipelines.

mod common;

use common::*;
use futures::{StreamExt, TryStreamExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_unordered_acks_out_of_order_and_commits_everything() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((0..500).map(|i| i.to_string())).await.unwrap();
    let sub = q.group("g").unwrap().max_in_flight(64).subscribe().await.unwrap();
    let seqs: Vec<u64> = sub
        .take(500)
        .map_ok(|d| async move {
            // Uneven work so completions interleave.
            for _ in 0..(d.seq() % 7) {
                tokio::task::yield_now().await;
            }
            let seq = d.seq();
            d.ack()?;
            Ok::<_, rockq::Error>(seq)
        })
        .try_buffer_unordered(32)
        .try_collect()
        .await
        .unwrap();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=500).collect::<Vec<_>>());
    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    assert_eq!(sub.commit().await.unwrap(), 500);
    assert_next_is_sentinel(&q, &mut sub).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_and_filter_map_compose() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((1..=30).map(|i| i.to_string())).await.unwrap();
    let sub = q.group("g").unwrap().subscribe().await.unwrap();
    let sums: Vec<u64> = sub
        .filter_map(|d| async move { d.ok() })
        .chunks(10)
        .take(3)
        .map(|chunk| {
            let sum: u64 = chunk.iter().map(|d| d.seq()).sum();
            chunk.into_iter().for_each(|d| d.ack().unwrap());
            sum
        })
        .collect()
        .await;
    assert_eq!(sums, vec![55, 155, 255]);
    broker.shutdown().await.unwrap();
}
