//! Many concurrent producers: unique, dense sequences; exactly-once consumption in a clean run.

mod common;

use std::collections::HashSet;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_get_unique_dense_sequences_and_each_message_is_consumed_once() {
    const PRODUCERS: usize = 8;
    const PER_PRODUCER: usize = 400;
    let dir = tempdir();
    let broker = open_with(dir.path(), rockq::Durability::Fsync).await;
    let q = broker.queue("work").await.unwrap();

    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..PER_PRODUCER {
                // Mix single sends and small atomic batches.
                if i % 4 == 0 {
                    let r = q.send_batch([format!("{p}-{i}-a"), format!("{p}-{i}-b")]).await.unwrap();
                    seqs.extend(r);
                } else {
                    seqs.push(q.send(format!("{p}-{i}")).await.unwrap());
                }
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let seqs = t.await.unwrap();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "one producer's sequences increase");
        all.extend(seqs);
    }
    let total = all.len();
    all.sort_unstable();
    assert_eq!(all, (1..=total as u64).collect::<Vec<_>>(), "unique and dense");
    assert!(broker.writer_stats().rounds < total as u64, "group commit shared rounds");

    let mut sub = q.group("g").unwrap().subscribe().await.unwrap();
    let mut seen = HashSet::new();
    for expected in 1..=total as u64 {
        let d = next(&mut sub).await;
        assert_eq!(d.seq(), expected);
        assert!(seen.insert(d.payload().clone()), "payload delivered twice");
        d.ack().unwrap();
    }
    assert_next_is_sentinel(&q, &mut sub).await;
    assert_eq!(seen.len(), total);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_contiguous_even_with_concurrent_single_sends() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("mixed").await.unwrap();
    let noise = {
        let q = q.clone();
        tokio::spawn(async move {
            for i in 0..500 {
                q.send(format!("noise-{i}")).await.unwrap();
            }
        })
    };
    let mut ranges = Vec::new();
    for b in 0..20 {
        let r = q.send_batch((0..25).map(|i| format!("b{b}-{i}"))).await.unwrap();
        ranges.push((b, r));
    }
    noise.await.unwrap();
    let mut sub = q.group("g").unwrap().read_batch(64).subscribe().await.unwrap();
    let all = take(&mut sub, 1000).await;
    for (b, r) in ranges {
        let got: Vec<String> = payloads(&all[(*r.start() - 1) as usize..*r.end() as usize]);
        let want: Vec<String> = (0..25).map(|i| format!("b{b}-{i}")).collect();
        assert_eq!(got, want, "batch {b} is contiguous and in order");
    }
    broker.shutdown().await.unwrap();
}
