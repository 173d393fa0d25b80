//! Queues and groups are independent.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queues_consumers_never_see_another_queues_messages() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let a = broker.queue("a").await.unwrap();
    let b = broker.queue("b").await.unwrap();
    // Interleave so the two queues' keys are written in the same WriteBatches.
    for i in 0..100 {
        let (x, y) = tokio::join!(a.send(format!("a{i}")), b.send(format!("b{i}")));
        assert_eq!((x.unwrap(), y.unwrap()), (i + 1, i + 1), "each queue has its own sequence");
    }
    let mut sa = a.group("g").unwrap().subscribe().await.unwrap();
    let mut sb = b.group("g").unwrap().subscribe().await.unwrap();
    let da = take(&mut sa, 100).await;
    let db = take(&mut sb, 100).await;
    assert!(payloads(&da).iter().all(|p| p.starts_with('a')));
    assert!(payloads(&db).iter().all(|p| p.starts_with('b')));
    da.into_iter().for_each(|d| d.ack().unwrap());
    assert_next_is_sentinel(&a, &mut sa).await;
    assert_eq!(sa.commit().await.unwrap(), 101);
    // b's group (same name, other queue) has not moved.
    assert_eq!(b.group("g").unwrap().committed(), Some(0));
    db.into_iter().for_each(|d| d.ack().unwrap());
    assert_next_is_sentinel(&b, &mut sb).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_groups_progress_never_moves_another() {
    let dir = tempdir();
    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    q.send_batch((1..=20).map(|i| i.to_string())).await.unwrap();
    let fast = q.group("fast").unwrap();
    let slow = q.group("slow").unwrap();
    let mut sf = fast.subscribe().await.unwrap();
    let mut ss = slow.subscribe().await.unwrap();
    take(&mut sf, 20).await.into_iter().for_each(|d| d.ack().unwrap());
    take(&mut ss, 5).await.into_iter().for_each(|d| d.ack().unwrap());
    assert_eq!((sf.commit().await.unwrap(), ss.commit().await.unwrap()), (20, 5));
    drop((sf, ss));
    broker.shutdown().await.unwrap();

    let broker = open(dir.path()).await;
    let q = broker.queue("q").await.unwrap();
    assert_eq!(q.group("fast").unwrap().committed(), Some(20));
    assert_eq!(q.group("slow").unwrap().committed(), Some(5));
    let mut ss = q.group("slow").unwrap().subscribe().await.unwrap();
    assert_eq!(next(&mut ss).await.seq(), 6);
    broker.shutdown().await.unwrap();
}
